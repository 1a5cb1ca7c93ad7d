"""Durable functions through the engine (issue 35), on every store: a committed step never runs again
(across a retry, a sleep, a wait), a sleeping or waiting job holds no worker, signals sent before and
after the wait, a timeout, a cancel while suspended, the three kinds of handler (trio, sync thread,
asyncio), and steps' values read back as the function's type."""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

import pipeline
from pipeline import Config


@dataclasses.dataclass
class Order:
    n: int = 0


@dataclasses.dataclass
class Other:
    n: int = 0


@attrs.frozen
class Receipt:
    amount: int
    at: dt.datetime


async def until(predicate: Callable[[], Any], timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not await predicate():
            await trio.sleep(0.01)


@asynccontextmanager
async def running(store_config: Config, registry: pipeline.Registry, **settings: Any) -> AsyncIterator[pipeline.Pipeline]:
    # a short poll: a signal or a wake-up made elsewhere is seen soon (the tests here wait on them)
    settings = {"poll_interval_ms": 100, "backoff_base_ms": 50, **settings}
    config = attrs.evolve(store_config, worker=attrs.evolve(store_config.worker, **settings))
    async with pipeline.open_pipeline(config, registry) as p:
        yield p


async def job_of(p: pipeline.Pipeline, job_id: str) -> pipeline.JobRecord:
    job = await p.backend.get(job_id)
    assert job is not None
    return job


async def status_is(p: pipeline.Pipeline, job_id: str, status: str) -> bool:
    return (await job_of(p, job_id)).status == status


async def test_a_committed_step_is_not_run_again_when_the_job_is_retried(store_config: Config) -> None:
    reg = pipeline.Registry()
    charged: list[int] = []
    shipped: list[int] = []

    def charge(n: int) -> dict[str, int]:
        charged.append(n)
        return {"charge": 100 + n}

    @reg.job(max_attempts=3)
    async def order(job: Order, ctx: pipeline.JobContext) -> Any:
        receipt = await ctx.step("charge", charge, job.n)
        if ctx.attempt == 1:
            raise RuntimeError("the shipping partner is down")
        shipped.append(receipt["charge"])
        return receipt

    async with running(store_config, reg) as p:
        job_id = await p.enqueue(Order(7))
        assert await p.result(job_id, timeout=10) == {"charge": 107}
        record = await job_of(p, job_id)
    assert charged == [7], "the step ran again on the retry"
    assert shipped == [107]
    assert record.attempts == 2
    assert [(s.name, s.status, s.value) for s in record.steps] == [("charge", "completed", '{"charge":107}')]


async def test_a_sleeping_job_holds_no_worker_and_resumes_without_counting_an_attempt(store_config: Config) -> None:
    reg = pipeline.Registry()
    events: list[tuple[str, float]] = []

    @reg.job(concurrency=1)
    async def order(job: Order, ctx: pipeline.JobContext) -> str:
        if job.n == 1:
            await ctx.step("before", lambda: events.append(("before", time.monotonic())))
            await ctx.sleep(0.6)
            events.append(("after", time.monotonic()))
            return "slept"
        events.append(("other", time.monotonic()))
        return "other"

    async with running(store_config, reg) as p:
        sleeper = await p.enqueue(Order(1))
        await until(lambda: status_is(p, sleeper, "suspended"))
        record = await job_of(p, sleeper)
        assert record.attempts == 0 and record.awaiting_signal is None and record.lease_owner is None
        other = await p.enqueue(Order(2))  # the type's one worker is free while the first sleeps
        assert await p.result(other, timeout=5) == "other"
        assert await status_is(p, sleeper, "suspended")
        assert await p.result(sleeper, timeout=10) == "slept"
        record = await job_of(p, sleeper)
    names = [name for name, _ in events]
    assert names == ["before", "other", "after"], names
    slept = events[2][1] - events[0][1]
    assert 0.55 <= slept < 5, f"resumed after {slept:.2f} s for a sleep of 0.6 s"
    assert record.attempts == 1, "a durable sleep counted an attempt"
    assert [s.name for s in record.steps] == ["before", "@sleep#1"]


async def test_a_signal_sent_after_the_wait_wakes_the_job_with_its_payload(store_config: Config) -> None:
    reg = pipeline.Registry()
    runs: list[int] = []

    @reg.job
    async def order(job: Order, ctx: pipeline.JobContext) -> Any:
        runs.append(ctx.attempt)
        decision = await ctx.wait_for("approval")
        return {"approved": decision}

    async with running(store_config, reg) as p:
        job_id = await p.enqueue(Order(1))
        await until(lambda: status_is(p, job_id, "suspended"))
        record = await job_of(p, job_id)
        assert record.awaiting_signal == "approval"
        assert [(s.name, s.status) for s in record.steps] == [("@wait:approval#1", "waiting")]
        assert await p.signal(job_id, "approval", {"by": "ada"}) == "woken"
        assert await p.result(job_id, timeout=10) == {"approved": {"by": "ada"}}
        record = await job_of(p, job_id)
    assert record.awaiting_signal is None
    assert [(s.name, s.status, s.value) for s in record.steps] == [("@wait:approval#1", "completed", '{"by":"ada"}')]
    assert len(runs) == 2  # it ran to its wait, then again from the top when woken


async def test_a_signal_sent_before_the_wait_is_kept_and_each_signal_is_taken_by_one_wait(store_config: Config) -> None:
    reg = pipeline.Registry()
    gate = trio.Event()

    @reg.job
    async def order(job: Order, ctx: pipeline.JobContext) -> Any:
        await gate.wait()
        first = await ctx.wait_for("item")
        second = await ctx.wait_for("item")
        return [first, second]

    async with running(store_config, reg) as p:
        job_id = await p.enqueue(Order(1))
        await until(lambda: status_is(p, job_id, "running"))
        assert await p.signal(job_id, "item", 1) == "kept"
        gate.set()
        await until(lambda: status_is(p, job_id, "suspended"))  # the first wait took it, the second waits
        assert (await job_of(p, job_id)).awaiting_signal == "item"
        assert await p.signal(job_id, "item", 2) == "woken"
        assert await p.result(job_id, timeout=10) == [1, 2]


async def test_a_wait_past_its_timeout_raises_signal_timeout_in_the_handler(store_config: Config) -> None:
    reg = pipeline.Registry()
    seen: list[str] = []

    @reg.job
    async def order(job: Order, ctx: pipeline.JobContext) -> str:
        try:
            await ctx.wait_for("approval", timeout=0.4)
        except pipeline.SignalTimeout as exc:
            seen.append(str(exc))
            return "no answer"
        return "approved"

    async with running(store_config, reg) as p:
        job_id = await p.enqueue(Order(1))
        started = time.monotonic()
        assert await p.result(job_id, timeout=10) == "no answer"
        took = time.monotonic() - started
        record = await job_of(p, job_id)
        assert 0.35 <= took < 5, took
        # a signal sent after the timeout is refused: the job has finished
        with pytest.raises(pipeline.UsageError, match="completed"):
            await p.signal(job_id, "approval", True)
    assert seen == [f"job {job_id}: no signal 'approval' came within 0.4 s"]
    assert [(s.name, s.status) for s in record.steps] == [("@wait:approval#1", "timed_out")]


async def test_signals_to_unknown_jobs_and_bad_signals_are_refused(store_config: Config) -> None:
    reg = pipeline.Registry()

    @reg.job
    async def order(job: Order, ctx: pipeline.JobContext) -> None:
        await ctx.wait_for("never")  # (alive all along: a finished job would refuse every signal first)

    async with running(store_config, reg) as p:
        with pytest.raises(LookupError):
            await p.signal("01900000-0000-7000-8000-000000000000", "approval")
        job_id = await p.enqueue(Order(1))
        with pytest.raises(pipeline.UsageError, match="name must not be empty"):
            await p.signal(job_id, " ")
        with pytest.raises(pipeline.UsageError, match="JSON value"):
            await p.signal(job_id, "approval", {1, 2})
        assert await p.signal(job_id, "approval", key="link-1") == "kept"
        with pytest.raises(pipeline.SignalKeyUsed):
            await p.signal(job_id, "approval", key="link-1")


async def test_a_suspended_job_can_be_cancelled(store_config: Config) -> None:
    reg = pipeline.Registry()

    @reg.job
    async def order(job: Order, ctx: pipeline.JobContext) -> None:
        await ctx.wait_for("approval")

    async with running(store_config, reg) as p:
        job_id = await p.enqueue(Order(1))
        await until(lambda: status_is(p, job_id, "suspended"))
        assert await p.cancel(job_id) == "cancelled"
        with pytest.raises(pipeline.JobCancelled):
            await p.result(job_id, timeout=5)
        with pytest.raises(pipeline.UsageError, match="cancelled"):
            await p.signal(job_id, "approval")


async def test_a_sync_handler_steps_sleeps_and_waits_with_plain_calls(store_config: Config) -> None:
    reg = pipeline.Registry()
    calls: list[str] = []

    @reg.job
    def order(job: Order, ctx: pipeline.JobContext) -> Any:
        first = ctx.step("first", lambda: calls.append("first") or "one")
        ctx.sleep(dt.timedelta(milliseconds=100))
        answer = ctx.wait_for("go")
        return [first, answer]

    async with running(store_config, reg) as p:
        job_id = await p.enqueue(Order(1))
        await until(lambda: status_is(p, job_id, "suspended"))
        await until(lambda: _awaiting(p, job_id, "go"))
        await p.signal(job_id, "go", "now")
        assert await p.result(job_id, timeout=10) == ["one", "now"]
    assert calls == ["first"]


async def _awaiting(p: pipeline.Pipeline, job_id: str, name: str) -> bool:
    return (await job_of(p, job_id)).awaiting_signal == name


async def test_a_step_returns_its_stored_value_as_the_functions_type(store_config: Config) -> None:
    reg = pipeline.Registry()
    values: list[Any] = []
    at = dt.datetime(2026, 12, 7, 12, 0, tzinfo=dt.UTC)

    def charge() -> Receipt:
        return Receipt(100, at)

    async def fetch() -> set[int]:
        return {3, 1, 2}

    @reg.job(max_attempts=2)
    async def order(job: Order, ctx: pipeline.JobContext) -> None:
        values.append((await ctx.step("charge", charge), await ctx.step("fetch", fetch)))
        if ctx.attempt == 1:
            raise RuntimeError("again")

    async with running(store_config, reg) as p:
        job_id = await p.enqueue(Order(1))
        await until(lambda: status_is(p, job_id, "completed"))
    assert values == [(Receipt(100, at), {1, 2, 3})] * 2
    assert isinstance(values[1][0].at, dt.datetime) and isinstance(values[1][1], set)


async def test_a_step_name_used_twice_in_a_run_fails_the_attempt_naming_it(store_config: Config) -> None:
    reg = pipeline.Registry()

    @reg.job(max_attempts=1)
    async def order(job: Order, ctx: pipeline.JobContext) -> None:
        for i in range(2):
            await ctx.step("send", lambda: i)

    async with running(store_config, reg) as p:
        job_id = await p.enqueue(Order(1))
        with pytest.raises(pipeline.JobFailed, match="step 'send' is used twice"):
            await p.result(job_id, timeout=10)


async def test_a_step_that_raises_commits_nothing_and_runs_again_on_the_retry(store_config: Config) -> None:
    reg = pipeline.Registry()
    tries: list[int] = []

    def flaky() -> str:
        tries.append(1)
        if len(tries) == 1:
            raise ConnectionError("card network timeout")
        return "ok"

    @reg.job(max_attempts=2)
    async def order(job: Order, ctx: pipeline.JobContext) -> str:
        return await ctx.step("charge", flaky)

    async with running(store_config, reg) as p:
        job_id = await p.enqueue(Order(1))
        assert await p.result(job_id, timeout=10) == "ok"
    assert len(tries) == 2


async def test_a_steps_value_over_the_result_limit_fails_the_job_for_good(store_config: Config) -> None:
    reg = pipeline.Registry()
    ran: list[int] = []

    @reg.job(max_attempts=3)
    async def order(job: Order, ctx: pipeline.JobContext) -> None:
        ran.append(1)
        await ctx.step("big", lambda: "x" * 5000)

    async with running(store_config, reg, result_max_bytes=1000) as p:
        job_id = await p.enqueue(Order(1))
        with pytest.raises(pipeline.JobFailed, match="step 'big': its value cannot be stored.*WORKER_RESULT_MAX_BYTES"):
            await p.result(job_id, timeout=10)
    assert ran == [1]


async def test_a_suspended_parent_keeps_its_after_children_waiting(store_config: Config) -> None:
    reg = pipeline.Registry()

    @reg.job
    async def order(job: Order, ctx: pipeline.JobContext) -> str:
        return str(await ctx.wait_for("go"))

    @reg.job
    async def other(job: Other, ctx: pipeline.JobContext) -> Any:
        return await ctx.parent_results()

    async with running(store_config, reg) as p:
        parent = await p.enqueue(Order(1))
        child = await p.enqueue(Other(1), after=[parent])
        await until(lambda: status_is(p, parent, "suspended"))
        await trio.sleep(0.2)
        assert await status_is(p, child, "waiting")
        await p.signal(parent, "go", 5)
        assert await p.result(child, timeout=10) == {parent: "5"}
