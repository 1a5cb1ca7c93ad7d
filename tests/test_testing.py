"""pipeline.testing (issue 22, item 6): handlers run in a test without a service, on the real
engine: drain() runs every job to its end, retries, RetryLater and delays included, without waiting
them out, follow-up jobs too; run() does it from a plain function."""

from __future__ import annotations

import time

import attrs
import pytest
import trio

import pipeline
from pipeline.testing import open_test_pipeline, run

calls: list[tuple[str, int]] = []


@attrs.frozen
class Flaky:
    name: str
    fail_times: int = 0
    later: bool = False  # RetryLater(delay=3600) on the first attempt


@attrs.frozen
class Chained:
    n: int


@attrs.frozen
class Stray:
    pass


async def flaky(job: Flaky, ctx: pipeline.JobContext) -> None:
    calls.append((job.name, ctx.attempt))
    if job.later and ctx.attempt == 1:
        raise pipeline.RetryLater("the partner asked for an hour", delay=3600)
    if ctx.attempt <= job.fail_times:
        raise RuntimeError(f"attempt {ctx.attempt} fails")


async def chained(job: Chained, ctx: pipeline.JobContext) -> None:
    calls.append(("chained", job.n))
    if job.n < 3:
        await ctx.emit(Step(job.n + 1))


@attrs.frozen
class Step:
    n: int


def route_step(event: Step, config: pipeline.Config) -> list[pipeline.Routed]:
    return [pipeline.Routed(Chained(event.n))]


def make_registry() -> pipeline.Registry:
    reg = pipeline.Registry()
    reg.register("flaky", Flaky, flaky, max_attempts=3)
    reg.register("chained", Chained, chained)
    reg.add_event("Step", Step, route_step)
    reg.register("stray", Stray)  # a type with no handler here
    return reg


@pytest.fixture(autouse=True)
def _clear() -> None:
    calls.clear()


async def test_drain_runs_retries_delays_and_follow_ups_without_waiting_them_out() -> None:
    started = time.monotonic()
    async with open_test_pipeline(make_registry()) as p:
        ok = await p.enqueue(Flaky("ok"))
        retried = await p.enqueue(Flaky("retried", fail_times=2))  # backoff ~10 s, ~20 s with the defaults
        dead = await p.enqueue(Flaky("dead", fail_times=5))
        later = await p.enqueue(Flaky("later", later=True))
        delayed = await p.enqueue(Flaky("delayed"), run_after=time.time() + 86400)
        await p.emit(Step(1))
        records = {r.id: r for r in await p.drain()}
    assert time.monotonic() - started < 15, "drain waited the delays out"
    assert [(records[i].status, records[i].attempts) for i in (ok, retried, dead, later, delayed)] == [
        ("completed", 1), ("completed", 3), ("dead", 3), ("completed", 2), ("completed", 1)]
    assert "attempt 3 fails" in (records[dead].error or "")
    assert [n for name, n in calls if name == "chained"] == [1, 2, 3]  # each follow-up job ran, in turn
    assert len(records) == 5 + 3


async def test_drain_names_a_type_nothing_here_runs_instead_of_hanging() -> None:
    async with open_test_pipeline(make_registry()) as p:
        await p.enqueue(Stray())
        with trio.fail_after(10), pytest.raises(pipeline.UsageError, match="stray"):
            await p.drain()


def test_run_from_a_plain_function() -> None:
    record = run(make_registry(), Flaky("plain", fail_times=1))
    assert (record.status, record.attempts, record.job_type) == ("completed", 2, "flaky")
    assert calls == [("plain", 1), ("plain", 2)]
    with pytest.raises(pipeline.UnknownJobType):
        run(make_registry(), object())
