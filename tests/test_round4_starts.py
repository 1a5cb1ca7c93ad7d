"""Issue 32's start checks: what a worker looks at as it takes a job (its expiry, a pause of its
type), the last progress a handler reports before it returns, and a result that cannot be stored.
The expiry and pause tests run on every store (SQLite, Postgres, Redis)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from backends.stores import BACKENDS

import pipeline
from pipeline.backends.base import JobRecord


@dataclasses.dataclass
class Work:
    n: int = 0


@dataclasses.dataclass
class SyncWork:
    n: int = 0


async def until(predicate: Callable[[], Awaitable[Any]], timeout: float = 15.0, what: Any = None) -> None:
    with trio.move_on_after(timeout):
        while not await predicate():
            await trio.sleep(0.01)
        return
    detail = await what() if callable(what) else what
    raise AssertionError(f"not within {timeout} s: {detail}")


@asynccontextmanager
async def running(store: str, tmp_path: Path, registry: pipeline.Registry, **settings: Any) -> AsyncIterator[pipeline.Pipeline]:
    async with BACKENDS[store](tmp_path) as config:
        if settings:
            config = attrs.evolve(config, worker=attrs.evolve(config.worker, **settings))
        async with pipeline.open_pipeline(config, registry) as p:
            yield p


async def record(p: pipeline.Pipeline, job_id: str) -> JobRecord:
    job = await p.backend.get(job_id)
    assert job is not None
    return job


async def held(p: pipeline.Pipeline, job_id: str) -> bool:
    """Claimed: held by this process, waiting for its busy worker (claimed ahead, mostly; a claim
    sent while the worker looked free counts its attempt at once)."""
    return (await record(p, job_id)).status == "running"


def blocker_registry() -> tuple[pipeline.Registry, trio.Event, trio.Event, list[int]]:
    """A type whose job 0 blocks its one worker until ``go`` is set; every run is recorded."""
    reg = pipeline.Registry()
    started, go = trio.Event(), trio.Event()
    ran: list[int] = []

    @reg.job(concurrency=1)
    async def slow(job: Work, ctx: pipeline.JobContext) -> None:
        ran.append(job.n)
        if job.n == 0:
            started.set()
            await go.wait()

    return reg, started, go, ran


# -- 1. expiry, checked as the worker takes the job ----------------------------------------------


@pytest.mark.parametrize("store", sorted(BACKENDS))
async def test_a_job_claimed_ahead_that_expires_behind_a_busy_worker_never_starts(store: str, tmp_path: Path) -> None:
    reg, started, go, ran = blocker_registry()
    async with running(store, tmp_path, reg, prefetch=1) as p:
        first = await p.enqueue(Work(0))
        with trio.fail_after(15):
            await started.wait()
        expires = time.time() + 1.0
        late = await p.enqueue(Work(1), expires_at=expires)
        await until(lambda: held(p, late), what=lambda: record(p, late))  # held here, behind the busy worker
        await trio.sleep(max(0.0, expires - time.time()) + 0.05)  # its expiry passes while it waits
        go.set()
        await p.result(first, timeout=15)
        with pytest.raises(pipeline.JobCancelled, match="expired at"):
            await p.result(late, timeout=15)
        job = await record(p, late)
    assert ran == [0], "the expired job's handler ran"
    assert job.status == "cancelled" and "expired at" in (job.error or "")


# -- 16. a result that cannot be stored ----------------------------------------------------------


class Opaque:
    """No JSON for it: neither a JSON value, an attrs class nor a dataclass."""


@pytest.mark.parametrize("returned, why", [("x" * 200, "over WORKER_RESULT_MAX_BYTES=100"), (Opaque(), "Opaque")])
async def test_a_result_that_cannot_be_stored_fails_for_good_after_one_run(tmp_path: Path, returned: Any, why: str) -> None:
    reg = pipeline.Registry()
    runs: list[int] = []  # the handler's side effect

    @reg.job(max_attempts=3)
    async def answer(job: Work, ctx: pipeline.JobContext) -> Any:
        runs.append(ctx.attempt)
        return returned

    async with running("sqlite", tmp_path, reg, result_max_bytes=100) as p:
        job_id = await p.enqueue(Work())
        with pytest.raises(pipeline.JobFailed) as caught:
            await p.result(job_id, timeout=15)
        job = await record(p, job_id)
    assert runs == [1], "the handler ran again for a result it could not store"
    assert job.status == "dead" and job.attempts == 1
    assert "job type answer" in (job.error or "") and why in (job.error or ""), job.error
    assert "answer" in str(caught.value)


async def test_a_result_of_exactly_the_size_limit_is_stored_and_one_byte_more_is_not(tmp_path: Path) -> None:
    reg = pipeline.Registry()

    @reg.job(max_attempts=1)
    async def sized(job: Work, ctx: pipeline.JobContext) -> str:
        return "x" * (job.n - 2)  # as JSON: n bytes, the quotes included

    async with running("sqlite", tmp_path, reg, result_max_bytes=100) as p:
        exact = await p.enqueue(Work(100))
        over = await p.enqueue(Work(101))
        assert await p.result(exact, timeout=15) == "x" * 98
        with pytest.raises(pipeline.JobFailed, match="101 bytes as JSON, over WORKER_RESULT_MAX_BYTES=100"):
            await p.result(over, timeout=15)


# -- 13. progress: the last report is kept; reports are stored at most once a second ---------------


async def test_the_last_progress_a_handler_reports_before_it_returns_is_stored(tmp_path: Path) -> None:
    reg = pipeline.Registry()

    @reg.job
    async def rows(job: Work, ctx: pipeline.JobContext) -> None:
        await ctx.progress(0.5, "500 of 1000 rows")  # the first of its second: stored at once
        await ctx.progress(1.0, "1000 of 1000 rows")  # within the same second, then it returns

    @reg.job
    def rows_sync(job: SyncWork, ctx: pipeline.JobContext) -> None:
        ctx.progress(0.5, "500 of 1000 rows")
        ctx.progress(1.0, "1000 of 1000 rows")

    async with running("sqlite", tmp_path, reg) as p:
        ids = [await p.enqueue(Work()), await p.enqueue(SyncWork())]
        for job_id in ids:
            await p.result(job_id, timeout=15)
        jobs = [await record(p, job_id) for job_id in ids]
    for job in jobs:
        assert job.status == "completed"
        assert (job.progress, job.progress_message) == (1.0, "1000 of 1000 rows"), job


async def test_progress_is_stored_at_most_once_a_second_and_the_latest_report_wins(tmp_path: Path) -> None:
    reg = pipeline.Registry()
    writes: list[tuple[float, float]] = []  # (fraction, trio time) of each write the store was asked for
    written = {0.1: trio.Event(), 0.4: trio.Event()}

    @reg.job
    async def steps(job: Work, ctx: pipeline.JobContext) -> None:
        await ctx.progress(0.1, "first")  # the first of a quiet second: written at once
        with trio.fail_after(15):
            await written[0.1].wait()
        for fraction in (0.2, 0.3, 0.4):  # within its second: only the latest is written, once the second is up
            await ctx.progress(fraction, f"step {fraction}")
            await trio.sleep(0.05)  # the writer runs between them: unthrottled, it would write each
        with trio.fail_after(15):
            await written[0.4].wait()

    async with running("sqlite", tmp_path, reg) as p:
        real = p.backend.set_progress

        async def counted(job_id: str, token: int, fraction: float, message: str | None) -> bool:
            writes.append((fraction, trio.current_time()))
            done = await real(job_id, token, fraction, message)
            if fraction in written:
                written[fraction].set()
            return done

        p.backend.set_progress = counted  # type: ignore[method-assign]  # counts the writes, the store's own call
        job_id = await p.enqueue(Work())
        await p.result(job_id, timeout=30)
        job = await record(p, job_id)
    assert [fraction for fraction, _ in writes] == [0.1, 0.4], writes
    assert writes[1][1] - writes[0][1] >= 0.9, f"the second write came {writes[1][1] - writes[0][1]:.3f} s after the first"
    assert (job.progress, job.progress_message) == (0.4, "step 0.4")


# -- 2. a pause: what a process holds of a paused type does not start ------------------------------


async def paused_here(p: pipeline.Pipeline, job_type: str) -> bool:
    return p.pools[job_type].paused  # (the process has acknowledged the pause)


@pytest.mark.parametrize("where", ["this process", "another process"])
@pytest.mark.parametrize("store", sorted(BACKENDS))
async def test_jobs_claimed_ahead_go_back_and_none_starts_once_a_pause_is_acknowledged(
    store: str, where: str, tmp_path: Path,
) -> None:
    reg, started, go, ran = blocker_registry()
    async with running(store, tmp_path, reg, prefetch=2) as p:
        first = await p.enqueue(Work(0))
        with trio.fail_after(15):
            await started.wait()
        ahead = [await p.enqueue(Work(1)), await p.enqueue(Work(2))]
        for job_id in ahead:
            await until(lambda: held(p, job_id), what=lambda: record(p, job_id))  # both behind the busy worker
        if where == "this process":
            await p.pause_type("slow")  # acknowledged here as it returns
        else:
            async with pipeline.backends.open_backend(p.config) as other:
                await other.set_type_paused("slow", True)
            await until(lambda: paused_here(p, "slow"))  # the process's look at the store
        go.set()
        await p.result(first, timeout=15)
        for job_id in ahead:
            await until(lambda: pending(p, job_id), what=lambda: record(p, job_id))
        assert ran == [0], "a job of the paused type started"
        assert [(await record(p, job_id)).attempts for job_id in ahead] == [0, 0]
        await p.resume_type("slow")
        for job_id in ahead:
            await p.result(job_id, timeout=15)
    assert sorted(ran) == [0, 1, 2]


async def pending(p: pipeline.Pipeline, job_id: str) -> bool:
    return (await record(p, job_id)).status == "pending"
