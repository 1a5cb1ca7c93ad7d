"""``PipelineBackend``: Django's task backend API (``django.tasks`` of Django 6, and the
``django-tasks`` backport) on the pipeline's store. See docs/django.md.

Where an enqueue is written:

| the call | the store is the OPTIONS DATABASE (the default) | another store (OPTIONS DATABASE_URL alone) |
|---|---|---|
| inside ``transaction.atomic()`` on that database | in your transaction: it commits with your rows, a rollback leaves no job | at once, in a transaction of its own (Django 6's contract; ``enqueue_on_commit`` of the backport up to 0.9: after your commit) |
| outside a transaction | at once, in a transaction of its own | the same |
| ``enqueue_on_commit=False`` (backport up to 0.9) | at once, in a transaction of its own, whatever yours does | the same |
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable
from typing import Any

from ...errors import UsageError
from ...requests import check_job_id
from . import compat
from .jobs import TaskCall, is_task_job, payload_class, resolve, result_of
from .options import BACKEND_PATH, BackendOptions, read, store_url
from .stores import client_for, get_here, ran_here

TASK_PRIORITY_LIMIT = 100  # Django's priorities run from -100 to 100


def pipeline_priority(priority: int) -> int:
    """Django's priority (higher runs first, -100..100, default 0) as the pipeline's (lower runs first)."""
    return -priority


def django_priority(priority: int) -> int:
    """The pipeline's priority as Django's, kept within Django's range (an operator may set any)."""
    return max(-TASK_PRIORITY_LIMIT, min(TASK_PRIORITY_LIMIT, -priority))


