"""Workflows on Postgres (issue 24, docs/workflows.md): inserts with ``after``, the sweep for waiting
jobs left behind, a batch's record, and what removing jobs removes with them. What ending a parent
does to its children is the store's (store.apply_edges: every path to a final status calls it in
the transaction that ends the job).

The graph is a table of edges (parent, child, position in the child's ``after``, counted), the
child's ``waiting_for`` (its edges not yet counted) and the parent's ``has_children`` flag
(schema.py, version 8). Locks, in the one order every path takes: a parent's row, then its
children's rows in id order (a level at a time). An insert locks the parents it names that are
not in its call (FOR UPDATE, in id order) only after its keyed rows, whose insert may wait for
another transaction's key, and holds them for the few statements left: a parent's outcome waits for
the insert's commit at most that long, or the insert for the outcome's; either way one of the two
sees the other, so the edge counts once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from ..base import BatchMember, BatchRecord, NewBatch, NewJob, ParentResult, check_after, parent_failed, unknown_parents
from .store import ENDED, MS, NOTIFY, SCHEMA, Plan, _text, apply_edges, deadlocks_retried, run_plan, unique_rounds


def is_linked(row: NewJob) -> bool:
    """Whether a row takes the workflow insert (:func:`insert_plan`) rather than the plain one."""
    return bool(row.after) or row.batch_id is not None or row.on_parent_failure is not None


# -- inserts -------------------------------------------------------------------------------------------

# The parents an insert names that are not in its call, locked in id order (the order of every
# multi-row lock of the store): until the insert commits, no outcome changes them, and an outcome
# that changed one first has committed (READ COMMITTED reads the row as it left it). They are
# flagged has_children (once): the statement that ends one hands it to apply_edges, and reading or
# removing one looks for its edges.
_LOCK_PARENTS = f"""
WITH locked AS MATERIALIZED (
    SELECT id, status, has_children FROM {SCHEMA}jobs WHERE id = ANY(%(ids)s::text[]) ORDER BY id FOR UPDATE),
flagged AS (
    UPDATE {SCHEMA}jobs j SET has_children = true FROM locked l
     WHERE j.id = ANY(%(ids)s::text[]) AND j.id = l.id AND l.has_children IS NOT TRUE)
SELECT id, status FROM locked
"""
# A bulk load's read of the parents its rows name outside their chunk: no lock at all (any lock held
# to the end of a long load would hold up a claim, a cancel or a delete of the job); confirmed just
# before the commit (:func:`confirm_parents`).
_READ_PARENTS = f"SELECT id, status FROM {SCHEMA}jobs WHERE id = ANY(%(ids)s::text[])"
# Rows without a unique key, placed (status, waiting_for, ...) by :func:`insert_plan`; a row
# cancelled at insert (a parent had failed) is finished now.
_INSERT_LINKED = f"""
INSERT INTO {SCHEMA}jobs (id, job_type, payload, status, attempts, max_attempts, run_after, created_at, updated_at, priority,
                  trace, expires_at, limit_key, error, waiting_for, has_children, runs_on_parent_failure, batch_id,
                  batch_position)
SELECT id, job_type, payload, status, 0, max_attempts, run_after::timestamptz, created_at::timestamptz,
       CASE WHEN status = 'cancelled' THEN {MS} ELSE created_at::timestamptz END, priority, trace,
       expires_at::timestamptz, limit_key, error, waiting_for, has_children, runs, batch_id, batch_position
  FROM unnest(%(ids)s::text[], %(types)s::text[], %(payloads)s::text[], %(max_attempts)s::bigint[],
              %(run_after)s::text[], %(priorities)s::bigint[], %(created)s::text[], %(traces)s::text[],
              %(expires)s::text[], %(limit_keys)s::text[], %(statuses)s::text[], %(errors)s::text[],
              %(waiting)s::int[], %(children)s::bool[], %(runs)s::bool[], %(batches)s::text[],
              %(places)s::int[])
       AS r(id, job_type, payload, max_attempts, run_after, priority, created_at, trace, expires_at, limit_key,
            status, error, waiting_for, has_children, runs, batch_id, batch_position)
"""
# Rows with a unique key and parents: inserted by store.unique_rounds (pending, as any keyed row,
# holding the key as a waiting row would), then placed here once the parents are read; rows of
# this transaction, which nobody else sees yet.
_PLACE_KEYED = f"""
UPDATE {SCHEMA}jobs j SET status = r.status, error = r.error, waiting_for = r.waiting_for, runs_on_parent_failure = r.runs,
       updated_at = CASE WHEN r.status = 'cancelled' THEN {MS} ELSE j.updated_at END
  FROM unnest(%(ids)s::text[], %(statuses)s::text[], %(errors)s::text[], %(waiting)s::int[], %(runs)s::bool[])
       AS r(id, status, error, waiting_for, runs)
 WHERE j.id = ANY(%(ids)s::text[]) AND j.id = r.id
