"""Workflows, round four (issue 32): ``after=`` and ``enqueue_batch`` in the caller's own transaction
(item 8), retention that keeps a batch whole until its callback has finished (item 9), and
``ctx.batch()`` read in pages (item 12); and which jobs Postgres retention removes first."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from backends.stores import BACKENDS
from jobkit import Echo, registry, wait_status

import pipeline
from pipeline import Config

LONG_POLL_MS = 60_000  # a job found only by the poll would wait a minute: what runs sooner was woken


def _quiet(config: Config) -> Config:
    return config.replace(worker=attrs.evolve(config.worker, poll_interval_ms=LONG_POLL_MS))


# A parent that runs until its test lets it go: GATES[name] is set by the test.
GATES: dict[str, threading.Event] = {}


@attrs.frozen
class Gate:
    name: str


async def gate(job: Gate, ctx: pipeline.JobContext) -> str:
    with trio.fail_after(30):
        while not GATES[job.name].is_set():
            await trio.sleep(0.005)
    return f"{job.name} went through"


def _registry() -> pipeline.Registry:
    reg = registry()
    reg.register("gate", Gate, gate)
    return reg


# -- item 8: after= and enqueue_batch in the caller's transaction ---------------------------------------------


async def test_sqlite_a_parent_ending_as_the_callers_transaction_begins_leaves_its_child_pending(config: Config) -> None:
    """A ``with conn:`` block whose first statement is the enqueue: the sqlite3 module opens no
    transaction before the first INSERT, so the parent's status was read outside it. The parent ends
    just as the enqueue's first write begins: the child must be pending at once (it runs, long before
    the minute's repair sweep), and a child of a parent that is dead is cancelled, as the docs say."""
    reg = _registry()
    GATES["sqlite-race"] = released = threading.Event()
    async with pipeline.open_pipeline(config, reg) as service:
        parent = await service.enqueue(Gate("sqlite-race"))
        failed = await service.enqueue(Echo("fails", mode="permanent"))
        await wait_status(service, parent, "running")
        await wait_status(service, failed, "dead")

        def enqueue_in_a_transaction() -> tuple[str, str, pipeline.Batch]:
            with pipeline.Client(registry=reg, config=config) as client:
                conn = sqlite3.connect(config.database_path)
                watcher = sqlite3.connect(config.database_path)

                def on_statement(sql: str) -> None:  # called as each statement starts, before it runs
                    if released.is_set() or sql.split()[0].upper() not in ("BEGIN", "INSERT", "UPDATE"):
                        return
                    released.set()  # the parent completes now, before the first write goes on
                    deadline = time.monotonic() + 20
                    while watcher.execute("SELECT status FROM jobs WHERE id = ?", (parent,)).fetchone()[0] != "completed":
                        assert time.monotonic() < deadline
                        time.sleep(0.005)

                conn.set_trace_callback(on_statement)
                with conn:
                    child = client.enqueue(Echo("child"), after=[parent], connection=conn)
                    orphan = client.enqueue(Echo("orphan"), after=[failed], connection=conn)
                    batch = client.enqueue_batch([Echo("m1"), Echo("m2")], then=Echo("then"), connection=conn)
                conn.set_trace_callback(None)
                with conn:  # rolled back: neither jobs nor a batch
                    gone = client.enqueue_batch([Echo("gone")], then=Echo("gone too"), connection=conn)
                    conn.rollback()
                assert client.batch(gone.id) is None and client.get(gone.job_ids[0]) is None
                conn.close()
                watcher.close()
                return child, orphan, batch

        child, orphan, batch = await trio.to_thread.run_sync(enqueue_in_a_transaction)
        assert released.is_set()
        await wait_status(service, child, "completed", timeout=20)  # the sweep is half a minute away at least
        record = await service.backend.get(orphan)
        assert record is not None and record.status == "cancelled" and failed in (record.error or "")
        await wait_status(service, batch.callback_id, "completed", timeout=20)
        found = await service.batch(batch.id)
        assert found is not None and found.counts == {"completed": 2} and found.callback_status == "completed"


