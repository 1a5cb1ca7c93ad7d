"""The SQLite job store: every SQL statement on the jobs table, as named synchronous functions.

Nothing here knows about trio. Functions take an open ``sqlite3.Connection`` (autocommit
mode, see :func:`connect`); the ones that write expect the caller to hold a write
transaction (:func:`write_transaction`), so the Ledger can group many of them into one
commit. Every update of a running job is fenced by its lease token: an outcome from a
worker that lost its lease matches no row and changes nothing.
"""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import attrs

from ... import states
from ...clock import format_ts, to_epoch
from ...sqlite_files import connect, write_transaction  # noqa: F401 - re-exported: store.connect, store.write_transaction
from ..base import Lease, NewJob, Settlement

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


# -- inserts --------------------------------------------------------------------------------

# numbered parameters in NewJob's field order, without its unique key (see insert_jobs)
_INSERT = (
    "INSERT INTO jobs (id, job_type, payload, status, attempts, max_attempts, run_after, "
    "created_at, updated_at, priority) VALUES (?1, ?2, ?3, 'pending', 0, ?4, ?5, ?7, ?7, ?6)"
)
# a row with a unique key: nothing is inserted while a pending or running job holds its type
# and key (the partial index idx_jobs_unique, named by its columns and WHERE); a duplicate id
# still fails, as in _INSERT
_INSERT_UNIQUE = (
    "INSERT INTO jobs (id, job_type, payload, status, attempts, max_attempts, run_after, "
    "created_at, updated_at, priority, unique_key, trace) VALUES (?1, ?2, ?3, 'pending', 0, ?4, ?5, ?7, ?7, ?6, ?8, ?9) "
    "ON CONFLICT (job_type, unique_key) WHERE unique_key IS NOT NULL AND status IN ('pending', 'running') DO NOTHING"
)
# a row with a trace context and no unique key: _INSERT's columns and the trace (its own statement,
# so that _INSERT, the hot path's, binds what it did before traces)
_INSERT_TRACED = (
    "INSERT INTO jobs (id, job_type, payload, status, attempts, max_attempts, run_after, "
    "created_at, updated_at, priority, trace) VALUES (?1, ?2, ?3, 'pending', 0, ?4, ?5, ?7, ?7, ?6, ?8)"
)
_HOLDER = "SELECT id FROM jobs WHERE job_type = ? AND unique_key = ? AND status IN ('pending', 'running')"


def insert_jobs(conn: sqlite3.Connection, rows: Sequence[NewJob]) -> list[str]:
    """Insert the rows; per row, the id stored for it: its own, or that of the pending or
    running job holding its type and unique key (then nothing is inserted for it). The
    caller holds the write transaction, so nothing changes between the insert and the look-up."""
    special = [row for row in rows if row.unique_key is not None or row.trace is not None]
    # Rows without a key or a trace: one executemany of _INSERT, as before unique keys, given
    # plain 7-tuples (row[:7]): binding an eighth parameter, NULL, cost 7 % of an insert, and
    # sqlite3 binds an exact tuple faster than a NamedTuple (measured: 20,000 rows in 115
    # ms, against 119 ms for NewJob as it was and 128 ms with the key bound)
    if not special:  # the common case
        conn.executemany(_INSERT, [row[:7] for row in rows])
        return [row.id for row in rows]
    if len(special) < len(rows):
        conn.executemany(_INSERT, [row[:7] for row in rows if row.unique_key is None and row.trace is None])
    traced = [(*row[:7], row.trace) for row in special if row.unique_key is None]
    if traced:
        conn.executemany(_INSERT_TRACED, traced)
    held: dict[str, str] = {}
    for row in special:  # in order: of two rows with one type and key, the first is inserted
        if row.unique_key is None:
            continue
        params = (row.id, row.job_type, row.payload, row.max_attempts, row.run_after, row.priority, row.created_at,
                  row.unique_key, row.trace)
        if conn.execute(_INSERT_UNIQUE, params).rowcount == 0:
            (holder,) = conn.execute(_HOLDER, (row.job_type, row.unique_key)).fetchone()
            held[row.id] = holder
    return [held.get(row.id, row.id) for row in rows]


def holder_of(conn: sqlite3.Connection, job_type: str, unique_key: str) -> str | None:
    """The id of the pending or running job holding this type and key, if any."""
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
RETURNING id, job_type, payload, attempts + 1 - :counted, max_attempts, lease_token, created_at, run_after, priority, trace
"""


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


def claim_leases(
    conn: sqlite3.Connection, now: str, *, wants: Mapping[str, int], owner: str, lease_seconds: float,
    start: Mapping[str, int] | None = None, limits: Mapping[str, int] | None = None,
) -> list[Lease]:
    """Claim for every job type of ``wants`` in one go (the Ledger's claim command): of each
    type, the first ``start[job_type]`` start at once (all when ``start`` is None), the rest
    are claimed ahead; in that order, so a FIFO hands the started ones to the free workers.

    A type in ``limits`` takes at most its limit less its running jobs: counted in the same
    write transaction as the claim, which every writer of the file takes in turn (BEGIN
    IMMEDIATE), so no other process's claim can come between the count and the claim."""
    expires = format_ts(to_epoch(now) + lease_seconds)
    claimed: list[Lease] = []
    for job_type, limit in wants.items():
        if limits and job_type in limits and limit > 0:
            limit = min(limit, limits[job_type] - running_of_type(conn, job_type))
        if limit <= 0:
            continue
        now_n = limit if start is None else max(0, min(limit, start.get(job_type, 0)))
        got = 0
        if now_n:
            rows = claim_rows(conn, job_type, now_n, now=now, owner=owner, expires=expires)
            claimed.extend(Lease(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], True, row[9]) for row in rows)
            got = len(rows)
        if limit > now_n and got == now_n:  # (fewer than asked: nothing more is due)
            rows = claim_rows(conn, job_type, limit - now_n, now=now, owner=owner, expires=expires, counted=False)
            claimed.extend(Lease(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], False, row[9])
                           for row in rows)
    return claimed


