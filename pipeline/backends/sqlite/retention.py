"""Retention on SQLite: whose turn it is, and the bounded deletes of finished jobs and of the
worker-registry entries of processes long gone. Each runs in a Ledger batch (``fn(conn, now)``)."""

from __future__ import annotations

import sqlite3

from ...clock import format_ts, to_epoch
from ...states import check_finished
from . import durable, workflows

TURN = "retention"


def take_turn(conn: sqlite3.Connection, *, now: str, interval_seconds: float) -> bool:
    """True, and the next turn set ``interval_seconds`` on, if no process took a turn within
    the last interval; in the Ledger's write transaction, so two processes cannot both win."""
    next_at = format_ts(to_epoch(now) + interval_seconds)
    return conn.execute(
        "INSERT INTO upkeep (name, next_at) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET next_at = excluded.next_at "
        "WHERE upkeep.next_at <= ?", (TURN, next_at, now),
    ).rowcount == 1


def prune(conn: sqlite3.Connection, status: str, *, now: str, older_than_seconds: float, limit: int) -> int:
    """Up to ``limit`` jobs of the final ``status`` last updated before now − ``older_than_seconds``,
    oldest first (the partial index idx_jobs_finished: a look that finds none reads nothing), except
    the jobs of a batch whose callback has not finished; their edges, emptied batches, steps and
    signals with them (:func:`forget_removed`), when the store has any."""
    check_finished([status], "retention removes")
    before = format_ts(to_epoch(now) - older_than_seconds)
    if not (workflows.in_use(conn) or durable.in_use(conn)):
        return conn.execute(PRUNE, (status, before, limit)).rowcount
    removed = conn.execute(f"{PRUNE} RETURNING id, batch_id", (status, before, limit)).fetchall()
    forget_removed(conn, removed)
    return len(removed)


def forget_removed(conn: sqlite3.Connection, removed: list[tuple[str, str | None]]) -> None:
    """After jobs (id, batch id) were removed: their edges and emptied batches (workflows.forget), their
    steps and signals (durable.forget)."""
    workflows.forget(conn, removed)
    durable.forget(conn, [job_id for job_id, _ in removed])


# The partial index's own condition is written out as it is, or the planner cannot use it (it
# does not know that a bound status is one of the three) and sorts every row of the status instead.
# A job of a batch whose callback has not finished is kept: the callback reads every job of its batch
# (ctx.batch()), and the batch's record goes with the last of them. A plain job pays the NULL test.
FINISHED = "(status = 'completed' OR status = 'dead' OR status = 'cancelled')"  # idx_jobs_finished's
KEPT_FOR_ITS_CALLBACK = (
    "EXISTS (SELECT 1 FROM batches AS b JOIN jobs AS c ON c.id = b.callback_id WHERE b.id = j.batch_id "
    "AND c.status NOT IN ('completed', 'dead', 'cancelled'))"
)
PRUNE = (
    f"DELETE FROM jobs WHERE id IN (SELECT id FROM jobs AS j WHERE {FINISHED} AND status = ? "
    f"AND updated_at < ? AND (batch_id IS NULL OR NOT {KEPT_FOR_ITS_CALLBACK}) ORDER BY updated_at LIMIT ?)"
)


def prune_workers(conn: sqlite3.Connection, *, now: str, older_than_seconds: float) -> int:
    """Worker entries whose lease (heartbeat + its length) ran out before now − ``older_than_seconds``."""
    cutoff = to_epoch(now) - older_than_seconds
    gone = [(owner, beat) for owner, beat, lease in conn.execute("SELECT owner, heartbeat_at, lease_seconds FROM workers")
            if to_epoch(beat) + lease < cutoff]
    for owner, beat in gone:
        conn.execute("DELETE FROM workers WHERE owner = ? AND heartbeat_at = ?", (owner, beat))
    return len(gone)
