"""The SQLite job store: every SQL statement on the jobs table, as named synchronous functions.

Nothing here knows about trio. Functions take an open ``sqlite3.Connection`` (autocommit
mode, see :func:`connect`); the ones that write expect the caller to hold a write
transaction (:func:`write_transaction`), so the Ledger can group many of them into one
commit. Every update of a running job is fenced by its lease token: an outcome from a
worker that lost its lease matches no row and changes nothing.
"""

from __future__ import annotations

import functools
import json
import math
import random
import sqlite3
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import attrs

from ... import states
from ...clock import format_ts, to_epoch
from ...sqlite_files import connect, write_transaction  # noqa: F401 - re-exported: store.connect, store.write_transaction
from ..base import FOREVER, Lease, NewJob, Settlement, cancelled_running_error, expired_error
from . import durable, workflows
from . import limits as limits_

# -- records --------------------------------------------------------------------------------



@attrs.frozen
class ClaimedRow:
    """A job just claimed: what the handler needs, and the lease that fences its outcome.
    Fields in the order of the claim's RETURNING clause."""

    id: str
    job_type: str
    payload: str
    attempts: int
    max_attempts: int
    lease_token: int
    created_at: str
    run_after: str
    priority: int
    trace: str | None = None
    expires_at: str | None = None


# -- inserts --------------------------------------------------------------------------------

# numbered parameters in NewJob's field order, without its unique key (see insert_jobs)
_INSERT = (
    "INSERT INTO jobs (id, job_type, payload, status, attempts, max_attempts, run_after, "
    "created_at, updated_at, priority) VALUES (?1, ?2, ?3, 'pending', 0, ?4, ?5, ?7, ?7, ?6)"
)
# When a row holds its unique key: idx_jobs_unique's condition, as migration 17 wrote it (an ON
# CONFLICT names a partial index by its columns and this very condition). A default job (unique_token
# NULL) holds it while waiting, pending, running or suspended; a job holding it only while pending
# (unique_while "pending"), under one lease token: a claim moves the token on, which frees it (a waiting
# one holds it as a pending one does: it is inserted with the token it holds it under; a suspended one
# too: SUSPEND takes it back as RELEASE does, see RETAKE).
HOLDS = (
    "unique_key IS NOT NULL AND (status = 'pending' OR status = 'running' OR status = 'waiting' OR status = 'suspended') "
    "AND (unique_token IS NULL OR unique_token = lease_token)"
)
# a row with a unique key: nothing is inserted while a job holding its type and key is pending or
# running (the partial index idx_jobs_unique); a duplicate id still fails, as in _INSERT
_INSERT_UNIQUE = (
    "INSERT INTO jobs (id, job_type, payload, status, attempts, max_attempts, run_after, "
    "created_at, updated_at, priority, unique_key, trace, expires_at) "
    "VALUES (?1, ?2, ?3, 'pending', 0, ?4, ?5, ?7, ?7, ?6, ?8, ?9, ?10) "
    f"ON CONFLICT (job_type, unique_key) WHERE {HOLDS} DO NOTHING"
)
# a row with a trace context or an expiry, and no unique key: _INSERT's columns and those two
# (a statement of its own, so that _INSERT, the hot path's, binds what it did before them)
_INSERT_MORE = (
    "INSERT INTO jobs (id, job_type, payload, status, attempts, max_attempts, run_after, "
    "created_at, updated_at, priority, trace, expires_at) VALUES (?1, ?2, ?3, 'pending', 0, ?4, ?5, ?7, ?7, ?6, ?8, ?9)"
)
# a row with a limit key, or a unique key held only while pending (unique_token ?12: 0, its lease
# token as inserted; see HOLDS): every column (issue 23's second part; the statements above bind
# what they did before it)
_INSERT_LIMITED = (
    "INSERT INTO jobs (id, job_type, payload, status, attempts, max_attempts, run_after, "
    "created_at, updated_at, priority, unique_key, trace, expires_at, limit_key, unique_token) "
    "VALUES (?1, ?2, ?3, 'pending', 0, ?4, ?5, ?7, ?7, ?6, ?8, ?9, ?10, ?11, ?12) "
    f"ON CONFLICT (job_type, unique_key) WHERE {HOLDS} DO NOTHING"
)
PENDING_ONLY = 0  # a new row's unique_token when its key is held only while pending (its lease_token)
# a row of a workflow (workflows.linked: parents, a policy, a batch): every column, its status as
# workflows.plan says (?13: waiting, pending, or cancelled with its error ?17), and has_children (?18)
# set when a later row of the call names it as a parent
_INSERT_LINKED = (
    "INSERT INTO jobs (id, job_type, payload, status, attempts, max_attempts, run_after, created_at, updated_at, "
    "priority, unique_key, trace, expires_at, limit_key, unique_token, waiting_for, on_parent_failure, batch_id, error, "
    "has_children) VALUES (?1, ?2, ?3, ?13, 0, ?4, ?5, ?7, ?7, ?6, ?8, ?9, ?10, ?11, ?12, ?14, ?15, ?16, ?17, ?18) "
    f"ON CONFLICT (job_type, unique_key) WHERE {HOLDS} DO NOTHING"
)
# the holder of a type and key: through idx_jobs_unique (the condition implies its own)
_HOLDER = f"SELECT id FROM jobs WHERE job_type = ? AND unique_key = ? AND {HOLDS}"


