"""What operators read and do on the Postgres job store (the admin API, the CLI, the
dashboard, /metrics): the same answers as the SQLite backend's queries.py, as named
synchronous functions on a psycopg connection."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs
import psycopg

from ... import states
from ...clock import format_ts, to_epoch
from ...errors import StoreError, UsageError
from ...states import Status
from ..base import (
    CANCELLING,
    MAX_LISTED_RELATIVES,
    JobRecord,
    WorkerRecord,
    cancelled_error,
    check_list_order,
    unique_key_held,
)
from . import durable, graph, store
from .store import HOLDS, MS, retake

_ROW = (
    "id, job_type, payload, status, attempts, max_attempts, run_after, error, created_at, updated_at, priority, "
    "lease_owner, lease_expires_at, unique_key, result, progress, progress_message, snoozes, expires_at, "
    "cancel_requested, limit_key, coalesce(waiting_for, 0), batch_id, "
    "CASE WHEN runs_on_parent_failure THEN 'run' END"
)
# and the signal it awaits, only while suspended (durable.py; ``id``: the job's, job_waits has none)
_COLUMNS = (f"{_ROW}, CASE WHEN status = 'suspended' "
            f"THEN (SELECT w.signal FROM {store.SCHEMA}job_waits w WHERE w.job_id = id) END")
_RECORD = f"SELECT {_COLUMNS} FROM jobs"


_FIELDS = (*(field.name for field in attrs.fields(JobRecord)[:21]), "waiting_for", "batch_id", "on_parent_failure",
           "awaiting_signal")
_RELATIVES = ("parents", "parent_count", "children", "child_count")


def _record(row: Sequence[Any]) -> JobRecord:
    """A row of :data:`_COLUMNS` (and, from :data:`_GET`, the job's relatives)."""
    fields = dict(zip(_FIELDS, row))
    fields.update(zip(_RELATIVES, row[len(_FIELDS):]))
    for name in ("parents", "children"):
        fields[name] = tuple(fields.get(name) or ())
    return JobRecord(**fields)


# One job and its relatives: its parents in its after's order and its children oldest first (at
# most MAX_LISTED_RELATIVES of each), and how many of each; read only for a job that has them
# (inserted with parents: waiting_for not NULL; named as a parent: has_children). Last, whether it
# has steps to read (durable.py). The signal it awaits is read after it, if it is suspended: a
# subquery of job_waits here would read that table whole while it is small (a plan of this statement
# reads no table whole: test_postgres_workflows).
_GET = f"""
SELECT {_ROW}, NULL::text,
       CASE WHEN waiting_for IS NOT NULL THEN ARRAY(
            SELECT parent_id FROM job_edges WHERE child_id = j.id ORDER BY position LIMIT {MAX_LISTED_RELATIVES}) END,
       CASE WHEN waiting_for IS NOT NULL THEN (SELECT count(*) FROM job_edges WHERE child_id = j.id) ELSE 0 END,
       CASE WHEN has_children THEN ARRAY(
            SELECT child_id FROM job_edges WHERE parent_id = j.id ORDER BY child_id LIMIT {MAX_LISTED_RELATIVES}) END,
       CASE WHEN has_children THEN (SELECT count(*) FROM job_edges WHERE parent_id = j.id) ELSE 0 END,
       durable IS TRUE
  FROM jobs j WHERE j.id = %s
"""


def get_job(conn: psycopg.Connection[Any], job_id: str) -> JobRecord | None:
    """The job with its relatives, its steps and the signal it awaits (a read or two more for a
    durable job)."""
    row = conn.execute(_GET, (job_id,)).fetchone()
    if row is None:
        return None
    job = _record(row[:-1])
    if not row[-1]:
        return job
    awaiting = durable.awaited(conn, job_id) if job.status == Status.SUSPENDED else None
    return attrs.evolve(job, steps=tuple(durable.steps(conn, job_id)), awaiting_signal=awaiting)


# A fixed form for each set of filters given and each order, made once here: no statement text
# is put together at run time.
_FILTERS = (("status", "status = %(status)s"), ("job_type", "job_type = %(job_type)s"), ("priority", "priority = %(priority)s"))
_ORDERS = {"newest": "id DESC", "claim": "priority, run_after, id"}  # (base.LIST_ORDERS)


def _list_forms() -> dict[tuple[bool, bool, bool, str], tuple[str, str]]:
    forms = {}
    for mask in range(8):
        given = (bool(mask & 1), bool(mask & 2), bool(mask & 4))
        where = " AND ".join(sql for (_, sql), on in zip(_FILTERS, given) if on)
        clause = f" WHERE {where}" if where else ""
        for order, by in _ORDERS.items():
            forms[(given[0], given[1], given[2], order)] = (f"{_RECORD}{clause} ORDER BY {by} LIMIT %(limit)s OFFSET %(offset)s",
                                      f"SELECT count(*) FROM jobs{clause}")
    return forms


_LIST = _list_forms()


def list_jobs(
    conn: psycopg.Connection[Any], *, status: str | None = None, job_type: str | None = None, limit: int = 50, offset: int = 0,
    priority: int | None = None, order: str = "newest",
) -> tuple[list[JobRecord], int]:
    """Newest first (ids are time-ordered), or in claim order, with the total that matches the
    filters; one snapshot for both (REPEATABLE READ), so the page and its total agree."""
    if status is not None and status not in set(Status):
        raise UsageError(f"unknown status {status!r}; expected one of {', '.join(Status)}")
    check_list_order(order)
    rows_sql, count_sql = _LIST[(status is not None, job_type is not None, priority is not None, order)]
    params = {"status": status, "job_type": job_type, "priority": priority, "limit": limit, "offset": offset}
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        row = conn.execute(count_sql, params).fetchone()
        rows = conn.execute(rows_sql, params).fetchall()
    return [_record(r) for r in rows], int(row[0]) if row else 0


def revive(conn: psycopg.Connection[Any], job_id: str, *, from_step: str | None = None) -> JobRecord:
    """Admin retry: dead or cancelled → pending, attempts, snoozes, progress, result and the
    cancel request reset, due now; its steps kept (it resumes). UsageError if neither dead nor
    cancelled, or if its unique key is held by another pending or running job; a job whose key is
    held only while pending takes it again if it is free, and is revived without it otherwise
    (store.retake). ``from_step`` (a replay): a completed job too (REPLAY), and the step of that
    name and every step first written after it removed in the same transaction (UsageError naming
    its steps if it has none of that name: nothing changed)."""
    try:
        return _revive(conn, job_id, from_step)
    except psycopg.errors.UniqueViolation:
        # the partial unique index refused: another job holds its type and key
        job = get_job(conn, job_id)
        if job is None or job.unique_key is None:
            raise
        found = conn.execute(_HOLDER, (job.job_type, job.unique_key)).fetchone()
        raise UsageError(unique_key_held(job, found[0] if found else "(another, finished since)")) from None


_HOLDER = f"SELECT id FROM jobs WHERE job_type = %s AND unique_key = %s AND {HOLDS}"
# A job whose key is held only while pending comes back holding none (unique_token -1, no lease's
# token), so that it never fails on jobs_unique; then it takes its key if free (store.retake).
_REVIVE = f"""
UPDATE jobs SET status = 'pending', attempts = 0, snoozes = 0, run_after = {MS}, updated_at = {MS}, started_at = NULL,
       progress = NULL, progress_message = NULL, result = NULL, cancel_requested = false,
       unique_token = CASE WHEN unique_token IS NOT NULL THEN -1 END
 WHERE id = %s AND status = ANY(%s::text[]) RETURNING id
"""
_REVIVABLE = ["dead", "cancelled"]
_REPLAYABLE = ["dead", "cancelled", "completed"]  # with from_step (Transition.REPLAY)
_STATUS_FOR_UPDATE = "SELECT status FROM jobs WHERE id = %s FOR UPDATE"


def _revive(conn: psycopg.Connection[Any], job_id: str, from_step: str | None) -> JobRecord:
    allowed = _REVIVABLE if from_step is None else _REPLAYABLE
    with conn.transaction():
        if from_step is not None:
            # the job's row first (the order of every path: a job, then what hangs off it), then its steps
            found = conn.execute(_STATUS_FOR_UPDATE, (job_id,)).fetchone()
            if found is None:
                raise LookupError(f"no job with id {job_id!r}")
            if found[0] not in allowed:
                raise UsageError(f"job {job_id} is {found[0]}, only dead, cancelled or completed jobs can be retried "
                                 "from a step")
            durable.forget_from(conn, job_id, from_step)
        row = conn.execute(_REVIVE, (job_id, allowed)).fetchone()
        job = get_job(conn, job_id)
        if job is None:
            raise LookupError(f"no job with id {job_id!r}")
        if row is None:
            raise UsageError(f"job {job_id} is {job.status}, only dead or cancelled jobs can be retried")
        retake(conn, [job_id])
        conn.execute("SELECT pg_notify('pipeline_jobs', current_schema())")
        return job


# -- control (issue 23): the operators' side --------------------------------------------------------

# The jobs not final yet, locked in id order (the order every multi-row update of the store locks
# in, store.by_id): each one's status is then ours to change until the commit.
_LOCK_LIVE = ("SELECT id, status FROM jobs WHERE id = ANY(%(ids)s) "
              "AND status IN ('waiting', 'pending', 'running', 'suspended') ORDER BY id FOR UPDATE")
# pending, waiting or suspended → cancelled; the ones with children, whose edges are applied next
_CANCEL_PENDING = f"""
WITH gone AS (
UPDATE jobs SET status = 'cancelled', error = %(error)s, updated_at = {MS}, started_at = NULL
 WHERE id = ANY(%(ids)s) AND status IN ('waiting', 'pending', 'suspended')
RETURNING id, has_children)
SELECT coalesce(array_agg(id) FILTER (WHERE has_children), '{{}}') FROM gone
"""
_REQUEST_CANCEL = "UPDATE jobs SET cancel_requested = true WHERE id = ANY(%(ids)s) AND status = 'running'"
_STATUSES = "SELECT id, status FROM jobs WHERE id = ANY(%(ids)s)"
CANCEL_ROUNDS = 5  # (a job revived between the lock and the read of the final ones is locked in the next round)


def cancel(conn: psycopg.Connection[Any], job_ids: Sequence[str], *, reason: str) -> list[str | None]:
    """In one transaction: pending, waiting or suspended → cancelled (states.cancelled_error), its edges
    applied (store.apply_edges), running → its cancel requested (CANCELLING); a final job's status
    as it is, None for an unknown id. Only the rows it changes are locked (and the children of
    those it cancels)."""
    return store.deadlocks_retried(conn, lambda: _cancel(conn, job_ids, reason=reason))


def _cancel(conn: psycopg.Connection[Any], job_ids: Sequence[str], *, reason: str) -> list[str | None]:
    error = cancelled_error(reason).replace("\x00", "\\x00")
    answers: dict[str, str | None] = {}
    todo = sorted(set(job_ids))
    for _ in range(CANCEL_ROUNDS):
        live = conn.execute(_LOCK_LIVE, {"ids": todo}).fetchall()
        pending = [job_id for job_id, status in live if status in (Status.PENDING, Status.WAITING, Status.SUSPENDED)]
        running = [job_id for job_id, status in live if status == Status.RUNNING]
        if pending:
            row = conn.execute(_CANCEL_PENDING, {"ids": pending, "error": error}).fetchone()
            store.apply_edges(conn, [(job_id, "cancelled") for job_id in (row[0] if row else [])])
        if running:
            conn.execute(_REQUEST_CANCEL, {"ids": running})
        answers.update((job_id, Status.CANCELLED.value) for job_id in pending)
        answers.update((job_id, CANCELLING) for job_id in running)
        rest = [job_id for job_id in todo if job_id not in answers]
        if not rest:
            break
        # READ COMMITTED: the latest commit of each, final (or gone) when it was not locked above,
        # unless it was revived meanwhile: then it is locked in the next round
        found = dict(conn.execute(_STATUSES, {"ids": rest}).fetchall())
        todo = []
        for job_id in rest:
            status = found.get(job_id)
            if status in (Status.WAITING, Status.PENDING, Status.RUNNING, Status.SUSPENDED):
                todo.append(job_id)
            else:
                answers[job_id] = status
        if not todo:
            break
    else:
        raise StoreError(f"{len(todo)} jobs changed status {CANCEL_ROUNDS} times while being cancelled; try again")
    return [answers[job_id] for job_id in job_ids]


# durable functions (issue 35): a person's or a client's signal (ServerBackend.operators.send_signal)
send_signal = durable.send_signal
signal_key_used = durable.signal_key_used


def set_type_paused(conn: psycopg.Connection[Any], job_type: str, paused: bool) -> None:
    """Pause (idempotent), or resume and wake every Poller: the type's due jobs can be claimed again."""
    if paused:
        conn.execute(f"INSERT INTO paused_types (job_type, paused_at) VALUES (%s, {MS}) "
                     "ON CONFLICT (job_type) DO NOTHING", (job_type,))
    else:
        conn.execute("WITH gone AS (DELETE FROM paused_types WHERE job_type = %s RETURNING 1) "
                     "SELECT pg_notify('pipeline_jobs', current_schema()) FROM gone", (job_type,))


def paused_types(conn: psycopg.Connection[Any]) -> set[str]:
    return {job_type for (job_type,) in conn.execute("SELECT job_type FROM paused_types")}


_LOCK_ONE = ("SELECT status, has_children IS TRUE, waiting_for IS NOT NULL, batch_id, durable IS TRUE FROM jobs "
             "WHERE id = %s FOR UPDATE")


def delete_job(conn: psycopg.Connection[Any], job_id: str) -> None:
    """Delete a job record; LookupError if unknown, UsageError if it is running. In one
    transaction: its edges that have not counted (it was pending, waiting or suspended) applied as
    a parent "deleted" (store.apply_edges), then its edges (both directions), its steps and signals,
    and its batch, if none of the batch's jobs is left, removed with it."""
    def remove() -> None:
        row = conn.execute(_LOCK_ONE, (job_id,)).fetchone()
        if row is None:
            raise LookupError(f"no job with id {job_id!r}")
        status, has_children, has_parents, batch_id, is_durable = row
        if status == Status.RUNNING:
            raise UsageError(f"job {job_id} is running; wait for it to finish before deleting it")
        if has_children:
            store.apply_edges(conn, [(job_id, "deleted")])
        conn.execute("DELETE FROM jobs WHERE id = %s", (job_id,))
        graph.forget(conn, [job_id] if has_children or has_parents else [], [batch_id] if batch_id else [])
        durable.forget(conn, [job_id] if is_durable else [])

    store.deadlocks_retried(conn, remove)


# The finished jobs removed, and of them those with edges or a batch (graph.forget's to remove).
_CLEANUP = """
WITH gone AS (
DELETE FROM jobs WHERE status = ANY(%(statuses)s::text[])
   AND (%(age)s::float8 IS NULL OR updated_at < now() - %(age)s::float8 * interval '1 second')
RETURNING id, batch_id, has_children IS TRUE OR waiting_for IS NOT NULL AS linked, durable)
SELECT count(*), coalesce(array_agg(id) FILTER (WHERE linked), '{}'),
       coalesce(array_agg(DISTINCT batch_id) FILTER (WHERE batch_id IS NOT NULL), '{}'),
       coalesce(array_agg(id) FILTER (WHERE durable), '{}') FROM gone
"""


def cleanup(conn: psycopg.Connection[Any], *, statuses: Sequence[str] = ("completed", "dead"), older_than_seconds: float | None = None) -> int:
    """Delete finished records (completed, dead, cancelled), optionally only those last updated more than
    ``older_than_seconds`` ago (by the server's clock); their edges, steps, signals and emptied batches with
    them."""
    states.check_finished(statuses, "cleanup deletes")
    with conn.transaction():
        row = conn.execute(_CLEANUP, {"statuses": list(statuses), "age": older_than_seconds}).fetchone()
        assert row is not None
        n, linked, batches, durable_ids = row
        graph.forget(conn, linked, batches)
        durable.forget(conn, durable_ids)
    return int(n)


# -- operator views ---------------------------------------------------------------------------

# The finished rows of the last hour through jobs_finished (completed, dead) and jobs_cancelled,
# one bitmap of both: written as an OR of each index's own statuses, which the planner matches to
# each partial index (given as one IN of the three statuses, it read the whole table).
_FINISHED_PER_MINUTE = """
SELECT to_char(date_trunc('minute', updated_at), 'YYYY-MM-DD"T"HH24:MI'), status, count(*) FROM jobs
 WHERE (status IN ('completed', 'dead') OR status = 'cancelled') AND updated_at >= %(since)s::timestamptz
 GROUP BY 1, 2
"""


def operator_stats(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """Counts by status and by type and status; jobs finished per minute over the last hour;
    how long the oldest due pending job has waited. One snapshot, the server's "now"."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        row = conn.execute(f"SELECT {MS}").fetchone()
        assert row is not None
        now: str = row[0]
        by_status = {s.value: 0 for s in Status}
        by_type: dict[str, dict[str, int]] = {}
        for job_type, status, n in conn.execute("SELECT job_type, status, count(*) FROM jobs GROUP BY job_type, status"):
            by_type.setdefault(job_type, {s.value: 0 for s in Status})[status] = n
            by_status[status] = by_status.get(status, 0) + n
        end = int(to_epoch(now) // 60) * 60
        first = end - 59 * 60
        buckets = {format_ts(first + i * 60)[:16]: {"completed": 0, "dead": 0, "cancelled": 0} for i in range(60)}
        for minute, status, n in conn.execute(_FINISHED_PER_MINUTE, {"since": format_ts(first)}):
            if minute in buckets:
                buckets[minute][status] = n
        row = conn.execute(
            "SELECT min(run_after), extract(epoch FROM now() - min(run_after)) FROM jobs WHERE status = 'pending' AND run_after <= now()"
        ).fetchone()
    age = None if row is None or row[1] is None else round(max(float(row[1]), 0.0), 3)
    return {
        "by_status": by_status, "by_type": by_type, "total": sum(by_status.values()),
        "finished_per_minute": [{"minute": f"{minute}:00Z", **counts} for minute, counts in buckets.items()],
        "oldest_due_pending_age_seconds": age, "now": now,
    }


def ping(conn: psycopg.Connection[Any]) -> None:
    """Health check: the server answers and the jobs table can be read."""
    conn.execute("SELECT 1 FROM jobs LIMIT 1").fetchall()


_WORKERS = """
SELECT owner, job_types, heartbeat_at, heartbeat_at + lease_seconds * interval '1 second' >= now()
  FROM workers ORDER BY heartbeat_at DESC, owner
"""


def workers(conn: psycopg.Connection[Any]) -> list[WorkerRecord]:
    found = []
    for owner, types, heartbeat_at, alive in conn.execute(_WORKERS).fetchall():
        try:
            job_types = tuple(json.loads(types))
        except (ValueError, TypeError):
            job_types = ()
        found.append(WorkerRecord(owner, job_types, heartbeat_at, bool(alive)))
    return found
