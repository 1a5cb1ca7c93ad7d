"""The Scheduler (pipeline/engine/actors/scheduler.py) on each store through the clock changes of
America/New_York, with a clock the test runs: it reads the wall clock through its ``clock``
argument, which here starts at a chosen moment and moves 15 s at each reading (so a round of
the Scheduler passes over the repeated hour in a fraction of a second). Each tick is enqueued
once; none is fired again. (The rules, on the pure function: tests/test_cron_dst.py.)"""

from __future__ import annotations

import json
from typing import Any

import trio
from jobkit import registry

from pipeline.backends import Backend, NewJob
from pipeline.backends.base import ScheduleRecord
from pipeline.clock import format_ts, to_epoch
from pipeline.engine.actors.scheduler import run_scheduler
from pipeline.engine.health import Health
from pipeline.schedules import make_schedule

from .kit import new_id

NY = "America/New_York"


class RunningClock:
    """Epoch seconds from ``start``, ``step`` more at each reading, up to ``end``, where it stops
    and ``reached`` is set."""

    def __init__(self, start: str, end: str, step: float = 15.0) -> None:
        self.now, self.end, self.step = to_epoch(start), to_epoch(end), step
        self.reached = trio.Event()
        self.readings = 0

    def __call__(self) -> float:
        self.readings += 1
        now = self.now
        if now >= self.end:
            self.reached.set()
        else:
            self.now = min(self.end, now + self.step)
        return now


async def sweep(backend: Backend, clock: RunningClock) -> None:
    """The Scheduler, until the clock has reached its end and some rounds have passed at it."""
    reg = registry()

    def new_job(job: Any, *, run_after: str, now: str) -> NewJob:
        job_type, payload = reg.encode(job)
        return NewJob(new_id(), job_type, payload, 3, run_after, 5, now, None)

    with trio.fail_after(30):
        async with trio.open_nursery() as tn:
            await tn.start(lambda task_status: run_scheduler(
                backend, reg, new_job, health=Health(), interval=0.002, clock=clock, task_status=task_status))
            await clock.reached.wait()
            readings = clock.readings
            while clock.readings < readings + 10:  # a few more rounds at the end: nothing more fires
                await trio.sleep(0.01)
            tn.cancel_scope.cancel()


async def ticks_of(backend: Backend) -> dict[str, list[str]]:
    jobs, _ = await backend.list(job_type="echo", limit=1000)
    found: dict[str, list[str]] = {}
    for job in jobs:
        found.setdefault(json.loads(job.payload)["text"], []).append(job.run_after)
    return {name: sorted(ticks) for name, ticks in found.items()}


async def add(backend: Backend, name: str, cron: str, *, at: str) -> None:
    declared = make_schedule(registry(), name, cron, "echo", {"text": name}, NY)
    await backend.put_schedule(ScheduleRecord.of(declared, origin="operator", now=at))


async def test_a_tick_due_in_the_repeated_hour_and_fired_late_fires_once(backend: Backend) -> None:
    """The storm of issue 21: 30 1 * * * due at 01:30 EDT (05:30Z), the service back at 01:10 EST
    (06:10Z, the second pass): one job, and the next run is the next day's."""
    await add(backend, "daily", "30 1 * * *", at="2024-11-03T04:50:00.000Z")  # next run 05:30Z
    await add(backend, "quarter", "*/15 * * * *", at="2024-11-03T04:50:00.000Z")  # next run 05:00Z
    await sweep(backend, RunningClock("2024-11-03T06:10:00.000Z", "2024-11-03T07:40:00.000Z"))
    ticks = await ticks_of(backend)
    assert ticks["daily"] == ["2024-11-03T05:30:00.000Z"]
    # the missed 05:00Z once, then every quarter of an hour by the clock, through the second pass
    assert ticks["quarter"] == ["2024-11-03T05:00:00.000Z"] + [
        format_ts(to_epoch("2024-11-03T06:15:00.000Z") + 900 * n) for n in range(6)]
    stored = {s.name: s for s in await backend.schedules()}
    assert stored["daily"].next_run == "2024-11-04T06:30:00.000Z"
    assert stored["quarter"].next_run == "2024-11-03T07:45:00.000Z"


async def test_the_repeated_hour_passed_over_fires_each_time_once(backend: Backend) -> None:
    await add(backend, "daily", "30 1 * * *", at="2024-11-03T04:50:00.000Z")
    await add(backend, "hourly", "10 * * * *", at="2024-11-03T04:50:00.000Z")
    await sweep(backend, RunningClock("2024-11-03T05:00:00.000Z", "2024-11-03T07:20:00.000Z"))
    ticks = await ticks_of(backend)
    assert ticks["daily"] == ["2024-11-03T05:30:00.000Z"]  # 01:30 EDT; not 01:30 EST (06:30Z)
    assert ticks["hourly"] == ["2024-11-03T05:10:00.000Z", "2024-11-03T06:10:00.000Z", "2024-11-03T07:10:00.000Z"]


async def test_a_time_the_spring_change_skips_fires_once_after_it(backend: Backend) -> None:
    await add(backend, "half-past-two", "30 2 * * *", at="2024-03-10T05:00:00.000Z")  # 02:30 does not exist
    await add(backend, "three", "0 3 * * *", at="2024-03-10T05:00:00.000Z")  # 03:00 EDT, 07:00Z
    await sweep(backend, RunningClock("2024-03-10T06:30:00.000Z", "2024-03-10T08:10:00.000Z"))
    ticks = await ticks_of(backend)
    assert ticks == {"half-past-two": ["2024-03-10T07:00:00.000Z"], "three": ["2024-03-10T07:00:00.000Z"]}
    stored = {s.name: s for s in await backend.schedules()}
    assert stored["half-past-two"].next_run == "2024-03-11T06:30:00.000Z"
    assert stored["three"].next_run == "2024-03-11T07:00:00.000Z"
