"""Control of jobs through the engine (issue 23), on every store: a running job cancelled in the
process that runs it (an async handler at once, a sync one through ``ctx.cancel_requested``),
results waited for and returned, Snooze not counting attempts, progress stored while the job
runs, expiry, and a paused type that starts nothing until resumed."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

import pipeline
from pipeline import Config
from pipeline.clock import format_ts


@dataclasses.dataclass
class Work:
    n: int = 0


@dataclasses.dataclass
class Other:
    n: int = 0


@dataclasses.dataclass
class Threaded:
    n: int = 0


@attrs.frozen
class Answer:
    total: int
    words: list[str]


async def until(predicate: Callable[[], Any], timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not await predicate():
            await trio.sleep(0.01)


@asynccontextmanager
async def running(store_config: Config, registry: pipeline.Registry, **settings: Any) -> AsyncIterator[pipeline.Pipeline]:
    config = attrs.evolve(store_config, worker=attrs.evolve(store_config.worker, **settings)) if settings else store_config
    async with pipeline.open_pipeline(config, registry) as p:
        yield p


async def status_of(p: pipeline.Pipeline, job_id: str) -> str:
    job = await p.backend.get(job_id)
    assert job is not None
    return job.status


async def test_a_running_async_handler_is_cancelled_at_once_and_never_retried(store_config: Config) -> None:
    reg = pipeline.Registry()
    started = trio.Event()
    stopped: list[str] = []

    @reg.job
    async def forever(job: Work, ctx: pipeline.JobContext) -> None:
        started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            stopped.append(ctx.id)
            raise

    async with running(store_config, reg) as p:
        job_id = await p.enqueue(Work())
        with trio.fail_after(10):
            await started.wait()
        before = time.monotonic()
        assert await p.cancel(job_id) == "cancelling"
        with pytest.raises(pipeline.JobCancelled) as caught:
            await p.result(job_id, timeout=10)
        took = time.monotonic() - before
        record = await p.backend.get(job_id)
    assert record is not None and record.status == "cancelled" and record.attempts == 1
    assert stopped == [job_id]
    assert "cancel requested" in (record.error or "") and caught.value.status == "cancelled"
    assert took < 2.0, f"the cancel took {took:.2f} s to stop the job"


async def test_a_sync_handler_sees_cancel_requested_and_the_job_ends_cancelled(store_config: Config) -> None:
    reg = pipeline.Registry()
    saw = threading.Event()
    started = threading.Event()

    @reg.job
    def patient(job: Work, ctx: pipeline.JobContext) -> None:
        started.set()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if ctx.cancel_requested:
                saw.set()
                return  # returned early: the job still ends cancelled, not completed
            time.sleep(0.01)

    async with running(store_config, reg) as p:
        job_id = await p.enqueue(Work())
        with trio.fail_after(10):
            while not started.is_set():
                await trio.sleep(0.01)
        assert await p.cancel(job_id) == "cancelling"
        with pytest.raises(pipeline.JobCancelled):
            await p.result(job_id, timeout=10)
    assert saw.is_set()


async def test_a_pending_job_is_cancelled_at_once_and_a_finished_one_is_left_alone(store_config: Config) -> None:
    reg = pipeline.Registry()

    @reg.job
    async def quick(job: Work, ctx: pipeline.JobContext) -> int:
        return job.n * 2

    async with running(store_config, reg) as p:
        later = await p.enqueue(Work(1), run_after=time.time() + 3600)
        assert await p.cancel(later) == "cancelled"
        with pytest.raises(pipeline.JobCancelled):
            await p.result(later, timeout=5)
        done = await p.enqueue(Work(21))
        assert await p.result(done, timeout=10) == 42
        assert await p.cancel(done) == "completed"
        assert await status_of(p, done) == "completed"
        with pytest.raises(LookupError):
            await p.cancel("no-such-job")


async def test_results_are_stored_json_attrs_and_dataclasses_alike(store_config: Config) -> None:
    reg = pipeline.Registry()

    @reg.job
    async def summarize(job: Work, ctx: pipeline.JobContext) -> Answer:
        return Answer(total=job.n, words=["a", "b"])

    @reg.job
    async def nothing(job: Other, ctx: pipeline.JobContext) -> None:
        return None

    @reg.job
    def in_thread(job: Threaded, ctx: pipeline.JobContext) -> dict[str, Any]:
        return {"n": job.n, "thread": threading.current_thread() is not threading.main_thread()}

    async with running(store_config, reg) as p:
        ids = [await p.enqueue(Work(7)), await p.enqueue(Other()), await p.enqueue(Threaded(3))]
        # read back as the handler's return annotation (-> Answer); stored as JSON (below)
        assert await p.result(ids[0], timeout=10) == Answer(total=7, words=["a", "b"])
        assert await p.result(ids[1], timeout=10) is None
        assert await p.result(ids[2], timeout=10) == {"n": 3, "thread": True}
        record = await p.backend.get(ids[0])
    assert record is not None and record.to_json()["result"] == {"total": 7, "words": ["a", "b"]}


async def test_a_result_too_large_or_not_json_fails_the_attempt_saying_why(store_config: Config) -> None:
    reg = pipeline.Registry()

    @reg.job(max_attempts=1)
    async def big(job: Work, ctx: pipeline.JobContext) -> str:
        return "x" * 200

    async with running(store_config, reg, result_max_bytes=100) as p:
        job_id = await p.enqueue(Work())
        with pytest.raises(pipeline.JobFailed) as caught:
            await p.result(job_id, timeout=10)
    assert caught.value.status == "dead"
    assert "WORKER_RESULT_MAX_BYTES=100" in str(caught.value) and "202 bytes" in str(caught.value)


async def test_snooze_puts_the_job_back_without_counting_the_attempt(store_config: Config) -> None:
    reg = pipeline.Registry()
    runs: list[int] = []

    @reg.job(max_attempts=1)  # a counted attempt would leave no second one
    async def wait_for_it(job: Work, ctx: pipeline.JobContext) -> str:
        runs.append(ctx.attempt)
        if len(runs) < 3:
            raise pipeline.Snooze(0.05)
        return "ready"

    async with running(store_config, reg) as p:
        job_id = await p.enqueue(Work())
        assert await p.result(job_id, timeout=10) == "ready"
        record = await p.backend.get(job_id)
    assert runs == [1, 1, 1]
    assert record is not None and record.attempts == 1 and record.snoozes == 2


async def test_a_job_that_snoozes_for_ever_ends_dead_past_the_limit(store_config: Config) -> None:
    reg = pipeline.Registry()

    @reg.job
    async def never_ready(job: Work, ctx: pipeline.JobContext) -> None:
        raise pipeline.Snooze(0)

    async with running(store_config, reg, max_snoozes=3) as p:
        job_id = await p.enqueue(Work())
        with pytest.raises(pipeline.JobFailed) as caught:
            await p.result(job_id, timeout=10)
        record = await p.backend.get(job_id)
    assert "WORKER_MAX_SNOOZES=3" in str(caught.value)
    assert record is not None and record.status == "dead" and record.snoozes == 4 and record.attempts == 0


async def test_progress_is_stored_while_the_job_runs(store_config: Config) -> None:
    reg = pipeline.Registry()
    go_on = trio.Event()

    @reg.job
    async def long(job: Work, ctx: pipeline.JobContext) -> None:
        await ctx.progress(0.25, "a quarter")
        await go_on.wait()

    async with running(store_config, reg) as p:
        job_id = await p.enqueue(Work())

        async def reported() -> bool:
            job = await p.backend.get(job_id)
            return job is not None and job.progress == 0.25

        await until(reported)
        job = await p.backend.get(job_id)
        assert job is not None and job.status == "running" and job.progress_message == "a quarter"
        assert job.to_json()["progress"] == {"fraction": 0.25, "message": "a quarter"}
        go_on.set()
        await p.result(job_id, timeout=10)


async def test_a_sync_handlers_progress_is_a_plain_call_and_stored_at_most_once_a_second(store_config: Config) -> None:
    reg = pipeline.Registry()
    release = threading.Event()

    @reg.job
    def counting(job: Work, ctx: pipeline.JobContext) -> None:
        for i in range(1, 101):
            ctx.progress(i / 100, f"step {i}")
        release.wait(20)

    writes: list[float] = []
    async with running(store_config, reg) as p:
        real = p.backend.set_progress

        async def counted(*args: Any) -> bool:
            writes.append(args[2])
            return await real(*args)

        p.backend.set_progress = counted  # type: ignore[method-assign]  # counts the writes, the store's own call
        job_id = await p.enqueue(Work())

        async def last_written() -> bool:
            job = await p.backend.get(job_id)
            return job is not None and job.progress == 1.0

        await until(last_written)
        release.set()
        await p.result(job_id, timeout=10)
    assert writes[-1] == 1.0 and len(writes) <= 3, writes  # the first at once, the latest a second later


async def test_an_expired_job_never_starts_and_ends_cancelled(store_config: Config) -> None:
    reg = pipeline.Registry()
    ran: list[int] = []

    @reg.job
    async def timely(job: Work, ctx: pipeline.JobContext) -> None:
        ran.append(job.n)

    async with running(store_config, reg) as p:
        await p.pause_type("timely")
        late = await p.enqueue(Work(1), expires_at=time.time() + 0.3)
        fresh = await p.enqueue(Work(2), expires_at=format_ts(time.time() + 3600))
        await trio.sleep(0.5)
        await p.resume_type("timely")
        with pytest.raises(pipeline.JobCancelled) as caught:
            await p.result(late, timeout=10)
        await p.result(fresh, timeout=10)
        with pytest.raises(pipeline.UsageError, match="not in the future"):
            await p.enqueue(Work(3), expires_at=time.time() - 1)
    assert ran == [2]
    assert "expired at" in str(caught.value)


async def test_a_paused_type_starts_nothing_until_resumed_while_enqueues_go_on(store_config: Config) -> None:
    reg = pipeline.Registry()
    ran: list[int] = []

    @reg.job
    async def held(job: Work, ctx: pipeline.JobContext) -> None:
        ran.append(job.n)

    @reg.job
    async def other(job: Other, ctx: pipeline.JobContext) -> None:
        ran.append(-job.n)

    async with running(store_config, reg) as p:
        await p.pause_type("held")
        assert "held" in await p.backend.paused_types()
        first = await p.enqueue(Work(1))
        await p.result(await p.enqueue(Other(5)), timeout=10)  # other types run meanwhile
        await trio.sleep(0.2)  # a few poll intervals
        assert ran == [-5] and await status_of(p, first) == "pending"
        await p.resume_type("held")
        await p.result(first, timeout=10)
        with pytest.raises(pipeline.UsageError, match="known: held, other"):
            await p.pause_type("nope")
    assert ran == [-5, 1]


async def test_the_clients_cancel_and_wait_for_results_of_jobs_a_service_runs(store_config: Config) -> None:
    reg = pipeline.Registry()
    started = trio.Event()

    @reg.job
    async def doubled(job: Work, ctx: pipeline.JobContext) -> int:
        if job.n < 0:
            started.set()
            await trio.sleep_forever()
        return job.n * 2

    async with running(store_config, reg):
        async with pipeline.AsyncClient(store_config.database_url, registry=reg, config=store_config) as client:
            job_id = await client.enqueue(Work(4))
            assert await client.result(job_id, timeout=10) == 8
            stuck = await client.enqueue(Work(-1))
            with trio.fail_after(10):
                await started.wait()
            assert await client.cancel(stuck) == "cancelling"
            with pytest.raises(pipeline.JobCancelled):
                await client.result(stuck, timeout=10)
            later = await client.enqueue(Work(1), delay=3600)
            with pytest.raises(TimeoutError, match="pending"):
                await client.result(later, timeout=0.2)
            with pytest.raises(LookupError):
                await client.cancel("no-such-job")

        def sync_side() -> Any:
            with pipeline.Client(store_config.database_url, registry=reg, config=store_config) as sync_client:
                assert sync_client.cancel(later) == "cancelled"
                return sync_client.result(sync_client.enqueue(Work(5)), timeout=10)

        assert await trio.to_thread.run_sync(sync_side) == 10