def insert_jobs(conn: sqlite3.Connection, rows: Sequence[NewJob]) -> list[str]:
    """Insert the rows; per row, the id stored for it: its own, or that of the waiting, pending
    or running job holding its type and unique key (then nothing is inserted for it). The
    caller holds the write transaction, so nothing changes between the insert and the look-up.

    Rows of a workflow (with parents, a policy or a batch) are inserted after the others, in
    their order, each waiting, pending or cancelled as its parents say (workflows.plan), with
    their edges; the call is checked first (:func:`~pipeline.backends.base.check_after`, every
    parent in the store or earlier in the call): a UsageError then writes nothing."""
    special = [row for row in rows if row.unique_key is not None or row.trace is not None or row.expires_at is not None
               or row.limit_key is not None or row.after or row.batch_id is not None or row.on_parent_failure is not None
               or row.idempotency_key is not None]
    if special and any(row.idempotency_key is not None for row in special):
        return insert_idempotent(conn, rows)
    # Rows without a key, a trace, an expiry or a limit key: one executemany of _INSERT, as before
    # unique keys, given plain 7-tuples (row[:7]): binding an eighth parameter, NULL, cost 7 % of an
    # insert, and sqlite3 binds an exact tuple faster than a NamedTuple (measured: 20,000 rows
    # in 115 ms, against 119 ms for NewJob as it was and 128 ms with the key bound)
    if not special:  # the common case
        conn.executemany(_INSERT, [row[:7] for row in rows])
        return [row.id for row in rows]
    linked = [row for row in special if workflows.linked(row)]
    if linked and any(row.unique_key is not None and not workflows.linked(row) for row in special):
        # of two rows with one type and key, the first in the call is inserted: with rows of a workflow
        # among the keyed ones, every keyed row goes the workflow's way, in the call's order
        linked = [row for row in special if workflows.linked(row) or row.unique_key is not None]
    statuses = workflows.parent_statuses(conn, rows) if linked else {}  # (raises before anything is written)
    if linked:
        taken = {row.id for row in linked}
        special = [row for row in special if row.id not in taken]
    if len(special) + len(linked) < len(rows):
        conn.executemany(_INSERT, [row[:7] for row in rows if row.unique_key is None and row.trace is None
                                   and row.expires_at is None and row.limit_key is None and not workflows.linked(row)])
    more = [(*row[:7], row.trace, row.expires_at) for row in special if row.unique_key is None and row.limit_key is None]
    if more:
        conn.executemany(_INSERT_MORE, more)
    # (NewJob's first eleven fields are the statement's first eleven parameters)
    limited = [(*row[:11], None) for row in special if row.unique_key is None and row.limit_key is not None]
    if limited:  # (no unique key: nothing to look up)
        conn.executemany(_INSERT_LIMITED, limited)
    held: dict[str, str] = {}
    params: tuple[Any, ...]
    for row in special:  # in order: of two rows with one type and key, the first is inserted
        if row.unique_key is None:
            continue
        if row.limit_key is None and row.unique_while is None:  # as before issue 23's limits
            sql, params = _INSERT_UNIQUE, row[:10]
        else:
            token = PENDING_ONLY if row.unique_while == "pending" else None
            sql, params = _INSERT_LIMITED, (*row[:11], token)
        if conn.execute(sql, params).rowcount == 0:
            (holder,) = conn.execute(_HOLDER, (row.job_type, row.unique_key)).fetchone()
            held[row.id] = holder
    if linked:
        held.update(_insert_linked(conn, linked, statuses))
    return [held.get(row.id, row.id) for row in rows]


def _insert_linked(conn: sqlite3.Connection, rows: Sequence[NewJob], statuses: dict[str, str]) -> dict[str, str]:
    """Insert the rows of a workflow, in order, with their edges (see insert_jobs); {row id: the
    holder's id} for those whose unique key was held (nothing inserted for them, nor edges)."""
    named = {parent for row in rows for parent in row.after}
    held: dict[str, str] = {}
    edges: list[tuple[str, str, int, int]] = []
    plain: list[tuple[Any, ...]] = []
    for row in rows:
        status, waiting_for, error, row_edges = workflows.plan(row, statuses)
        token = PENDING_ONLY if row.unique_while == "pending" else None
        params = (*row[:11], token, status, waiting_for, row.on_parent_failure, row.batch_id, error, int(row.id in named))
        if row.unique_key is None:
            plain.append(params)
        else:
            # in order, as other keyed rows (no row of the call waits for a keyed one: check_after); one
            # cancelled at once holds no key, so the holder is looked for first
            holder = holder_of(conn, row.job_type, row.unique_key) if status == "cancelled" else None
            if holder is None and conn.execute(_INSERT_LINKED, params).rowcount == 0:
                holder = holder_of(conn, row.job_type, row.unique_key)
            if holder is not None:
                held[row.id] = holder
                continue
        edges.extend(row_edges)
    if plain:
        conn.executemany(_INSERT_LINKED, plain)
    workflows.write_edges(conn, edges, flagged=(row.id for row in rows if row.id in named))
    return held


# -- idempotency keys (migration 16) -----------------------------------------------------------------

# the job a type and key name, if recorded less than their window ago (?3: now)
_KEY_JOB = "SELECT job_id FROM idempotency_keys WHERE job_type = ?1 AND key = ?2 AND expires_at > ?3"
# a key recorded (or recorded again: the row there, if any, has expired, else _KEY_JOB found it)
_KEY_RECORD = (
    "INSERT INTO idempotency_keys (job_type, key, job_id, expires_at) VALUES (?1, ?2, ?3, ?4) "
    "ON CONFLICT (job_type, key) DO UPDATE SET job_id = excluded.job_id, expires_at = excluded.expires_at"
)
# expired keys, up to twice as many as the insert records (?2, at least KEY_SWEEP_MIN): keys go faster
# than they come however many a call records (the Ledger writes many callers' rows in one call), through the index
_KEY_SWEEP = ("DELETE FROM idempotency_keys WHERE rowid IN "
              "(SELECT rowid FROM idempotency_keys WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2)")