"""
_INSERT_EDGES = f"""
INSERT INTO {SCHEMA}job_edges (parent_id, child_id, position, counted)
SELECT * FROM unnest(%(parents)s::text[], %(children)s::text[], %(positions)s::int[], %(counted)s::bool[])
"""
_INSERT_BATCH = f"INSERT INTO {SCHEMA}batches (id, callback_id, created_at) VALUES (%(id)s, %(callback)s, %(created)s::timestamptz)"


def _runs(row: NewJob) -> bool | None:
    """The row's runs_on_parent_failure: true for on_parent_failure="run", NULL for the default."""
    return True if row.on_parent_failure == "run" else None


def _placed(row: NewJob, status_of: Callable[[str], str]) -> tuple[str, int | None, str | None, list[tuple[str, int, bool]]]:
    """Where a row starts, given its parents' statuses: (status, waiting_for, error, its edges as
    (parent, position, counted)). A parent completed counts at once; one dead or cancelled counts
    at once too and cancels the row under the default on_parent_failure (the error names the
    first such parent in ``after``); any other edge waits."""
    if not row.after:
        return "pending", None, None, []
    left = 0
    failed: tuple[str, str] | None = None
    edges = []
    for position, parent in enumerate(row.after):
        status = status_of(parent)
        counted = status in ENDED
        if not counted:
            left += 1
        elif status != "completed" and row.on_parent_failure != "run" and failed is None:
            failed = (parent, status)
        edges.append((parent, position, counted))
    if failed is not None:
        return "cancelled", left, _text(parent_failed(*failed)), edges
    return ("pending" if left == 0 else "waiting"), left, None, edges


def insert_plan(rows: Sequence[NewJob], batch: NewBatch | None = None, *, later: set[str] | None = None) -> Plan[list[str]]:
    """The statements of an insert whose rows may have parents (``after``) or be a batch's, in the
    caller's transaction (see store.Plan); per row, the id stored for it (Backend.insert). In order:
    the batch's record; the rows with a unique key (their insert may wait for another transaction's
    key, before any parent is locked); the parents not in the call, locked (:data:`_LOCK_PARENTS`:
    UsageError :func:`unknown_parents` if some are not in the store, and nothing is kept); the other
    rows, each placed as its parents' statuses say (:func:`_placed`); the edges. With ``later`` (a bulk
    load's, whose transaction may be long, or the caller's own: outbox.statements), the parents are
    only read (:data:`_READ_PARENTS`) and added to ``later``, for :func:`confirm_parents` before the
    bulk load's commit, or after the caller's (outbox.confirm_after_commit)."""
    if any(row.after or row.on_parent_failure is not None for row in rows):
        check_after(rows)
    in_call = {row.id for row in rows}
    outside = sorted({parent for row in rows for parent in row.after if parent not in in_call})
    if batch is not None:
        yield _INSERT_BATCH, {"id": batch.id, "callback": batch.callback_id, "created": batch.created_at}
    keyed = [row for row in rows if row.unique_key is not None]
    stored = (yield from unique_rounds(keyed)) if keyed else {}
    found: dict[str, str] = {}
    if outside:
        found = dict((yield _LOCK_PARENTS if later is None else _READ_PARENTS, {"ids": outside}))
        missing = [parent for parent in outside if parent not in found]
        if missing:
            raise unknown_parents(missing)
    named = {parent for row in rows for parent in row.after if parent in in_call}
    place = {row.id: n for n, row in enumerate(rows)}  # a batch's jobs in the order of the call
    status_of: dict[str, str] = {}
    plain: list[tuple[NewJob, str, int | None, str | None]] = []
    placed: list[tuple[NewJob, str, int | None, str | None]] = []
    edges: list[tuple[str, str, int, bool]] = []
    for row in rows:
        if stored.get(row.id, row.id) != row.id:
            continue  # its unique key is held: not inserted, no edges
        status, left, error, row_edges = _placed(row, lambda parent: status_of.get(parent) or found[parent])
        status_of[row.id] = status
        edges += [(parent, row.id, position, counted) for parent, position, counted in row_edges]
        if row.unique_key is None:
            plain.append((row, status, left, error))
        elif row.after:
            placed.append((row, status, left, error))
    if plain:
        params: dict[str, Any] = {
            "ids": [r.id for r, *_ in plain], "types": [r.job_type for r, *_ in plain],
            "payloads": [r.payload for r, *_ in plain], "max_attempts": [r.max_attempts for r, *_ in plain],
            "run_after": [r.run_after for r, *_ in plain], "priorities": [r.priority for r, *_ in plain],
            "created": [r.created_at for r, *_ in plain], "traces": [r.trace for r, *_ in plain],
            "expires": [r.expires_at for r, *_ in plain], "limit_keys": [r.limit_key for r, *_ in plain],
            "statuses": [status for _, status, _, _ in plain], "errors": [error for *_, error in plain],
            "waiting": [left for _, _, left, _ in plain], "children": [True if r.id in named else None for r, *_ in plain],
            "runs": [_runs(r) for r, *_ in plain], "batches": [r.batch_id for r, *_ in plain],
            "places": [None if r.batch_id is None else place[r.id] for r, *_ in plain],
        }
        yield _INSERT_LINKED, params
    if placed:
        yield _PLACE_KEYED, {"ids": [r.id for r, *_ in placed], "statuses": [status for _, status, _, _ in placed],
                             "errors": [error for *_, error in placed], "waiting": [left for _, _, left, _ in placed],
                             "runs": [_runs(r) for r, *_ in placed]}
    if edges:
        yield _INSERT_EDGES, {"parents": [e[0] for e in edges], "children": [e[1] for e in edges],
                              "positions": [e[2] for e in edges], "counted": [e[3] for e in edges]}
    if any(status == "pending" for status in (*status_of.values(), *(() if later is not None else found.values()))):
        # delivered at the commit, with the rows: a pending row is due, or a pending parent was
        # locked here, and a claim meanwhile skipped it (SKIP LOCKED) and looks again only if told
        yield NOTIFY, {}
    if later is not None:
        later.update(found)
    return [stored.get(row.id, row.id) for row in rows]


