"""Workflows through the engine (issue 24), on every store: a chain runs in order, each job reading
its parent's result (an async and a sync handler); a parent that dies cancels the jobs waiting for it
and lets run those that asked to; a batch's callback runs once, after its last job, and reads the
batch; the clients enqueue the same. The Poller polls once a minute here: a woken job starts because
the outcome that woke it said so (a nudge, NOTIFY, PUBLISH, the WAL watch), not because of a poll."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

import pipeline
from pipeline import Config


@dataclasses.dataclass
class Step:
    n: int
    fail: bool = False


@dataclasses.dataclass
class SyncStep:
    n: int


@dataclasses.dataclass
class Summary:
    label: str


@asynccontextmanager
async def running(store_config: Config, registry: pipeline.Registry) -> AsyncIterator[pipeline.Pipeline]:
    config = attrs.evolve(store_config, worker=attrs.evolve(store_config.worker, poll_interval_ms=60_000))
    async with pipeline.open_pipeline(config, registry) as p:
        yield p


async def final(p: pipeline.Pipeline, job_id: str, timeout: float = 10.0) -> pipeline.JobRecord:
    with trio.fail_after(timeout):
        while True:
            job = await p.backend.get(job_id)
            assert job is not None
            if job.status in ("completed", "dead", "cancelled"):
                return job
            await trio.sleep(0.01)


async def test_a_chain_runs_in_order_and_each_job_reads_its_parents_result(store_config: Config) -> None:
    reg = pipeline.Registry()
    ran: list[tuple[int, dict[str, Any], float]] = []
    lock = threading.Lock()

    @reg.job
    async def step(job: Step, ctx: pipeline.JobContext) -> int:
        ran.append((job.n, await ctx.parent_results(), time.monotonic()))
        return job.n * 10

    @reg.job
    def sync_step(job: SyncStep, ctx: pipeline.JobContext) -> dict[str, int]:
        parents = ctx.parent_results()  # a plain call from the handler's thread
        with lock:
            ran.append((job.n, parents, time.monotonic()))
        return {"n": job.n}

    async with running(store_config, reg) as p:
        started = time.monotonic()
        ids = await p.enqueue_many(pipeline.chain(Step(1), SyncStep(2), Step(3), Step(4)))
        assert len(ids) == 4
        waiting = await p.backend.get(ids[2])
        assert waiting is not None and waiting.parents == (ids[1],)  # it may have woken already: only its graph here
        last = await final(p, ids[3])
        took = time.monotonic() - started
    assert last.status == "completed" and last.result == "40"
    assert [n for n, _, _ in ran] == [1, 2, 3, 4]
    assert [parents for _, parents, _ in ran] == [{}, {ids[0]: 10}, {ids[1]: {"n": 2}}, {ids[2]: 30}]
    assert took < 5.0, f"a chain of 4 no-op jobs took {took:.2f} s: a woken job waited for a poll"


async def test_a_dead_parent_cancels_what_waits_for_it_and_lets_run_what_asked_to(store_config: Config) -> None:
    reg = pipeline.Registry()
    seen: dict[int, dict[str, Any]] = {}

    @reg.job
    async def step(job: Step, ctx: pipeline.JobContext) -> int:
        if job.fail:
            raise pipeline.PermanentError("no such account")
        seen[job.n] = await ctx.parent_results()
        return job.n

    async with running(store_config, reg) as p:
        parent = await p.enqueue(Step(0, fail=True))
        cancelled = await p.enqueue(Step(1), after=[parent])
        grandchild = await p.enqueue(Step(2), after=cancelled)
        runs = await p.enqueue(Step(3), after=[parent], on_parent_failure="run")
        ran = await final(p, runs)
        first, second = await final(p, cancelled), await final(p, grandchild)
        with pytest.raises(pipeline.UsageError, match="unknown parent"):
            await p.enqueue(Step(9), after=["0190e4b2-0000-7000-8000-000000000000"])
        with pytest.raises(pipeline.UsageError, match="without after"):
            await p.enqueue(Step(9), on_parent_failure="run")
        late = await p.enqueue(Step(5), after=[parent])  # a parent already dead: cancelled at once
        late_job = await p.backend.get(late)
    assert ran.status == "completed" and seen[3] == {parent: None}
    assert (first.status, second.status) == ("cancelled", "cancelled")
    assert parent in (first.error or "") and cancelled in (second.error or "")
    assert late_job is not None and late_job.status == "cancelled" and 1 not in seen and 2 not in seen


async def test_a_batch_callback_runs_once_after_its_last_job_and_reads_the_batch(store_config: Config) -> None:
    reg = pipeline.Registry()
    finished: dict[str, float] = {}
    outcomes: list[tuple[pipeline.BatchOutcome, list[pipeline.BatchJob], float]] = []

    @reg.job
    async def step(job: Step, ctx: pipeline.JobContext) -> int:
        await trio.sleep(0.01 * (job.n % 4))
        finished[ctx.id] = time.monotonic()
        if job.fail:
            raise pipeline.PermanentError(f"step {job.n} refused")
        return job.n

    @reg.job
    async def summary(job: Summary, ctx: pipeline.JobContext) -> str:
        outcome = await ctx.batch()  # the counts; the jobs with their results a page at a time (issue 32)
        outcomes.append((outcome, [job async for job in outcome.members(page_size=5)], time.monotonic()))
        return job.label

    async with running(store_config, reg) as p:
        async with pipeline.AsyncClient(store_config.database_url, registry=reg, config=store_config) as client:
            batch = await client.enqueue_batch([Step(n, fail=n == 7) for n in range(12)], then=Summary("done"))
            assert len(batch.job_ids) == 12 and batch.callback_id is not None
            callback = await final(p, batch.callback_id)
            record = await client.batch(batch.id)
        await trio.sleep(0.3)  # a second run of the callback would show here

        def sync_side() -> tuple[pipeline.Batch, list[str]]:
            with pipeline.Client(store_config.database_url, registry=reg, config=store_config) as sync_client:
                plain = sync_client.enqueue_batch([Step(100)])
                first = sync_client.enqueue(Step(101))
                return plain, [first, sync_client.enqueue(Step(102), after=[first])]

        plain, pair = await trio.to_thread.run_sync(sync_side)
        assert plain.callback_id is None and (await final(p, plain.job_ids[0])).status == "completed"
        assert (await final(p, pair[1])).status == "completed"
    assert callback.status == "completed" and len(outcomes) == 1
    outcome, members, ran_at = outcomes[0]
    assert outcome.id == batch.id and [job.id for job in members] == list(batch.job_ids)
    assert outcome.counts == {"completed": 11, "dead": 1} and outcome.total == 12 and not outcome.succeeded
    assert {job.id: job.result for job in members if job.status == "completed"} == {
        job_id: n for n, job_id in enumerate(batch.job_ids) if n != 7}
    assert "step 7 refused" in (members[7].error or "")
    assert ran_at >= max(finished[job_id] for job_id in batch.job_ids)
    assert record is not None and record.total == 12 and record.finished == 12 and record.callback_status == "completed"
