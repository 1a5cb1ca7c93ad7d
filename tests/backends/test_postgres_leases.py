"""Postgres leases under lock waits: the heartbeat's renewal never waits behind a lock another
transaction holds, so no lease of a live process runs out while its Ledger waits."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest
import trio

import pipeline
from pipeline.backends import open_backend
from pipeline.backends.postgres import store

from .kit import job
from .stores import BACKENDS, postgres_store

pytestmark = pytest.mark.skipif("postgres" not in BACKENDS, reason="no postgres entry")

LEASE = 1.5  # seconds: renewed every 0.5 s


@attrs.frozen
class Slow:
    n: int


@attrs.frozen
class Quick:
    n: int


@attrs.frozen
class Keyed:
    key: str


async def until(check: Any, what: str, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not await check():
            await trio.sleep(0.02)


def hold_key(url: str, key: str) -> psycopg.Connection[Any]:
    """Another session inserts a job of type "keyed" and key ``key`` and keeps its transaction
    open: an insert of the same type and key elsewhere waits until it ends (a keyed bulk load)."""
    conn = psycopg.connect(url)
    store.insert_unique(conn, [job("keyed", unique_key=key)])
    return conn


async def test_a_keyed_insert_waiting_for_another_transaction_loses_no_lease(tmp_path: Path) -> None:
    """The Ledger once wrote a batch's outcomes and then its keyed inserts in one transaction:
    an insert waiting for a key another transaction held uncommitted kept the outcomes' rows
    locked, the heartbeat's renewal (of every lease, those rows' among them) waited on them,
    every lease of the process ran out, and other processes rescued and ran again jobs still
    running here. Here: jobs run with a 1.5 s lease while a batch of outcomes and a keyed
    insert of a held key waits 3 s; another process rescues whatever expires."""
    runs: Counter[str] = Counter()
    started = {"slow": 0, "quick": 0}
    go, end = trio.Event(), trio.Event()

    async def slow(j: Slow, ctx: pipeline.JobContext) -> None:
        runs[ctx.id] += 1
        started["slow"] += 1
        await end.wait()

    async def quick(j: Quick, ctx: pipeline.JobContext) -> None:
        runs[ctx.id] += 1
        started["quick"] += 1
        await go.wait()

    async def keyed(j: Keyed, ctx: pipeline.JobContext) -> None:
        runs[ctx.id] += 1

    registry = pipeline.Registry()
    registry.register("slow", Slow, slow, concurrency=3)
    registry.register("quick", Quick, quick, concurrency=3)
    registry.register("keyed", Keyed, keyed, concurrency=1)
    async with postgres_store(tmp_path) as config:
        config = config.replace(worker=attrs.evolve(config.worker, lease_seconds=LEASE))
        url = config.database_url
        held: list[psycopg.Connection[Any]] = []
        rescued = 0
        async with pipeline.open_pipeline(config, registry) as p, open_backend(config) as other:
            try:
                held += [await trio.to_thread.run_sync(hold_key, url, key) for key in ("k1", "k2")]
                ids = await p.enqueue_many([Slow(i) for i in range(3)]) + await p.enqueue_many([Quick(i) for i in range(3)])

                async def all_started() -> bool:
                    return started == {"slow": 3, "quick": 3}

                await until(all_started, "the six jobs started")

                async def rescue_as_another_process(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
                    nonlocal rescued
                    task_status.started()
                    while True:
                        rescued += await other.rescue_expired(base_seconds=0.0)
                        await trio.sleep(0.05)

                async with trio.open_nursery() as tn:
                    await tn.start(rescue_as_another_process)
                    enqueued: dict[str, str] = {}

                    async def enqueue(key: str) -> None:
                        enqueued[key] = await p.enqueue(Keyed(key), unique_key=key)

                    tn.start_soon(enqueue, "k1")  # the Ledger's batch waits for k1
                    await until(lambda: _sessions_waiting_on_locks(url, 1), "the Ledger waits for k1")
                    tn.start_soon(enqueue, "k2")
                    go.set()  # the quick jobs' outcomes wait behind it, on a tray, beside the insert of k2
                    ledger_send = p.backend._ledger_send  # type: ignore[attr-defined]
                    await until(lambda: _true(ledger_send.statistics().current_buffer_used >= 2), "k2 and the outcomes wait")
                    await trio.sleep(0.1)  # (every quick job's outcome on that tray)
                    held[0].rollback()  # k1 free: the next batch holds the outcomes and k2, and waits for k2
                    await until(lambda: _true("k1" in enqueued), "k1 enqueued")
                    await until(lambda: _sessions_waiting_on_locks(url, 1), "the Ledger waits for k2")
                    t0 = time.monotonic()

                    async def quick_ones_completed() -> bool:
                        done = [await p.backend.get(job_id) for job_id in ids[3:]]
                        return all(found is not None and found.status == "completed" for found in done)

                    # the outcomes of the batch are committed before its keyed insert waits
                    await until(quick_ones_completed, "the outcomes committed while k2 waits", timeout=LEASE)
                    while time.monotonic() - t0 < 2 * LEASE:  # two leases: every lease needs renewing meanwhile
                        assert rescued == 0, "a lease of a live process ran out while its Ledger waited for a key"
                        await trio.sleep(0.05)
                    held[1].rollback()
                    await until(lambda: _true("k2" in enqueued), "k2 enqueued")
                    end.set()

                    async def all_done() -> bool:
                        done = [await p.backend.get(job_id) for job_id in [*ids, *enqueued.values()]]
                        return all(found is not None and found.status == "completed" for found in done)

                    await until(all_done, "every job completed")
                    tn.cancel_scope.cancel()
                assert rescued == 0
                for job_id in ids:
                    assert (await p.backend.get(job_id)).attempts == 1  # type: ignore[union-attr]
                assert set(runs.values()) == {1}, f"jobs run more than once: {runs}"
                assert len(runs) == 8
            finally:  # whatever happened: the Ledger's wait and the jobs end, so that the pipeline can stop
                go.set()
                end.set()
                for conn in held:
                    conn.close()


async def test_a_renewal_skips_a_row_another_transaction_holds_locked_and_does_not_call_it_lost(tmp_path: Path) -> None:
    """A renewal that waited for one locked row renewed none of the others meanwhile; and a
    lease skipped is not lost: it is still this process's, only not renewed this time."""
    async with postgres_store(tmp_path) as config, open_backend(config) as backend:
        rows = [job(), job()]
        await backend.insert(rows)
        leases = await backend.claim({"t": 2}, owner="w", lease_seconds=LEASE)
        (locked, free) = sorted(leases, key=lambda lease: lease.id)
        before = {lease.id: (await backend.get(lease.id)).lease_expires_at for lease in leases}  # type: ignore[union-attr]
        renewer = backend.lease_renewer()
        with psycopg.connect(config.database_url) as other:  # a transaction, held open
            try:
                other.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (locked.id,))
                await trio.sleep(0.01)  # (the next renewal's expiry is later than the claim's)
                t0 = time.monotonic()
                lost = None
                with trio.move_on_after(5):
                    lost = await trio.to_thread.run_sync(
                        lambda: renewer.renew("w", ["t"], [(lease.id, lease.token) for lease in leases], lease_seconds=60.0),
                        abandon_on_cancel=True)
                took = time.monotonic() - t0
                assert took < 2.5, f"(a renewal that waits for the lock waits the 5 s out) the renewal waited {took:.1f} s for a row another transaction held locked"
                assert lost == []
            finally:
                other.rollback()
        after = {lease.id: (await backend.get(lease.id)).lease_expires_at for lease in leases}  # type: ignore[union-attr]
        assert after[locked.id] == before[locked.id]
        assert after[free.id] > before[free.id]  # type: ignore[operator]
        # the lock gone, the next renewal renews it; a lease taken since is lost
        assert await trio.to_thread.run_sync(lambda: renewer.renew("w", ["t"], [(locked.id, locked.token)], lease_seconds=60.0)) == []
        assert (await backend.get(locked.id)).lease_expires_at > before[locked.id]  # type: ignore[operator,union-attr]
        assert await trio.to_thread.run_sync(lambda: renewer.renew("w", ["t"], [(locked.id, locked.token - 1)], lease_seconds=60.0)) == [locked.id]
        await trio.to_thread.run_sync(renewer.close)


async def _true(value: bool) -> bool:
    return value


async def _sessions_waiting_on_locks(url: str, at_least: int) -> bool:
    def count() -> int:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                               "AND wait_event_type = 'Lock'").fetchone()
        return int(row[0]) if row else 0

    return await trio.to_thread.run_sync(count) >= at_least