KEY_SWEEP_MIN = 4


def insert_idempotent(conn: sqlite3.Connection, rows: Sequence[NewJob]) -> list[str]:
    """:func:`insert_jobs` for a call with idempotency keys (Backend.insert says what they promise):
    a row whose type and key are recorded and not expired answers the recorded id and is not
    inserted; a second row of the call with one type and key answers the first's; the others are
    inserted (each may still be held by its unique key) and their keys recorded for the id each
    answered. The caller's write transaction makes the look and the record one step for every
    process on the file."""
    answered: dict[str, str] = {}  # a row not inserted: the id its key names (a job's, or a row's of the call)
    first: dict[tuple[str, str], NewJob] = {}  # the row of the call that records a type and key
    fresh: list[NewJob] = []
    for row in rows:
        key = row.idempotency_key
        if key is None:
            fresh.append(row)
            continue
        taken = first.get((row.job_type, key))
        if taken is not None:
            answered[row.id] = taken.id
            continue
        found = conn.execute(_KEY_JOB, (row.job_type, key, row.created_at)).fetchone()
        if found is not None:
            answered[row.id] = str(found[0])
            continue
        first[(row.job_type, key)] = row
        fresh.append(row._replace(idempotency_key=None))
    stored = dict(zip((row.id for row in fresh), insert_jobs(conn, fresh))) if fresh else {}
    for (job_type, key), row in first.items():
        until = format_ts(to_epoch(row.created_at) + row.idempotency_seconds)
        conn.execute(_KEY_RECORD, (job_type, key, stored[row.id], until))
    if first:
        conn.execute(_KEY_SWEEP, (rows[0].created_at, max(KEY_SWEEP_MIN, 2 * len(first))))
    return [stored[row.id] if row.id in stored else stored.get(answered[row.id], answered[row.id]) for row in rows]


def holder_of(conn: sqlite3.Connection, job_type: str, unique_key: str) -> str | None:
    """The id of the waiting, pending or running job holding this type and key, if any."""
    row = conn.execute(_HOLDER, (job_type, unique_key)).fetchone()
    return None if row is None else str(row[0])


# -- claim and settle -------------------------------------------------------------------------

# rowid, not id, between the subquery and the update: the claim index holds the rowid,
# so each claimed row is found directly instead of through the primary-key index on id
# (measured: 7.2 -> 5.9 us per claimed row, 50,000 pending). ``counted`` is 1 for jobs that
# start at once (their attempt counts now) and 0 for jobs claimed ahead of a free worker
# (it counts when they start: see _START); the lease says the attempt it is, either way.
_CLAIM = """
UPDATE jobs
   SET status = 'running', attempts = attempts + :counted, started_at = CASE WHEN :counted THEN :now END,
       lease_token = lease_token + 1, lease_owner = :owner, lease_expires_at = :expires, updated_at = :now
 WHERE rowid IN (SELECT rowid FROM jobs
                  WHERE status = 'pending' AND job_type = :job_type AND run_after <= :now
                  ORDER BY priority, run_after, id
                  LIMIT :limit)
RETURNING id, job_type, payload, attempts + 1 - :counted, max_attempts, lease_token, created_at, run_after, priority, trace,
          expires_at
"""


# The same, for jobs picked beforehand (limits.pick_keyed: a type with per-key limits), by rowid
_CLAIM_PICKED = (
    _CLAIM[: _CLAIM.index(" WHERE rowid IN")].rstrip()
    + "\n WHERE rowid IN (SELECT value FROM json_each(:rowids)) AND status = 'pending'\n"
    + _CLAIM[_CLAIM.index("RETURNING"):]
)


# Whether a type has a due pending job: one seek of the claim's own index (idx_jobs_claim_order), read
# before its claim, which a process whose pools have room sends for every type it runs, mostly with
# nothing due for most of them. (Measured: 1.5 us for the look, 8 us for a claim that finds nothing.)
_DUE = ("SELECT 1 FROM jobs INDEXED BY idx_jobs_claim_order "
        "WHERE status = 'pending' AND job_type = ? AND run_after <= ? LIMIT 1")


def claim_rows(
    conn: sqlite3.Connection, job_type: str, limit: int, *, now: str, owner: str, expires: str, counted: bool = True,
) -> list[tuple[Any, ...]]:
    """pending → running for up to ``limit`` due jobs of one type, in priority then due
    order; the rows as tuples in :class:`ClaimedRow`'s field order (the Ledger's hot path
    makes its leases from them directly)."""
    rows = conn.execute(
        _CLAIM,
        {"owner": owner, "expires": expires, "now": now, "job_type": job_type, "limit": limit, "counted": int(counted)},
    ).fetchall()
    rows.sort(key=_claim_order)  # RETURNING's order is unspecified
    return rows