async def test_postgres_after_existing_jobs_in_the_callers_transaction_holds_nothing_and_misses_nothing(
        tmp_path: Path) -> None:
    """``after=`` naming jobs already in the store, with ``connection=``: accepted (it was refused).
    The parents are not locked, so a parent still running completes while the caller's transaction is
    open; once the caller commits, its child is pending at once (it runs within seconds, not at the
    minute's sweep). A completed parent's child is pending, a dead parent's child cancelled; a batch
    commits with its callback in the caller's transaction; a rollback leaves nothing."""
    import psycopg

    reg = _registry()
    GATES["pg-race"] = released = threading.Event()
    async with BACKENDS["postgres"](tmp_path) as config, pipeline.open_pipeline(_quiet(config), reg) as service:
        running = await service.enqueue(Gate("pg-race"))
        done = await service.enqueue(Echo("done"))
        failed = await service.enqueue(Echo("fails", mode="permanent"))
        await wait_status(service, running, "running")
        await wait_status(service, done, "completed")
        await wait_status(service, failed, "dead")
        client = await trio.to_thread.run_sync(lambda: pipeline.Client(registry=reg, config=config))
        conn = await trio.to_thread.run_sync(lambda: psycopg.connect(config.database_url))
        try:
            def enqueue() -> tuple[str, str, str, pipeline.Batch]:
                conn.execute("SELECT 1")  # the caller's transaction is open
                return (client.enqueue(Echo("after running"), after=[running], connection=conn),
                        client.enqueue(Echo("after done"), after=[done], connection=conn),
                        client.enqueue(Echo("after failed"), after=[failed], connection=conn),
                        client.enqueue_batch([Echo("m1"), Echo("m2")], then=Echo("then"), connection=conn))

            child, ready, orphan, batch = await trio.to_thread.run_sync(enqueue)
            released.set()
            await wait_status(service, running, "completed", timeout=20)  # while the caller's transaction is open
            assert await service.backend.get(child) is None  # not committed yet
            await trio.to_thread.run_sync(conn.commit)
            await wait_status(service, child, "completed", timeout=20)
            await wait_status(service, ready, "completed", timeout=20)
            record = await service.backend.get(orphan)
            assert record is not None and record.status == "cancelled" and failed in (record.error or "")
            await wait_status(service, batch.callback_id, "completed", timeout=20)

            def rolled_back() -> pipeline.Batch:
                conn.execute("SELECT 1")
                gone = client.enqueue_batch([Echo("gone")], then=Echo("gone too"), connection=conn)
                client.enqueue(Echo("gone"), after=[done], connection=conn)
                conn.rollback()
                return gone

            gone = await trio.to_thread.run_sync(rolled_back)
            assert await service.batch(gone.id) is None

            async def asyncio_app(parent: str) -> tuple[str, pipeline.Batch]:
                async with pipeline.AsyncClient(registry=reg, config=config) as aclient:
                    async with await psycopg.AsyncConnection.connect(config.database_url) as aconn:
                        async with aconn.transaction():
                            one = await aclient.enqueue(Echo("async child"), after=[parent], connection=aconn)
                            more = await aclient.enqueue_batch([Echo("a1")], then=Echo("a then"), connection=aconn)
                            GATES["pg-async"].set()
                            await asyncio.sleep(0.3)  # the parent may end before the commit, or after: both count
                return one, more

            GATES["pg-async"] = threading.Event()
            parent = await service.enqueue(Gate("pg-async"))
            await wait_status(service, parent, "running")
            one, more = await trio.to_thread.run_sync(lambda: asyncio.run(asyncio_app(parent)))
            await wait_status(service, one, "completed", timeout=20)
            await wait_status(service, more.callback_id, "completed", timeout=20)
        finally:
            await trio.to_thread.run_sync(conn.close)
            await trio.to_thread.run_sync(client.close)


