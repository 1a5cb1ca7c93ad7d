"""Rate limits, per-key limits and unique_while="pending" through the engine (issue 23), on every
store: a rate-limited type starts no more than its limit in any window while a backlog waits, and
keeps close to the limit (the Poller waits for the window, not a poll interval); one key's backlog
does not starve another key; a job enqueued with unique_while="pending" while its twin runs is
inserted."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import attrs
import trio

import pipeline
from pipeline import Config

from .kit import max_in_window


@dataclasses.dataclass
class Call:
    n: int = 0


@dataclasses.dataclass
class TenantJob:
    tenant: str
    n: int = 0


@dataclasses.dataclass
class Rebuild:
    n: int = 0


def slow_polls(config: Config, **worker: Any) -> Config:
    """A poll interval of a minute: only the Poller's own wake-ups (the window's, the stores') can explain pace."""
    return attrs.evolve(config, worker=attrs.evolve(config.worker, poll_interval_ms=60_000, **worker))


async def test_a_rate_limited_type_starts_at_most_its_limit_per_window_and_keeps_close_to_it(store_config: Config) -> None:
    reg = pipeline.Registry()
    started: list[float] = []

    @reg.job(rate_limit="20/s", concurrency=8)
    async def call_partner(job: Call, ctx: pipeline.JobContext) -> None:
        started.append(time.time())

    async with pipeline.open_pipeline(slow_polls(store_config), reg) as p:
        await p.enqueue_many([Call(i) for i in range(50)])
        with trio.fail_after(20):
            while len(started) < 50:
                await trio.sleep(0.02)
    # the claim records its time before the handler starts: allow what a loaded machine puts between
    # the two (50 ms was too little once: a window's first handlers started late, its next ones on time)
    assert max_in_window(started, 0.9) <= 20, sorted(started)
    span = max(started) - min(started)
    # 50 jobs at 20/s: 20 at once, 20 more as the next window opens, the last ten at 2 s. Much later: the
    # Poller waited for a poll, not for the window (the interval here is a minute). On a loaded machine a
    # job that reaches its worker past its window's margin is handed back to a later window and the
    # type's windows widen (pools.RATE_LATE): a CI run took 3.31 s so, one window more than the ideal
    assert 1.9 <= span <= 5.0, f"50 jobs took {span:.2f} s at 20/s (expected 2 s)"


async def test_one_keys_backlog_does_not_starve_another_key(store_config: Config) -> None:
    reg = pipeline.Registry()
    done: list[tuple[str, int]] = []
    running: dict[str, int] = {}
    most: dict[str, int] = {}

    @reg.job(limit_key=lambda job: job.tenant, key_limit=2, concurrency=4)
    async def tenant_work(job: TenantJob, ctx: pipeline.JobContext) -> None:
        running[job.tenant] = running.get(job.tenant, 0) + 1
        most[job.tenant] = max(most.get(job.tenant, 0), running[job.tenant])
        await trio.sleep(0.01)
        running[job.tenant] -= 1
        done.append((job.tenant, job.n))

    async with pipeline.open_pipeline(store_config, reg) as p:
        await p.pause_type("tenant_work")  # the backlog is all there before anything runs
        await p.enqueue_many([TenantJob("a", i) for i in range(2000)])
        await p.enqueue_many([TenantJob("b", i) for i in range(10)])
        await p.resume_type("tenant_work")
        with trio.fail_after(20):
            while sum(1 for tenant, _ in done if tenant == "b") < 10:
                await trio.sleep(0.01)
        a_done = sum(1 for tenant, _ in done if tenant == "a")
    # at most 2 of a key at once: b's ten take 5 rounds of 10 ms, while a runs 2 at a time beside them
    assert a_done < 200, f"b's 10 jobs finished only after {a_done} of a's"
    assert most == {"a": 2, "b": 2}


async def test_a_key_held_only_while_pending_lets_a_new_job_in_while_the_first_runs(store_config: Config) -> None:
    reg = pipeline.Registry()
    first_started = trio.Event()
    go_on = trio.Event()
    ran: list[int] = []

    @reg.job
    async def rebuild(job: Rebuild, ctx: pipeline.JobContext) -> None:
        ran.append(job.n)
        if job.n == 1:
            first_started.set()
            await go_on.wait()

    async with pipeline.open_pipeline(store_config, reg) as p:
        first = await p.enqueue_unique(Rebuild(1), unique_key="site", unique_while="pending")
        with trio.fail_after(10):
            await first_started.wait()
        second = await p.enqueue_unique(Rebuild(2), unique_key="site", unique_while="pending")
        assert not second.duplicate, "the key is held only while pending: the running job frees it"
        go_on.set()
        await p.result(first.id, timeout=10)
        await p.result(second.id, timeout=10)
    assert ran == [1, 2]