def _claim_order(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return row[8], row[7], row[0]  # priority, run_after, id


def claim(conn: sqlite3.Connection, job_type: str, limit: int, *, now: str, owner: str, expires: str) -> list[ClaimedRow]:
    """:func:`claim_rows` as records."""
    return [ClaimedRow(*r) for r in claim_rows(conn, job_type, limit, now=now, owner=owner, expires=expires)]


# A type's running jobs, for its global limit: through idx_jobs_status, so the read is bounded
# by the running rows (of every type: a few per worker), not by the type's rows of every status
# (idx_jobs_type). No index of (job_type) over the running rows only: it would be a schema change
# for a count that is already one seek and a short range.
_RUNNING_OF_TYPE = "SELECT count(*) FROM jobs INDEXED BY idx_jobs_status WHERE status = 'running' AND job_type = ?"


def running_of_type(conn: sqlite3.Connection, job_type: str) -> int:
    (n,) = conn.execute(_RUNNING_OF_TYPE, (job_type,)).fetchone()
    return int(n)


# The claim's one look before it claims (issue 23's control), both parts index seeks: of the
# requested types (?2 ...), those paused (paused_types' key); then a row of NULL if a pending job
# of a requested type that is not paused expired by now (?1): idx_jobs_expiring by expires_at,
# one seek that reads nothing when none is due, none of the types' other rows either way.
_LOOK = (
    "SELECT job_type FROM paused_types WHERE job_type IN ({types}) "
    "UNION ALL "
    "SELECT NULL FROM (SELECT 1 FROM jobs INDEXED BY idx_jobs_expiring "
    "WHERE status = 'pending' AND expires_at IS NOT NULL AND expires_at <= ?1 AND job_type IN ({types}) "
    "AND job_type NOT IN (SELECT job_type FROM paused_types) LIMIT 1)"
)
# What the look's NULL leads to, for the types the claim takes (?4 ...): their expired pending
# jobs end cancelled with base.expired_error's text (?2 and ?3 around each one's expires_at).
# Through the same index; a cancelled job frees its unique key (idx_jobs_unique holds pending
# and running rows only).
_EXPIRE = (
    "UPDATE jobs INDEXED BY idx_jobs_expiring SET status = 'cancelled', error = ?2 || expires_at || ?3, updated_at = ?1 "
    "WHERE status = 'pending' AND expires_at IS NOT NULL AND expires_at <= ?1{types} RETURNING id"
)
_EXPIRED_TEXT = tuple(expired_error("\0").split("\0"))  # (before, after) the time


@functools.lru_cache(maxsize=64)
def _look_sql(types: int) -> str:
    return _LOOK.format(types=", ".join(f"?{i}" for i in range(2, types + 2)))


@functools.lru_cache(maxsize=64)
def _expire_sql(types: int | None) -> str:
    """:data:`_EXPIRE` for that many types; None: of every type (the rescue's)."""
    if types is None:
        return _EXPIRE.format(types="")
    return _EXPIRE.format(types=f" AND job_type IN ({', '.join(f'?{i}' for i in range(4, types + 4))})")


def expire_pending(conn: sqlite3.Connection, now: str, job_types: Sequence[str] | None = None) -> list[str]:
    """Pending jobs of ``job_types`` (None: of any type) whose ``expires_at`` is at or before
    ``now`` → cancelled, with :func:`~pipeline.backends.base.expired_error`, their edges applied;
    their ids. (A waiting job does not expire: it is not pending.)"""
    sql = _expire_sql(None if job_types is None else len(job_types))
    expired = [job_id for (job_id,) in conn.execute(sql, (now, *_EXPIRED_TEXT, *(job_types or ())))]
    workflows.after_ended(conn, expired, now=now)
    return expired


def claim_leases(
    conn: sqlite3.Connection, now: str, *, wants: Mapping[str, int], owner: str, lease_seconds: float,
    start: Mapping[str, int] | None = None, limits: Mapping[str, int] | None = None,
    rates: Mapping[str, tuple[int, float]] | None = None, key_limits: Mapping[str, int] | None = None,
    at: float | None = None,
) -> list[Lease]:
    """Claim for every job type of ``wants`` in one go (the Ledger's claim command): of each
    type, the first ``start[job_type]`` start at once (all when ``start`` is None), the rest
    are claimed ahead; in that order, so a FIFO hands the started ones to the free workers.

    A type in ``limits`` takes at most its limit less its running jobs: counted in the same
    write transaction as the claim, which every writer of the file takes in turn (BEGIN
    IMMEDIATE), so no other process's claim can come between the count and the claim. So are
    a type's rate (``rates``: at most N less its claims within the window, each recorded at
    ``at``, the claim's instant, epoch seconds: now by default) and its per-key limits
    (``key_limits``: its jobs picked round-robin across their keys, see limits.py). A type in
    none of them runs the statements it ran before them.

    A paused type is not claimed; the expired pending jobs of the types claimed are ended
    (cancelled) first: one statement (:data:`_LOOK`) says whether there are any, and which
    types are paused, in this transaction."""
    types = [job_type for job_type, limit in wants.items() if limit > 0]
    if not types:
        return []
    paused: set[str] = set()
    expired = False
    for (job_type,) in conn.execute(_look_sql(len(types)), (now, *types)):
        if job_type is None:
            expired = True
        else:
            paused.add(job_type)
    if expired:  # rare: a job with an expiry that nobody started in time
        expire_pending(conn, now, [t for t in types if t not in paused])
    expires = format_ts(to_epoch(now) + lease_seconds)
    claimed: list[Lease] = []
    for job_type, limit in wants.items():
        if job_type in paused:
            continue
        if limits and job_type in limits and limit > 0:
            limit = min(limit, limits[job_type] - running_of_type(conn, job_type))
        rate = rates.get(job_type) if rates else None
        if rate is not None and limit > 0:
            if at is None:
                at = time.time()  # (under the write lock: instants rise from one claim to the next)
            limit = min(limit, limits_.rate_room(conn, job_type, *rate, at=at))
        if limit <= 0:
            continue
        now_n = limit if start is None else max(0, min(limit, start.get(job_type, 0)))
        before = len(claimed)
        if key_limits and job_type in key_limits:
            picked = limits_.pick_keyed(conn, job_type, limit, key_limits[job_type], now=now)
            claimed.extend(claim_picked(conn, picked[:now_n], now=now, owner=owner, expires=expires))
            claimed.extend(claim_picked(conn, picked[now_n:], now=now, owner=owner, expires=expires, counted=False))
        elif conn.execute(_DUE, (job_type, now)).fetchone() is not None:  # (nothing due: no claim, a fifth of its cost)
            got = 0
            if now_n:
                rows = claim_rows(conn, job_type, now_n, now=now, owner=owner, expires=expires)
                claimed.extend(Lease(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], True, row[9], row[10])
                               for row in rows)
                got = len(rows)
            if limit > now_n and got == now_n:  # (fewer than asked: nothing more is due)
                rows = claim_rows(conn, job_type, limit - now_n, now=now, owner=owner, expires=expires, counted=False)
                claimed.extend(Lease(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], False, row[9], row[10])
                               for row in rows)
        if rate is not None:
            limits_.record_claims(conn, job_type, len(claimed) - before, at=at)  # type: ignore[arg-type]
    return claimed


