"""Sync handlers (issue 22, item 3): a plain ``def`` handler runs in a worker thread, at most the
type's concurrency at once, and the trio loop goes on meanwhile. A thread cannot be cancelled: at
its timeout the job fails all the same, the thread is abandoned (said in the log), what it does
later is ignored and its emit refused. ``ctx.emit`` works from the thread."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
import time

import attrs
import pytest
import trio
from jobkit import Tick, wait_status

import pipeline
from pipeline import Config


@dataclasses.dataclass
class Nap:
    seconds: float = 0.0
    fail_times: int = 0


@attrs.frozen
class Pinged:
    n: int


def _ping_route(event: Pinged, config: Config) -> list[pipeline.Routed]:
    return [pipeline.Routed(Tick(event.n))]


async def _until(predicate: object, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():  # type: ignore[operator]
            await trio.sleep(0.005)


async def test_async_jobs_keep_completing_while_a_sync_handler_sleeps(config: Config) -> None:
    slept: list[float] = []  # the sync handler's start and end
    ticked: list[float] = []  # each async job's end

    reg = pipeline.Registry()

    @reg.job
    def nap(job: Nap, ctx: pipeline.JobContext) -> None:
        slept.append(time.monotonic())
        time.sleep(job.seconds)  # blocking, as requests or boto3 would be
        slept.append(time.monotonic())

    @reg.job(name="tick")
    async def tick(job: Tick, ctx: pipeline.JobContext) -> None:
        await trio.lowlevel.checkpoint()
        ticked.append(time.monotonic())

    async with pipeline.open_pipeline(config, reg) as p:
        nap_id = await p.enqueue(Nap(0.5))
        await _until(lambda: slept)
        while len(slept) < 2:  # one async job after another, each enqueued and run while the thread sleeps
            tick_id = await p.enqueue(Tick())
            await wait_status(p, tick_id, "completed")
        job = await wait_status(p, nap_id, "completed")
    during = [t for t in ticked if slept[0] < t < slept[1]]
    assert (job.attempts, job.error) == (1, None)
    assert len(during) >= 3, f"only {len(during)} async jobs completed during the 0.5 s the sync handler slept"


async def test_a_sync_handler_past_its_timeout_fails_the_job_and_its_thread_is_abandoned(
    config: Config, caplog: pytest.LogCaptureFixture
) -> None:
    release = threading.Event()  # the test lets the thread finish once the job is settled
    returned = threading.Event()
    emits: list[BaseException | list[str]] = []
    ran: list[float] = []

    reg = pipeline.Registry()
    reg.register("tick", Tick)
    reg.add_event("pinged", Pinged, _ping_route)

    @reg.job(timeout=0.3, max_attempts=1)
    def overrun(job: Nap, ctx: pipeline.JobContext) -> None:
        ran.append(time.monotonic())
        try:
            release.wait(10)  # a call that does not return in time
            try:
                emits.append(ctx.emit(Pinged(1)))  # too late: the attempt is over
            except pipeline.UsageError as exc:
                emits.append(exc)
        finally:
            returned.set()

    caplog.set_level(logging.WARNING, "pipeline.jobs")
    async with pipeline.open_pipeline(config, reg) as p:
        job_id = await p.enqueue(Nap())
        job = await wait_status(p, job_id, "dead")
        settled = time.monotonic()
        assert not returned.is_set()  # the job failed while its thread still ran
        release.set()
        await _until(returned.is_set)
        await trio.sleep(0.1)
        after = await p.backend.get(job_id)
        assert after is not None and (after.status, after.attempts) == ("dead", 1)  # its late return is ignored
        assert (await p.backend.list())[1] == 1  # and its emit routed nothing
    assert job.error is not None and job.error.startswith("timed out after 0.3 s (attempt 1)")
    assert 0.1 < settled - ran[0] < 2.0, "the job should fail at about its timeout, not when the thread returns"
    (refused,) = emits
    assert isinstance(refused, pipeline.UsageError) and "attempt 1 is over" in str(refused)
    (line,) = [r.getMessage() for r in caplog.records if "abandoned" in r.getMessage()]
    assert job_id in line and "timed out after 0.3 s" in line and "cannot be stopped" in line


async def test_ctx_emit_from_the_thread_routes_jobs_and_returns_their_ids(config: Config) -> None:
    emitted: list[str] = []
    done: list[int] = []

    reg = pipeline.Registry()
    reg.add_event("pinged", Pinged, _ping_route)

    @reg.job(name="tick")
    async def tick(job: Tick, ctx: pipeline.JobContext) -> None:
        done.append(job.n)

    @reg.job
    def announce(job: Nap, ctx: pipeline.JobContext) -> None:
        emitted.extend(ctx.emit(Pinged(1)))  # blocks until committed: the ids
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # and from a thread of its own
            emitted.extend(pool.submit(ctx.emit, Pinged(2)).result())

    async with pipeline.open_pipeline(config, reg) as p:
        await wait_status(p, await p.enqueue(Nap()), "completed")
        assert len(emitted) == 2
        for job_id in emitted:
            await wait_status(p, job_id, "completed")
    assert sorted(done) == [1, 2]


async def test_no_more_sync_jobs_run_at_once_than_the_concurrency(config: Config) -> None:
    lock = threading.Lock()
    running = [0, 0]  # now, most

    reg = pipeline.Registry()

    @reg.job(concurrency=2)
    def busy(job: Nap, ctx: pipeline.JobContext) -> None:
        with lock:
            running[0] += 1
            running[1] = max(running)
        time.sleep(job.seconds)
        with lock:
            running[0] -= 1
        if ctx.attempt <= job.fail_times:
            raise RuntimeError("failing on purpose")

    async with pipeline.open_pipeline(config.replace(worker=attrs.evolve(config.worker, concurrency=8)), reg) as p:
        ids = await p.enqueue_many([Nap(0.1, fail_times=i % 2) for i in range(8)])
        jobs = [await wait_status(p, job_id, "completed") for job_id in ids]
    assert running[1] == 2
    assert sorted(job.attempts for job in jobs) == [1] * 4 + [2] * 4  # an exception in the thread is retried


async def test_abandoned_threads_keep_their_slots_until_they_return(config: Config, caplog: pytest.LogCaptureFixture) -> None:
    """Two threads abandoned at their timeout hold both of the type's slots: the next jobs wait for
    one and are handed back when their timeout passes, their attempt not counted (they never ran:
    they do not go dead for it); no third thread is started, and once the slots come free they run."""
    release = threading.Event()
    started: list[str] = []

    reg = pipeline.Registry()

    @reg.job(concurrency=2, timeout=0.3, max_attempts=1)
    def stuck(job: Nap, ctx: pipeline.JobContext) -> None:
        started.append(ctx.id)
        release.wait(10)

    caplog.set_level(logging.WARNING, "pipeline.jobs")
    async with pipeline.open_pipeline(config, reg) as p:
        first = await p.enqueue_many([Nap(), Nap()])
        await _until(lambda: len(started) == 2)
        for job_id in first:
            await wait_status(p, job_id, "dead")
        waiting = await p.enqueue_many([Nap(), Nap()])
        await _until(lambda: "none of the type's 2 threads came free" in caplog.text)
        assert len(started) == 2  # no third thread
        for job_id in waiting:
            job = await p.backend.get(job_id)
            assert job is not None and job.status in ("pending", "running") and job.error is None, job
        release.set()  # the abandoned handlers return; the slots come free and the waiting jobs run
        later = [await wait_status(p, job_id, "dead", "completed") for job_id in waiting]
        await _until(lambda: not any(t.name.startswith("pipeline job") for t in threading.enumerate()))
    assert set(first) <= set(started) and set(waiting) <= set(started)
    assert all(job.attempts == 1 for job in later), later  # the waits were not counted


async def test_a_sync_handler_still_running_at_the_end_of_the_shutdown_grace_does_not_hold_up_the_stop(
    config: Config, caplog: pytest.LogCaptureFixture
) -> None:
    release = threading.Event()
    started = threading.Event()
    reg = pipeline.Registry()

    @reg.job
    def stuck(job: Nap, ctx: pipeline.JobContext) -> None:
        started.set()
        release.wait(10)

    caplog.set_level(logging.WARNING, "pipeline.jobs")
    config = config.replace(worker=attrs.evolve(config.worker, shutdown_timeout=0.3))
    try:
        async with pipeline.open_pipeline(config, reg) as p:
            job_id = await p.enqueue(Nap())
            await _until(started.is_set)
            stopping = time.monotonic()
        stopped = time.monotonic() - stopping
        async with pipeline.open_pipeline(config.replace(worker=attrs.evolve(config.worker, enabled=False)), reg) as p:
            job = await p.backend.get(job_id)
    finally:
        release.set()
    assert stopped < 3.0, f"the stop waited {stopped:.1f} s for the thread"
    assert job is not None and (job.status, job.attempts) == ("pending", 0)  # released: it runs again at the next start
    assert any("stopped by the shutdown" in r.getMessage() and "abandoned" in r.getMessage() for r in caplog.records)


async def test_a_thread_that_gets_its_slot_as_the_attempt_ends_never_emits_after_it(config: Config) -> None:
    """A review found a race: the task took a thread whose handler had not yet marked itself started
    as abandoned never, so a handler that began just as its timeout passed emitted from a job already
    dead (3 children of dead jobs in 400). Now a thread either starts before the attempt ends (and is
    abandoned: its emit refused) or does not run the handler at all."""
    reg = pipeline.Registry()
    emitted: list[str] = []

    @reg.job(concurrency=8, timeout=0.002, max_attempts=1)
    def slow_then_emit(job: Nap, ctx: pipeline.JobContext) -> None:
        time.sleep(0.02)
        ctx.emit(Pinged(1))  # refused once the attempt is over (UsageError, ignored: abandoned)
        emitted.append(ctx.id)

    async def tick(job: Tick, ctx: pipeline.JobContext) -> None:
        pass

    reg.register("tick", Tick, tick)
    reg.add_event("Pinged", Pinged, _ping_route)
    async with pipeline.open_pipeline(config, reg) as p:
        ids = await p.enqueue_many([Nap() for _ in range(150)])
        final = {job_id: (await wait_status(p, job_id, "dead", "completed", timeout=30)).status for job_id in ids}
        await _until(lambda: not any(t.name.startswith("pipeline job") for t in threading.enumerate()))
        ticks, _ = await p.backend.list(job_type="tick", limit=1000)
    # (on a loaded machine a handler may finish before its timeout is seen: its job completed, and
    # its emit is its own)
    late = [job_id for job_id in emitted if final[job_id] != "completed"]
    assert late == [] and len(ticks) == len(emitted), f"{len(late)} emits from attempts already over: {late[:3]}"


def test_sys_exit_in_a_sync_handler_fails_its_job_not_the_pipeline(tmp_path: object) -> None:
    """SystemExit raised in a handler (sys.exit(), argparse in reused CLI code) took the whole
    pipeline down: a service would crash, restart, and crash again on the same job."""
    import sys

    from pipeline.testing import run

    reg = pipeline.Registry()

    @reg.job(max_attempts=1)
    def exits(job: Nap, ctx: pipeline.JobContext) -> None:
        sys.exit(3)

    record = run(reg, Nap())
    assert record.status == "dead" and record.error is not None and "SystemExit: 3" in record.error, record


async def test_ctx_time_left_is_the_attempts_timeout_then_the_stops_grace_in_async_and_sync_handlers(config: Config) -> None:
    """ctx.time_left(): seconds until the attempt is cancelled, read on the loop, from a thread an async
    handler started, or from a sync handler's thread: its timeout, counting down; once the pipeline
    stops, the end of the stop's grace, if sooner; 0.0 once the attempt is over. (The timeout is not
    a trio deadline: trio.current_effective_deadline() does not show it.)"""
    seen: dict[str, list[float]] = {"async": [], "async, its thread": [], "sync": []}
    stopping = {"async": trio.Event(), "sync": threading.Event()}
    kept: list[pipeline.JobContext] = []
    reg = pipeline.Registry()

    @reg.job(name="sleepy", timeout=20)
    async def sleepy(job: Tick, ctx: pipeline.JobContext) -> None:
        kept.append(ctx)
        seen["async"].append(ctx.time_left())
        seen["async, its thread"].append(await trio.to_thread.run_sync(ctx.time_left))
        await trio.sleep(0.3)
        seen["async"].append(ctx.time_left())
        seen["async, its thread"].append(await trio.to_thread.run_sync(ctx.time_left))
        await stopping["async"].wait()
        seen["async"].append(ctx.time_left())
        seen["async, its thread"].append(await trio.to_thread.run_sync(ctx.time_left))

    @reg.job(timeout=20)
    def nap(job: Nap, ctx: pipeline.JobContext) -> None:
        kept.append(ctx)
        seen["sync"].append(ctx.time_left())
        time.sleep(0.3)
        seen["sync"].append(ctx.time_left())
        stopping["sync"].wait(10)
        seen["sync"].append(ctx.time_left())

    async def once_stopping(p: pipeline.Pipeline) -> None:
        await _until(lambda: all(pool.stopping for pool in p.pools.values()))
        stopping["async"].set()
        stopping["sync"].set()

    grace = 5.0
    config = config.replace(worker=attrs.evolve(config.worker, shutdown_timeout=grace))
    async with trio.open_nursery() as nursery:
        async with pipeline.open_pipeline(config, reg) as p:
            await p.enqueue(Tick())
            await p.enqueue(Nap())
            await _until(lambda: all(len(values) == 2 for values in seen.values()))
            nursery.start_soon(once_stopping, p)  # the block's end stops the pipeline
        assert [ctx.time_left() for ctx in kept] == [0.0, 0.0]  # their attempts are over
    for kind, (first, later, stopped) in seen.items():
        assert 19.0 < first <= 20.0, (kind, seen)
        assert 0.25 < first - later < 5.0, (kind, seen)  # counting down: the handler slept 0.3 s between
        assert grace - 2.0 < stopped <= grace, (kind, seen)  # the stop's grace, sooner than the timeout
    outside = pipeline.JobContext("id", "t", 1, 3, emit=None, resources={}, config=config)  # type: ignore[arg-type]
    assert outside.time_left() == float("inf")
