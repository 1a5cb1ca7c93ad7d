"""What operators read and do (the admin API, the CLI, the dashboard, /metrics): every SQL
statement on the jobs table that is not the workers' own, as named synchronous functions.
The ones that write run inside the Ledger's transaction, like the store's."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

import attrs

from ... import states
from ...clock import format_ts, to_epoch
from ...errors import UsageError
from ...states import Status
from ..base import CANCELLING, JobRecord, WorkerRecord, cancelled_error, check_list_order, unique_key_held
from . import durable, store, workflows
from .retention import FINISHED, forget_removed

# JobRecord's fields in order, then a workflow's columns (the job's parents and children are read
# apart, by get: see workflows.relatives). A cancel request is shown only while the job runs:
# SUCCEED's statement, the hot path's, leaves the column as it was (see store._SUCCEED), and a
# request means nothing once the run has ended.
COLUMNS = (
    "id, job_type, payload, status, attempts, max_attempts, run_after, error, "
    "created_at, updated_at, priority, lease_owner, lease_expires_at, unique_key, "
    "result, progress, progress_message, snoozes, expires_at, status = 'running' AND cancel_requested = 1, limit_key, "
    "waiting_for, batch_id, on_parent_failure, awaiting_signal"
)


def _record(row: tuple[Any, ...]) -> JobRecord:
    return JobRecord(*row[:19], bool(row[19]), row[20],  # type: ignore[call-arg,misc]
                     waiting_for=row[21], batch_id=row[22], on_parent_failure=row[23], awaiting_signal=row[24])


# -- operator actions -----------------------------------------------------------------------


def revive(conn: sqlite3.Connection, job_id: str, *, now: str, from_step: str | None = None) -> JobRecord:
    """Admin retry: dead or cancelled → pending, due now; attempts, snoozes, the progress, the
    result and a cancel request reset, the error kept, the steps kept (it resumes). UsageError for
    any other status. ``from_step`` (a replay): a completed job too (REPLAY), and the step of that
    name and every step first written after it removed; UsageError naming the job's steps if it has
    none of that name. Either way, nothing is written when it refuses."""
    job = get_job(conn, job_id)
    if job is None:
        raise LookupError(f"no job with id {job_id!r}")
    if job.status not in states.REVIVABLE and not (from_step is not None and job.status == Status.COMPLETED):
        which = "dead, cancelled or (from a step) completed" if from_step is not None else "dead or cancelled"
        raise UsageError(f"job {job_id} is {job.status}, only {which} jobs can be retried")
    if job.unique_key is not None and not _pending_only(conn, job_id):
        holder = store.holder_of(conn, job.job_type, job.unique_key)
        if holder is not None:  # (the Ledger's transaction: nobody takes the key in between)
            raise UsageError(unique_key_held(job, holder))
    if from_step is not None:
        durable.replay_from(conn, job_id, from_step)  # (raises before anything is written)
    conn.execute(_REVIVE, (now, now, job_id))
    return get_job_linked(conn, job_id)  # type: ignore[return-value]  # (as get() reads it)


# A job holding its key only while pending is revived whoever holds it, and takes it again only if
# nobody does (store.RETAKE); a default one is refused while another job holds it (above). (A completed
# one only with from_step: checked above, under the Ledger's transaction.)
_REVIVE = (
    "UPDATE jobs SET status = 'pending', attempts = 0, snoozes = 0, progress = NULL, progress_message = NULL, "
    f"result = NULL, cancel_requested = 0, awaiting_signal = NULL, run_after = ?, updated_at = ?, {store.RETAKE} "
    "WHERE id = ? AND status IN ('dead', 'cancelled', 'completed')"
)


def _pending_only(conn: sqlite3.Connection, job_id: str) -> bool:
    """Whether the job holds its unique key only while pending (unique_while "pending")."""
    (token,) = conn.execute("SELECT unique_token FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return token is not None


def cancel(conn: sqlite3.Connection, job_ids: Sequence[str], *, reason: str, now: str) -> list[str | None]:
    """Per id in order, what the job is after it: a pending, waiting or suspended one cancelled at once
    ("cancelled", its unique key freed: idx_jobs_unique holds no cancelled row; its edges applied
    at once: a job after it in ``job_ids`` that it cancelled answers "cancelled" too); a running
    one asked to stop (``CANCELLING``: its worker reads cancel_requests); a final one's status,
    unchanged; None for an unknown id. In the Ledger's transaction: nothing moves in between."""
    error = cancelled_error(reason)
    answers: list[str | None] = []
    for job_id in job_ids:
        row = conn.execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone()
        status = None if row is None else row[0]
        if status in (Status.PENDING, Status.WAITING, Status.SUSPENDED):
            conn.execute("UPDATE jobs SET status = 'cancelled', error = ?, updated_at = ?, awaiting_signal = NULL "
                         "WHERE id = ? AND (status = 'pending' OR status = 'waiting' OR status = 'suspended')",
                         (error, now, job_id))
            workflows.apply_edges(conn, [(job_id, "cancelled")], now=now)
            status = Status.CANCELLED.value
        elif status == Status.RUNNING:
            conn.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ? AND status = 'running'", (job_id,))
            status = CANCELLING
        answers.append(status)
    return answers


