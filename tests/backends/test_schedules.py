"""Cron schedules in the store: added, listed, paused, resumed and removed; merged from code at
start; and fired, each tick once, whoever tries and however many at once."""

from __future__ import annotations

import time
from pathlib import Path

import attrs
import pytest
import trio

from pipeline import Config
from pipeline.backends import Backend, ScheduleRecord, open_backend
from pipeline.clock import to_epoch
from pipeline.errors import UsageError

from .kit import job, record, ts
from .stores import on_each_store

PAYLOAD = '{"n":1}'


def schedule(name: str = "nightly", *, cron: str = "0 3 * * *", origin: str = "operator", next_run: str | None = None,
             timezone: str = "UTC", payload: str = PAYLOAD) -> ScheduleRecord:
    now = ts()
    return ScheduleRecord(name=name, job_type="t", payload=payload, cron=cron, timezone=timezone, enabled=True,
                          origin=origin, next_run=next_run or ts(3600), created_at=now, updated_at=now)


async def jobs_of(backend: Backend, job_type: str = "t") -> list[str]:
    found, _ = await backend.list(job_type=job_type, limit=1000)
    return [j.id for j in found]


async def test_operators_add_list_pause_resume_and_remove_schedules(backend: Backend) -> None:
    assert await backend.schedules() == []
    added = schedule("b-report", timezone="Europe/Paris")
    await backend.put_schedule(added)
    await backend.put_schedule(schedule("a-digest", cron="*/5 * * * *"))
    found = await backend.schedules()
    assert [s.name for s in found] == ["a-digest", "b-report"]  # by name
    assert found[1] == added  # every field as written, times included

    with pytest.raises(UsageError, match="already exists"):  # "add" never replaces
        await backend.put_schedule(schedule("b-report", cron="* * * * *"))
    assert (await backend.schedules())[1] == added  # and changed nothing

    paused = await backend.set_schedule_enabled("b-report", False)
    assert not paused.enabled and paused.next_run == added.next_run
    resumed = await backend.set_schedule_enabled("b-report", True)
    assert resumed.enabled
    # from the first tick after now, in its zone (03:00 Paris): not the tick stored before the pause
    assert ts() < resumed.next_run <= ts(86400) and resumed.next_run.endswith(":00:00.000Z")
    assert (await backend.schedules())[1] == resumed

    await backend.remove_schedule("a-digest")
    assert [s.name for s in await backend.schedules()] == ["b-report"]
    with pytest.raises(LookupError):
        await backend.remove_schedule("a-digest")
    with pytest.raises(LookupError):
        await backend.set_schedule_enabled("nope", True)


async def test_a_tick_fires_once_with_its_job_in_the_same_write(backend: Backend) -> None:
    tick = ts(-1)
    await backend.put_schedule(schedule(next_run=tick))
    after = ts(60)
    first = job(run_after=tick)
    assert await backend.fire_schedule("nightly", tick=tick, next_run=after, job=first)
    # a second process that read the same tick: nothing written, no second job
    assert not await backend.fire_schedule("nightly", tick=tick, next_run=ts(61), job=job(run_after=tick))
    assert await jobs_of(backend) == [first.id]
    (fired,) = await backend.schedules()
    assert (fired.next_run, fired.last_run, fired.last_job_id) == (after, tick, first.id)
    assert (await record(backend, first.id)).status == "pending"

    # paused: the tick stored does not fire
    await backend.set_schedule_enabled("nightly", False)
    assert not await backend.fire_schedule("nightly", tick=after, next_run=ts(120), job=job())
    assert await jobs_of(backend) == [first.id]
    # unknown: nothing
    assert not await backend.fire_schedule("nope", tick=after, next_run=ts(120), job=job())
    assert await jobs_of(backend) == [first.id]


async def test_a_next_run_that_is_not_after_the_tick_is_refused(backend: Backend) -> None:
    """The store never writes back a next run at or before the tick it fires: the Scheduler would
    find that tick due again and fire it every round (issue 21's storm in the repeated hour)."""
    tick = ts(-1)
    await backend.put_schedule(schedule(next_run=tick))
    for next_run in (ts(-2400), tick):
        with pytest.raises(UsageError, match="is not after the tick"):
            await backend.fire_schedule("nightly", tick=tick, next_run=next_run, job=job(run_after=tick))
    (still,) = await backend.schedules()
    assert (still.next_run, still.last_run) == (tick, None) and await jobs_of(backend) == []
    assert await backend.fire_schedule("nightly", tick=tick, next_run=ts(60), job=job(run_after=tick))


