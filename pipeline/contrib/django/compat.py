"""Which Tasks framework a task belongs to: Django's own ``django.tasks`` (Django 6, Python >= 3.12)
or the ``django-tasks`` backport (``django_tasks``, Django 4.2-5.2). Their APIs are the same but
for a few names (``InvalidTask`` / ``InvalidTaskError``, where ``normalize_json`` lives) and, in
the backport up to 0.9, ``enqueue_on_commit``. The backend takes its base class from Django's own
when there is one; each result is made of the classes of its task's own framework, so a project
may even use both.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any


def _load(package: str) -> SimpleNamespace | None:
    try:
        base = importlib.import_module(f"{package}.base")
    except ImportError:
        return None
    exceptions = importlib.import_module(f"{package}.exceptions")
    backends = importlib.import_module(f"{package}.backends.base")
    if package == "django.tasks":
        from django.utils.json import normalize_json  # (Django 6)
    else:
        normalize_json = importlib.import_module(f"{package}.utils").normalize_json
    return SimpleNamespace(
        package=package,
        Task=base.Task,
        TaskResult=base.TaskResult,
        TaskResultStatus=base.TaskResultStatus,
        TaskError=base.TaskError,
        TaskContext=base.TaskContext,
        BaseTaskBackend=backends.BaseTaskBackend,
        InvalidTask=getattr(exceptions, "InvalidTask", None) or exceptions.InvalidTaskError,
        TaskResultDoesNotExist=exceptions.TaskResultDoesNotExist,
        normalize_json=normalize_json,
        signals=lambda: importlib.import_module(f"{package}.signals"),  # (imports the settings: only once set up)
        task_backends=lambda: importlib.import_module(package).task_backends,
    )


def _frameworks() -> list[SimpleNamespace]:
    found = [fw for fw in (_load("django.tasks"), _load("django_tasks")) if fw is not None]
    if not found:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            "pipeline.contrib.django needs Django's Tasks framework: Django 6 (django.tasks, Python >= 3.12), or on "
            "Django 4.2-5.2 the backport: pip install 'trio-pipeline[django]' (or pip install django-tasks)")
    return found


FRAMEWORKS = _frameworks()
PRIMARY = FRAMEWORKS[0]  # Django's own when it has one: the backend's base class, its errors


def of(task: Any) -> SimpleNamespace:
    """The framework whose Task ``task`` is (the primary one for anything else)."""
    for fw in FRAMEWORKS:
        if isinstance(task, fw.Task):
            return fw
    return PRIMARY