def claim_picked(
    conn: sqlite3.Connection, picked: Sequence[limits_.Job], *, now: str, owner: str, expires: str, counted: bool = True,
) -> list[Lease]:
    """pending → running for the jobs ``picked`` (limits.pick_keyed's), as leases in that order."""
    if not picked:
        return []
    params = {"owner": owner, "expires": expires, "now": now, "counted": int(counted),
              "rowids": json.dumps([job[3] for job in picked])}
    rows = {row[0]: row for row in conn.execute(_CLAIM_PICKED, params)}
    return [Lease(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], counted, row[9], row[10])
            for row in (rows.get(job[2]) for job in picked) if row is not None]


_FENCE = "WHERE id = ? AND status = 'running' AND lease_token = ?"
# Every statement that sends a job back to pending sets this (the job's other columns are as they
# were): a job holding its unique key only while pending, whose claim freed it, holds it again
# (unique_token = its lease token, see HOLDS) if no waiting, pending, running or suspended job holds it now, and goes on
# without it (one less: never its token, which only grows) otherwise, never failing for it. A
# default job's NULL stays NULL: its first test, and nothing else is read (measured: 20,000
# retries cost what they did). The subquery seeks idx_jobs_unique; the row itself, running under
# a token it does not hold (or finished), is never its own holder.
RETAKE = (
    "unique_token = CASE WHEN unique_token IS NULL THEN NULL WHEN EXISTS (SELECT 1 FROM jobs AS h "
    "WHERE h.job_type = jobs.job_type AND h.unique_key = jobs.unique_key AND h.unique_key IS NOT NULL "
    "AND (h.status = 'pending' OR h.status = 'running' OR h.status = 'waiting' OR h.status = 'suspended') "
    "AND (h.unique_token IS NULL OR h.unique_token = h.lease_token)) "
    "THEN lease_token - 1 ELSE lease_token END"
)
# The outcomes that send a job back to pending (RETRY, RELEASE, SNOOZE) are fenced by no cancel
# request as well: one whose cancel was requested ends cancelled instead (_STOPPED, see settle).
_FENCE_BACK = f"{_FENCE} AND cancel_requested = 0"
# The outcomes that end a job are written for jobs without children (workflows: has_children = 0)
# first: the column is read from the row the statement reads anyway, so that a plain job's outcome
# costs no look for children. Only when such a statement writes fewer rows than it was given (a
# stale lease, or a job with children) does its twin for jobs with children (_WITH_CHILDREN) run,
# and the edges of those it ended are applied (see settle).
_CHILDLESS = " AND has_children = 0"
_SUCCEED = (
    "UPDATE jobs SET status = 'completed', updated_at = ?, lease_owner = NULL, lease_expires_at = NULL "
    f"{_FENCE}{_CHILDLESS}"
)
# a handler's return value stored too (_SUCCEED, the hot path's, binds what it did before results)
_SUCCEED_RESULT = (
    "UPDATE jobs SET status = 'completed', result = ?, updated_at = ?, lease_owner = NULL, lease_expires_at = NULL "
    f"{_FENCE}{_CHILDLESS}"
)
_RETRY = (
    "UPDATE jobs SET status = 'pending', run_after = ?, error = ?, updated_at = ?, progress = NULL, progress_message = NULL, "
    f"lease_owner = NULL, lease_expires_at = NULL, {RETAKE} {_FENCE_BACK}"
)
_BURY = f"UPDATE jobs SET status = 'dead', error = ?, updated_at = ?, lease_owner = NULL, lease_expires_at = NULL {_FENCE}"
_RELEASE = (  # the attempt is given back if it was counted (it started)
    "UPDATE jobs SET status = 'pending', attempts = max(attempts - (started_at IS NOT NULL), 0), started_at = NULL, "
    "run_after = ?, updated_at = ?, progress = NULL, progress_message = NULL, lease_owner = NULL, lease_expires_at = NULL, "
    f"{RETAKE} {_FENCE_BACK}"
)
_START = (  # a job claimed ahead starts: its attempt counts from now (twice is once)
    f"UPDATE jobs SET attempts = attempts + (started_at IS NULL), started_at = coalesce(started_at, ?) {_FENCE}"
)
_UNCLAIM = (  # a lease that expired before its job started: back in its place, nothing counted
    "UPDATE jobs SET status = 'pending', updated_at = ?, progress = NULL, progress_message = NULL, lease_owner = NULL, "
    f"lease_expires_at = NULL, {RETAKE} {_FENCE}"
)
# its handler stopped on a cancel request (or its worker died meanwhile: the rescue's)
_CANCEL = (
    "UPDATE jobs SET status = 'cancelled', error = ?, updated_at = ?, cancel_requested = 0, lease_owner = NULL, "
    f"lease_expires_at = NULL {_FENCE}"
)
# Snooze(delay): pending after the delay, the attempt given back as RELEASE gives it back, one
# more snooze; or, past the limit (?1), dead with the error (?2), the attempt given back too (a
# snooze is no failed attempt).
_SNOOZE = f"""
UPDATE jobs
   SET status = CASE WHEN snoozes + 1 > ?1 THEN 'dead' ELSE 'pending' END,
       error = CASE WHEN snoozes + 1 > ?1 THEN ?2 ELSE error END,
       run_after = CASE WHEN snoozes + 1 > ?1 THEN run_after ELSE ?3 END,
       attempts = max(attempts - (started_at IS NOT NULL), 0), started_at = NULL,
       progress = CASE WHEN snoozes + 1 > ?1 THEN progress END,
       progress_message = CASE WHEN snoozes + 1 > ?1 THEN progress_message END,
       snoozes = snoozes + 1, updated_at = ?4, lease_owner = NULL, lease_expires_at = NULL, {RETAKE}
 WHERE id = ?5 AND status = 'running' AND lease_token = ?6 AND cancel_requested = 0
"""
# A RETRY, RELEASE or SNOOZE of a job whose cancel was requested: cancelled instead (a cancel
# racing the job's own outcome leaves one final state, never a retry); attempts as they are.
_STOPPED = (
    "UPDATE jobs SET status = 'cancelled', error = ?, updated_at = ?, cancel_requested = 0, lease_owner = NULL, "
    f"lease_expires_at = NULL {_FENCE} AND cancel_requested = 1"
)
STOPPED = "cancelled while running (cancel requested); its attempt ended: {}"  # the outcome's error, or 'released'
_BACK = (states.Transition.RETRY, states.Transition.RELEASE, states.Transition.SNOOZE)
# SUSPEND (durable functions: ctx.sleep, ctx.wait_for): SNOOZE to another status. The attempt given
# back as RELEASE gives it back, the lease cleared, expires_at cleared (it applies to the first start
# only), snoozes and progress as they were; suspended until ?2 (FOREVER: no deadline), waiting for the
# signal ?1 (NULL: a sleep). Fenced by no cancel request, as the outcomes that send a job back are.
# The job's key is taken back as RELEASE takes it (RETAKE): a suspended job holds it as a pending one.
_SUSPEND = (
    "UPDATE jobs SET status = 'suspended', awaiting_signal = ?1, run_after = ?2, "
    "attempts = max(attempts - (started_at IS NOT NULL), 0), started_at = NULL, expires_at = NULL, updated_at = ?3, "
    f"lease_owner = NULL, lease_expires_at = NULL, {RETAKE} "
    "WHERE id = ?4 AND status = 'running' AND lease_token = ?5 AND cancel_requested = 0"
)
# SUSPEND awaiting a signal that was sent already: pending, due now (nothing to wait for)
_SUSPEND_SIGNALLED = (
    "UPDATE jobs SET status = 'pending', awaiting_signal = NULL, run_after = ?1, "
    "attempts = max(attempts - (started_at IS NOT NULL), 0), started_at = NULL, expires_at = NULL, updated_at = ?1, "
    f"lease_owner = NULL, lease_expires_at = NULL, {RETAKE} "
    "WHERE id = ?2 AND status = 'running' AND lease_token = ?3 AND cancel_requested = 0"
)
# settle's statements for the other outcomes that end a job (or may: a snooze past its limit), for jobs
# without children (_BURY and _CANCEL as they are: the rescue's, for any job, which looks for children after)
_ALONE = {sql: f"{sql.rstrip()}{_CHILDLESS}" for sql in (_BURY, _CANCEL, _SNOOZE, _STOPPED)}
# each one's twin for jobs with children (same parameters)
_WITH_CHILDREN = {
    **{sql: sql.replace(_CHILDLESS, " AND has_children = 1") for sql in (_SUCCEED, _SUCCEED_RESULT)},
    **{sql: f"{sql.rstrip()} AND has_children = 1" for sql in (_BURY, _CANCEL, _SNOOZE, _STOPPED)},
}


