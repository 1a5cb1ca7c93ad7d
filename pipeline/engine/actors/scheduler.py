"""The Scheduler: fires the cron schedules that are due, in every worker process, with no leader.

Each round reads the schedules due within the next ``interval`` (enabled, ``next_run`` <= now +
interval: an indexed read) and, for each one whose tick has come, builds its job
(``Pipeline.new_job``: the payload checked against the registered type) and calls
``Backend.fire_schedule``, which inserts the job and moves ``next_run`` on in one transaction,
only if ``next_run`` still holds the tick read: of every process that tries, one wins, and a
process that dies between the read and the write has written nothing. Then it sleeps until the
earliest tick it knows of (one read ahead, or the next run of one it fired), or ``interval`` at
most: a tick fires within milliseconds of its time, whatever a round's work took, and a schedule
added or changed elsewhere is seen within ``interval``.

The job is due at its tick (``run_after`` = the tick). A tick missed while no process ran fires once,
when one is back, and the next run is the first tick after that moment: no burst of missed ticks.
A schedule of a type this process does not know (another application's) is left to a process that does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import trio

from ...backends.base import Backend, NewJob, ScheduleRecord
from ...clock import format_ts, to_epoch
from ...errors import PipelineClosed, PipelineError, UnknownJobType, UsageError
from ...registry import Registry
from ...schedules import next_tick
from ..health import Health

log = logging.getLogger("pipeline.scheduler")

INTERVAL = 1.0  # the longest sleep between two reads of the schedules: a schedule added elsewhere waits this much at most


async def run_scheduler(
    backend: Backend,
    registry: Registry,
    new_job: Callable[..., NewJob],
    *,
    health: Health,
    interval: float = INTERVAL,
    clock: Callable[[], float] = time.time,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """``clock``: the wall clock ticks are read by (epoch seconds; the tests set it)."""
    task_status.started()
    told: set[tuple[str, str]] = set()  # (schedule, why it cannot fire here) already logged: once, not every round
    while True:
        wake = clock() + interval
        try:
            for schedule in await backend.due_schedules(format_ts(wake)):
                now = clock()
                if to_epoch(schedule.next_run) > now:  # not yet: wake up for it
                    wake = min(wake, to_epoch(schedule.next_run))
                    continue
                try:
                    following = await _fire(backend, registry, new_job, schedule, format_ts(now), told)
                except UsageError as exc:  # this schedule's own trouble (a row written by hand): not the others'
                    _tell(told, logging.ERROR, schedule, f"cannot fire: {exc}")
                    continue
                if following is not None:  # (fired here or by another process: either way, due then)
                    wake = min(wake, to_epoch(following))
            health.clear("scheduler")
        except PipelineClosed:
            return
        except PipelineError as exc:  # the store refused or is unreachable: try again next round
            health.report("scheduler", f"cannot read or fire the schedules: {exc}")
            log.warning("scheduler: %s", exc)
            wake = clock() + interval
        await trio.sleep(max(0.0, min(wake - clock(), interval)))


async def _fire(backend: Backend, registry: Registry, new_job: Callable[..., NewJob], schedule: ScheduleRecord,
                now: str, told: set[tuple[str, str]]) -> str | None:
    """Fire the schedule's due tick (unless another process did); its next run, or None if
    this process does not fire it."""
    try:
        job = registry.decode(schedule.job_type, schedule.payload)
    except UnknownJobType:
        _tell(told, logging.INFO, schedule, f"job type {schedule.job_type!r} is not registered here; a process that "
                                            "knows it fires it")
        return None
    except UsageError as exc:  # a payload that no longer fits the type (the code changed): it stays due until fixed
        _tell(told, logging.ERROR, schedule, f"its payload does not fit job type {schedule.job_type!r} any more: {exc}; "
                                             "fix it or remove the schedule")
        return None
    following = next_tick(schedule.cron, schedule.timezone, now)  # a missed tick fires once: no catching up
    row = new_job(job, run_after=schedule.next_run, now=now)
    if await backend.fire_schedule(schedule.name, tick=schedule.next_run, next_run=following, job=row):
        log.info("schedule %s: tick %s fired job %s; next run %s", schedule.name, schedule.next_run, row.id, following)
    return following


def _tell(told: set[tuple[str, str]], level: int, schedule: ScheduleRecord, why: str) -> None:
    if (schedule.name, why) not in told:
        told.add((schedule.name, why))
        log.log(level, "schedule %s: %s", schedule.name, why)
