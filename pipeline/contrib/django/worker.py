"""The worker of a Django project: ``python -m pipeline --app pipeline.contrib.django:registry`` (with
DJANGO_SETTINGS_MODULE set), or ``python manage.py pipeline``.

:func:`registry` sets Django up (``django.setup()``: no shim in the project), and makes one job type
per queue of every PipelineBackend in TASKS, all run by :func:`run_task`: a plain ``def``, so each
task runs in a worker thread, where it uses that thread's Django connections as a request does:
``close_old_connections()`` before and after every task (a connection past CONN_MAX_AGE, or broken,
is closed; with the default CONN_MAX_AGE=0, every one the task opened), and the queries log reset.

The store is the one the web processes write to (options.store_url): the factory puts it in the
environment's DATABASE_URL before the service reads its settings (it takes no Config argument so
that it is called first), and refuses a DATABASE_URL that names another store.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from typing import Any

from ...context import JobContext
from ...errors import ConfigError, JobError, PermanentError
from ...registry import Registry
from . import compat


def setup_django() -> None:
    """``django.setup()`` once, with its failures said as the service's settings errors (exit 2)."""
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        from django.conf import settings

        if not settings.configured:
            raise ConfigError("DJANGO_SETTINGS_MODULE is not set: the Django worker needs your project's settings "
                              "(DJANGO_SETTINGS_MODULE=mysite.settings python -m pipeline --app "
                              "pipeline.contrib.django:registry, or python manage.py pipeline)")
    import django
    from django.apps import apps
    from django.core.exceptions import ImproperlyConfigured

    if apps.ready:
        return
    try:
        django.setup()
    except ImproperlyConfigured as exc:
        raise ConfigError(f"Django's settings ({os.environ.get('DJANGO_SETTINGS_MODULE')}): {exc}") from exc


def registry() -> Registry:
    """The Django project's job types, run by :func:`run_task` (the worker's ``--app``)."""
    setup_django()
    from django.core.exceptions import ImproperlyConfigured

    from .backend import pipeline_backends
    from .jobs import types_registry
    from .options import store_url

    try:
        backends = pipeline_backends()
        stores = {alias: store_url(options) for alias, options in backends.items()}
    except ImproperlyConfigured as exc:
        raise ConfigError(str(exc)) from exc
    if not backends:
        raise ConfigError("no TASKS entry has BACKEND 'pipeline.contrib.django.PipelineBackend': the worker has no "
                          "queue to run (docs/django.md)")
    if len(set(stores.values())) > 1:
        raise ConfigError(f"the PipelineBackends of TASKS use {len(set(stores.values()))} stores ({_aliases(stores)}): "
                          "one worker serves one store; run a worker per store (DATABASE_URL)")
    (url,) = set(stores.values())
    given = os.environ.get("DATABASE_URL")
    if given and given.strip() != url:
        from ...config import masked_url

        raise ConfigError(f"DATABASE_URL={masked_url(given)!r} is not the store of TASKS ({_aliases(stores)}: "
                          f"{masked_url(url)!r}); unset it (the worker takes the store from your settings) or make them agree")
    os.environ["DATABASE_URL"] = url  # read by the service's Config.from_env, and inherited by its worker processes
    return types_registry(backends, run_task)


def _aliases(stores: dict[str, str]) -> str:
    return ", ".join(f"TASKS[{alias!r}]" for alias in stores)


WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"  # a TaskResult's worker_ids (the lease owner's host:pid)


def run_task(job: Any, ctx: JobContext) -> dict[str, Any]:
    """Run a stored task call in this worker thread, as Django runs a view: its connections checked
    before, closed (or kept, under CONN_MAX_AGE) after. Its return value (normalised to JSON, as
    Django's backends do) is the job's result, with when and where it ran; what it raises fails the job
    (:class:`TaskRaised`: its class path, message and traceback); the pipeline's own JobErrors
    (RetryLater, Snooze, PermanentError) keep their meaning."""
    from django.db import close_old_connections, reset_queries

    reset_queries()
    close_old_connections()
    try:
        return call_task(job, ctx)
    finally:
        close_old_connections()


def call_task(job: Any, ctx: JobContext) -> dict[str, Any]:
    """The task itself, on this thread's connections as they are (run_tasks: the test's own, in its
    transaction, which close_old_connections would close: Django's test client leaves them alone too)."""
    from django.utils import timezone

    from .jobs import TaskRaised, resolve

    try:
        task = resolve(job.task)
    except LookupError as exc:
        raise PermanentError(str(exc)) from exc
    fw = compat.of(task)
    started = timezone.now()
    result = fw.TaskResult(
        task=task, id=ctx.id, status=fw.TaskResultStatus.RUNNING, enqueued_at=None, started_at=started,
        finished_at=None, last_attempted_at=started, args=job.args, kwargs=job.kwargs, backend=job.backend, errors=[],
        worker_ids=[WORKER_ID] * ctx.attempt)
    signals = fw.signals()
    sender = type(fw.task_backends()[job.backend])  # (Django's own backends send their class)
    signals.task_started.send(sender=sender, task_result=result)
    try:
        if task.takes_context:
            value = task.call(fw.TaskContext(task_result=result), *job.args, **job.kwargs)
        else:
            value = task.call(*job.args, **job.kwargs)
        value = fw.normalize_json(value)
    except JobError:
        raise
    except Exception as exc:  # noqa: BLE001 - the task's failure: the job's error, Django's FAILED
        kind = type(exc)
        object.__setattr__(result, "status", fw.TaskResultStatus.FAILED)
        object.__setattr__(result, "finished_at", timezone.now())
        signals.task_finished.send(sender=sender, task_result=result)
        raise TaskRaised(f"{kind.__module__}.{kind.__qualname__}", str(exc)) from exc
    object.__setattr__(result, "status", fw.TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(result, "_return_value", value)
    signals.task_finished.send(sender=sender, task_result=result)
    return {"return_value": value, "started_at": started.astimezone(dt.UTC).isoformat(), "worker_id": WORKER_ID}

