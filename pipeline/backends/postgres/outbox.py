"""Enqueue inside the caller's own Postgres transaction (the outbox pattern), on the caller's
psycopg 3 connection, sync or async: the rows and their NOTIFY are written in the caller's
transaction, so a rollback leaves no job and the commit delivers the wake-up with the rows.
Nothing here commits.

The statements are one plan (:func:`statements`, see store.Plan), run on a ``Connection`` by
store.run_plan and awaited on an ``AsyncConnection`` here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from ...errors import UsageError
from ..base import NewJob
from . import graph, store

IDENTITY = "SELECT current_database(), current_schema()"

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


def statements(rows: Sequence[NewJob]) -> store.Plan[list[str]]:
    """The plan of an insert in the caller's transaction; returns, per row, the id stored for it
    (store.unique_rounds decides it for the rows with a unique key). Rows with ``after`` take the
    workflow insert (graph.insert_plan), whose parents must be rows of the same call (a chain):
    UsageError, before anything is written, for one that names an existing job, which would stay
    locked until the caller commits."""
    if any(graph.is_linked(row) for row in rows):
        return (yield from graph.insert_plan(rows, external=False))
    plain = [row for row in rows if row.unique_key is None]
    if plain:
        yield store.insert_statement(plain), store.insert_params(plain)
    keyed = [row for row in rows if row.unique_key is not None]
    stored = (yield from store.unique_rounds(keyed)) if keyed else {}
    yield store.NOTIFY, {}  # delivered at the caller's commit, with the rows; dropped by a rollback
    return [stored.get(row.id, row.id) for row in rows]


def insert_in_transaction(conn: psycopg.Connection[Any], rows: Sequence[NewJob]) -> list[str]:
    check_joinable(conn.info, conn.autocommit)
    return store.run_plan(conn, statements(rows))


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
