"""Workflows on SQLite (issue 24): the edges between a job and the jobs it waits for, applied in the
transaction that ends each parent; batches; and the reads of both.

A job enqueued with ``after`` gets one row in ``edges`` per parent, and in ``waiting_for`` the number
of them not yet counted. When a parent ends (completed, dead, cancelled, or deleted), every path that
ends it (settle, the rescue, the claim's expiry, cancel, the burial of unknown types, delete) calls
:func:`after_ended` or :func:`apply_edges` in its own transaction, which counts each of the parent's
edges once (``counted`` = 1) and moves its children: down a count, woken to pending at zero, or
cancelled with their own edges applied in turn, as base.Backend.insert says. SQLite serializes
writers, so the transaction that ends a parent and the one that inserts a child naming it are one
after the other: the insert reads the parent's status under the write lock and counts the edge
itself when the parent has already ended.

Nothing here knows about trio; the functions that write expect the caller's write transaction.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from typing import NamedTuple

import attrs

from ..base import (
    MAX_LISTED_RELATIVES,
    BatchMember,
    BatchRecord,
    NewBatch,
    NewJob,
    ParentResult,
    check_after,
    parent_failed,
    unknown_parents,
)

FINAL = ("completed", "dead", "cancelled")
_FINAL = "(p.status = 'completed' OR p.status = 'dead' OR p.status = 'cancelled')"  # of the parent, p

# The jobs the Ledger's batch in hand woke (waiting → pending): the Ledger sets a list here, in its
# database thread, for the length of one batch, and nudges its Poller once the batch committed, as an
# insert does (other processes' Pollers learn of the commit from their WAL watch). Every path that
# applies edges adds to it, so that none has to hand the news up through what it returns. Unset (a
# bulk load, the outbox in the caller's transaction), nothing is kept.
WOKEN: ContextVar[list[str] | None] = ContextVar("pipeline_sqlite_woken", default=None)


# -- inserts ------------------------------------------------------------------------------------


def linked(row: NewJob) -> bool:
    """Whether the row takes part in a workflow (parents, a policy, a batch): inserted by :func:`plan`."""
    return bool(row.after) or row.on_parent_failure is not None or row.batch_id is not None


_STATUSES = "SELECT id, status FROM jobs WHERE id IN (SELECT value FROM json_each(?))"


def parent_statuses(conn: sqlite3.Connection, rows: Sequence[NewJob]) -> dict[str, str]:
    """Check the call (:func:`~pipeline.backends.base.check_after`), then the status of every job
    named as a parent: those of the store as it is now (the caller holds the write lock, so none
    ends before the insert commits), the jobs of the call as "pending" (:func:`plan` sets the linked
    ones' own as it goes). UsageError (:func:`~pipeline.backends.base.unknown_parents`) if one is
    neither: raised before anything is written."""
    check_after(rows)
    statuses = {row.id: "pending" for row in rows}
    outside = {parent for row in rows for parent in row.after if parent not in statuses}
    if outside:
        found = dict(conn.execute(_STATUSES, (json.dumps(sorted(outside)),)).fetchall())
        if len(found) < len(outside):
            raise unknown_parents(outside - found.keys())
        statuses.update(found)
    return statuses


class Linked(NamedTuple):
    """How a row with parents is inserted: its status, its parents not yet ended, its error (a
    parent's failure cancelled it), and its edges (parent, child, position, counted)."""

    status: str
    waiting_for: int
    error: str | None
    edges: list[tuple[str, str, int, int]]


def plan(row: NewJob, statuses: dict[str, str]) -> Linked:
    """The row's status from its parents' (``statuses``, updated with the row's own, for the jobs
    after it in the call): a parent completed counts at once; one dead or cancelled counts at once
    and cancels the row, unless it runs on a parent's failure; any other waits. Pure."""
    waiting_for, failed = 0, None
    edges = []
    for position, parent in enumerate(row.after):
        status = statuses[parent]
        counted = status in FINAL
        if not counted:
            waiting_for += 1
        elif status != "completed" and row.on_parent_failure != "run" and failed is None:
            failed = parent_failed(parent, status)
        edges.append((parent, row.id, position, int(counted)))
    status = "cancelled" if failed is not None else "waiting" if waiting_for else "pending"
    statuses[row.id] = status
    return Linked(status, waiting_for, failed, edges)


_INSERT_EDGE = "INSERT INTO edges (parent_id, child_id, position, counted) VALUES (?, ?, ?, ?)"
# a parent's next success is written by the statement for jobs with children (store._SUCCEED_PARENT)
_HAS_CHILDREN = "UPDATE jobs SET has_children = 1 WHERE id IN (SELECT value FROM json_each(?)) AND has_children = 0"


def write_edges(conn: sqlite3.Connection, edges: Sequence[tuple[str, str, int, int]], flagged: Iterable[str] = ()) -> None:
    """Insert the edges of the rows just inserted, and mark their parents as having children
    (except those ``flagged`` already: rows of the call inserted with the mark)."""
    if not edges:
        return
    conn.executemany(_INSERT_EDGE, edges)
    parents = {edge[0] for edge in edges}.difference(flagged)
    if parents:
        conn.execute(_HAS_CHILDREN, (json.dumps(sorted(parents)),))


def insert_batch(conn: sqlite3.Connection, batch: NewBatch) -> None:
    """The batch's record (its members and callback are inserted with it, in the same transaction)."""
    conn.execute("INSERT INTO batches (id, callback_id, created_at) VALUES (?, ?, ?)", batch)


# -- applying a parent's edges -------------------------------------------------------------------

# The edges not yet counted of the parents given (a JSON array), with what their children are now (a
# child gone: NULLs): a seek per parent in idx_edges_uncounted, then the child by its id
_UNCOUNTED = (
    "SELECT e.parent_id, e.child_id, c.status, c.waiting_for, c.on_parent_failure FROM json_each(?) AS j "
    "CROSS JOIN edges AS e INDEXED BY idx_edges_uncounted LEFT JOIN jobs AS c ON c.id = e.child_id "
    "WHERE e.parent_id = j.value AND e.counted = 0"
)
_COUNT = "UPDATE edges SET counted = 1 WHERE parent_id IN (SELECT value FROM json_each(?)) AND counted = 0"
# a child that is not waiting (cancelled by an operator, revived), or waits for other parents still
_MOVE = "UPDATE jobs SET waiting_for = max(waiting_for - ?, 0) WHERE id = ?"
# WAKE: its own run_after holds, as stored (a past one: due at once, in its place in the claim order)
_WAKE = "UPDATE jobs SET status = 'pending', waiting_for = 0, updated_at = ?1 WHERE id = ?2 AND status = 'waiting'"
# CANCEL_WAITING: finished now; its unique key freed (idx_jobs_unique holds no cancelled row)
_CANCEL_WAITING = (
    "UPDATE jobs SET status = 'cancelled', waiting_for = max(waiting_for - ?, 0), error = ?, updated_at = ? "
    "WHERE id = ? AND status = 'waiting'"
)


@attrs.define
class _Child:
    """A child of the parents of one generation of :func:`apply_edges`, as their edges count."""

    waiting: bool  # still waiting (not woken nor cancelled by an edge before)
    waiting_for: int  # its parents not yet ended, as stored
    counted: int = 0  # its edges counted now
    woken: bool = False
    error: str | None = None  # cancelled: the parent's failure


def apply_edges(conn: sqlite3.Connection, ended: Iterable[tuple[str, str]], *, now: str) -> int:
    """Count the edges of each parent (id, how it ended: "completed", "dead", "cancelled" or
    "deleted") that have not counted yet, and move their children: a parent completed, or a child
    that runs on a parent's failure: one parent less to wait for, and a waiting child with none
    left → pending (WAKE); a parent failed under the default: a waiting child → cancelled
    (CANCEL_WAITING, :func:`~pipeline.backends.base.parent_failed`), whose own edges are applied
    next as a parent "cancelled", down the graph, in this transaction. A child that no longer waits
    only has its count moved. Returns how many jobs it woke or cancelled.

    The parents are taken together, a generation at a time (those given, then the children they
    cancelled, ...): a few statements per generation, however many parents (the members of a batch
    that end in one Ledger batch, for the callback waiting for them all)."""
    generation = dict(ended)
    woken: list[str] = []
    cancelled = 0
    while generation:
        parents = json.dumps(list(generation))
        edges = conn.execute(_UNCOUNTED, (parents,)).fetchall()
        if not edges:
            break
        conn.execute(_COUNT, (parents,))
        children: dict[str, _Child] = {}
        for parent, child, status, waiting_for, policy in edges:
            if status is None:  # the child is gone: its edge only counts
                continue
            state = children.setdefault(child, _Child(waiting=status == "waiting", waiting_for=waiting_for))
            state.counted += 1
            if not state.waiting:  # not waiting, or woken or cancelled by a parent before this one
                continue
            how = generation[parent]
            if how == "completed" or policy == "run":
                if state.counted >= state.waiting_for:
                    state.waiting, state.woken = False, True
            else:
                state.waiting, state.error = False, parent_failed(parent, how)
        move, wake, cancel = [], [], []
        for child, state in children.items():
            if state.error is not None:
                cancel.append((state.counted, state.error, now, child))
            elif state.woken:
                wake.append((now, child))
            else:
                move.append((state.counted, child))
        if move:
            conn.executemany(_MOVE, move)
        if wake:
            conn.executemany(_WAKE, wake)
            woken.extend(child for _, child in wake)
        if cancel:
            conn.executemany(_CANCEL_WAITING, cancel)
            cancelled += len(cancel)
        generation = {child: "cancelled" for _, _, _, child in cancel}
    if woken:
        tally = WOKEN.get()
        if tally is not None:
            tally.extend(woken)
    return len(woken) + cancelled


# Which of the jobs just ended have edges to apply: a seek per id in idx_edges_uncounted, which holds
# the waiting edges only (empty where no job waits), then the parent's status by its id. In that order
# (CROSS JOIN): the planner would otherwise walk idx_jobs_finished, every finished job of the store.
_ENDED = (
    "SELECT DISTINCT p.id, p.status FROM json_each(?) AS j CROSS JOIN edges AS e INDEXED BY idx_edges_uncounted "
    f"CROSS JOIN jobs AS p WHERE e.parent_id = j.value AND e.counted = 0 AND p.id = e.parent_id AND {_FINAL}"
)


def after_ended(conn: sqlite3.Connection, job_ids: Sequence[str], *, now: str) -> int:
    """Apply the edges of those of ``job_ids`` that are final now (just ended by the caller's
    statements), as :func:`apply_edges`; one statement when none has edges left to count."""
    if not job_ids:
        return 0
    ended = conn.execute(_ENDED, (json.dumps(list(job_ids)),)).fetchall()
    return apply_edges(conn, ended, now=now) if ended else 0


# -- the sweep ----------------------------------------------------------------------------------

# Edges not yet counted whose parent is final or gone: only a defect, or a row written by hand,
# leaves one (every path that ends a job applies its edges). The whole of idx_edges_uncounted is
# read: the edges of the jobs that wait now, nothing when none does.
_STRANDED = (
    "SELECT e.parent_id, coalesce(p.status, 'deleted') FROM edges AS e INDEXED BY idx_edges_uncounted "
    f"LEFT JOIN jobs AS p ON p.id = e.parent_id WHERE e.counted = 0 AND (p.id IS NULL OR {_FINAL}) LIMIT ?"
)
# Waiting jobs with no parent left to wait for (idx_jobs_status: the waiting ones only)
_UNBLOCKED = (
    "SELECT id FROM jobs AS c WHERE status = 'waiting' AND (waiting_for <= 0 OR NOT EXISTS "
    "(SELECT 1 FROM edges AS e WHERE e.child_id = c.id AND e.counted = 0)) LIMIT ?"
)


def rescue_waiting(conn: sqlite3.Connection, *, limit: int, now: str) -> int:
    """The repair sweep (base.Backend.rescue_waiting): the parents of up to ``limit`` edges not
    counted although the parent is final or gone have their edges applied (a gone one as
    "deleted"), then up to ``limit`` waiting jobs with nothing left to wait for are woken.
    Returns how many jobs it woke or cancelled."""
    stranded = dict(conn.execute(_STRANDED, (limit,)).fetchall())  # (one entry per parent)
    moved = apply_edges(conn, stranded.items(), now=now) if stranded else 0
    unblocked = [(now, job_id) for (job_id,) in conn.execute(_UNBLOCKED, (limit,)).fetchall()]
    if unblocked:
        woken = conn.executemany(_WAKE, unblocked).rowcount
        tally = WOKEN.get()
        if tally is not None:
            tally.extend(job_id for _, job_id in unblocked)
        moved += woken
    return moved


# -- removing jobs ------------------------------------------------------------------------------


def in_use(conn: sqlite3.Connection) -> bool:
    """Whether the store holds any edge or batch: removing jobs has more to do only then."""
    return conn.execute("SELECT EXISTS (SELECT 1 FROM edges) OR EXISTS (SELECT 1 FROM batches)").fetchone()[0] == 1


_FORGET_AS_PARENT = "DELETE FROM edges WHERE parent_id IN (SELECT value FROM json_each(?))"
_FORGET_AS_CHILD = "DELETE FROM edges WHERE child_id IN (SELECT value FROM json_each(?))"
_FORGET_BATCH = "DELETE FROM batches WHERE id = ?1 AND NOT EXISTS (SELECT 1 FROM jobs WHERE batch_id = ?1)"


def forget(conn: sqlite3.Connection, removed: Sequence[tuple[str, str | None]]) -> None:
    """After jobs (id, batch id) were removed: their edges, both ways, and the batches none of
    whose jobs is left."""
    if not removed:
        return
    ids = json.dumps([job_id for job_id, _ in removed])
    conn.execute(_FORGET_AS_PARENT, (ids,))
    conn.execute(_FORGET_AS_CHILD, (ids,))
    batches = sorted({batch_id for _, batch_id in removed if batch_id is not None})
    if batches:
        conn.executemany(_FORGET_BATCH, [(batch_id,) for batch_id in batches])


# -- reads --------------------------------------------------------------------------------------

_PARENTS = "SELECT parent_id FROM edges WHERE child_id = ? ORDER BY position LIMIT ?"
_PARENT_COUNT = "SELECT count(*) FROM edges WHERE child_id = ?"
# children in id order: ids are UUID v7, made by the engine at the enqueue, so oldest first
_CHILDREN = "SELECT child_id FROM edges WHERE parent_id = ? ORDER BY child_id LIMIT ?"
_CHILD_COUNT = "SELECT count(*) FROM edges WHERE parent_id = ?"


def relatives(conn: sqlite3.Connection, job_id: str) -> tuple[tuple[str, ...], int, tuple[str, ...], int]:
    """(parents in the order of its after, how many in all, children oldest first, how many), at
    most MAX_LISTED_RELATIVES of each listed. In the caller's read transaction."""
    parents = tuple(p for (p,) in conn.execute(_PARENTS, (job_id, MAX_LISTED_RELATIVES)))
    children = tuple(c for (c,) in conn.execute(_CHILDREN, (job_id, MAX_LISTED_RELATIVES)))
    # counted only when the list is full: a shorter one is all of them
    parent_count = len(parents) if len(parents) < MAX_LISTED_RELATIVES else conn.execute(_PARENT_COUNT, (job_id,)).fetchone()[0]
    child_count = len(children) if len(children) < MAX_LISTED_RELATIVES else conn.execute(_CHILD_COUNT, (job_id,)).fetchone()[0]
    return parents, int(parent_count), children, int(child_count)


_PARENT_RESULTS = (
    "SELECT p.id, p.job_type, p.result FROM edges AS e JOIN jobs AS p ON p.id = e.parent_id WHERE e.child_id = ? "
    "ORDER BY e.position"
)


def parent_results(conn: sqlite3.Connection, job_id: str) -> dict[str, ParentResult]:
    """{parent id: (its job type, its result)} of the job's parents still in the store, in the order of its after."""
    return {parent: ParentResult(job_type, result) for parent, job_type, result in conn.execute(_PARENT_RESULTS, (job_id,))}


_BATCH = "SELECT id, callback_id, created_at FROM batches WHERE id = ?"
# through idx_jobs_batch; the callback is in the batch too, and not counted
_BATCH_COUNTS = "SELECT status, count(*) FROM jobs WHERE batch_id = ?1 AND id IS NOT ?2 GROUP BY status"
_BATCH_JOBS = (
    "SELECT id, job_type, status, result, error FROM jobs WHERE batch_id = ?1 AND id IS NOT ?2 ORDER BY rowid LIMIT ?3 OFFSET ?4"
)


def batch(conn: sqlite3.Connection, batch_id: str) -> BatchRecord | None:
    """The batch, its members counted by status, and its callback's status; None if unknown."""
    found = conn.execute(_BATCH, (batch_id,)).fetchone()
    if found is None:
        return None
    _, callback_id, created_at = found
    counts = {status: int(n) for status, n in conn.execute(_BATCH_COUNTS, (batch_id, callback_id))}
    callback = None if callback_id is None else conn.execute("SELECT status FROM jobs WHERE id = ?", (callback_id,)).fetchone()
    return BatchRecord(batch_id, callback_id, created_at, total=sum(counts.values()), counts=counts,
                       callback_status=None if callback is None else callback[0])


def batch_jobs(conn: sqlite3.Connection, batch_id: str, *, limit: int | None, offset: int) -> list[BatchMember]:
    """The batch's members in insertion order; [] for an unknown batch."""
    found = conn.execute(_BATCH, (batch_id,)).fetchone()
    if found is None:
        return []
    rows = conn.execute(_BATCH_JOBS, (batch_id, found[1], -1 if limit is None else limit, offset)).fetchall()
    return [BatchMember(*row) for row in rows]
