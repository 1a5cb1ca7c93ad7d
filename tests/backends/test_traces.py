"""A job's trace context (NewJob.trace, pipeline/otel.py): stored at insert on every store, by
every insert path (the Ledger's batch, a bulk load, a keyed row, a caller's transaction), and
handed back in every lease of the job, retries and claims ahead included. Rows without one
insert and claim as they always did, with ``Lease.trace`` None."""

from __future__ import annotations

import sqlite3
from typing import Any

import trio

from pipeline.backends import Backend, Lease, NewJob
from pipeline.config import Config

from .kit import LONG, claim_one, insert, job, retry, settle_one, succeed

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
STATE = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"


def traced(row: NewJob, trace: str) -> NewJob:
    return row._replace(trace=trace)


async def claim_all(backend: Backend, job_type: str, n: int, **options: Any) -> dict[str, Lease]:
    leases = await backend.claim({job_type: n}, owner="owner-a", lease_seconds=LONG, **options)
    assert len(leases) == n
    return {lease.id: lease for lease in leases}


async def test_a_trace_stored_at_insert_comes_back_in_the_lease_and_untraced_rows_are_as_before(backend: Backend) -> None:
    plain = [job() for _ in range(3)]
    with_parent, with_state = traced(job(), PARENT), traced(job(), f"{PARENT} {STATE}")
    keyed = traced(job(unique_key="k1"), PARENT)
    keyed_plain = job(unique_key="k2")
    assert await backend.insert([plain[0], with_parent, plain[1], with_state, keyed, keyed_plain, plain[2]]) == [
        plain[0].id, with_parent.id, plain[1].id, with_state.id, keyed.id, keyed_plain.id, plain[2].id]
    leases = await claim_all(backend, "t", 7)
    assert {i: lease.trace for i, lease in leases.items()} == {
        plain[0].id: None, plain[1].id: None, plain[2].id: None, keyed_plain.id: None,
        with_parent.id: PARENT, with_state.id: f"{PARENT} {STATE}", keyed.id: PARENT,
    }
    # the rest of each lease is what it always was
    for row in (*plain, with_parent):
        lease = leases[row.id]
        assert (lease.job_type, lease.payload, lease.attempts, lease.max_attempts, lease.started) == (
            "t", row.payload, 1, row.max_attempts, True)


async def test_an_all_untraced_batch_claims_with_no_trace(backend: Backend) -> None:
    ids = await insert(backend, *(job() for _ in range(5)))
    leases = await claim_all(backend, "t", 5)
    assert set(leases) == set(ids) and {lease.trace for lease in leases.values()} == {None}


async def test_every_attempt_and_a_claim_ahead_carries_the_trace(backend: Backend) -> None:
    row = traced(job(max_attempts=3), PARENT)
    await insert(backend, row)
    first = await claim_one(backend)
    assert (first.attempts, first.trace) == (1, PARENT)
    assert await settle_one(backend, retry(first, delay=0))
    second = await claim_one(backend)
    assert (second.id, second.attempts, second.trace) == (row.id, 2, PARENT)
    assert await settle_one(backend, succeed(second))

    ahead = traced(job("ahead"), PARENT)
    await insert(backend, ahead)
    (lease,) = await backend.claim({"ahead": 1}, owner="owner-a", lease_seconds=LONG, start={"ahead": 0})
    assert (lease.started, lease.trace) == (False, PARENT)


async def test_a_bulk_load_keeps_each_rows_trace(backend: Backend) -> None:
    rows = [traced(job(), PARENT) if i % 3 == 0 else job() for i in range(9)]
    rows.append(traced(job(unique_key="bulk"), f"{PARENT} {STATE}"))
    assert await backend.bulk_insert(iter(rows), commit_every=4) == 10
    leases = await claim_all(backend, "t", 10)
    assert {i: lease.trace for i, lease in leases.items()} == {row.id: row.trace for row in rows}


async def test_inserts_batched_with_outcomes_keep_their_traces(backend: Backend) -> None:
    """Outcomes and inserts arriving together share the Ledger's batch (one statement on Postgres,
    one round trip on Redis, one transaction on SQLite): the traced rows keep their trace there too."""
    await insert(backend, *(job("busy") for _ in range(20)))
    leases = list((await claim_all(backend, "busy", 20)).values())
    rows = [traced(job(), PARENT) if i % 2 else job() for i in range(20)]
    async with trio.open_nursery() as nursery:
        for lease, row in zip(leases, rows):
            nursery.start_soon(backend.settle, [succeed(lease)])
            nursery.start_soon(backend.insert, [row])
    got = await claim_all(backend, "t", 20)
    assert {i: lease.trace for i, lease in got.items()} == {row.id: row.trace for row in rows}


async def test_a_fired_schedule_and_a_callers_transaction_keep_or_store_the_trace(backend: Backend, store_config: Config) -> None:
    """A tick's job is inserted with whatever trace its row has (the Scheduler gives none); a row
    written in the caller's own transaction (Client(connection=...)) stores its trace too."""
    from pipeline.backends.base import ScheduleRecord
    from pipeline.schedules import Schedule

    record = ScheduleRecord.of(Schedule("tick", "* * * * *", "t", "{}"), origin="operator")
    await backend.put_schedule(record)
    fired = job()
    assert await backend.fire_schedule("tick", tick=record.next_run, next_run="2999-01-01T00:00:00.000Z", job=fired)
    assert (await claim_one(backend)).trace is None

    row = traced(job(), PARENT)
    if store_config.backend == "sqlite":
        from pipeline.backends.sqlite.outbox import insert_in_transaction

        conn = sqlite3.connect(store_config.database_path, isolation_level=None)
        conn.execute("BEGIN")
        assert insert_in_transaction(conn, [row]) == [row.id]
        conn.execute("COMMIT")
        conn.close()
    elif store_config.backend == "postgres":
        import psycopg

        from pipeline.backends.postgres import outbox

        with psycopg.connect(store_config.database_url) as pg, pg.transaction():
            assert outbox.insert_in_transaction(pg, [row]) == [row.id]
    else:
        return  # Redis has no caller's transaction to join
    assert (await claim_one(backend)).trace == PARENT