class PipelineBackend(compat.PRIMARY.BaseTaskBackend):  # type: ignore[name-defined]
    """``TASKS = {"default": {"BACKEND": "pipeline.contrib.django.PipelineBackend", ...}}``; the
    worker: ``python -m pipeline --app pipeline.contrib.django:registry`` or ``python manage.py pipeline``."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.pipeline_options: BackendOptions = read(alias, params)

    # -- the store ----------------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The process's pipeline.Client of this backend's store (opened at first use)."""
        return client_for(self.pipeline_options, store_url(self.pipeline_options))

    def _joined(self) -> Any:
        """Django's connection whose transaction an enqueue joins: the OPTIONS DATABASE's, when it is
        inside ``atomic()`` (None: none)."""
        if self.pipeline_options.database is None:
            return None
        from django.db import connections

        connection = connections[self.pipeline_options.database]
        return connection if connection.in_atomic_block else None

    # -- enqueue ------------------------------------------------------------------------------------

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        self.validate_task(task)
        fw = compat.of(task)
        args, kwargs = fw.normalize_json(list(args)), fw.normalize_json(dict(kwargs))
        run_after = _aware(task.run_after)
        queue = self.pipeline_options.queue(task.queue_name)
        call = payload_class(queue.job_type)(task.module_path, args, kwargs, self.alias,
                                              None if run_after is None else run_after.isoformat())
        client = self.client
        options = {"priority": pipeline_priority(task.priority), "run_after": run_after}
        on_commit = self._on_commit(task)
        joined = self._joined()
        if joined is not None and on_commit is not False:
            job_id = client.enqueue(call, connection=joined, **options)
        elif on_commit and self.pipeline_options.database is None and _in_atomic():
            job_id = self._after_commit(client, call, options)
        else:
            job_id = client.enqueue(call, **options)
        from django.utils import timezone

        result = fw.TaskResult(task=task, id=job_id, status=fw.TaskResultStatus.READY, enqueued_at=timezone.now(),
                               started_at=None, finished_at=None, last_attempted_at=None, args=args, kwargs=kwargs,
                               backend=self.alias, errors=[], worker_ids=[])
        fw.signals().task_enqueued.send(type(self), task_result=result)
        return result

    def _on_commit(self, task: Any) -> bool | None:
        """The backport's ``enqueue_on_commit`` (up to 0.9: the task's, else ENQUEUE_ON_COMMIT's, True by
        default); None where the framework has none (Django 6, the backport from 0.10)."""
        if not hasattr(task, "enqueue_on_commit"):
            return None
        if task.enqueue_on_commit is not None:
            return bool(task.enqueue_on_commit)
        return bool(getattr(self, "enqueue_on_commit", True))

    def _after_commit(self, client: Any, call: TaskCall, options: dict[str, Any]) -> str:
        """The backport's enqueue_on_commit on a store outside Django's database: the row is made now
        (its id is the result's) and written by ``transaction.on_commit``; a rollback drops it."""
        from django.db import transaction

        pipeline = client._pipeline_here()
        row = pipeline.new_job(call, **options)

        def write() -> None:
            client._call(lambda p: p.backend.insert([row]))

        transaction.on_commit(write)
        return str(row.id)

    # -- results ------------------------------------------------------------------------------------

    def get_result(self, result_id: str) -> Any:
        ran = ran_here(result_id)
        if ran is not None:
            return ran
        missing = compat.PRIMARY.TaskResultDoesNotExist(result_id)
        try:
            check_job_id(result_id)
        except UsageError:
            raise missing from None
        client = self.client
        joined = self._joined()
        record = get_here(client, joined, result_id) if joined is not None else client.get(result_id)
        if record is None or not is_task_job(record):
            raise missing
        try:
            return self.result_of(record)
        except LookupError as exc:  # its task's code is gone (renamed, removed)
            raise compat.PRIMARY.TaskResultDoesNotExist(f"{result_id}: {exc}") from exc

    def result_of(self, record: Any) -> Any:
        """A job of one of the queues as a TaskResult (its task imported by its path)."""
        registry = self.client.registry
        payload = registry.decode(record.job_type, record.payload, stored=True)
        task = resolve(payload.task)
        stored_after = None if payload.run_after is None else dt.datetime.fromisoformat(payload.run_after)
        task = dataclasses.replace(task, priority=django_priority(record.priority),
                                   queue_name=record.job_type.partition(".")[2], backend=payload.backend,
                                   run_after=_django_time(stored_after))
        return result_of(record, payload, task)

    def check(self, **kwargs: Any) -> Iterable[Any]:
        """Django's system checks: the store can be named (an in-memory SQLite database cannot be shared)."""
        from django.core import checks
        from django.core.exceptions import ImproperlyConfigured

        try:
            store_url(self.pipeline_options)
        except ImproperlyConfigured as exc:
            return [checks.Error(str(exc), obj=f"TASKS[{self.alias!r}]", id="pipeline.E001")]
        return []


def _in_atomic() -> bool:
    from django.db import connections

    return any(connection.in_atomic_block for connection in connections.all(initialized_only=True))


def _aware(value: dt.datetime | None) -> dt.datetime | None:
    """A task's run_after as an aware time: Django refuses a naive one under USE_TZ; without it, a
    naive one is in TIME_ZONE."""
    if value is None or value.tzinfo is not None:
        return value
    from django.utils import timezone

    return timezone.make_aware(value)


def _django_time(value: dt.datetime | None) -> dt.datetime | None:
    if value is None:
        return None
    from django.conf import settings
    from django.utils import timezone

    return value if settings.USE_TZ else timezone.make_naive(value)


def pipeline_backends() -> dict[str, BackendOptions]:
    """Every TASKS entry whose backend is PipelineBackend (or a subclass named by its own path), by alias."""
    from django.conf import settings
    from django.utils.module_loading import import_string

    found = {}
    for alias, params in (getattr(settings, "TASKS", None) or {}).items():
        path = params.get("BACKEND", "")
        if path == BACKEND_PATH or (path and _is_ours(import_string, path)):
            found[alias] = read(alias, params)
    return found


def _is_ours(import_string: Any, path: str) -> bool:
    try:
        found = import_string(path)
    except ImportError:
        return False
    return isinstance(found, type) and issubclass(found, PipelineBackend)
