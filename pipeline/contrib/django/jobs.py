"""A Django task call as a pipeline job, and a job read back as a Django ``TaskResult``.

A call is stored as a job of its queue's type (``django.<queue>``, options.py) whose payload names
the task by its module path, as every Django task backend does: the worker imports it there.

    {"task": "shop.tasks.send_receipt", "args": [42], "kwargs": {}, "backend": "default", "run_after": null}

What a Django ``TaskResult`` holds, from the job's record:

| TaskResult | from |
|---|---|
| ``id`` | the job's id |
| ``status`` | pending, waiting: READY; running: RUNNING; completed: SUCCESSFUL; dead, cancelled: FAILED |
| ``return_value`` | the result's ``return_value`` (the handler stores ``{"return_value", "started_at", "worker_id"}``) |
| ``errors`` | the job's last error, one ``TaskError`` (the pipeline keeps the last attempt's alone) |
| ``task.priority`` | minus the job's priority (Django: higher runs first, -100..100; the pipeline: lower first) |
| ``enqueued_at``, ``finished_at`` | the job's created_at, and its updated_at once it ended |
| ``started_at``, ``last_attempted_at`` | when the handler started (a completed job's result), the claim (a running job's) |
| ``worker_ids`` | one per attempt: host:pid of the process that ran it |
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Mapping
from typing import Any

import attrs

from ...backends.base import JobRecord
from ...clock import parse_ts
from ...registry import Registry
from . import compat
from .options import JOB_TYPE_PREFIX, BackendOptions


@attrs.frozen
class TaskCall:
    """A Django task call, as stored (one subclass per queue: a payload class is one job type's)."""

    task: str  # the task's module path: shop.tasks.send_receipt
    args: list[Any]  # normalised to JSON by Django's normalize_json, as the TaskResult holds them
    kwargs: dict[str, Any]
    backend: str = "default"  # the TASKS alias it was enqueued through
    run_after: str | None = None  # the task's own run_after (the job's moves with its retries)


_CLASSES: dict[str, type] = {}  # job type -> its payload class: classes are made once, so registries agree


def payload_class(job_type: str) -> type:
    cls = _CLASSES.get(job_type)
    if cls is None:
        name = "TaskCall_" + re.sub(r"\W", "_", job_type[len(JOB_TYPE_PREFIX):])
        cls = _CLASSES.setdefault(job_type, attrs.frozen(type(name, (TaskCall,), {"__module__": __name__})))
    return cls


def types_registry(backends: Mapping[str, BackendOptions], handler: Any = None) -> Registry:
    """The queues' job types: to enqueue and check them (no handler), or to run them (``handler``)."""
    registry = Registry()
    for options in backends.values():
        for queue in options.queues.values():
            if queue.job_type in registry.job_types():
                continue  # (two aliases on one store share a queue's type)
            # the options with or without a handler: max_attempts is written with each job, by whoever enqueues it
            registry.register(queue.job_type, payload_class(queue.job_type), handler, **queue.options)
    return registry


def is_task_job(record: JobRecord) -> bool:
    return record.job_type.startswith(JOB_TYPE_PREFIX)


@functools.lru_cache(maxsize=1024)
def resolve(path: str) -> Any:
    """The Task a stored call names (its module path: the module's attribute that @task made)."""
    from django.utils.module_loading import import_string

    try:
        task = import_string(path)
    except ImportError as exc:
        raise LookupError(f"the task {path!r} cannot be imported ({exc}): a task is a module-level function decorated "
                          "with @task, found by its module path") from exc
    if not any(isinstance(task, fw.Task) for fw in compat.FRAMEWORKS):
        raise LookupError(f"{path!r} is {type(task).__name__}, not a task: decorate it with @task")
    return task


# -- errors -------------------------------------------------------------------------------------------------


class TaskRaised(Exception):
    """A task raised: the job's error starts ``TaskRaised: <the exception's class path>: <its message>``,
    its traceback below (the pipeline keeps it as the job's error, TaskError reads it back)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if message else path)
        self.path = path


_RAISED = re.compile(r"TaskRaised: ([\w.]+)")
# what other ends are, as exception classes a TaskError can name (and import)
_ENDS = (("timed out", "builtins.TimeoutError"), ("permanent error", "pipeline.errors.PermanentError"))


def task_error(fw: Any, record: JobRecord) -> Any:
    error = record.error or ""
    found = _RAISED.match(error)
    if found:
        path = found.group(1)
    elif record.status == "cancelled":
        path = "pipeline.errors.JobCancelled"
    else:
        path = next((cls for start, cls in _ENDS if error.startswith(start)), "pipeline.errors.JobFailed")
    return fw.TaskError(exception_class_path=path, traceback=error)


# -- results ------------------------------------------------------------------------------------------------

_STATUS = {"pending": "READY", "waiting": "READY", "running": "RUNNING", "completed": "SUCCESSFUL",
           "dead": "FAILED", "cancelled": "FAILED"}


def _when(text: str | None) -> dt.datetime | None:
    """A stored time as Django wants it: aware (UTC) under USE_TZ, else naive in TIME_ZONE."""
    if not text:
        return None
    from django.conf import settings
    from django.utils import timezone

    value = parse_ts(text)
    return value if settings.USE_TZ else timezone.make_naive(value)


def result_of(record: JobRecord, payload: TaskCall, task: Any) -> Any:
    """The Django TaskResult of a job of a task queue, its ``task`` the stored call's."""
    fw = compat.of(task)
    status = fw.TaskResultStatus[_STATUS[record.status]]
    envelope: dict[str, Any] = {}
    if record.status == "completed" and record.result:
        import json

        loaded = json.loads(record.result)
        envelope = loaded if isinstance(loaded, dict) else {"return_value": loaded}
    worker = envelope.get("worker_id") or (record.lease_owner or "").rpartition(":")[0] or (record.lease_owner or "")
    running = record.status == "running"
    started = envelope.get("started_at") or (record.updated_at if running else None)
    ended = record.status in ("completed", "dead", "cancelled")
    errors = [task_error(fw, record)] if record.error and record.status != "completed" else []
    result = fw.TaskResult(
        task=task, id=record.id, status=status, enqueued_at=_when(record.created_at), started_at=_when(started),
        finished_at=_when(record.updated_at) if ended else None, last_attempted_at=_when(started),
        args=payload.args, kwargs=payload.kwargs, backend=payload.backend, errors=errors,
        worker_ids=[worker] * record.attempts if worker else [""] * record.attempts,
    )
    if record.status == "completed":
        object.__setattr__(result, "_return_value", envelope.get("return_value"))
    return result
