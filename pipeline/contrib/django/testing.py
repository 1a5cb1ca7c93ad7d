"""``run_tasks()``: a test's pending tasks run in the test itself, on its own connection.

Django's ``TestCase`` never commits: each test runs in a transaction that is rolled back, so a
worker (another process, another connection) never sees the jobs the test enqueued, nor the rows
they need. :func:`run_tasks` reads the pending jobs of the PipelineBackends' queues through the
test's connection (its uncommitted rows included), and runs each task in the calling thread, so the
task's queries see what the test wrote. It returns their TaskResults; ``get_result`` (and a
result's ``refresh()``) answers them too.

The jobs' rows are left as they are (pending, in a transaction the test rolls back): their
outcomes are kept in this process, by job id, not written. A task that fails is FAILED at once,
whatever its queue's MAX_ATTEMPTS.
"""

from __future__ import annotations

from typing import Any


def run_tasks(*, backend: str | None = None, limit: int = 1000) -> list[Any]:
    """Run every pending task of the PipelineBackends (or of TASKS[``backend``]) in this thread,
    on this thread's connection, in the order a worker claims them (priority, then run_after:
    deferred tasks too, now), the tasks they enqueue included; their TaskResults, in the order they
    ran. ``limit``: at most this many tasks in all (RuntimeError past it: a task that enqueues itself)."""
    from django.db import connections

    from . import compat
    from .backend import pipeline_backends
    from .stores import pending_here, ran_here, remember_ran

    backends = {alias: compat.PRIMARY.task_backends()[alias] for alias in pipeline_backends() if backend in (None, alias)}
    if backend is not None and not backends:
        raise LookupError(f"TASKS[{backend!r}] is not a PipelineBackend")
    results: list[Any] = []
    while True:
        ran_one = False
        for tasks in backends.values():
            options = tasks.pipeline_options
            if options.database is None:
                raise RuntimeError(f"TASKS[{options.alias!r}] keeps its jobs outside Django's databases "
                                   "(OPTIONS DATABASE_URL alone): run_tasks reads them through the test's connection, so "
                                   "it needs them in one of them (OPTIONS DATABASE)")
            job_types = [queue.job_type for queue in options.queues.values()]
            for record in pending_here(tasks.client, connections[options.database], job_types):
                if ran_here(record.id) is not None:
                    continue
                if len(results) >= limit:
                    raise RuntimeError(f"run_tasks ran {limit} tasks and more are pending: does a task enqueue itself?")
                result = _run(tasks, record, tasks.client.registry.decode(record.job_type, record.payload, stored=True))
                remember_ran(record.id, result)
                results.append(result)
                ran_one = True
        if not ran_one:
            return results


def _run(tasks: Any, record: Any, call: Any) -> Any:
    """One task, as the worker runs it (worker.call_task, without the request cycle's connection checks), its outcome a TaskResult."""
    import traceback

    import attrs
    from django.utils import timezone

    from ...clock import format_ts
    from ...context import JobContext
    from ...errors import JobError
    from .jobs import result_of
    from .worker import call_task

    context = JobContext(id=record.id, job_type=record.job_type, attempt=record.attempts + 1,
                         max_attempts=record.max_attempts, emit=_no_emit, resources={}, config=tasks.client.config)
    now = format_ts(timezone.now().timestamp())
    try:
        value = call_task(call, context)
    except (Exception, JobError) as exc:  # noqa: BLE001 - its failure is its result's
        text = "".join(traceback.format_exception(exc, limit=-3)).strip()
        ended = attrs.evolve(record, status="dead", attempts=record.attempts + 1, updated_at=now,
                             error=f"{type(exc).__name__}: {exc}\n{text}")
    else:
        import json

        ended = attrs.evolve(record, status="completed", attempts=record.attempts + 1, updated_at=now,
                             result=json.dumps(value), error=None)
    return result_of(ended, call, tasks.result_of(record).task)


async def _no_emit(event: Any) -> list[str]:
    raise RuntimeError("a task run by run_tasks() cannot emit pipeline events")
