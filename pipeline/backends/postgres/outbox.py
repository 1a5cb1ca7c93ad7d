"""Enqueue inside the caller's own Postgres transaction (the outbox pattern), on the caller's
psycopg 3 connection, sync or async: the rows and their NOTIFY are written in the caller's
transaction, so a rollback leaves no job and the commit delivers the wake-up with the rows.
Nothing here commits.

The statements are one plan (:func:`statements`, see store.Plan), run on a ``Connection`` by
store.run_plan and awaited on an ``AsyncConnection`` here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import psycopg
from psycopg.pq import TransactionStatus

from ...errors import UsageError
from ..base import NewBatch, NewJob
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


class Written(NamedTuple):
    """What an insert in the caller's transaction wrote: per row, the id stored for it; and, when its
    rows named jobs already in the store as parents, those parents and the caller's transaction id
    (``txid_current()``), for :func:`confirm_after_commit` once that transaction has committed."""

    ids: list[str]
    parents: frozenset[str] = frozenset()
    xact: int | None = None


_XACT = "SELECT txid_current()"


def statements(rows: Sequence[NewJob], batch: NewBatch | None = None) -> store.Plan[Written]:
    """The plan of an insert in the caller's transaction (and of a batch's record, with ``batch``).
    Rows with parents or a batch take the workflow insert (graph.insert_plan). Parents already in
    the store are read without a lock (graph.insert_plan's ``later``): a lock would hold up their
    outcomes, and every outcome batched with them, until the caller commits. A parent that ends
    between that read and the caller's commit does not see the new edge (not committed yet): the
    answer then names the parents and the caller's transaction, and :func:`confirm_after_commit`,
    once that transaction has committed, counts what the parent's end could not."""
    if batch is not None or any(graph.is_linked(row) for row in rows):
        later: set[str] = set()
        ids = yield from graph.insert_plan(rows, batch, later=later)
        if not later:
            return Written(ids)
        ((xact,),) = yield _XACT, {}
        return Written(ids, frozenset(later), int(xact))
    plain = [row for row in rows if row.unique_key is None]
    if plain:
        yield store.insert_statement(plain), store.insert_params(plain)
    keyed = [row for row in rows if row.unique_key is not None]
    stored = (yield from store.unique_rounds(keyed)) if keyed else {}
    yield store.NOTIFY, {}  # delivered at the caller's commit, with the rows; dropped by a rollback
    return Written([stored.get(row.id, row.id) for row in rows])


def write_in_transaction(conn: psycopg.Connection[Any], rows: Sequence[NewJob], batch: NewBatch | None = None) -> Written:
    """:func:`statements` run on the caller's connection (the clients' ``connection=``)."""
    check_joinable(conn.info, conn.autocommit)
    return store.run_plan(conn, statements(rows, batch))


async def write_in_transaction_async(conn: psycopg.AsyncConnection[Any], rows: Sequence[NewJob],
                                     batch: NewBatch | None = None) -> Written:
    """:func:`statements` awaited on the caller's ``AsyncConnection``."""
    check_joinable(conn.info, conn.autocommit)
    plan = statements(rows, batch)
    try:
        sql, params = next(plan)
        while True:
            cursor = await conn.execute(sql, params)
            sql, params = plan.send(await cursor.fetchall() if cursor.description else [])
    except StopIteration as done:
        return done.value


def insert_in_transaction(conn: psycopg.Connection[Any], rows: Sequence[NewJob]) -> list[str]:
    """Per row, the id stored for it. Without a client to confirm the parents after the commit
    (:func:`confirm_after_commit`), a parent that ends before the caller commits leaves its child to
    the repair sweep (a minute): the clients' ``connection=`` does confirm them."""
    return write_in_transaction(conn, rows).ids


async def insert_in_transaction_async(conn: psycopg.AsyncConnection[Any], rows: Sequence[NewJob]) -> list[str]:
    return (await write_in_transaction_async(conn, rows)).ids


# -- after the caller's commit ------------------------------------------------------------------------------

_XACT_STATUS = "SELECT txid_status(%(xact)s::bigint)"


def xact_status(conn: psycopg.Connection[Any], xact: int) -> str:
    """The caller's transaction: "in progress", "committed" or "aborted" (None, too old to know: "committed",
    which :func:`confirm_after_commit` may take either way)."""
    row = conn.execute(_XACT_STATUS, {"xact": xact}).fetchone()
    return "committed" if row is None or row[0] is None else str(row[0])


def confirm_after_commit(conn: psycopg.Connection[Any], parents: frozenset[str]) -> None:
    """Once the caller's transaction committed (:func:`xact_status`): graph.confirm_parents on the
    parents it named, in a short transaction of its own: each locked (so an outcome in flight commits
    first), flagged as having children (so its later outcome applies the new edges), and those that
    ended meanwhile (or were deleted) have the edges their end could not see applied now. Each edge
    counts once whoever gets there first: after a rollback there is nothing to count."""
    graph.confirm_parents(conn, set(parents))
