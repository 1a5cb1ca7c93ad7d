"""Enqueue without the pipeline running: inside the host application's own transaction
(the outbox pattern), and for the CLI, which works on the database file directly.

    with sqlite3.connect("pipeline.db", isolation_level=None) as conn:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO posts ...")
        pipeline.enqueue_in_transaction(conn, RebuildSearchIndex(post_ids=[post_id]))
        conn.execute("COMMIT")   # the post and its job commit or roll back together

The running pipeline's Poller finds such rows within WORKER_POLL_INTERVAL_MS.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from . import store
from .clock import now_ts, to_ts
from .errors import UsageError
from .ids import UUID7Factory
from .registry import Registry


class JobRequest(NamedTuple):
    """A job as the CLI and the admin API receive it: type name and raw payload. (A tuple:
    ``enqueue --from-file`` makes one per line.)"""

    job_type: str
    payload: Mapping[str, Any] | str
    max_attempts: int | None = None
    run_after: Any = None
    priority: int = 5


def prepare_rows(
    registry: Registry,
    requests: Iterable[JobRequest],
    *,
    default_max_attempts: int = 3,
    new_id: UUID7Factory | None = None,
    now: str | None = None,
) -> list[store.NewJobRow]:
    """Validate every request (UsageError naming the problem) and build rows; writes nothing."""
    new_id = new_id or UUID7Factory()
    now = now or now_ts()
    return [prepare_row(registry, req, default_max_attempts, new_id, now) for req in requests]


def prepare_row(registry: Registry, req: JobRequest, default_max_attempts: int, new_id: UUID7Factory, now: str) -> store.NewJobRow:
    """One request checked against its job type, as the row to insert."""
    payload = registry.validate(req.job_type, req.payload)
    max_attempts = req.max_attempts
    if max_attempts is None:
        max_attempts = registry.spec(req.job_type).max_attempts or default_max_attempts
    if type(max_attempts) is not int or max_attempts < 1:  # bool is not an int here
        raise UsageError(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
    if type(req.priority) is not int:
        raise UsageError(f"priority must be an integer, got {req.priority!r}")
    if req.run_after is None:
        run_after = now
    else:
        try:
            run_after = to_ts(req.run_after)
        except (ValueError, TypeError, OverflowError) as exc:
            raise UsageError(f"run_after {req.run_after!r} is not an ISO 8601 time: {exc}") from None
    return store.NewJobRow(new_id(), req.job_type, payload, max_attempts, run_after, req.priority, now)


def enqueue_in_transaction(
    conn: sqlite3.Connection,
    job: Any,
    *,
    registry: Registry | None = None,
    run_after: Any = None,
    max_attempts: int | None = None,
    priority: int = 5,
) -> str:
    """Insert ``job`` with the caller's connection, in the caller's open transaction.

    Nothing is committed here: the job becomes visible when the caller commits, and
    vanishes if it rolls back. Returns the new job's id.
    """
    registry = registry or Registry.with_builtins()
    job_type, payload = registry.encode(job)
    (row,) = prepare_rows(registry, [JobRequest(job_type, payload, max_attempts, run_after, priority)])
    store.insert_jobs(conn, [row])
    return row.id