def confirm_parents(conn: psycopg.Connection[Any], parents: set[str]) -> None:
    """Just before a bulk load's commit: the parents its rows named outside their chunk (``later``
    of :func:`insert_plan`, read without a lock), locked now in id order and flagged has_children
    (:data:`_LOCK_PARENTS`), as an insert locks them, for the few statements left. One that ended
    after its read applied only the edges it saw, and the load's were not committed: they are
    applied now (store.apply_edges; one final when read had its edges counted then, and has none
    left); one deleted since, as "deleted", and its edges removed, as its delete would have. So a
    long load never holds a job another transaction must wait for, and each edge still counts once:
    before this lock the parent's end did not see it, after it the end does."""
    def confirm() -> None:
        found = dict(conn.execute(_LOCK_PARENTS, {"ids": sorted(parents)}).fetchall())
        gone = sorted(parents - found.keys())
        apply_edges(conn, [*((parent, status) for parent, status in found.items() if status in ENDED),
                           *((parent, "deleted") for parent in gone)])
        forget(conn, gone, ())
        if "pending" in found.values():  # (a claim meanwhile skipped it: see insert_plan)
            conn.execute(NOTIFY)

    deadlocks_retried(conn, confirm)


def insert_jobs(conn: psycopg.Connection[Any], rows: Sequence[NewJob], batch: NewBatch | None = None) -> list[str]:
    """:func:`insert_plan` in a transaction of its own (tried again if Postgres broke a deadlock
    with it); every row or none."""
    if not rows:
        return []
    return deadlocks_retried(conn, lambda: run_plan(conn, insert_plan(rows, batch)))


# -- the sweep -----------------------------------------------------------------------------------------

# Edges not counted although their parent is final or gone: what no transaction left, unless a row
# was restored or removed by hand (every path to a final status applies them as it commits). The
# partial index job_edges_uncounted holds only the edges still to count, read in its order, each
# parent looked up by id (a LATERAL with a LIMIT, which the planner keeps a nested loop: joined
# plainly, it hashed the whole jobs table); locked SKIP LOCKED, so sweeps from several processes
# take disjoint edges and never wait. What it reads grows with the edges still to count, never
# with the jobs.
_STRANDED = """
SELECT e.parent_id, e.child_id, coalesce(p.status, 'deleted') FROM job_edges e
  LEFT JOIN LATERAL (SELECT status FROM jobs WHERE id = e.parent_id LIMIT 1) p ON true
 WHERE NOT e.counted AND (p.status IS NULL OR p.status IN ('completed', 'dead', 'cancelled'))
 ORDER BY e.parent_id, e.child_id
 LIMIT %(limit)s
   FOR UPDATE OF e SKIP LOCKED
"""
# waiting jobs with nothing left to count, woken (through jobs_status's waiting range)
_UNSTUCK = f"""
UPDATE jobs SET status = 'pending', updated_at = {MS}
 WHERE id = ANY(ARRAY(SELECT id FROM jobs WHERE status = 'waiting' AND waiting_for <= 0
                       ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
   AND status = 'waiting' AND waiting_for <= 0
"""