async def test_many_firing_one_tick_at_once_insert_one_job(backend: Backend) -> None:
    tick = ts(-1)
    await backend.put_schedule(schedule(next_run=tick))
    won: list[str] = []

    async def fire(i: int) -> None:
        row = job(run_after=tick)
        if await backend.fire_schedule("nightly", tick=tick, next_run=ts(60 + i), job=row):
            won.append(row.id)

    async with trio.open_nursery() as tn:
        for i in range(10):
            tn.start_soon(fire, i)
    assert len(won) == 1
    assert await jobs_of(backend) == won
    assert (await backend.schedules())[0].last_job_id == won[0]


async def test_a_refused_insert_leaves_the_tick_to_fire(backend: Backend) -> None:
    """The job and the move of next_run are one write: if the insert fails, the tick is still due."""
    tick = ts(-1)
    await backend.put_schedule(schedule(next_run=tick))
    taken = job()
    await backend.insert([taken])
    with pytest.raises(Exception, match="already exists|UNIQUE|duplicate"):
        await backend.fire_schedule("nightly", tick=tick, next_run=ts(60), job=taken)  # a duplicate id: refused
    (still,) = await backend.schedules()
    assert still.next_run == tick and still.last_run is None


async def test_code_schedules_are_merged_at_start_and_retired_when_gone(backend: Backend) -> None:
    await backend.put_schedule(schedule("by-hand"))
    digest, report = schedule("digest", origin="code"), schedule("report", origin="code", cron="0 4 * * *")
    await backend.sync_code_schedules([digest, report])
    stored = {s.name: s for s in await backend.schedules()}
    assert stored["digest"] == digest and stored["report"] == report
    assert stored["by-hand"].origin == "operator"

    # it fired meanwhile; another process starts with the same declarations: the tick it moved stays
    fired_to = ts(7200)
    assert await backend.fire_schedule("digest", tick=digest.next_run, next_run=fired_to, job=job())
    await backend.set_schedule_enabled("report", False)  # an operator's pause
    await backend.sync_code_schedules([schedule("digest", origin="code", next_run=ts(10)), attrs.evolve(report, payload='{"n":2}')])
    stored = {s.name: s for s in await backend.schedules()}
    assert stored["digest"].next_run == fired_to
    assert stored["report"].payload == '{"n":2}' and not stored["report"].enabled  # new payload, still paused

    # a new cron expression: the timing is the declaration's
    retimed = schedule("digest", origin="code", cron="30 * * * *", next_run=ts(1800))
    await backend.sync_code_schedules([retimed, report])
    assert {s.name: s for s in await backend.schedules()}["digest"].next_run == retimed.next_run

    # removed from the code: disabled, not deleted, not firing; the operator's schedule untouched
    await backend.sync_code_schedules([report])
    stored = {s.name: s for s in await backend.schedules()}
    gone = stored["digest"]
    assert (gone.enabled, gone.declared, gone.origin) == (False, False, "code")
    assert gone.to_json()["state"] == "removed from code"
    assert not await backend.fire_schedule("digest", tick=gone.next_run, next_run=ts(9000), job=job())
    assert stored["by-hand"].enabled and stored["by-hand"].origin == "operator"

    # declared again: enabled again, timed from the declaration
    back = schedule("digest", origin="code", next_run=ts(100))
    await backend.sync_code_schedules([back, report])
    again = {s.name: s for s in await backend.schedules()}["digest"]
    assert (again.enabled, again.declared, again.next_run) == (True, True, back.next_run)


async def test_only_the_owner_of_a_type_retires_its_code_schedules(backend: Backend) -> None:
    """A start retires a code schedule it no longer declares only if its job type is ``owned``
    (the types the process runs): a process that only enqueues, or another service's workers, do not."""
    digest = schedule("digest", origin="code")  # of job type "t"
    await backend.sync_code_schedules([digest])
    await backend.sync_code_schedules([], owned=set())  # enqueues only
    await backend.sync_code_schedules([], owned={"other"})  # runs other types
    (kept,) = await backend.schedules()
    assert kept.enabled and kept.declared
    await backend.sync_code_schedules([], owned={"t"})  # runs its type, without the declaration
    (gone,) = await backend.schedules()
    assert (gone.enabled, gone.declared) == (False, False)


