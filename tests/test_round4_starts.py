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
from pipeline import Config
from pipeline.backends.base import JobRecord


@dataclasses.dataclass
class Work:
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