# idx_jobs_cancel_requests: as many entries as there are requests (none, mostly)
_CANCEL_REQUESTS = "SELECT id, lease_token FROM jobs WHERE lease_owner = ? AND status = 'running' AND cancel_requested = 1"


def cancel_requests(conn: sqlite3.Connection, owner: str) -> list[tuple[str, int]]:
    """(id, lease token) of the running jobs ``owner`` holds whose cancel was requested."""
    return [(job_id, int(token)) for job_id, token in conn.execute(_CANCEL_REQUESTS, (owner,))]


def set_type_paused(conn: sqlite3.Connection, job_type: str, paused: bool, *, now: str) -> None:
    """Pause (kept from the first pause: asking twice is harmless) or resume a job type."""
    if paused:
        conn.execute("INSERT INTO paused_types (job_type, paused_at) VALUES (?, ?) ON CONFLICT (job_type) DO NOTHING",
                     (job_type, now))
    else:
        conn.execute("DELETE FROM paused_types WHERE job_type = ?", (job_type,))


def paused_types(conn: sqlite3.Connection) -> set[str]:
    return {job_type for (job_type,) in conn.execute("SELECT job_type FROM paused_types")}


def delete_job(conn: sqlite3.Connection, job_id: str, *, now: str) -> None:
    """Delete a job record; LookupError if unknown, UsageError if it is running. A job whose edges
    have not counted (pending, waiting, suspended) applies them first as a parent "deleted"; its edges,
    both ways, its batch if no other job of it is left, its steps and its signals go with it."""
    row = conn.execute("SELECT status, batch_id FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if row is None:
        raise LookupError(f"no job with id {job_id!r}")
    status, batch_id = row
    if status == Status.RUNNING:
        raise UsageError(f"job {job_id} is running; wait for it to finish before deleting it")
    workflows.apply_edges(conn, [(job_id, status if status in workflows.FINAL else "deleted")], now=now)
    conn.execute("DELETE FROM jobs WHERE id = ? AND status != 'running'", (job_id,))
    workflows.forget(conn, [(job_id, batch_id)])
    durable.forget(conn, [job_id])


def cleanup(conn: sqlite3.Connection, *, statuses: Sequence[str] = ("completed", "dead"), older_than: str | None = None) -> int:
    """Delete finished records (completed, dead, cancelled: ``statuses``), optionally only those last
    updated before ``older_than``; their edges, emptied batches, steps and signals with them
    (retention.forget_removed)."""
    states.check_finished(statuses, "cleanup deletes")
    marks = ",".join("?" for _ in statuses)
    where, params = f"status IN ({marks})", tuple(statuses)
    if older_than is not None:
        where, params = f"{where} AND updated_at < ?", (*params, older_than)
    if not (workflows.in_use(conn) or durable.in_use(conn)):
        return conn.execute(f"DELETE FROM jobs WHERE {where}", params).rowcount
    removed = conn.execute(f"DELETE FROM jobs WHERE {where} RETURNING id, batch_id", params).fetchall()
    forget_removed(conn, removed)
    return len(removed)


# -- reads ------------------------------------------------------------------------------------


def get_job(conn: sqlite3.Connection, job_id: str) -> JobRecord | None:
    """The job without its parents and children (see :func:`get_job_linked`)."""
    row = conn.execute(f"SELECT {COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return _record(row) if row else None


def get_job_linked(conn: sqlite3.Connection, job_id: str) -> JobRecord | None:
    """The job with its parents, children and steps (Backend.get), read in one read transaction."""
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN")
    try:
        job = get_job(conn, job_id)
        if job is None:
            return None
        parents, parent_count, children, child_count = workflows.relatives(conn, job_id)
        steps = tuple(durable.steps(conn, job_id))
    finally:
        if own and conn.in_transaction:
            conn.execute("COMMIT")
    return attrs.evolve(job, parents=parents, parent_count=parent_count, children=children, child_count=child_count,
                        steps=steps)


def list_jobs(
    conn: sqlite3.Connection, *, status: str | None = None, job_type: str | None = None, limit: int = 50, offset: int = 0,
    priority: int | None = None, order: str = "newest",
) -> tuple[list[JobRecord], int]:
    """Newest first (ids are time-ordered), or in claim order, with the total that matches the filters."""
    if status is not None and status not in set(Status):
        raise UsageError(f"unknown status {status!r}; expected one of {', '.join(Status)}")
    check_list_order(order)
    where: list[str] = []
    params: list[str | int] = []
    if status is not None:
        where.append("status = ?")
        params.append(status)
    if job_type is not None:
        where.append("job_type = ?")
        params.append(job_type)
    if priority is not None:
        where.append("priority = ?")
        params.append(priority)
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    # one read transaction, one snapshot: the total counts the rows the page is cut from, whatever
    # commits in between (outside one, a claim between the two reads made them disagree)
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN")
    try:
        (total,) = conn.execute(f"SELECT count(*) FROM jobs {clause}", params).fetchone()
        rows = conn.execute(
            f"SELECT {COLUMNS} FROM jobs {clause} ORDER BY {_LIST_ORDER[order]} LIMIT ? OFFSET ?", (*params, limit, offset)
        ).fetchall()
    finally:
        if own and conn.in_transaction:
            conn.execute("COMMIT")
    return [_record(r) for r in rows], int(total)


_LIST_ORDER = {"newest": "id DESC", "claim": "priority, run_after, id"}  # (base.LIST_ORDERS)


def count_by_status(conn: sqlite3.Connection, status: str) -> int:
    (n,) = conn.execute("SELECT count(*) FROM jobs WHERE status = ?", (status,)).fetchone()
    return int(n)


def stats(conn: sqlite3.Connection) -> dict[str, Any]:
    """Counts by status, and by type and status."""
    by_status = {s.value: 0 for s in Status}
    for status, n in conn.execute("SELECT status, count(*) FROM jobs GROUP BY status"):
        by_status[status] = n
    by_type: dict[str, dict[str, int]] = {}
    for job_type, status, n in conn.execute("SELECT job_type, status, count(*) FROM jobs GROUP BY job_type, status"):
        by_type.setdefault(job_type, {s.value: 0 for s in Status})[status] = n
    return {"by_status": by_status, "by_type": by_type, "total": sum(by_status.values())}


# -- operator views (the admin API, the dashboard, `stats`, /metrics) ---------------------------

_FINISHED_PER_MINUTE = (  # through idx_jobs_finished (its condition as it is written there)
    "SELECT substr(updated_at, 1, 16) AS minute, status, count(*) FROM jobs "
    f"WHERE {FINISHED} AND updated_at >= ? GROUP BY minute, status"
)


def finished_per_minute(conn: sqlite3.Connection, *, now: str, minutes: int = 60) -> list[dict[str, Any]]:
    """Jobs that reached completed, dead or cancelled in each of the last ``minutes`` minutes, oldest first.

    Counted from the rows still in the table (``updated_at`` of a final row is when it
    finished), so records removed by cleanup are no longer counted.
    """
    end = int(to_epoch(now) // 60) * 60  # start of the current minute
    first = end - (minutes - 1) * 60
    buckets = {format_ts(first + i * 60)[:16]: {"completed": 0, "dead": 0, "cancelled": 0} for i in range(minutes)}
    for minute, status, n in conn.execute(_FINISHED_PER_MINUTE, (format_ts(first),)):
        if minute in buckets:  # a clock set back can leave rows "in the future"
            buckets[minute][status] = n
    return [{"minute": f"{minute}:00Z", **counts} for minute, counts in buckets.items()]


def oldest_due_pending(conn: sqlite3.Connection, *, now: str) -> str | None:
    """``run_after`` of the pending job that has been due the longest (None: nothing is due)."""
    # INDEXED BY: the planner would otherwise pick idx_jobs_status and sort every pending
    # row (33 ms at 40k pending); the partial index answers in microseconds
    (oldest,) = conn.execute(
        "SELECT min(run_after) FROM jobs INDEXED BY idx_jobs_run_after WHERE status = 'pending' AND run_after <= ?", (now,)
    ).fetchone()
    return oldest


def operator_stats(conn: sqlite3.Connection, *, now: str) -> dict[str, Any]:
    """:func:`stats` plus throughput over the last hour and how late the queue is running."""
    out = stats(conn)
    out["finished_per_minute"] = finished_per_minute(conn, now=now)
    oldest = oldest_due_pending(conn, now=now)
    try:
        age = None if oldest is None else round(max(to_epoch(now) - to_epoch(oldest), 0.0), 3)
    except ValueError:  # a row written by other SQL with a run_after that is not ISO 8601
        age = None
    out["oldest_due_pending_age_seconds"] = age
    out["now"] = now
    return out


def ping(conn: sqlite3.Connection) -> None:
    """Health check: the file opens and the jobs table can be read."""
    conn.execute("SELECT 1 FROM jobs LIMIT 1").fetchall()


_WORKERS = """
SELECT owner, job_types, heartbeat_at,
       julianday(heartbeat_at) + lease_seconds / 86400.0 >= julianday(:now) AS alive
  FROM workers ORDER BY heartbeat_at DESC, owner
"""


def workers(conn: sqlite3.Connection, *, now: str) -> list[WorkerRecord]:
    found = []
    for owner, types, heartbeat_at, alive in conn.execute(_WORKERS, {"now": now}):
        try:
            job_types = tuple(json.loads(types))
        except (ValueError, TypeError):
            job_types = ()
        found.append(WorkerRecord(owner, job_types, heartbeat_at, bool(alive)))
    return found
