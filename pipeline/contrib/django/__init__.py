"""The pipeline as Django's task backend: ``django.tasks`` (Django 6) and the ``django-tasks``
backport (Django 4.2-5.2), one class for both. See docs/django.md.

    # settings.py
    INSTALLED_APPS = [..., "pipeline.contrib.django"]          # manage.py pipeline; the store made by migrate
    TASKS = {"default": {"BACKEND": "pipeline.contrib.django.PipelineBackend"}}

    # the worker, either of:
    DJANGO_SETTINGS_MODULE=mysite.settings python -m pipeline --app pipeline.contrib.django:registry
    python manage.py pipeline

    # in a TestCase
    from pipeline.contrib.django import run_tasks
    results = run_tasks()

Names are imported on first use: ``--app pipeline.contrib.django:registry`` imports this module
before Django is set up, which :func:`registry` then does.
"""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from .backend import PipelineBackend
    from .jobs import TaskRaised
    from .testing import run_tasks
    from .worker import registry

_MODULE_OF = {"PipelineBackend": "backend", "TaskRaised": "jobs", "registry": "worker", "run_tasks": "testing"}

__all__ = ["PipelineBackend", "TaskRaised", "registry", "run_tasks"]


def __getattr__(name: str) -> _typing.Any:
    try:
        module = _MODULE_OF[name]
    except KeyError:
        raise AttributeError(f"module 'pipeline.contrib.django' has no attribute {name!r}") from None
    value = getattr(_importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
