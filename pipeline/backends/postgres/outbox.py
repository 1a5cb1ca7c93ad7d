"""Enqueue inside the caller's own Postgres transaction (the outbox pattern), on the caller's
psycopg 3 connection, sync or async: the rows and their NOTIFY are written in the caller's
transaction, so a rollback leaves no job and the commit delivers the wake-up with the rows.
Nothing here commits.

The statements are one plan (:func:`statements`, a generator of (SQL, parameters) that is sent
each statement's rows), run by :func:`insert_in_transaction` on a ``Connection`` and by
:func:`insert_in_transaction_async` on an ``AsyncConnection``.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from ...errors import StoreError, UsageError
from ..base import NewJob
from . import store

IDENTITY = "SELECT current_database(), current_schema()"

Plan = Generator[tuple[str, dict[str, Any]], list[tuple[Any, ...]], list[str]]


def identity(conn: psycopg.Connection[Any]) -> tuple[str, str]:
    """Which store a connection is on: its database and the schema its tables are found in."""
    row = conn.execute(IDENTITY).fetchone()
    assert row is not None
    return str(row[0]), str(row[1])


async def identity_async(conn: psycopg.AsyncConnection[Any]) -> tuple[str, str]:
    row = await (await conn.execute(IDENTITY)).fetchone()
    assert row is not None
    return str(row[0]), str(row[1])


def check_joinable(info: Any, autocommit: bool) -> None:
    """UsageError, before anything is written, unless the connection has (or will open) a
    transaction of the caller's to join."""
    status = info.transaction_status
    if status == TransactionStatus.INERROR:
        raise UsageError("the connection's transaction has failed; roll it back before enqueueing in it")
    if status == TransactionStatus.ACTIVE:
        raise UsageError("the connection is running a statement; enqueue once it is done")
    if autocommit and status == TransactionStatus.IDLE:
        raise UsageError("the connection is in autocommit mode with no transaction open, so the job would commit on its "
                         "own; enqueue inside `with conn.transaction():` (or use a connection that is not autocommit)")


def statements(rows: Sequence[NewJob]) -> Plan:
    """The plan of an insert in the caller's transaction; returns, per row, the id stored for it:
    its own, or that of the pending or running job holding its type and unique key (as
    store.insert_unique decides, with the same rounds for holders that finish meanwhile)."""
    plain = [row for row in rows if row.unique_key is None]
    if plain:
        yield store._INSERT, store.insert_params(plain)
    stored: dict[tuple[str, str | None], str] = {}
    first: dict[tuple[str, str | None], NewJob] = {}
    for row in rows:
        if row.unique_key is not None:
            first.setdefault((row.job_type, row.unique_key), row)
    todo = sorted(first.values(), key=lambda row: (row.job_type, row.unique_key or ""))
    for _ in range(store.UNIQUE_ROUNDS):
        if not todo:
            break
        inserted = {job_id for (job_id,) in (yield store._INSERT_UNIQUE, store.insert_params(todo))}
        rest = [row for row in todo if row.id not in inserted]
        stored.update({(row.job_type, row.unique_key): row.id for row in todo if row.id in inserted})
        if rest:
            found = yield store._HOLDERS, {"types": [r.job_type for r in rest], "keys": [r.unique_key for r in rest]}
            stored.update({(job_type, key): job_id for job_type, key, job_id in found})
        todo = [row for row in rest if (row.job_type, row.unique_key) not in stored]
    if todo:
        raise StoreError(f"the unique keys of {len(todo)} jobs changed hands {store.UNIQUE_ROUNDS} times while inserting; "
                         "try again")
    yield store.NOTIFY, {}  # delivered at the caller's commit, with the rows; dropped by a rollback
    return [row.id if row.unique_key is None else stored[row.job_type, row.unique_key] for row in rows]


def insert_in_transaction(conn: psycopg.Connection[Any], rows: Sequence[NewJob]) -> list[str]:
    check_joinable(conn.info, conn.autocommit)
    plan = statements(rows)
    try:
        sql, params = next(plan)
        while True:
            cursor = conn.execute(sql, params)
            sql, params = plan.send(cursor.fetchall() if cursor.description else [])
    except StopIteration as done:
        return done.value


async def insert_in_transaction_async(conn: psycopg.AsyncConnection[Any], rows: Sequence[NewJob]) -> list[str]:
    check_joinable(conn.info, conn.autocommit)
    plan = statements(rows)
    try:
        sql, params = next(plan)
        while True:
            cursor = await conn.execute(sql, params)
            sql, params = plan.send(await cursor.fetchall() if cursor.description else [])
    except StopIteration as done:
        return done.value