def settle(conn: sqlite3.Connection, items: Sequence[Settlement], *, now: str) -> int:
    """Apply outcomes, grouped by statement (one executemany each). Returns how many rows
    changed; fewer than ``len(items)`` means some leases were stale and were ignored.

    The statements that send a job back to pending change nothing if its cancel was requested;
    only when one of them changed fewer rows than it was given (a stale lease, or a cancel
    request: both rare) does :data:`_STOPPED` end those with a request cancelled.

    Every job with children ended here has its edges applied (workflows.after_ended) in the same
    transaction: the statements that end a job are written for jobs without children first, and
    for the others (:data:`_WITH_CHILDREN`) only when those wrote fewer rows than they were given.
    A batch of plain jobs' outcomes runs no statement more than it did before workflows."""
    by_sql: dict[str, list[tuple[Any, ...]]] = {}
    now_epoch: float | None = None
    params: tuple[Any, ...]
    suspends: list[Settlement] = []
    for s in items:
        transition = s.transition
        if transition is states.Transition.SUCCEED:
            if s.result is None:
                sql, params = _SUCCEED, (now, s.id, s.token)
            else:
                sql, params = _SUCCEED_RESULT, (s.result, now, s.id, s.token)
        elif transition is states.Transition.RETRY:
            if now_epoch is None:
                now_epoch = to_epoch(now)
            sql, params = _RETRY, (format_ts(now_epoch + s.delay), s.error, now, s.id, s.token)
        elif transition is states.Transition.BURY:
            sql, params = _BURY, (s.error, now, s.id, s.token)
        elif transition is states.Transition.RELEASE:
            sql, params = _RELEASE, (now, now, s.id, s.token)
        elif transition is states.Transition.START:
            sql, params = _START, (now, s.id, s.token)
        elif transition is states.Transition.CANCEL:
            sql, params = _CANCEL, (s.error, now, s.id, s.token)
        elif transition is states.Transition.SNOOZE:
            if now_epoch is None:
                now_epoch = to_epoch(now)
            sql, params = _SNOOZE, (s.snooze_limit, s.error, format_ts(now_epoch + s.delay), now, s.id, s.token)
        elif transition is states.Transition.STEP:
            if s.step is None:
                raise ValueError(f"job {s.id}: a STEP outcome without its step")
            sql, params = durable.PUT_STEP, durable.step_params(s.id, s.token, s.step)
        elif transition is states.Transition.SUSPEND:
            suspends.append(s)
            continue
        else:
            raise ValueError(f"{transition!r} is not an outcome")
        by_sql.setdefault(sql, []).append(params)
    changed = 0
    ended: list[str] = []  # ids of jobs with children written (each statement's last parameter but one)
    for sql, params_list in by_sql.items():
        n = _write(conn, sql, params_list, ended)
        if n < len(params_list) and sql in (_RETRY, _RELEASE, _SNOOZE):
            kind = _BACK[(_RETRY, _RELEASE, _SNOOZE).index(sql)]
            stopped = [(STOPPED.format(s.error if s.error is not None else "released"), now, s.id, s.token)
                       for s in items if s.transition is kind]
            n += _write(conn, _STOPPED, stopped, ended, expected=len(params_list) - n)
        changed += n
    if suspends:
        changed += _suspend(conn, suspends, now=now, ended=ended)
    if ended:
        workflows.after_ended(conn, ended, now=now)
    return changed


