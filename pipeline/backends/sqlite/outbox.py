"""Enqueue inside the host application's own SQLite transaction (the outbox pattern).

    with sqlite3.connect("pipeline.db", isolation_level=None) as conn:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO posts ...")
        pipeline.enqueue_in_transaction(conn, RebuildSearchIndex(post_ids=[post_id]))
        conn.execute("COMMIT")   # the post and its job commit or roll back together

The running pipeline's Poller finds such rows within WORKER_POLL_INTERVAL_MS.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from ...registry import Registry
from ...requests import JobRequest, prepare_rows
from ..base import PRIORITY_DEFAULT, JobRecord, NewBatch, NewJob
from . import queries
from .store import insert_jobs
from .workflows import insert_batch


def enqueue_in_transaction(
    conn: sqlite3.Connection,
    job: Any,
    *,
    registry: Registry | None = None,
    run_after: Any = None,
    max_attempts: int | None = None,
    priority: int = PRIORITY_DEFAULT,
    unique_key: str | None = None,
) -> str:
    """Insert ``job`` with the caller's connection, in the caller's open transaction.

    Nothing is committed here: the job becomes visible when the caller commits, and
    vanishes if it rolls back. Returns the new job's id; with ``unique_key``, the id of the
    pending or running job of its type and key if there is one (then nothing is inserted).
    """
    if registry is None:
        from ...site import types_registry

        registry = types_registry()
    job_type, payload = registry.encode(job)
    (row,) = prepare_rows(registry, [JobRequest(job_type, payload, max_attempts, run_after, priority, unique_key)])
    (stored,) = insert_jobs(conn, [row])
    return stored


# Takes the write lock (SQLite's RESERVED lock) without changing a row: in the sqlite3 module's
# default mode it also opens the caller's transaction, which that module would open only at our
# first INSERT. In a transaction whose snapshot is stale (another writer committed since its first
# read) it fails at once ("database is locked"), as any write of the caller's would.
_TAKE_WRITE_LOCK = "UPDATE jobs SET id = id WHERE 0"


def insert_in_transaction(conn: sqlite3.Connection, rows: Sequence[NewJob]) -> list[str]:
    """Rows already checked (``Pipeline.new_job``) inserted with the caller's connection, in its
    transaction (``pipeline.Client(...).enqueue(job, connection=conn)``); per row, the id stored for it.

    Rows that name parents take the write lock first: the parents' statuses are then read in the
    caller's transaction, and no parent can end between that read and the commit (its outcome waits
    for the lock), so a child of a completed parent is pending at once and one of a failed parent
    follows its on_parent_failure. Read before the lock (the caller's first statement being this
    enqueue, in the sqlite3 module's default mode, opens no transaction until an INSERT), a parent
    that ended in between left its child waiting for the minute's repair sweep."""
    if any(row.after for row in rows):
        conn.execute(_TAKE_WRITE_LOCK)
    return insert_jobs(conn, rows)


def insert_batch_in_transaction(conn: sqlite3.Connection, rows: Sequence[NewJob], batch: NewBatch) -> list[str]:
    """A batch's record and its rows (``Pipeline.batch_rows``) inserted in the caller's transaction, as
    the Ledger inserts them in its own (``Client.enqueue_batch(..., connection=conn)``)."""
    conn.execute(_TAKE_WRITE_LOCK)
    insert_batch(conn, batch)
    return insert_jobs(conn, rows)


# -- reads in the caller's transaction (pipeline.contrib.django: a test's uncommitted jobs) -------------------


def job_in_transaction(conn: sqlite3.Connection, job_id: str) -> JobRecord | None:
    """The job as the caller's connection sees it: its own uncommitted rows too."""
    return queries.get_job(conn, job_id)


def pending_in_transaction(conn: sqlite3.Connection, job_types: Sequence[str], limit: int = 1000) -> list[JobRecord]:
    """The pending jobs of ``job_types`` as the caller's connection sees them, in claim order."""
    found = [job for job_type in job_types
             for job in queries.list_jobs(conn, status="pending", job_type=job_type, limit=limit, order="claim")[0]]
    return sorted(found, key=lambda job: (job.priority, job.run_after, job.id))[:limit]
