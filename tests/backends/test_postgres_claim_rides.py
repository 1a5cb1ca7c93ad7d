"""The Poller's claims on Postgres go through the Ledger (PostgresBackend.claim, ledger.py): a claim
sent while outcomes wait for the Ledger is a second statement in their transaction, one commit and
one WAL flush for both (issue 36). Shown by the rows' xmin, the id of the transaction that wrote
them: the outcome's row and the claimed rows share one. A claim the Ledger does not take within
CLAIM_RIDE_WAIT (it is busy with a batch that waits for a lock) is made on a connection of the pool
meanwhile, and so is one sent once the Ledger has stopped; a claim that comes alone is a transaction
of its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

import pipeline.backends.postgres as postgres
from pipeline.backends import Lease, open_backend
from pipeline.backends.base import ClaimOffer
from pipeline.backends.batches import Command
from pipeline.backends.postgres import ledger
from pipeline.backends.trays import Tray
from pipeline.replies import Reply

from .kit import LONG, add, claim_one, flow_job, job, settle_one, succeed
from .stores import BACKENDS, postgres_store
from .test_postgres_control import connection

pytestmark = pytest.mark.skipif("postgres" not in BACKENDS, reason="no postgres entry")


def _xmins(conn: psycopg.Connection[Any], ids: list[str]) -> dict[str, str]:
    return dict(conn.execute("SELECT id, xmin::text FROM jobs WHERE id = ANY(%s)", (ids,)).fetchall())


async def _a_session_waits_for_a_lock(observer: psycopg.Connection[Any]) -> None:
    with trio.fail_after(10):
        while observer.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                               "AND wait_event_type = 'Lock'").fetchone() == (0,):
            await trio.sleep(0.005)


async def test_a_claim_sent_while_outcomes_wait_rides_their_transaction(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres, "CLAIM_RIDE_WAIT", 30.0)  # (the Ledger is held up on purpose below)
    async with postgres_store(tmp_path) as config, open_backend(config) as backend:
        await add(backend, 6, "t")
        first, second = await claim_one(backend), await claim_one(backend)
        settled: list[bool] = []
        claimed: list[Lease] = []

        async def settle_second() -> None:
            settled.append(await settle_one(backend, succeed(second)))

        async def claim_two() -> None:
            claimed.extend(await backend.claim({"t": 2}, owner="owner-a", lease_seconds=LONG))

        with connection(config) as holder, connection(config) as observer:
            holder.execute("BEGIN")
            holder.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (first.id,))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(settle_one, backend, succeed(first))  # the Ledger's batch: waits for the lock
                await _a_session_waits_for_a_lock(observer)
                nursery.start_soon(settle_second)  # both wait in the Ledger's inbox meanwhile
                nursery.start_soon(claim_two)
                await trio.sleep(0.2)
                assert not settled and not claimed
                holder.execute("COMMIT")
            assert settled == [True] and len(claimed) == 2
            xmins = _xmins(observer, [first.id, second.id, *(lease.id for lease in claimed)])
        assert xmins[second.id] == xmins[claimed[0].id] == xmins[claimed[1].id], xmins
        assert xmins[first.id] != xmins[second.id]  # (the batch before: a transaction of its own)


async def test_a_claim_does_not_wait_for_a_ledger_held_up_by_a_lock(tmp_path: Path) -> None:
    async with postgres_store(tmp_path) as config, open_backend(config) as backend:
        await add(backend, 3, "t")
        first = await claim_one(backend)
        settled: list[bool] = []

        async def settle_first() -> None:
            settled.append(await settle_one(backend, succeed(first)))

        with connection(config) as holder, connection(config) as observer:
            holder.execute("BEGIN")
            holder.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (first.id,))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(settle_first)  # the Ledger's batch: waits for the lock
                await _a_session_waits_for_a_lock(observer)
                with trio.fail_after(5):
                    claimed = await backend.claim({"t": 2}, owner="owner-a", lease_seconds=LONG)
                assert len(claimed) == 2 and not settled  # claimed while the Ledger still waits
                holder.execute("COMMIT")
            assert settled == [True]


async def test_a_claim_alone_and_a_claim_after_the_ledger_stopped_still_claim(tmp_path: Path) -> None:
    async with postgres_store(tmp_path) as config:
        async with open_backend(config) as backend:
            await add(backend, 3, "t")
            alone = await claim_one(backend)
            assert await settle_one(backend, succeed(alone))
            backend._ledger_send.close()  # type: ignore[attr-defined]  # as the pipeline's stop closes it
            late = await backend.claim({"t": 1}, owner="owner-a", lease_seconds=LONG)
            assert len(late) == 1 and late[0].id != alone.id


async def test_outcomes_answered_written_are_written_when_the_claim_in_their_transaction_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A parent's outcome in a transaction that carries a claim: the claim takes the children it woke
    (ledger._claim_woken). Its statement failing (forced here: no real claim fails this way on
    demand) aborts the transaction, which is then written again without the claim; the outcome is
    answered written only once it is (psycopg ends a transaction block in error with a ROLLBACK, and
    a claim error swallowed there had the outcome answered written and lost)."""
    async with postgres_store(tmp_path) as config:
        async with open_backend(config) as backend:
            parents = [job("p"), job("p")]
            await backend.insert(parents)
            await backend.insert([flow_job("c", after=[p.id for p in parents])])
            lease = await claim_one(backend, "p")

        def failing_claim(conn: psycopg.Connection[Any], *args: Any, **kwargs: Any) -> None:
            conn.execute("SELECT 1/0")

        monkeypatch.setattr(ledger.limits, "claim", failing_claim)
        with connection(config) as conn:
            tray = Tray(items=[succeed(lease)], is_open=False)
            results, leases, _ = ledger._write_and_claim(conn, [Command(Reply(), tray=tray)], False,
                                                         ClaimOffer({"c": 1}, "owner-a", LONG))
            assert results == [(True, [True])] and leases is None
            assert conn.execute("SELECT status FROM jobs WHERE id = %s", (lease.id,)).fetchone() == ("completed",)