async def test_redis_has_no_transaction_to_join_for_a_batch_either(tmp_path: Path) -> None:
    async with BACKENDS["redis"](tmp_path) as config:
        def misuse() -> str:
            with pipeline.Client(registry=registry(), config=config) as client, \
                    pytest.raises(pipeline.UsageError) as caught:
                client.enqueue_batch([Echo("x")], then=Echo("y"), connection=object())
            return str(caught.value)

        assert "Redis" in await trio.to_thread.run_sync(misuse)


# -- item 9: retention keeps a batch whole until its callback has finished ------------------------------------

READS: dict[str, Any] = {}  # what each ReadBatch callback read, by its name


@attrs.frozen
class ReadBatch:
    """A batch's callback that waits for GATES[name], then reads its batch into READS[name]."""

    name: str


async def read_batch(job: ReadBatch, ctx: pipeline.JobContext) -> None:
    with trio.fail_after(30):
        while not GATES[job.name].is_set():
            await trio.sleep(0.005)
    outcome = await ctx.batch()
    READS[job.name] = (outcome.counts, outcome.succeeded, [member.id async for member in outcome.members()])


@pytest.mark.parametrize("store", sorted(BACKENDS))
async def test_retention_keeps_a_batchs_jobs_and_record_until_its_callback_has_finished(store: str, tmp_path: Path) -> None:
    """Three jobs of a batch ended (two completed, one cancelled) and past every retention age while
    their callback runs: retention removes none of them (a plain job as old goes), so the callback
    reads all three, and not succeeded. Once the callback has finished, the jobs, the callback and
    the batch's record go."""
    reg = _registry()
    reg.register("read_batch", ReadBatch, read_batch)
    name = f"retention-{store}"
    GATES[name], GATES[f"{name}-member"] = threading.Event(), threading.Event()
    async with BACKENDS[store](tmp_path) as config, pipeline.open_pipeline(config, reg) as service:
        plain = await service.enqueue(Echo("plain"))
        batch = await service.enqueue_batch([Echo("a"), Echo("b"), Gate(f"{name}-member")], then=ReadBatch(name))
        for job_id in (plain, *batch.job_ids[:2]):
            await wait_status(service, job_id, "completed")
        await wait_status(service, batch.job_ids[2], "running")
        await service.cancel(batch.job_ids[2])
        await wait_status(service, batch.job_ids[2], "cancelled")
        await wait_status(service, batch.callback_id, "running")
        await trio.sleep(0.05)  # every job that ended is older than the age given below

        removed = {status: await service.backend.prune(status, older_than_seconds=0.01, limit=1000)
                   for status in ("completed", "dead", "cancelled")}
        assert removed == {"completed": 1, "dead": 0, "cancelled": 0}  # the plain job only
        assert await service.backend.get(plain) is None
        assert [(await service.backend.get(job_id)) is not None for job_id in batch.job_ids] == [True] * 3

        GATES[name].set()
        await wait_status(service, batch.callback_id, "completed")
        assert READS[name] == ({"completed": 2, "cancelled": 1}, False, list(batch.job_ids))
        await trio.sleep(0.05)
        removed = {status: await service.backend.prune(status, older_than_seconds=0.01, limit=1000)
                   for status in ("completed", "cancelled")}
        assert removed == {"completed": 3, "cancelled": 1}
        assert await service.batch(batch.id) is None


@pytest.mark.parametrize("store", sorted(BACKENDS))
async def test_retention_removes_the_oldest_finished_jobs_first(store: str, tmp_path: Path) -> None:
    """Four jobs completed one after the other, all past the age: a call with room for two removes the
    two that finished first, the next call the third (Postgres ordered newest first passed the test
    that only counts)."""
    from backends.kit import add, claim_one, settle_one, succeed

    async with BACKENDS[store](tmp_path) as config, pipeline.backends.open_backend(config) as backend:
        ids = await add(backend, 4)
        finished = []
        for _ in ids:
            lease = await claim_one(backend)
            assert await settle_one(backend, succeed(lease))
            finished.append(lease.id)
            await trio.sleep(0.02)  # each finishes at a later millisecond than the one before
        assert await backend.prune("completed", older_than_seconds=0.01, limit=2) == 2
        assert [await backend.get(job_id) is None for job_id in finished] == [True, True, False, False]
        assert await backend.prune("completed", older_than_seconds=0.01, limit=1) == 1
        assert [await backend.get(job_id) is None for job_id in finished] == [True, True, True, False]


