"""Sync handlers and middleware on every store (issue 22, items 3 and 7): a ``def`` handler runs
in a thread while another type's async jobs complete, its ``ctx.emit`` from the thread commits
the routed job, and the registry's middleware is entered around it."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import AsyncIterator

import trio
from jobkit import wait_status

import pipeline
from pipeline import Config


@dataclasses.dataclass
class Blocking:
    seconds: float


@dataclasses.dataclass
class Quick:
    n: int


@dataclasses.dataclass
class Done:
    n: int


async def test_a_sync_handler_blocks_its_thread_not_the_loop_and_emits_from_it(store_config: Config) -> None:
    release = threading.Event()
    emitted: list[str] = []
    quick: list[int] = []
    wrapped: list[str] = []

    reg = pipeline.Registry()
    reg.add_event("done", Done, lambda event, config: [pipeline.Routed(Quick(event.n))])

    @reg.middleware
    @contextlib.asynccontextmanager
    async def note(ctx: pipeline.JobContext) -> AsyncIterator[None]:
        wrapped.append(ctx.job_type)
        yield

    @reg.job
    def blocking(job: Blocking, ctx: pipeline.JobContext) -> None:
        if not release.wait(job.seconds):  # blocking: only a loop left free lets the test set it
            raise TimeoutError("the async jobs did not complete while this thread waited")
        emitted.extend(ctx.emit(Done(99)))

    @reg.job(name="quick")
    async def run_quick(job: Quick, ctx: pipeline.JobContext) -> None:
        quick.append(job.n)

    async with pipeline.open_pipeline(store_config, reg) as p:
        blocking_id = await p.enqueue(Blocking(10.0))
        quick_ids = await p.enqueue_many([Quick(i) for i in range(5)])
        for job_id in quick_ids:
            await wait_status(p, job_id, "completed")
        release.set()
        job = await wait_status(p, blocking_id, "completed", "dead")
        assert (job.status, job.attempts) == ("completed", 1), job.error
        (routed,) = emitted
        await wait_status(p, routed, "completed")
        with trio.fail_after(5):
            while 99 not in quick:
                await trio.sleep(0.01)
    assert sorted(quick) == [0, 1, 2, 3, 4, 99]
    assert sorted(wrapped) == ["blocking"] + ["quick"] * 6