_FENCE = "WHERE id = ? AND status = 'running' AND lease_token = ?"
_SUCCEED = f"UPDATE jobs SET status = 'completed', updated_at = ?, lease_owner = NULL, lease_expires_at = NULL {_FENCE}"
_RETRY = (
    "UPDATE jobs SET status = 'pending', run_after = ?, error = ?, updated_at = ?, "
    f"lease_owner = NULL, lease_expires_at = NULL {_FENCE}"
)
_BURY = f"UPDATE jobs SET status = 'dead', error = ?, updated_at = ?, lease_owner = NULL, lease_expires_at = NULL {_FENCE}"
_RELEASE = (  # the attempt is given back if it was counted (it started)
    "UPDATE jobs SET status = 'pending', attempts = max(attempts - (started_at IS NOT NULL), 0), started_at = NULL, "
    f"run_after = ?, updated_at = ?, lease_owner = NULL, lease_expires_at = NULL {_FENCE}"
)
_START = (  # a job claimed ahead starts: its attempt counts from now (twice is once)
    f"UPDATE jobs SET attempts = attempts + (started_at IS NULL), started_at = coalesce(started_at, ?) {_FENCE}"
)
_UNCLAIM = (  # a lease that expired before its job started: back in its place, nothing counted
    f"UPDATE jobs SET status = 'pending', updated_at = ?, lease_owner = NULL, lease_expires_at = NULL {_FENCE}"
)
_RENEW = f"UPDATE jobs SET lease_expires_at = ? {_FENCE}"


_SETTLE_SQL = {
    states.Transition.SUCCEED: _SUCCEED,
    states.Transition.RETRY: _RETRY,
    states.Transition.BURY: _BURY,
    states.Transition.RELEASE: _RELEASE,
    states.Transition.START: _START,
}


def settle(conn: sqlite3.Connection, items: Sequence[Settlement], *, now: str) -> int:
    """Apply outcomes, grouped by kind (one executemany each). Returns how many rows changed;
    fewer than ``len(items)`` means some leases were stale and were ignored."""
    by_kind: dict[states.Transition, list[tuple[Any, ...]]] = {}
    now_epoch: float | None = None
    for s in items:
        if s.transition is states.Transition.SUCCEED:
            params: tuple[Any, ...] = (now, s.id, s.token)
        elif s.transition is states.Transition.RETRY:
            if now_epoch is None:
                now_epoch = to_epoch(now)
            params = (format_ts(now_epoch + s.delay), s.error, now, s.id, s.token)
        elif s.transition is states.Transition.BURY:
            params = (s.error, now, s.id, s.token)
        elif s.transition is states.Transition.RELEASE:
            params = (now, now, s.id, s.token)
        elif s.transition is states.Transition.START:
            params = (now, s.id, s.token)
        else:
            raise ValueError(f"{s.transition!r} is not an outcome")
        by_kind.setdefault(s.transition, []).append(params)
    changed = 0
    for kind, params_list in by_kind.items():
        changed += conn.executemany(_SETTLE_SQL[kind], params_list).rowcount
    return changed


def settle_each(conn: sqlite3.Connection, items: Sequence[Settlement], *, now: str) -> list[bool]:
    """Like :func:`settle`, but tells which items changed a row (the slow path for stale leases)."""
    return [settle(conn, [item], now=now) == 1 for item in items]


def renew(conn: sqlite3.Connection, leases: Iterable[tuple[str, int]], *, expires: str) -> list[str]:
    """Push the expiry of held leases forward; return the ids whose lease is no longer held."""
    lost = []
    for job_id, token in leases:
        if conn.execute(_RENEW, (expires, job_id, token)).rowcount == 0:
            lost.append(job_id)
    return lost


_EXPIRED = (
    "SELECT id, lease_token, attempts, max_attempts, lease_owner, started_at FROM jobs "
    "WHERE status = 'running' AND lease_expires_at < ?"
)


def rescue_expired(
    conn: sqlite3.Connection, *, now: str, base_seconds: float, rng: random.Random | None = None,
    spare: Collection[tuple[str, int]] = (),
) -> list[tuple[str, states.Transition]]:
    """running jobs whose lease ran out (their worker died, or lost them) → pending with
    backoff, or dead; a job that never started → pending in its place, nothing counted.

    ``spare``: the leases (id, token) the caller still holds. A live process does not rescue
    those (if its renewals failed, the database locked by a third process for longer than a
    lease, they are still running here and its heartbeat renews them once it can); every
    other expired lease is rescued, the caller's own included (a row left running that no
    worker of it holds would otherwise stay running for as long as the process lives).
    """
    done = []
    now_epoch = to_epoch(now)
    for job_id, token, attempts, max_attempts, owner, started_at in conn.execute(_EXPIRED, (now,)).fetchall():
        if (job_id, token) in spare:
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
    return done


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
    worker knows that was alive since ``due_before``, or is alive now (see :func:`live_job_types`)."""
    live = live_job_types(conn, since=due_before, now=now)
    n = 0
    for job_type in job_types:
        if job_type in live:
            continue
        n += conn.execute(
            "UPDATE jobs SET status = 'dead', error = ?, updated_at = ? "
            "WHERE status = 'pending' AND job_type = ? AND run_after <= ?",
            (
                f"no worker handles job type {job_type!r}: no live process registers a handler for it "
                "(it may be registered without one, or not at all); add a handler, then retry the job",
                now, job_type, due_before,
            ),
        ).rowcount
    return n


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