def _suspend(conn: sqlite3.Connection, items: Sequence[Settlement], *, now: str, ended: list[str]) -> int:
    """SUSPEND outcomes (see :data:`_SUSPEND`): each one's step written first, under its lease (not
    counted: the outcome is the job's row), then the job suspended; or, awaiting a signal sent to it
    already, pending due now (woken: the Ledger nudges its Poller); or, its cancel requested, cancelled
    (:data:`_STOPPED`). Returns how many jobs it wrote (fewer than ``items``: stale leases)."""
    steps = [durable.step_params(s.id, s.token, s.step) for s in items if s.step is not None]
    if steps:
        conn.executemany(durable.PUT_STEP, steps)
    now_epoch = to_epoch(now)
    plain: list[tuple[Any, ...]] = []
    changed = 0
    for s in items:
        if s.awaiting is not None and durable.has_signal(conn, s.id, s.awaiting):
            if conn.execute(_SUSPEND_SIGNALLED, (now, s.id, s.token)).rowcount:
                durable.woke([s.id])
                changed += 1
            continue
        # (a time past FOREVER would not sort as text: none is stored; the engine refuses such a delay anyway)
        until = FOREVER if math.isinf(s.delay) or now_epoch + s.delay >= to_epoch(FOREVER) else format_ts(now_epoch + s.delay)
        plain.append((s.awaiting, until, now, s.id, s.token))
    if plain:
        changed += conn.executemany(_SUSPEND, plain).rowcount
    if changed < len(items):  # stale, or asked to stop: those asked end cancelled (the others change nothing)
        stopped = [(STOPPED.format("suspended"), now, s.id, s.token) for s in items]
        changed += _write(conn, _STOPPED, stopped, ended, expected=len(items) - changed)
    return changed


def _write(conn: sqlite3.Connection, sql: str, params_list: list[tuple[Any, ...]], ended: list[str], *,
           expected: int | None = None) -> int:
    """One statement of settle's for every item of its kind; for those that end a job, the twin for
    jobs with children too when fewer than ``expected`` (all of them) were written, their ids added
    to ``ended``. Returns how many rows changed."""
    n = conn.executemany(_ALONE.get(sql, sql), params_list).rowcount
    if n < (len(params_list) if expected is None else expected) and sql in _WITH_CHILDREN:
        parents = conn.executemany(_WITH_CHILDREN[sql], params_list).rowcount
        if parents:
            ended.extend(params[-2] for params in params_list)
        n += parents
    return n


def settle_each(conn: sqlite3.Connection, items: Sequence[Settlement], *, now: str) -> list[bool]:
    """Like :func:`settle`, but tells which items changed a row (the slow path for stale leases)."""
    return [settle(conn, [item], now=now) == 1 for item in items]


def set_progress(conn: sqlite3.Connection, job_id: str, token: int, fraction: float, message: str | None) -> bool:
    """A running job's progress, fenced like an outcome: True if written."""
    return conn.execute(f"UPDATE jobs SET progress = ?, progress_message = ? {_FENCE}",
                        (fraction, message, job_id, token)).rowcount == 1


_RENEW = f"UPDATE jobs SET lease_expires_at = ? {_FENCE}"


def renew(conn: sqlite3.Connection, leases: Iterable[tuple[str, int]], *, expires: str) -> list[str]:
    """Push the expiry of held leases forward; return the ids whose lease is no longer held."""
    lost = []
    for job_id, token in leases:
        if conn.execute(_RENEW, (expires, job_id, token)).rowcount == 0:
            lost.append(job_id)
    return lost