async def test_the_due_schedules_are_the_enabled_ones_whose_tick_has_come(backend: Backend) -> None:
    old, recent = ts(-120), ts(-5)
    await backend.put_schedule(schedule("recent", next_run=recent))
    await backend.put_schedule(schedule("old", next_run=old))
    await backend.put_schedule(schedule("future", next_run=ts(60)))
    await backend.put_schedule(schedule("paused", next_run=ts(-10)))
    await backend.set_schedule_enabled("paused", False)
    await backend.put_schedule(schedule("removed", next_run=ts(-10)))
    await backend.remove_schedule("removed")
    await backend.sync_code_schedules([schedule("code", origin="code", next_run=ts(-10))])
    await backend.sync_code_schedules([])  # gone from the code: disabled
    now = ts()
    assert [s.name for s in await backend.due_schedules(now)] == ["old", "recent"]  # the most overdue first
    assert await backend.fire_schedule("old", tick=old, next_run=ts(3600), job=job())
    assert [s.name for s in await backend.due_schedules(now)] == ["recent"]
    resumed = await backend.set_schedule_enabled("paused", True)  # from its next tick: not due now
    assert [s.name for s in await backend.due_schedules(ts())] == ["recent"]
    later = ts(86400)
    assert [s.name for s in await backend.due_schedules(later)] == [
        s.name for s in sorted(await backend.schedules(), key=lambda s: s.next_run) if s.enabled and s.next_run <= later]
    assert resumed.name in {s.name for s in await backend.due_schedules(later)}


# -- the Scheduler on each store ------------------------------------------------------------------


async def test_the_scheduler_fires_each_tick_on_time_whatever_a_round_takes(tmp_path: Path) -> None:
    """It sleeps until the next tick, not a whole interval after each round's work (which fired
    each tick up to an interval late, and later every round, until a per-second schedule skipped
    one). Started half-way through a second, with the default interval of 1 s: every tick of a
    per-second schedule for 3 s is fired, each well under the interval late. On each store, the
    three side by side (each run is 3 s of waiting for ticks)."""
    async def on(name: str, config: Config, folder: Path) -> None:
        async with open_backend(config) as backend:
            await fires_each_tick_on_time(backend)

    await on_each_store(tmp_path, on)


async def fires_each_tick_on_time(backend: Backend) -> None:
    from jobkit import registry

    from pipeline.backends import NewJob
    from pipeline.engine.actors.scheduler import run_scheduler
    from pipeline.engine.health import Health
    from pipeline.schedules import make_schedule

    from .kit import new_id

    reg = registry()

    def new_job(job: object, *, run_after: str, now: str) -> NewJob:
        job_type, payload = reg.encode(job)
        return NewJob(new_id(), job_type, payload, 3, run_after, 5, now, None)

    # Started 0.7-0.8 s into a second: a Scheduler that slept a whole interval after each round fires every
    # tick 0.7 s late and more (its rounds fall 0.7 s into each second, drifting later); one that sleeps
    # until the tick fires it within what a loaded machine's wake-up and insert take (tens of ms here)
    while not 0.7 < time.time() % 1 < 0.8:
        await trio.sleep(0.01)
    declared = make_schedule(reg, "every-second", "* * * * * *", "echo", {"text": "tick"})
    await backend.put_schedule(ScheduleRecord.of(declared, origin="operator"))
    first = to_epoch((await backend.schedules())[0].next_run)
    async with trio.open_nursery() as tn:
        await tn.start(lambda task_status: run_scheduler(backend, reg, new_job, health=Health(), task_status=task_status))
        await trio.sleep(first + 2.6 - time.time())  # three ticks, each up to the bound late
        tn.cancel_scope.cancel()
    jobs, _ = await backend.list(job_type="echo", limit=100)
    fired = sorted((to_epoch(j.run_after), to_epoch(j.created_at)) for j in jobs)
    assert [tick for tick, _ in fired] == [first, first + 1, first + 2], fired  # none skipped, none twice
    late = [at - tick for tick, at in fired]
    assert all(0 <= lateness < 0.5 for lateness in late), late  # (a round after a full interval's sleep: 0.7 s and more)