def rescue_waiting(conn: psycopg.Connection[Any], *, limit: int = 500) -> int:
    """Up to ``limit`` edges whose parent is final (or gone: "deleted") and that have not counted,
    applied (store.apply_edges); then up to ``limit`` waiting jobs with nothing left to count,
    woken; in one transaction. How many jobs it woke or cancelled."""
    def sweep() -> int:
        stranded = conn.execute(_STRANDED, {"limit": limit}).fetchall()
        woken, cancelled = apply_edges(conn, (), [(parent, child, how) for parent, child, how in stranded]) if stranded else (0, 0)
        unstuck = conn.execute(_UNSTUCK, {"limit": limit}).rowcount
        if unstuck:
            conn.execute(NOTIFY)
        return woken + cancelled + unstuck

    return deadlocks_retried(conn, sweep)


# -- removing jobs ---------------------------------------------------------------------------------------

_FORGET_EDGES = "DELETE FROM job_edges WHERE parent_id = ANY(%(ids)s::text[]) OR child_id = ANY(%(ids)s::text[])"
# A batch is removed with the last of its jobs. Its row is locked first: two transactions removing
# its last jobs at once take turns, and the second, reading after the first committed, sees both gone.
_LOCK_BATCHES = "SELECT id FROM batches WHERE id = ANY(%(ids)s::text[]) ORDER BY id FOR UPDATE"
_FORGET_BATCHES = ("DELETE FROM batches b WHERE b.id = ANY(%(ids)s::text[]) "
                   "AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.batch_id = b.id)")


def forget(conn: psycopg.Connection[Any], linked: Sequence[str], batches: Sequence[str]) -> None:
    """In the transaction that removed jobs: the edges of the ``linked`` ones (both directions),
    and each of the ``batches`` none of whose jobs is left."""
    if linked:
        conn.execute(_FORGET_EDGES, {"ids": list(linked)})
    if batches:
        conn.execute(_LOCK_BATCHES, {"ids": sorted(set(batches))})
        conn.execute(_FORGET_BATCHES, {"ids": sorted(set(batches))})


# -- reading ------------------------------------------------------------------------------------------------

_PARENT_RESULTS = """
SELECT e.parent_id, p.job_type, p.result FROM job_edges e JOIN jobs p ON p.id = e.parent_id
 WHERE e.child_id = %(id)s ORDER BY e.position
"""


def parent_results(conn: psycopg.Connection[Any], job_id: str) -> dict[str, ParentResult]:
    """{parent id: (its job type, its result)} of the job's parents still in the store, in ``after`` order."""
    return {parent: ParentResult(job_type, result) for parent, job_type, result in conn.execute(_PARENT_RESULTS, {"id": job_id})}


# The members counted by status (one grouped read through jobs_batch), and the callback's status.
_BATCH = """
SELECT b.id, b.callback_id, b.created_at, c.statuses, c.counts, (SELECT status FROM jobs WHERE id = b.callback_id)
  FROM batches b
  LEFT JOIN LATERAL (
    SELECT array_agg(status) AS statuses, array_agg(n) AS counts FROM (
        SELECT status, count(*) AS n FROM jobs WHERE batch_id = b.id AND id IS DISTINCT FROM b.callback_id
         GROUP BY status) s) c ON true
 WHERE b.id = %(id)s
"""


def batch(conn: psycopg.Connection[Any], batch_id: str) -> BatchRecord | None:
    row = conn.execute(_BATCH, {"id": batch_id}).fetchone()
    if row is None:
        return None
    found_id, callback_id, created_at, statuses, counts, callback_status = row
    counted = dict(zip(statuses or [], (int(n) for n in counts or [])))
    return BatchRecord(found_id, callback_id, created_at, sum(counted.values()), counted, callback_status)


# the members in the order they were inserted (jobs_batch)
_BATCH_JOBS = """
SELECT j.id, j.job_type, j.status, j.result, j.error FROM batches b JOIN jobs j ON j.batch_id = b.id
 WHERE b.id = %(id)s AND j.id IS DISTINCT FROM b.callback_id
 ORDER BY j.batch_position LIMIT %(limit)s::bigint OFFSET %(offset)s
"""


def batch_jobs(conn: psycopg.Connection[Any], batch_id: str, *, limit: int | None = None, offset: int = 0) -> list[BatchMember]:
    return [BatchMember(*row) for row in conn.execute(_BATCH_JOBS, {"id": batch_id, "limit": limit, "offset": offset})]