_EXPIRED = (
    "SELECT id, lease_token, attempts, max_attempts, lease_owner, started_at, cancel_requested FROM jobs "
    "WHERE status = 'running' AND lease_expires_at < ?"
)
_RESCUE_CANCELLED = cancelled_running_error("its cancel was requested")


def rescue_expired(
    conn: sqlite3.Connection, *, now: str, base_seconds: float, rng: random.Random | None = None,
    spare: Collection[tuple[str, int]] = (),
) -> list[tuple[str, states.Transition]]:
    """running jobs whose lease ran out (their worker died, or lost them) → pending with
    backoff, or dead; a job that never started → pending in its place, nothing counted; a job
    whose cancel was requested → cancelled, started or not. Then every pending job whose
    ``expires_at`` passed, of any type (those of the types nobody claims) → cancelled.

    ``spare``: the leases (id, token) the caller still holds. A live process does not rescue
    those (if its renewals failed, the database locked by a third process for longer than a
    lease, they are still running here and its heartbeat renews them once it can); every
    other expired lease is rescued, the caller's own included (a row left running that no
    worker of it holds would otherwise stay running for as long as the process lives).

    Every job it ends (dead, cancelled) has its edges applied, in the caller's transaction.
    """
    done = []
    now_epoch = to_epoch(now)
    for job_id, token, attempts, max_attempts, owner, started_at, cancelling in conn.execute(_EXPIRED, (now,)).fetchall():
        if (job_id, token) in spare:
            continue
        if cancelling:
            conn.execute(_CANCEL, (_RESCUE_CANCELLED, now, job_id, token))
            done.append((job_id, states.Transition.RESCUE_CANCEL))
            continue
        if started_at is None:
            conn.execute(_UNCLAIM, (now, job_id, token))
            done.append((job_id, states.Transition.UNCLAIM))
            continue
        decision = states.rescue(attempts=attempts, max_attempts=max_attempts, base_seconds=base_seconds, rng=rng)
        error = f"lease expired: worker {owner or '?'} stopped renewing it during attempt {attempts}"
        if decision.transition is states.Transition.RESCUE:
            conn.execute(_RETRY, (format_ts(now_epoch + decision.delay), error, now, job_id, token))
        else:
            conn.execute(_BURY, (error, now, job_id, token))
        done.append((job_id, decision.transition))
    workflows.after_ended(conn, [job_id for job_id, how in done if how in _RESCUE_ENDS], now=now)
    done.extend((job_id, states.Transition.EXPIRE) for job_id in expire_pending(conn, now))
    return done


_RESCUE_ENDS = (states.Transition.RESCUE_CANCEL, states.Transition.RESCUE_BURY)


def pending_job_types(conn: sqlite3.Connection) -> list[str]:
    """Distinct job types with pending rows, by seeking the claim index once per type."""
    found: list[str] = []
    last = ""
    while True:
        (job_type,) = conn.execute(
            "SELECT min(job_type) FROM jobs WHERE status = 'pending' AND job_type > ?", (last,)
        ).fetchone()
        if job_type is None:
            return found
        found.append(job_type)
        last = job_type


def bury_unknown_types(conn: sqlite3.Connection, job_types: Iterable[str], *, now: str, due_before: str) -> int:
    """Pending jobs of types no code here knows, due since before ``due_before`` (nobody
    claimed them meanwhile) → dead, with an error that says why; but not the types a
    worker knows that was alive since ``due_before``, or is alive now (see :func:`live_job_types`).
    Their edges are applied."""
    live = live_job_types(conn, since=due_before, now=now)
    buried: list[str] = []
    for job_type in job_types:
        if job_type in live:
            continue
        buried.extend(job_id for (job_id,) in conn.execute(
            "UPDATE jobs SET status = 'dead', error = ?, updated_at = ? "
            "WHERE status = 'pending' AND job_type = ? AND run_after <= ? RETURNING id",
            (
                f"no worker handles job type {job_type!r}: no live process registers a handler for it "
                "(it may be registered without one, or not at all); add a handler, then retry the job",
                now, job_type, due_before,
            ),
        ))
    workflows.after_ended(conn, buried, now=now)
    return len(buried)


# -- worker processes ---------------------------------------------------------------------------

_BEAT = """
INSERT INTO workers (owner, job_types, started_at, heartbeat_at, lease_seconds) VALUES (:owner, :types, :now, :now, :lease)
ON CONFLICT (owner) DO UPDATE SET job_types = :types, heartbeat_at = :now, lease_seconds = :lease
"""


def beat(conn: sqlite3.Connection, owner: str, job_types: Sequence[str], *, now: str, lease_seconds: float) -> None:
    """Record that the worker process ``owner``, knowing ``job_types``, is alive; it beats
    again within ``lease_seconds`` (three times, in fact) for as long as it lives."""
    conn.execute(_BEAT, {"owner": owner, "types": json.dumps(sorted(job_types)), "now": now, "lease": lease_seconds})


def forget_worker(conn: sqlite3.Connection, owner: str) -> None:
    conn.execute("DELETE FROM workers WHERE owner = ?", (owner,))


_LIVE = """
SELECT job_types FROM workers
 WHERE heartbeat_at >= :since
    OR julianday(heartbeat_at) + lease_seconds / 86400.0 >= julianday(:now)
"""


def live_job_types(conn: sqlite3.Connection, *, since: str, now: str) -> set[str]:
    """The job types of the workers that beat since ``since``, or that are alive by their own
    clock: a worker beats every third of its lease, so one that beat within a lease lives."""
    types: set[str] = set()
    for (text,) in conn.execute(_LIVE, {"since": since, "now": now}):
        try:
            types.update(json.loads(text))
        except (ValueError, TypeError):
            continue
    return types