# -- item 12: ctx.batch() reads counts, and the jobs with their results a page at a time ---------------------

RESULT_BYTES = 20_000
MEASURED: dict[str, Any] = {}


@attrs.frozen
class Big:
    n: int


async def big(job: Big, ctx: pipeline.JobContext) -> str:
    return f"{job.n:06d}" + "x" * RESULT_BYTES


@attrs.frozen
class Measure:
    name: str
    page: int


async def measure(job: Measure, ctx: pipeline.JobContext) -> None:
    import tracemalloc

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        outcome = await ctx.batch()
        counts_peak = tracemalloc.get_traced_memory()[1] - before
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        seen, result_bytes = [], 0
        async for member in outcome.members(page_size=job.page):
            seen.append((member.id, member.status, member.result[:6]))
            result_bytes += len(member.result)
        pages_peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    MEASURED[job.name] = (dict(outcome.counts), outcome.total, outcome.succeeded, counts_peak, seen, result_bytes, pages_peak)


@pytest.mark.parametrize("store", sorted(BACKENDS))
async def test_a_big_batchs_callback_reads_counts_without_results_and_its_jobs_a_page_at_a_time(
        store: str, tmp_path: Path) -> None:
    """300 jobs of 20 kB results each (6 MB): ctx.batch() allocates a small fraction of that (the
    counts only: loading every result at once took it all, and more), and members() walks every job
    in order while holding a page at a time (its peak a fraction of the whole)."""
    reg = registry()
    reg.register("big", Big, big, concurrency=16)
    reg.register("measure", Measure, measure)
    name = f"big-{store}"
    n = 300
    async with BACKENDS[store](tmp_path) as config, pipeline.open_pipeline(config, reg) as service:
        batch = await service.enqueue_batch([Big(i) for i in range(n)], then=Measure(name, page=20))
        await wait_status(service, batch.callback_id, "completed", timeout=60)
    counts, total, succeeded, counts_peak, seen, result_bytes, pages_peak = MEASURED[name]
    whole = n * RESULT_BYTES
    assert (counts, total, succeeded) == ({"completed": n}, n, True)
    assert counts_peak < whole / 10, f"ctx.batch() allocated {counts_peak} bytes for counts (the results: {whole})"
    assert [(job_id, "completed", f"{i:06d}") for i, job_id in enumerate(batch.job_ids)] == seen
    assert result_bytes >= whole
    assert pages_peak < whole / 2, f"members() held {pages_peak} bytes at its peak, of {whole} in all"


@attrs.frozen
class SyncRead:
    name: str


def sync_read(job: SyncRead, ctx: pipeline.JobContext) -> None:
    outcome = ctx.batch()
    with pytest.raises(pipeline.UsageError, match="members"):
        outcome.results  # noqa: B018 - the old attribute says what replaced it
    MEASURED[job.name] = (dict(outcome.counts), outcome.succeeded,
                          [(m.id, m.status, m.result) for m in outcome.members(page_size=2)])


async def test_a_sync_callback_iterates_its_batchs_jobs_with_a_plain_for(config: Config) -> None:
    reg = registry()
    reg.register("sync_read", SyncRead, sync_read)
    async with pipeline.open_pipeline(config, reg) as service:
        batch = await service.enqueue_batch([Echo("a"), Echo("b", mode="permanent"), Echo("c")], then=SyncRead("sync"))
        await wait_status(service, batch.callback_id, "completed", timeout=20)
    counts, succeeded, members = MEASURED["sync"]
    assert counts == {"completed": 2, "dead": 1} and not succeeded
    assert [(job_id, status) for job_id, status, _ in members] == list(zip(batch.job_ids, ["completed", "dead", "completed"]))
