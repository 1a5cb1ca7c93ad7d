"""Enqueue inside the caller's own Postgres transaction (the outbox pattern), on the caller's
psycopg 3 connection: the rows and their NOTIFY are written in the caller's transaction, so a
rollback leaves no job and the commit delivers the wake-up with the rows. Nothing here commits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from ...errors import UsageError
from ..base import NewJob
from . import store

IDENTITY = "SELECT current_database(), current_schema()"


def identity(conn: psycopg.Connection[Any]) -> tuple[str, str]:
    """Which store a connection is on: its database and the schema its tables are found in."""
    row = conn.execute(IDENTITY).fetchone()
    assert row is not None
    return str(row[0]), str(row[1])


def insert_in_transaction(conn: psycopg.Connection[Any], rows: Sequence[NewJob]) -> list[str]:
    """Insert ``rows`` (and NOTIFY) in the connection's transaction; per row, the id stored for it
    (see store.insert_unique). UsageError, before anything is written, if there is no transaction
    of the caller's to join."""
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise UsageError("the connection's transaction has failed; roll it back before enqueueing in it")
    if status == TransactionStatus.ACTIVE:
        raise UsageError("the connection is running a statement; enqueue once it is done")
    if conn.autocommit and status == TransactionStatus.IDLE:
        raise UsageError("the connection is in autocommit mode with no transaction open, so the job would commit on its "
                         "own; enqueue inside `with conn.transaction():` (or use a connection that is not autocommit)")
    plain = [row for row in rows if row.unique_key is None]
    stored: dict[str, str] = {}
    if plain:
        conn.execute(store._INSERT, store.insert_params(plain))
    if len(plain) < len(rows):
        stored = store.insert_unique(conn, [row for row in rows if row.unique_key is not None])
    conn.execute(store.NOTIFY)  # delivered at the caller's commit, with the rows; dropped by a rollback
    return [stored.get(row.id, row.id) for row in rows]
