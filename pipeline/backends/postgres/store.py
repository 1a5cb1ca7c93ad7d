"""The Postgres job store's statements on the worker side: insert, claim, settle, renew,
rescue, the worker registry. Named synchronous functions taking a psycopg connection
(autocommit: a function that needs more than one statement opens its own transaction, and
a single statement is a transaction of its own, without a BEGIN/COMMIT round trip each).

Every update of a running job is fenced exactly as on SQLite: ``id``, ``status = 'running'``
and the lease token, matched row by row against an array of (id, token) pairs, and each
statement says which pairs it changed (``RETURNING j.id, o.token``), so a batch of outcomes
learns which leases were stale without writing any of them twice.

"Now" is the database server's clock (``now()``, the statement's or transaction's start)
for every time the store makes: leases, retries, rescues, heartbeats. One clock for every
process, whatever each machine's clock says. Times it makes are rounded to the millisecond
(:data:`MS`), the precision of the protocol's text, as
clock.format_ts rounds.

Workflows (issue 24; graph.py has the inserts and the sweep): every statement that ends a job
tells which of the jobs it ended have children (the has_children flag, read from rows it reads
anyway), and :func:`apply_edges` counts their edges in the same transaction. The Ledger's one
statement leaves jobs with children out and :func:`settle_parents` writes their outcomes in a
transaction of its own, so that a batch of plain jobs is the statement it was before; the
rescue, the burial of unknown types and the claim's expiry (:func:`expire_parents`) do the same.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import Callable, Collection, Generator, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import psycopg

from ... import states
from ...clock import to_epoch
from ...errors import StoreError
from .. import base
from ..base import NewJob, Settlement, cancelled_running_error, expired_error

# the statement's "now", as stored: rounded to the nearest millisecond, as clock.format_ts rounds
MS = "date_trunc('milliseconds', now() + interval '500 microseconds')"
CHANNEL = "pipeline_jobs"  # NOTIFY channel; the payload is the schema whose jobs became due
# Where a statement that also runs on a caller's connection (Client.enqueue(connection=...): outbox.py)
# names a table. The caller's search_path is the application's own ("public"), not the pipeline's, so
# there it must name the pipeline's schema: outbox.in_schema writes the schema in the marker's place, and
# in ``current_schema()``'s (the NOTIFY's payload, the schema whose jobs became due). On the pipeline's
# own connections the marker is a comment, and the table is found through the URL's search_path as
# every other statement's is: the hot path's text, and its cost, are unchanged.
SCHEMA = "/*schema*/"


def seconds_after(value: str) -> str:
    """SQL for ``now() + value`` seconds (a float8 expression), as stored."""
    return f"date_trunc('milliseconds', now() + ({value}) * interval '1 second' + interval '500 microseconds')"


# -- inserts ----------------------------------------------------------------------------------

_ROWS = (
    "SELECT id, job_type, payload, 'pending', 0, max_attempts, run_after::timestamptz, created_at::timestamptz, "
    "created_at::timestamptz, priority FROM unnest(%(ids)s::text[], %(types)s::text[], %(payloads)s::text[], "
    "%(max_attempts)s::bigint[], %(run_after)s::text[], %(priorities)s::bigint[], %(created)s::text[]) "
    "AS r(id, job_type, payload, max_attempts, run_after, priority, created_at)"
)
_INSERT_INTO = f"INSERT INTO {SCHEMA}jobs (id, job_type, payload, status, attempts, max_attempts, run_after, created_at, updated_at, priority) "
_INSERT = _INSERT_INTO + _ROWS
# Rows of which some have a trace context, an expiry or a limit key: _INSERT's rows, their traces,
# their expires_at and their limit_key. A statement of its own (and batch variants), so that
# _INSERT, the hot path's, binds what it did before these.
_INSERT_TRACED = (
    f"INSERT INTO {SCHEMA}jobs (id, job_type, payload, status, attempts, max_attempts, run_after, created_at, updated_at, priority, "
    "trace, expires_at, limit_key) SELECT id, job_type, payload, 'pending', 0, max_attempts, run_after::timestamptz, "
    "created_at::timestamptz, created_at::timestamptz, priority, trace, expires_at::timestamptz, limit_key FROM "
    "unnest(%(ids)s::text[], %(types)s::text[], %(payloads)s::text[], %(max_attempts)s::bigint[], %(run_after)s::text[], "
    "%(priorities)s::bigint[], %(created)s::text[], %(traces)s::text[], %(expires)s::text[], %(limit_keys)s::text[]) "
    "AS r(id, job_type, payload, max_attempts, run_after, priority, created_at, trace, expires_at, limit_key)"
)


def insert_params(rows: Sequence[NewJob]) -> dict[str, Any]:
    """NewJob rows as the arrays of :data:`_INSERT` (one parameter per column, not per row)."""
    # NewJob's fields, in its order
    ids, types, payloads, max_attempts, run_after, priorities, created, keys, traces, expires, limit_keys, whiles = (
        list(column) for column in list(zip(*rows))[:12])
    return {"ids": ids, "types": types, "payloads": payloads, "max_attempts": max_attempts, "run_after": run_after,
            "priorities": priorities, "created": created, "keys": keys, "traces": traces, "expires": expires,
            "limit_keys": limit_keys, "unique_tokens": [PENDING_ONLY if w == "pending" else None for w in whiles]}


PENDING_ONLY = 0  # a new row's unique_token when its key is held only while pending: its lease_token, 0


def traced(rows: Sequence[NewJob]) -> bool:
    """Whether some row has a trace context, an expiry or a limit key: then it is inserted by the
    statements that write them (:data:`_INSERT_TRACED`)."""
    return any(row.trace is not None or row.expires_at is not None or row.limit_key is not None for row in rows)


def insert_statement(rows: Sequence[NewJob]) -> str:
    """The insert for rows without a unique key: :data:`_INSERT`, or with traces, expiries or
    limit keys :data:`_INSERT_TRACED`."""
    return _INSERT_TRACED if traced(rows) else _INSERT


# Which rows hold their unique key: jobs_unique's predicate (schema.py, versions 7, 8 and 12). A job whose
# key is held only while pending (or waiting, or suspended) holds it under one lease token (unique_token): a
# claim moves the token on and frees it; a default job (unique_token NULL) holds it while waiting, pending,
# running or suspended (a suspended job holds it as a pending one does).
HOLDS = ("unique_key IS NOT NULL AND status IN ('waiting', 'pending', 'running', 'suspended') "
         "AND (unique_token IS NULL OR unique_token = lease_token)")
# Rows with a unique key: _INSERT's rows and their keys, none inserted while a job holds its type
# and key (the partial unique index jobs_unique, named by its columns and WHERE); a duplicate id
# still fails the statement. Its own statement: _INSERT, the hot path's, is the same as before
# unique keys.
_INSERT_UNIQUE = (
    f"INSERT INTO {SCHEMA}jobs (id, job_type, payload, status, attempts, max_attempts, run_after, created_at, updated_at, priority, "
    "unique_key, trace, expires_at, limit_key, unique_token) SELECT id, job_type, payload, 'pending', 0, max_attempts, "
    "run_after::timestamptz, created_at::timestamptz, created_at::timestamptz, priority, unique_key, trace, "
    "expires_at::timestamptz, limit_key, unique_token FROM "
    "unnest(%(ids)s::text[], %(types)s::text[], %(payloads)s::text[], %(max_attempts)s::bigint[], %(run_after)s::text[], "
    "%(priorities)s::bigint[], %(created)s::text[], %(keys)s::text[], %(traces)s::text[], %(expires)s::text[], "
    "%(limit_keys)s::text[], %(unique_tokens)s::bigint[]) "
    "AS r(id, job_type, payload, max_attempts, run_after, priority, created_at, unique_key, trace, expires_at, limit_key, "
    f"unique_token) ON CONFLICT (job_type, unique_key) WHERE {HOLDS} DO NOTHING RETURNING id"
)
_HOLDERS = f"""
SELECT j.job_type, j.unique_key, j.id FROM {SCHEMA}jobs j
  JOIN unnest(%(types)s::text[], %(keys)s::text[]) AS k(job_type, unique_key)
    ON j.job_type = k.job_type AND j.unique_key = k.unique_key
 WHERE j.unique_key IS NOT NULL AND j.status IN ('waiting', 'pending', 'running', 'suspended')
   AND (j.unique_token IS NULL OR j.unique_token = j.lease_token)
"""
T = TypeVar("T")
UNIQUE_ROUNDS = 20  # inserts tried again for keys whose holder finished in between (each round: one that did)


# A plan of statements: yields (SQL, parameters), is sent each statement's rows, returns its
# answer. The same plan runs on the Ledger's connection (run_plan) and, awaited, on a caller's
# AsyncConnection (outbox.py), so that the rules of unique keys are written once.
Plan = Generator[tuple[str, dict[str, Any]], list[tuple[Any, ...]], T]


def run_plan(conn: psycopg.Connection[Any], plan: Plan[T]) -> T:
    """Run a plan's statements on ``conn``, in order, each sent its rows; the plan's answer."""
    try:
        sql, params = next(plan)
        while True:
            cursor = conn.execute(sql, params)
            sql, params = plan.send(cursor.fetchall() if cursor.description else [])
    except StopIteration as done:
        return done.value


def unique_rounds(rows: Sequence[NewJob]) -> Plan[dict[str, str]]:
    """Insert rows that have a unique key; per row id, the id stored for it: its own, or that
    of the pending or running job holding its type and key (of two rows of one type and key,
    the first). Insert, then look up the holders of the keys not inserted: READ COMMITTED, so
    a holder may finish between the two statements, and those keys are tried again."""
    first: dict[tuple[str, str | None], NewJob] = {}
    for row in rows:
        first.setdefault((row.job_type, row.unique_key), row)
    # in one order of keys in every process: two inserts waiting on each other's keys would deadlock
    todo = sorted(first.values(), key=lambda row: (row.job_type, row.unique_key or ""))
    stored: dict[tuple[str, str | None], str] = {}
    for _ in range(UNIQUE_ROUNDS):
        inserted = {job_id for (job_id,) in (yield _INSERT_UNIQUE, insert_params(todo))}
        rest = []
        for row in todo:
            if row.id in inserted:
                stored[row.job_type, row.unique_key] = row.id
            else:
                rest.append(row)
        if not rest:
            break
        found = yield _HOLDERS, {"types": [r.job_type for r in rest], "keys": [r.unique_key for r in rest]}
        for job_type, key, job_id in found:
            stored[job_type, key] = job_id
        todo = [row for row in rest if (row.job_type, row.unique_key) not in stored]
        if not todo:
            break
    else:
        raise StoreError(f"the unique keys of {len(todo)} jobs changed hands {UNIQUE_ROUNDS} times while inserting; "
                         "try again")
    return {row.id: stored[row.job_type, row.unique_key] for row in rows}


def insert_unique(conn: psycopg.Connection[Any], rows: Sequence[NewJob]) -> dict[str, str]:
    """:func:`unique_rounds` on ``conn``."""
    return run_plan(conn, unique_rounds(rows))


# A job whose key is held only while pending, back in pending (a retry, a release, a snooze, a
# rescue, a revive) or suspended (which holds it as pending does), takes its key again (unique_token =
# lease_token) if no job holds it; of two with one type and key, the first in claim order. The others go
# on without it.
_RETAKE = """
UPDATE jobs j SET unique_token = j.lease_token
 WHERE j.id = ANY(ARRAY(
        SELECT DISTINCT ON (c.job_type, c.unique_key) c.id FROM jobs c
         WHERE c.id = ANY(%(ids)s::text[]) AND c.status IN ('pending', 'suspended') AND c.unique_token <> c.lease_token
           AND NOT EXISTS (SELECT 1 FROM jobs h WHERE h.job_type = c.job_type AND h.unique_key = c.unique_key
                              AND h.status IN ('waiting', 'pending', 'running', 'suspended')
                              AND (h.unique_token IS NULL OR h.unique_token = h.lease_token))
         ORDER BY c.job_type, c.unique_key, c.priority, c.run_after, c.id))
   AND j.status IN ('pending', 'suspended') AND j.unique_token <> j.lease_token
"""
# whether some of the ids is such a job (in a transaction, before the savepoint the retake takes)
_RETAKERS = ("SELECT 1 FROM jobs WHERE id = ANY(%(ids)s::text[]) AND status IN ('pending', 'suspended') "
             "AND unique_token <> lease_token LIMIT 1")
RETAKE_ROUNDS = 5


def retake(conn: psycopg.Connection[Any], ids: Sequence[str]) -> None:
    """The jobs among ``ids`` whose key is held only while pending, and that are pending without
    it: each takes its key again if no job holds it (:data:`_RETAKE`). Never raises for a key:
    another transaction may hold it uncommitted (an insert), and the update then waits for it and,
    if it commits, fails on jobs_unique; it is tried again (READ COMMITTED: the next statement sees
    the holder and leaves that key), in a savepoint of the caller's transaction if there is one.
    After RETAKE_ROUNDS such failures the jobs go on without their key."""
    if not ids:
        return
    params = {"ids": list(ids)}
    within = conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
    if within and conn.execute(_RETAKERS, params).fetchone() is None:
        return  # (the common case: no such job, and no savepoint's two round trips)
    for _ in range(RETAKE_ROUNDS):
        try:
            with conn.transaction() if within else contextlib.nullcontext():
                conn.execute(_RETAKE, params)
            return
        except (psycopg.errors.UniqueViolation, psycopg.errors.DeadlockDetected):
            continue


def insert_special(conn: psycopg.Connection[Any], rows: Sequence[NewJob]) -> dict[str, str]:
    """Rows that COPY does not write (a bulk load's): those with a trace context, an expiry or a
    limit key and no unique key by :data:`_INSERT_TRACED`, those with a key by :func:`insert_unique`; per keyed row's id,
    the id stored for it."""
    plain = [row for row in rows if row.unique_key is None]
    if plain:
        conn.execute(_INSERT_TRACED, insert_params(plain))
    keyed = [row for row in rows if row.unique_key is not None]
    return insert_unique(conn, keyed) if keyed else {}


def insert_jobs(conn: psycopg.Connection[Any], rows: Sequence[NewJob], *, notify: bool) -> list[str]:
    """Every row or none (a duplicate id fails it whole); per row, the id stored for it (see
    :func:`insert_unique`). Rows without a unique key: one statement."""
    if not rows:
        return []
    with conn.transaction():
        plain = [row for row in rows if row.unique_key is None]
        stored: dict[str, str] = {}
        if len(plain) < len(rows):
            if plain:
                conn.execute(insert_statement(plain), insert_params(plain))
            stored = insert_unique(conn, [row for row in rows if row.unique_key is not None])
        else:
            conn.execute(insert_statement(rows), insert_params(rows))
        if notify:
            conn.execute(NOTIFY)
    return [stored.get(row.id, row.id) for row in rows]


# -- idempotency keys (migration 10) -------------------------------------------------------------------

# Take each (type, key) that nobody holds or whose holder expired, for a row of the call; a key another
# transaction inserts meanwhile makes this wait for it (the primary key), then counts as held if it
# committed. Rows in (type, key) order, so two calls taking the same keys lock them in one order.
_KEYS_TAKE = """
INSERT INTO idempotency_keys AS k (job_type, key, job_id, expires_at)
SELECT u.t, u.k, u.id, date_trunc('milliseconds', clock_timestamp()) + make_interval(secs => u.s)
  FROM unnest(%(types)s::text[], %(keys)s::text[], %(ids)s::text[], %(secs)s::float8[]) WITH ORDINALITY AS u(t, k, id, s, n)
 ORDER BY u.n
    ON CONFLICT (job_type, key) DO UPDATE SET job_id = excluded.job_id, expires_at = excluded.expires_at
 WHERE k.expires_at <= clock_timestamp()
RETURNING k.job_id
"""
# the jobs the keys not taken name (a statement of its own: it sees what the take waited for)
_KEYS_HELD = """
SELECT k.job_type, k.key, k.job_id FROM idempotency_keys k
  JOIN unnest(%(types)s::text[], %(keys)s::text[]) AS u(t, k) ON k.job_type = u.t AND k.key = u.k
"""
# a taken key whose row was held by its unique key: it names the holder, as the insert answered
_KEYS_MOVE = """
UPDATE idempotency_keys k SET job_id = u.holder
  FROM unnest(%(ids)s::text[], %(holders)s::text[]) AS u(id, holder) WHERE k.job_id = u.id
"""
# expired keys, up to twice as many as the call takes (at least KEYS_SWEEP_MIN): they go faster than
# they come however many keys a call has (through the index)
_KEYS_SWEEP = """
DELETE FROM idempotency_keys WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM idempotency_keys WHERE expires_at <= clock_timestamp() ORDER BY expires_at LIMIT %(n)s
       FOR UPDATE SKIP LOCKED))
"""
KEYS_SWEEP_MIN = 4


def insert_idempotent(conn: psycopg.Connection[Any], rows: Sequence[NewJob],
                      insert: Callable[[psycopg.Connection[Any], list[NewJob]], list[str]]) -> list[str]:
    """An insert with idempotency keys in one transaction (Backend.insert says what they promise):
    the keys taken first (:data:`_KEYS_TAKE`), then the rows whose key was free (or expired), and
    the rows without one, by ``insert`` (the plain or the workflow insert), in the same transaction;
    a row whose key is held answers the job it names, a second row of the call with one type and
    key the first's. Per row, the id stored for it."""
    first: dict[tuple[str, str], NewJob] = {}
    answered: dict[str, str] = {}  # a row not inserted: the id its key names (or a row's of the call)
    for row in rows:
        if row.idempotency_key is None:
            continue
        taken = first.setdefault((row.job_type, row.idempotency_key), row)
        if taken is not row:
            answered[row.id] = taken.id
    keyed = sorted(first.items())
    with conn.transaction():
        params = {"types": [t for (t, _), _ in keyed], "keys": [k for (_, k), _ in keyed],
                  "ids": [row.id for _, row in keyed], "secs": [row.idempotency_seconds for _, row in keyed]}
        mine = {job_id for (job_id,) in conn.execute(_KEYS_TAKE, params)}
        held = [(t, k) for (t, k), row in keyed if row.id not in mine]
        if held:
            found = {(t, k): job_id for t, k, job_id in conn.execute(
                _KEYS_HELD, {"types": [t for t, _ in held], "keys": [k for _, k in held]})}
            for t, k in held:
                if (t, k) not in found:  # expired and swept between the two statements: a retry takes it
                    raise StoreError(f"the idempotency key {k!r} of job type {t} expired during this enqueue; "
                                     "enqueue again")
                answered[first[(t, k)].id] = found[(t, k)]
        fresh = [row._replace(idempotency_key=None) for row in rows if row.id not in answered]
        stored = dict(zip((row.id for row in fresh), insert(conn, fresh))) if fresh else {}
        moved = [(job_id, holder) for job_id, holder in stored.items() if holder != job_id and job_id in mine]
        if moved:
            conn.execute(_KEYS_MOVE, {"ids": [a for a, _ in moved], "holders": [b for _, b in moved]})
        conn.execute(_KEYS_SWEEP, {"n": max(KEYS_SWEEP_MIN, 2 * len(keyed))})
    return [stored[row.id] if row.id in stored else stored.get(answered[row.id], answered[row.id]) for row in rows]


_STORED = "SELECT id FROM jobs WHERE id = ANY(%(ids)s::text[])"
_KEY_NAMES = ("SELECT job_id FROM idempotency_keys WHERE job_type = %(type)s AND key = %(key)s "
              "AND expires_at > clock_timestamp()")
_HOLDER = f"SELECT id FROM jobs WHERE job_type = %(type)s AND unique_key = %(key)s AND {HOLDS}"


def insert_outcome(conn: psycopg.Connection[Any], rows: Sequence[NewJob]) -> list[tuple[bool, str | None]]:
    """For an insert whose answer was lost (base.asked_again): per row, whether its id is stored,
    and the id its idempotency key (else its unique key) names now."""
    stored = {job_id for (job_id,) in conn.execute(_STORED, {"ids": [row.id for row in rows]})}
    found: list[tuple[bool, str | None]] = []
    for row in rows:
        named = None
        if row.id not in stored and row.idempotency_key is not None:
            named = conn.execute(_KEY_NAMES, {"type": row.job_type, "key": row.idempotency_key}).fetchone()
        if row.id not in stored and named is None and row.unique_key is not None:
            named = conn.execute(_HOLDER, {"type": row.job_type, "key": row.unique_key}).fetchone()
        found.append((row.id in stored, None if named is None else str(named[0])))
    return found


NOTIFY = f"SELECT pg_notify('{CHANNEL}', current_schema())"

COPY_COLUMNS = "COPY jobs (id, job_type, payload, max_attempts, run_after, priority, created_at, updated_at) FROM STDIN"


# -- settle: the Ledger's batch -----------------------------------------------------------------

_OUTCOMES = (
    "SELECT *, NULL::text AS result, 0 AS snooze_limit, 'running'::text AS running FROM unnest(%(o_ids)s::text[], "
    "%(o_tokens)s::bigint[], %(o_kinds)s::text[], %(o_errors)s::text[], %(o_delays)s::float8[]) "
    "AS o(id, token, kind, error, delay) OFFSET 0"
)
# Outcomes of which some carry a handler's result or are snoozes: two arrays more. Their own
# statement, so that a batch without them binds what it did before results and snoozes.
_OUTCOMES_FULL = (
    "SELECT *, 'running'::text AS running FROM unnest(%(o_ids)s::text[], %(o_tokens)s::bigint[], %(o_kinds)s::text[], "
    "%(o_errors)s::text[], %(o_delays)s::float8[], %(o_results)s::text[], %(o_limits)s::int[]) "
    "AS o(id, token, kind, error, delay, result, snooze_limit) OFFSET 0"
)
# The fence compares status with o.running, a column of the outcomes, not a constant, and the
# ids are an initplan's array: so the planner cannot read the running rows through the
# partial index jobs_leases or jobs_status's 'running' range. It did on a table without
# statistics (just filled), guessing one running row: a nested loop that scanned the
# outcomes again per row (256 × 256) over every dead index entry left by earlier batches
# (bitmap scans do not mark them dead), 25-45 ms a batch and growing, where the primary key
# takes 6. The same in _RENEW and _RESCUE.
#
# One UPDATE for every kind of outcome. RELEASE and SNOOZE give back the attempt only if it was
# counted (started_at set); START counts the attempt of a job claimed ahead (once) and keeps its
# lease. An outcome that would send the job back to pending (RETRY, RELEASE, a SNOOZE within its
# limit) ends it cancelled instead when its cancel was requested meanwhile (_STOPPED): a cancel
# racing the job's own outcome leaves one final state, never a retry. Leaving running clears the
# request; going back to pending clears the progress.
STOPPED = "cancelled while running (cancel requested); its attempt ended: "  # + the outcome's error, or 'released'
_BACK = "(o.kind IN ('retry', 'release') OR o.kind = 'snooze' AND j.snoozes < o.snooze_limit)"
_PENDING = f"({_BACK} AND NOT j.cancel_requested)"
_STOPPED = f"({_BACK} AND j.cancel_requested)"


# A job with children (has_children, schema version 8) is left alone by the Ledger's one statement
# (answered as not written): its outcome is written by :func:`settle_parents`, in a transaction that
# applies its edges when it ends it. So a batch of plain jobs is the one statement of before, with
# one more condition on rows it reads anyway.
_PLAIN = " AND j.has_children IS NOT TRUE"
# what settle_parents learns of each row it wrote: its new status, and whether it has children
_PARENT_RETURNING = "RETURNING j.id, o.token, j.status, j.has_children IS TRUE AS kids"


def _settle(outcomes: str, *, only: str = _PLAIN, returning: str = "RETURNING j.id, o.token") -> str:
    return f"""
UPDATE jobs j
   SET status = CASE WHEN {_PENDING} THEN 'pending' WHEN o.kind = 'cancel' OR {_STOPPED} THEN 'cancelled'
                     WHEN o.kind = 'succeed' THEN 'completed' WHEN o.kind = 'start' THEN 'running' ELSE 'dead' END,
       attempts = CASE WHEN o.kind IN ('release', 'snooze') AND j.started_at IS NOT NULL
                       THEN greatest(j.attempts - 1, 0)
                       WHEN o.kind = 'start' AND j.started_at IS NULL THEN j.attempts + 1
                       ELSE j.attempts END,
       run_after = CASE WHEN NOT {_PENDING} THEN j.run_after WHEN o.kind = 'release' THEN {MS}
                        ELSE {seconds_after('o.delay')} END,
       error = CASE WHEN {_STOPPED} THEN '{STOPPED}' || coalesce(o.error, 'released')
                    WHEN o.kind IN ('retry', 'bury', 'cancel') OR o.kind = 'snooze' AND j.snoozes >= o.snooze_limit
                    THEN o.error
                    ELSE j.error END,
       started_at = CASE WHEN o.kind IN ('retry', 'release', 'snooze') THEN NULL
                         WHEN o.kind = 'start' THEN coalesce(j.started_at, {MS}) ELSE j.started_at END,
       snoozes = j.snoozes + (o.kind = 'snooze')::int,
       result = CASE WHEN o.kind = 'succeed' THEN o.result ELSE j.result END,
       progress = CASE WHEN {_PENDING} THEN NULL ELSE j.progress END,
       progress_message = CASE WHEN {_PENDING} THEN NULL ELSE j.progress_message END,
       cancel_requested = o.kind = 'start' AND j.cancel_requested,
       updated_at = {MS},
       lease_owner = CASE WHEN o.kind = 'start' THEN j.lease_owner END,
       lease_expires_at = CASE WHEN o.kind = 'start' THEN j.lease_expires_at END
  FROM ({outcomes}) o
 WHERE j.id = ANY(ARRAY(SELECT unnest(%(o_ids)s::text[]))) AND j.id = o.id AND j.status = o.running AND j.lease_token = o.token{only}
{returning}
"""


_SETTLE = _settle(_OUTCOMES)
_SETTLE_FULL = _settle(_OUTCOMES_FULL)
SETTLE_PARENTS = _settle(_OUTCOMES, only="", returning=_PARENT_RETURNING)
SETTLE_PARENTS_FULL = _settle(_OUTCOMES_FULL, only="", returning=_PARENT_RETURNING)

_KINDS = {
    states.Transition.SUCCEED: "succeed",
    states.Transition.RETRY: "retry",
    states.Transition.BURY: "bury",
    states.Transition.RELEASE: "release",
    states.Transition.START: "start",
    states.Transition.CANCEL: "cancel",
    states.Transition.SNOOZE: "snooze",
}

# A batch's one statement: outcomes, inserts and the wake-up together, a transaction of its own.
# (Fixed variants, so that no statement text is put together at run time.)
_FINAL = (
    "SELECT (SELECT array_agg(id) FROM settled), (SELECT array_agg(token) FROM settled), "
    f"(SELECT pg_notify('{CHANNEL}', current_schema()) WHERE %(notify)s)"
)
BATCH_SETTLE = f"WITH settled AS ({_SETTLE}) {_FINAL}"
BATCH_INSERT = f"WITH ins AS ({_INSERT} RETURNING 1), settled AS (SELECT NULL::text AS id, NULL::bigint AS token WHERE false) {_FINAL}"
BATCH_BOTH = f"WITH settled AS ({_SETTLE}), ins AS ({_INSERT} RETURNING 1) {_FINAL}"
# the same with rows of which some have a trace context or an expiry
BATCH_INSERT_TRACED = (f"WITH ins AS ({_INSERT_TRACED} RETURNING 1), settled AS (SELECT NULL::text AS id, NULL::bigint "
                       f"AS token WHERE false) {_FINAL}")
BATCH_BOTH_TRACED = f"WITH settled AS ({_SETTLE}), ins AS ({_INSERT_TRACED} RETURNING 1) {_FINAL}"
# the same with outcomes of which some carry a result or are snoozes
BATCH_SETTLE_FULL = f"WITH settled AS ({_SETTLE_FULL}) {_FINAL}"
BATCH_BOTH_FULL = f"WITH settled AS ({_SETTLE_FULL}), ins AS ({_INSERT} RETURNING 1) {_FINAL}"
BATCH_BOTH_TRACED_FULL = f"WITH settled AS ({_SETTLE_FULL}), ins AS ({_INSERT_TRACED} RETURNING 1) {_FINAL}"
_BATCHES = {  # (outcomes, rows, rows traced, outcomes full): the statement
    (True, False, False, False): BATCH_SETTLE, (True, False, False, True): BATCH_SETTLE_FULL,
    (False, True, False, False): BATCH_INSERT, (False, True, True, False): BATCH_INSERT_TRACED,
    (True, True, False, False): BATCH_BOTH, (True, True, True, False): BATCH_BOTH_TRACED,
    (True, True, False, True): BATCH_BOTH_FULL, (True, True, True, True): BATCH_BOTH_TRACED_FULL,
}


def by_id(items: Sequence[Any]) -> list[Any]:
    """Rows in the order every multi-row update here locks them: by id. The updates join the
    table to the unnest of their arrays, and the plan may lock rows in the arrays' order (a
    hash join probes with them); two statements locking the same running jobs in different
    orders (a batch of outcomes and a lease renewal, or a rescue) deadlocked in the chaos run,
    and Postgres refused one of them after deadlock_timeout."""
    return sorted(items, key=lambda item: item[0] if isinstance(item, tuple) else item.id)


def full(items: Sequence[Settlement]) -> bool:
    """Whether some outcome carries a result or is a snooze: then it is written by the
    statements that bind them (:data:`_OUTCOMES_FULL`)."""
    return any(s.result is not None or s.transition is states.Transition.SNOOZE for s in items)


def _text(value: str | None) -> str | None:
    """Postgres text holds no NUL character: a text that has one keeps it escaped."""
    return None if value is None else value.replace("\x00", "\\x00")


def outcome_params(items: Sequence[Settlement]) -> dict[str, Any]:
    items = by_id(items)
    kinds = []
    for s in items:
        kind = _KINDS.get(s.transition)
        if kind is None:
            raise ValueError(f"{s.transition!r} is not an outcome")
        kinds.append(kind)
    params = {
        "o_ids": [s.id for s in items],
        "o_tokens": [s.token for s in items],
        "o_kinds": kinds,
        "o_errors": [_text(s.error) for s in items],
        "o_delays": [float(s.delay) for s in items],
    }
    if full(items):
        params["o_results"] = [_text(s.result) for s in items]
        params["o_limits"] = [int(s.snooze_limit) for s in items]
    return params


def rounds(items: Sequence[Settlement]) -> list[list[int]]:
    """The positions of ``items`` split so that no job appears twice in one statement (an
    UPDATE changes a row once, however many pairs match it): a job's k-th outcome goes in
    round k, so its outcomes are written in the order given."""
    out: list[list[int]] = []
    seen: dict[str, int] = {}
    for n, item in enumerate(items):
        k = seen.get(item.id, 0)
        seen[item.id] = k + 1
        if k == len(out):
            out.append([])
        out[k].append(n)
    return out


def write_batch(
    conn: psycopg.Connection[Any], items: Sequence[Settlement], rows: Sequence[NewJob], *, notify: bool,
    parents: bool = True,
) -> list[bool]:
    """Outcomes and inserted rows in one statement (one transaction, one round trip); one bool
    per outcome: whether it was written (its lease held). The outcomes of jobs with children are
    left out of that statement: with ``parents`` they are written after it by
    :func:`settle_parents` (a transaction of its own, which applies their edges); without, they
    are answered False, as stale ones are, for the caller to hand to settle_parents. STEP and
    SUSPEND outcomes are written by a statement of their own (:func:`settle_durable`), so that
    the others' is the one it was. Raises whatever a statement raised (a duplicate id among the
    rows: the caller splits the batch)."""
    if any(s.transition in DURABLE for s in items):
        return _write_with_durable(conn, items, rows, notify=notify, parents=parents)
    parts = rounds(items)
    if len(parts) <= 1:
        held = _execute_batch(conn, items, rows, notify=notify)
        answers = [(s.id, s.token) in held for s in items]
    else:
        answers = [False] * len(items)
        with conn.transaction():  # the same job twice in one batch: a statement per round, one transaction
            for k, part in enumerate(parts):
                last = k == len(parts) - 1
                chosen = [items[n] for n in part]
                held = _execute_batch(conn, chosen, rows if last else (), notify=notify and last)
                for n, s in zip(part, chosen):
                    answers[n] = (s.id, s.token) in held
    # jobs back in pending whose key is held only while pending take it again if free (a statement
    # more only for a batch with such outcomes: SUCCEED's, the hot path's, is the one above alone)
    retake(conn, [s.id for s, written in zip(items, answers) if written and s.transition in _BACK_TO_PENDING])
    rest = [n for n, written in enumerate(answers) if not written]
    if parents and rest:  # (none in a batch of plain jobs whose leases held)
        for n, written in zip(rest, settle_parents(conn, [items[n] for n in rest])[0]):
            answers[n] = written
    return answers


_BACK_TO_PENDING = frozenset({states.Transition.RETRY, states.Transition.RELEASE, states.Transition.SNOOZE})


def _write_with_durable(conn: psycopg.Connection[Any], items: Sequence[Settlement], rows: Sequence[NewJob], *,
                        notify: bool, parents: bool) -> list[bool]:
    """:func:`write_batch` of a batch with STEP or SUSPEND outcomes: the others (and the rows) as
    before, then those by :func:`settle_durable`. A job with a durable outcome and another in one
    batch (the engine waits for each of a job's outcomes before the next) is written one outcome at
    a time, in order."""
    durable = [n for n, item in enumerate(items) if item.transition in DURABLE]
    others = [n for n, item in enumerate(items) if item.transition not in DURABLE]
    answers = [False] * len(items)
    if {items[n].id for n in durable} & {items[n].id for n in others}:
        if rows:
            write_batch(conn, [], rows, notify=notify, parents=parents)
        for n, item in enumerate(items):
            answers[n] = write_batch(conn, [item], [], notify=notify, parents=parents)[0]
        return answers
    if others or rows:
        for n, written in zip(others, write_batch(conn, [items[n] for n in others], rows, notify=notify, parents=parents)):
            answers[n] = written
    for n, written in zip(durable, settle_durable(conn, [items[n] for n in durable])):
        answers[n] = written
    return answers


def _execute_batch(conn: psycopg.Connection[Any], items: Sequence[Settlement], rows: Sequence[NewJob], *, notify: bool) -> set[tuple[str, int]]:
    if not items and not rows:
        return set()
    params: dict[str, Any] = {"notify": notify}
    if items:
        params.update(outcome_params(items))
    if rows:
        params.update(insert_params(rows))
    sql = _BATCHES[(bool(items), bool(rows), bool(rows) and traced(rows), bool(items) and full(items))]
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    ids, tokens = row[0] or [], row[1] or []
    return set(zip(ids, tokens))


# -- workflows (issue 24): a parent's edges, applied by whatever ends it -----------------------------

ENDED = ("completed", "dead", "cancelled")  # the final statuses: a job's edges count when it reaches one
DEADLOCK_ROUNDS = 5  # a transaction that applies edges, tried again when Postgres broke a deadlock with it

# The edges of parents that have just ended and have not counted yet, counted now, and their children
# woken or cancelled, down the graph: one call of the function of schema version 9 (schema.py has its
# text, and why). Exactly once: the flag is flipped under the edge's row lock, and any other transaction
# applying the same edge (the sweep, a delete) waits for it and then finds the flag set (READ COMMITTED
# reads the row again). Children are locked in id order, after the parents (which the statement that
# ended them locked): the order every path takes, parents first, then children in id order, a level at
# a time; the count is moved under the child's lock, so parents ended by K transactions at once bring it
# to zero once, and wake the child once.
_APPLY_EDGES = ("SELECT woken, cancelled FROM pipeline_apply_edges(%(parents)s::text[], %(hows)s::text[], "
                "%(e_parents)s::text[], %(e_children)s::text[], %(e_hows)s::text[], true)")
assert CHANNEL == "pipeline_jobs"  # (the function NOTIFYs on it by name)


def apply_edges(conn: psycopg.Connection[Any], ended: Iterable[tuple[str, str]],
                edges: Sequence[tuple[str, str, str]] = ()) -> tuple[int, int]:
    """In the caller's transaction, which has ended the jobs ``ended`` ((id, how): "completed",
    "dead", "cancelled", "deleted") under their row locks: each of their edges that has not counted
    yet counts now (``edges``: (parent, child, how) to count besides, the sweep's). Per child, under
    its row lock: the count of edges not yet counted goes down; a child still waiting is cancelled
    (:func:`~pipeline.backends.base.parent_failed`, naming the first such parent in its ``after``)
    when a parent ended other than completed and it follows the default on_parent_failure, woken
    (pending, Transition.WAKE) when nothing is left to count; a child no longer waiting only has
    its count moved. A cancelled child's own edges are applied the same way, down the graph. With a
    child woken (or a pending one locked, which a claim may have skipped meanwhile), NOTIFY
    (delivered at the commit). Returns (woken, cancelled)."""
    parents = sorted(set(ended))
    if not parents and not edges:
        return 0, 0
    row = conn.execute(_APPLY_EDGES, {"parents": [p for p, _ in parents], "hows": [h for _, h in parents],
                                      "e_parents": [e[0] for e in edges], "e_children": [e[1] for e in edges],
                                      "e_hows": [e[2] for e in edges]}).fetchone()
    assert row is not None
    return row[0], row[1]


def deadlocks_retried(conn: psycopg.Connection[Any], fn: Callable[[], T], *, one_statement: bool = False) -> T:
    """``fn()`` in a transaction (a savepoint of the caller's, if one is open), run again when
    Postgres ended it to break a deadlock: a transaction that applies edges locks a parent, then
    its children, then theirs, which is id order within a level only (a job can be a child here
    and, further down, a parent of a row locked earlier), and an insert that names several
    parents locks them in id order; a rare graph makes two of these wait on each other.
    ``one_statement``: ``fn`` runs a single statement, a transaction of its own in autocommit, so
    outside a caller's transaction it needs no BEGIN and COMMIT round trips."""
    bare = one_statement and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    for attempt in range(DEADLOCK_ROUNDS):
        try:
            with contextlib.nullcontext() if bare else conn.transaction():
                return fn()
        except psycopg.errors.DeadlockDetected:
            if attempt == DEADLOCK_ROUNDS - 1:
                raise
    raise AssertionError("unreachable")


# The outcomes of jobs with children and their edges as one statement: the outcomes written (their
# parents' rows locked, as the Ledger's statement locks them), then the edges of those that ended
# applied by the function, which reads and locks only edges and children (never a row this statement
# wrote: a child runs only once every edge to it has counted).
def _settle_and_apply(settle: str) -> str:
    return f"""
WITH s AS ({settle}),
     e AS (SELECT id, status FROM s WHERE kids AND status IN ('completed', 'dead', 'cancelled'))
SELECT (SELECT array_agg(id) FROM s), (SELECT array_agg(token) FROM s), a.woken, a.pending
  FROM pipeline_apply_edges(ARRAY(SELECT id FROM e ORDER BY id), ARRAY(SELECT status FROM e ORDER BY id),
                            '{{}}', '{{}}', '{{}}', %(notify)s) AS a
"""


SETTLE_AND_APPLY = _settle_and_apply(SETTLE_PARENTS)
SETTLE_AND_APPLY_FULL = _settle_and_apply(SETTLE_PARENTS_FULL)


def settle_parents(conn: psycopg.Connection[Any], items: Sequence[Settlement], *,
                   notify: bool = True) -> tuple[list[bool], int, list[str]]:
    """Outcomes the batch's statement left (jobs with children, and stale ones), with the edges of
    the jobs they end applied in the same transaction (:func:`apply_edges`); per outcome, whether it
    was written; how many children woke; and the pending children it locked (woken, or pending
    already: a claim meanwhile skipped them), which it NOTIFYs of unless ``notify`` is False (the
    caller claims them, and NOTIFYs of any it did not claim). One statement (a transaction of its
    own, tried again if Postgres broke a deadlock with it) unless the same job comes twice, or
    outcomes go back to pending (then a transaction of several, which NOTIFYs whatever ``notify``).
    STEP and SUSPEND outcomes left (stale ones: :func:`settle_durable` writes the others) are
    answered False."""
    if any(s.transition in DURABLE for s in items):
        mine = [n for n, s in enumerate(items) if s.transition not in DURABLE]
        answers = [False] * len(items)
        if not mine:
            return answers, 0, []
        written, woken, pending = settle_parents(conn, [items[n] for n in mine], notify=notify)
        for n, held in zip(mine, written):
            answers[n] = held
        return answers, woken, pending
    parts = rounds(items)
    if len(parts) == 1 and not any(s.transition in _BACK_TO_PENDING for s in items):
        params = {**outcome_params(items), "notify": notify}
        sql = SETTLE_AND_APPLY_FULL if full(items) else SETTLE_AND_APPLY

        def one() -> tuple[list[bool], int, list[str]]:
            row = conn.execute(sql, params).fetchone()
            assert row is not None
            held = set(zip(row[0] or [], row[1] or []))
            return [(s.id, s.token) in held for s in items], row[2], row[3]

        return deadlocks_retried(conn, one, one_statement=True)

    def write() -> tuple[list[bool], int, list[str]]:
        answers = [False] * len(items)
        ended: list[tuple[str, str]] = []
        for part in parts:
            chosen = [items[n] for n in part]
            found = conn.execute(SETTLE_PARENTS_FULL if full(chosen) else SETTLE_PARENTS, outcome_params(chosen)).fetchall()
            held = {(job_id, token) for job_id, token, _, _ in found}
            for n, s in zip(part, chosen):
                answers[n] = (s.id, s.token) in held
            ended += [(job_id, status) for job_id, _, status, children in found if children and status in ENDED]
        woken, _ = apply_edges(conn, ended)
        retake(conn, [s.id for s, written in zip(items, answers) if written and s.transition in _BACK_TO_PENDING])
        return answers, woken, []  # (NOTIFYd already)

    return deadlocks_retried(conn, write)


# -- durable functions (issue 35): STEP and SUSPEND -------------------------------------------------

DURABLE = frozenset({states.Transition.STEP, states.Transition.SUSPEND})
FOREVER = f"'{base.FOREVER}'::timestamptz"  # a suspended job's run_after without a deadline

# STEP and SUSPEND outcomes, one row each with its step (name NULL: none) and, for a SUSPEND, its delay
# (NULL: no deadline) and the signal it awaits
_DURABLE_OUTCOMES = (
    "SELECT *, 'running'::text AS running FROM unnest(%(ids)s::text[], %(tokens)s::bigint[], %(suspends)s::bool[], "
    "%(delays)s::float8[], %(awaiting)s::text[], %(names)s::text[], %(statuses)s::text[], %(values)s::text[], "
    "%(started)s::text[], %(ended)s::text[]) "
    "AS o(id, token, suspend, delay, awaiting, name, step_status, value, started_at, ended_at) OFFSET 0"
)
# Fenced as every outcome (see _settle). STEP: the job keeps running, flagged durable (its steps go with it:
# delete, cleanup, retention), its step upserted by name (a step written again keeps its position). SUSPEND:
# SNOOZE to another status: running → suspended, the attempt given back if it was counted, due ``delay``
# seconds on (or never: FOREVER), awaiting its signal (job_waits; NULL: none), lease and expires_at cleared, snoozes
# unchanged; or cancelled, as a release is, when its cancel was requested meanwhile (STOPPED + "suspended",
# every store's text). A job that stops running holds no limit slot: the limits count running rows.
# Whether a signal it awaits came already is the next statement's (_WOKEN_AT_ONCE).
_SETTLE_DURABLE = f"""
WITH o AS MATERIALIZED ({_DURABLE_OUTCOMES}),
settled AS (
UPDATE jobs j
   SET status = CASE WHEN NOT o.suspend THEN j.status WHEN j.cancel_requested THEN 'cancelled' ELSE 'suspended' END,
       attempts = CASE WHEN o.suspend AND j.started_at IS NOT NULL THEN greatest(j.attempts - 1, 0) ELSE j.attempts END,
       run_after = CASE WHEN NOT o.suspend OR j.cancel_requested THEN j.run_after WHEN o.delay IS NULL THEN {FOREVER}
                        ELSE {seconds_after('o.delay')} END,
       error = CASE WHEN o.suspend AND j.cancel_requested THEN '{STOPPED}suspended' ELSE j.error END,
       started_at = CASE WHEN o.suspend THEN NULL ELSE j.started_at END,
       expires_at = CASE WHEN o.suspend THEN NULL ELSE j.expires_at END,
       progress = CASE WHEN o.suspend AND NOT j.cancel_requested THEN NULL ELSE j.progress END,
       progress_message = CASE WHEN o.suspend AND NOT j.cancel_requested THEN NULL ELSE j.progress_message END,
       cancel_requested = NOT o.suspend AND j.cancel_requested,
       updated_at = CASE WHEN o.suspend THEN {MS} ELSE j.updated_at END,
       lease_owner = CASE WHEN o.suspend THEN NULL ELSE j.lease_owner END,
       lease_expires_at = CASE WHEN o.suspend THEN NULL ELSE j.lease_expires_at END,
       durable = true
  FROM o
 WHERE j.id = ANY(ARRAY(SELECT id FROM o)) AND j.id = o.id AND j.status = o.running AND j.lease_token = o.token
RETURNING j.id, o.token, j.status, j.has_children IS TRUE AS kids, j.unique_token IS NOT NULL AS keyed),
waits AS (
INSERT INTO job_waits AS w (job_id, signal)
SELECT o.id, o.awaiting FROM o JOIN settled ON settled.id = o.id AND settled.token = o.token WHERE o.suspend
ON CONFLICT (job_id) DO UPDATE SET signal = excluded.signal),
stepped AS (
INSERT INTO job_steps AS s (job_id, name, status, value, started_at, ended_at)
SELECT o.id, o.name, o.step_status, o.value, o.started_at::timestamptz, o.ended_at::timestamptz
  FROM o JOIN settled ON settled.id = o.id AND settled.token = o.token
 WHERE o.name IS NOT NULL
ON CONFLICT (job_id, name) DO UPDATE
   SET status = excluded.status, value = excluded.value, started_at = excluded.started_at, ended_at = excluded.ended_at)
SELECT id, token, status, kids, keyed FROM settled
"""
# A job just suspended awaiting a signal that was sent already → pending, due now. A statement of its own,
# after the SUSPEND's, in its transaction: its snapshot is taken after the SUSPEND locked the job's row, so it
# sees every signal whose sender locked that row first (send_signal locks it before it inserts); a sender
# that comes after finds the job suspended under its lock, and wakes it itself. (The SUSPEND's own
# statement cannot look: its snapshot may be older than a signal whose sender it waited for.)
_WOKEN_AT_ONCE = f"""
WITH woken AS (
UPDATE jobs j SET status = 'pending', run_after = {MS}, updated_at = {MS}
 WHERE j.id = ANY(%(ids)s::text[]) AND j.status = 'suspended'
   AND EXISTS (SELECT 1 FROM job_waits w JOIN job_signals s ON s.job_id = w.job_id AND s.name = w.signal
                WHERE w.job_id = j.id AND NOT s.consumed)
RETURNING j.id)
SELECT (SELECT count(*) FROM woken), (SELECT pg_notify('{CHANNEL}', current_schema()) WHERE EXISTS (SELECT 1 FROM woken))
"""


def _delay(item: Settlement) -> float | None:
    """A SUSPEND's delay as bound: None for none (math.inf) or one past FOREVER."""
    if item.transition is not states.Transition.SUSPEND:
        return 0.0
    delay = max(float(item.delay), 0.0)
    return None if delay >= to_epoch(base.FOREVER) - time.time() else delay


def durable_params(items: Sequence[Settlement]) -> dict[str, Any]:
    items = by_id(items)
    steps = [item.step for item in items]
    return {
        "ids": [s.id for s in items], "tokens": [s.token for s in items],
        "suspends": [s.transition is states.Transition.SUSPEND for s in items],
        "delays": [_delay(s) for s in items], "awaiting": [_text(s.awaiting) for s in items],
        "names": [None if step is None else _text(step.name) for step in steps],
        "statuses": [None if step is None else step.status for step in steps],
        "values": [None if step is None else _text(step.value) for step in steps],
        "started": [None if step is None else step.started_at for step in steps],
        "ended": [None if step is None else step.ended_at for step in steps],
    }


def settle_durable(conn: psycopg.Connection[Any], items: Sequence[Settlement]) -> list[bool]:
    """STEP and SUSPEND outcomes (:data:`_SETTLE_DURABLE`); per outcome, whether it was written (its
    lease held). STEPs alone: that one statement. With SUSPENDs, a transaction (tried again if
    Postgres broke a deadlock with it) that also wakes at once the jobs whose awaited signal was
    sent already (:data:`_WOKEN_AT_ONCE`, NOTIFYing), and applies the edges of a job cancelled
    instead (its cancel was requested); then a job whose key is held only while pending takes it
    again (:func:`retake`)."""
    if not items:
        return []
    answers = [False] * len(items)
    for part in rounds(items):  # (one round but for a job twice in a batch)
        chosen = [items[n] for n in part]
        for n, written in zip(part, _settle_durable_round(conn, chosen)):
            answers[n] = written
    return answers


def _settle_durable_round(conn: psycopg.Connection[Any], items: Sequence[Settlement]) -> list[bool]:
    params = durable_params(items)
    if not any(params["suspends"]):
        found = conn.execute(_SETTLE_DURABLE, params).fetchall()
        held = {(job_id, token) for job_id, token, *_ in found}
        return [(s.id, s.token) in held for s in items]
    awaiting = any(s.transition is states.Transition.SUSPEND and s.awaiting is not None for s in items)

    def write() -> list[Any]:
        found = conn.execute(_SETTLE_DURABLE, params).fetchall()
        if awaiting:
            conn.execute(_WOKEN_AT_ONCE, {"ids": [job_id for job_id, _, status, *_ in found if status == "suspended"]})
        apply_edges(conn, [(job_id, "cancelled") for job_id, _, status, kids, _ in found if kids and status == "cancelled"])
        return found

    found = deadlocks_retried(conn, write)
    retake(conn, [job_id for job_id, _, status, _, keyed in found if keyed and status == "suspended"])
    held = {(job_id, token) for job_id, token, *_ in found}
    return [(s.id, s.token) in held for s in items]


# -- expiry ---------------------------------------------------------------------------------------


def _literal(text: str) -> str:
    """``text`` as an SQL string literal inside a statement that takes parameters."""
    return "'" + text.replace("'", "''").replace("%", "%%") + "'"


# A pending job not started by its expires_at → cancelled, with base.expired_error's text
# (its expiry as the protocol's text, from the stored time).
_BEFORE, _AFTER = expired_error("\x00").split("\x00")
_EXPIRE = (f"status = 'cancelled', updated_at = {MS}, started_at = NULL, error = {_literal(_BEFORE)} || "
           f"""to_char(j.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') || {_literal(_AFTER)}""")
EXPIRE_CHUNK = 10000  # expired jobs of one type ended per statement (a backlog: the next claim or rescue goes on)
# the expired pending jobs of the types in w, one seek each into jobs_expiring (empty unless jobs
# have an expires_at), locked as a claim locks: SKIP LOCKED, so no expiry waits for a claim
_EXPIRED_OF = f"""
SELECT e.id FROM w CROSS JOIN LATERAL (
    SELECT id FROM jobs WHERE status = 'pending' AND job_type = w.job_type AND expires_at <= now()
     LIMIT {EXPIRE_CHUNK}
       FOR UPDATE SKIP LOCKED) e"""
# The claims' expiry, in a statement that commits alone: the expired jobs of the types in w (locked,
# as _EXPIRED_OF locks them), of which it ends those without children (schema version 8). An
# expired job with children is only seen, as a row of NULLs among the claim's rows (_PARKED), and
# the claim ends it at once in a transaction that applies its edges (:func:`expire_parents`). None
# is picked either way: its expires_at has passed.
_EXPIRING = f"""expiring AS MATERIALIZED (
    SELECT e.id, e.has_children FROM w CROSS JOIN LATERAL (
        SELECT id, has_children FROM jobs WHERE status = 'pending' AND job_type = w.job_type AND expires_at <= now()
         LIMIT {EXPIRE_CHUNK}
           FOR UPDATE SKIP LOCKED) e
),
expired AS (
    UPDATE jobs j SET {_EXPIRE}
     WHERE j.id = ANY(ARRAY(SELECT id FROM expiring WHERE has_children IS NOT TRUE)) AND j.status = 'pending'
    RETURNING 1
)"""
_PARKED = "(SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM expiring WHERE has_children LIMIT 1)"


# Every type that has an expiring pending job, one seek each (a loose index scan of jobs_expiring):
# the rescue's, for the jobs of the types nobody claims
_EXPIRE_ALL = f"""
WITH RECURSIVE w(job_type) AS (
    (SELECT job_type FROM jobs WHERE status = 'pending' AND expires_at IS NOT NULL ORDER BY job_type LIMIT 1)
    UNION ALL
    SELECT (SELECT j.job_type FROM jobs j
             WHERE j.status = 'pending' AND j.expires_at IS NOT NULL AND j.job_type > w.job_type
             ORDER BY j.job_type LIMIT 1)
      FROM w WHERE w.job_type IS NOT NULL
),
gone AS (
UPDATE jobs j SET {_EXPIRE}
 WHERE j.id = ANY(ARRAY({_EXPIRED_OF})) AND j.status = 'pending'
RETURNING j.id, j.has_children)
SELECT count(*), coalesce(array_agg(id) FILTER (WHERE has_children), '{{}}') FROM gone
"""


def expire(conn: psycopg.Connection[Any]) -> int:
    """In the caller's transaction: pending jobs of every type whose expires_at passed → cancelled
    (base.expired_error), their edges applied."""
    row = conn.execute(_EXPIRE_ALL).fetchone()
    assert row is not None
    n, parents = row
    apply_edges(conn, [(job_id, "cancelled") for job_id in parents])
    return int(n)


# An expired pending job with children of the given types (what a claim left: _PARKED), ended in a
# transaction that applies its edges; locked as the claim locks, SKIP LOCKED.
_EXPIRE_PARENTS = f"""
WITH gone AS (
UPDATE jobs j SET {_EXPIRE}
 WHERE j.id = ANY(ARRAY(SELECT id FROM jobs WHERE status = 'pending' AND job_type = ANY(%(types)s::text[])
                           AND expires_at <= now() AND has_children
                         ORDER BY id LIMIT {EXPIRE_CHUNK} FOR UPDATE SKIP LOCKED))
   AND j.status = 'pending'
RETURNING j.id)
SELECT coalesce(array_agg(id), '{{}}') FROM gone
"""


def expire_parents(conn: psycopg.Connection[Any], job_types: Sequence[str]) -> None:
    """The expired pending jobs with children of ``job_types`` → cancelled, their edges applied,
    in one transaction (a claim's statement saw them: it ends only jobs without children)."""
    def end() -> None:
        row = conn.execute(_EXPIRE_PARENTS, {"types": list(job_types)}).fetchone()
        apply_edges(conn, [(job_id, "cancelled") for job_id in (row[0] if row else [])])

    deadlocks_retried(conn, end)


# -- claim ----------------------------------------------------------------------------------------

# Per requested type not paused (paused_types, read by the claim's own statement), its first n
# due pending jobs in claim order, skipping rows another claim has locked (SKIP LOCKED: claimers
# never wait on each other, nor take a job twice), through jobs_claim; then all of them running
# under one lease owner. The first k of each type start at once (their attempt counts now); the
# rest are claimed ahead, counted by START. Its expired pending jobs are ended first (expired: a
# seek into jobs_expiring per type), and none of them is picked: both parts read one snapshot, so
# picked skips what expired ends, and the two change disjoint rows. An expired job with children
# is not ended here but seen: a row of NULLs after the claimed rows (_EXPIRING, _PARKED).
# whether a claimed row starts at once: at or before the last counted row of its type, in claim order
_COUNTED = ("EXISTS (SELECT 1 FROM cut WHERE cut.job_type = j.job_type "
            "AND (j.priority, j.run_after, j.id) <= (cut.priority, cut.run_after, cut.id))")
_CLAIM = f"""
WITH w AS MATERIALIZED (
    SELECT * FROM unnest(%(types)s::text[], %(limits)s::int[], %(starts)s::int[]) AS w(job_type, n, k)
     WHERE NOT EXISTS (SELECT 1 FROM paused_types p WHERE p.job_type = w.job_type)
),
{_EXPIRING},
picked AS MATERIALIZED (
    SELECT p.id, w.job_type, p.priority, p.run_after,
           row_number() OVER (PARTITION BY w.job_type ORDER BY p.priority, p.run_after, p.id) <= w.k AS counted
      FROM w
     CROSS JOIN LATERAL (
        SELECT id, priority, run_after FROM jobs
         WHERE status = 'pending' AND job_type = w.job_type AND run_after <= now()
           AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority, run_after, id
         LIMIT w.n
           FOR UPDATE SKIP LOCKED) p
),
-- per type, the last picked row that starts at once (fewer than k may have been picked)
cut AS MATERIALIZED (
    SELECT DISTINCT ON (job_type) job_type, priority, run_after, id FROM picked WHERE counted
     ORDER BY job_type, priority DESC, run_after DESC, id DESC),
leased AS (
UPDATE jobs j
   SET status = 'running', lease_token = j.lease_token + 1,
       attempts = j.attempts + ({_COUNTED})::int,
       started_at = CASE WHEN {_COUNTED} THEN {MS} END,
       lease_owner = %(owner)s, lease_expires_at = {seconds_after('%(lease)s::float8')}, updated_at = {MS}
-- = ANY(ARRAY(...)) and no join with picked: one scan of the primary key for every claimed
-- row. (Joined with picked, the plans depended on the table's statistics: with none, as on a
-- table just filled, a nested loop sorted the array of ids again for each row, 17 ms of a
-- claim; guessing 4000 rows from the lateral join, it hashed the whole table.)
 WHERE j.id = ANY(ARRAY(SELECT id FROM picked))
RETURNING j.id, j.job_type, j.payload, j.attempts + (j.started_at IS NULL)::int, j.max_attempts, j.lease_token,
          j.created_at, j.run_after, j.priority, j.started_at IS NOT NULL, j.trace, j.expires_at)
SELECT * FROM leased UNION ALL {_PARKED}"""


# A claim of a globally limited type runs in a transaction of its own that first takes this
# lock, one per (schema, type): two processes' claims of the type take turns, each counting the
# running rows after the one before it committed (READ COMMITTED: a statement's snapshot is
# taken when it starts, after the lock is ours). Only claims make rows running; outcomes,
# rescues and unlimited types never take the lock.
_LIMIT_LOCK = "SELECT pg_advisory_xact_lock(hashtext('pipeline limit ' || current_schema()), hashtext(%(job_type)s))"
# The type in the aggregate's FILTER, not the WHERE: the read is bounded by the running rows
# (jobs_leases, jobs_status), whatever the statistics say. With the type in the WHERE, a table
# without statistics (just filled) was read through jobs_type as well: every row of the type,
# 100,000 completed ones in 3 ms, where the running rows alone take 0.01.
_RUNNING_OF_TYPE = "SELECT count(*) FILTER (WHERE job_type = %(job_type)s) FROM jobs WHERE status = 'running'"



def _claim_rows(conn: psycopg.Connection[Any], wanted: Sequence[tuple[str, int]], owner: str, lease_seconds: float,
                start: Mapping[str, int] | None) -> list[Any]:
    """The rows of :data:`_CLAIM`: one per job claimed, and a row of NULLs if it saw an expired job
    with children (limits.claim ends those: :func:`expire_parents`)."""
    wanted = [(t, n) for t, n in wanted if n > 0]
    if not wanted:
        return []
    starts = [n if start is None else max(0, min(n, start.get(t, 0))) for t, n in wanted]
    return conn.execute(_CLAIM, {"types": [t for t, _ in wanted], "limits": [n for _, n in wanted], "starts": starts,
                                 "owner": owner, "lease": float(lease_seconds)}).fetchall()


# -- leases ---------------------------------------------------------------------------------------

# A renewal never waits for a row lock: it renews the rows it can lock at once (SKIP LOCKED)
# and reads the others as last committed. A row another transaction holds locked (an outcome
# being written, a rescue of an expired lease) and still ours as last committed is not lost,
# only not renewed this time: if its lease was in fact taken, the next renewal says so. Waiting
# instead held up every lease of the process behind one lock: a Ledger batch whose keyed insert
# waited for another transaction's uncommitted key kept its outcomes' rows locked, every lease
# ran out, and other processes ran jobs still running here.
_RENEW = f"""
WITH h AS MATERIALIZED (
    SELECT *, 'running'::text AS running FROM unnest(%(ids)s::text[], %(tokens)s::bigint[]) AS h(id, token)),
ours AS MATERIALIZED (
    SELECT j.id, h.token FROM jobs j, h
     WHERE j.id = ANY(ARRAY(SELECT id FROM h)) AND j.id = h.id AND j.status = h.running AND j.lease_token = h.token),
free AS MATERIALIZED (
    SELECT j.id FROM jobs j, h
     WHERE j.id = ANY(ARRAY(SELECT id FROM ours)) AND j.id = h.id AND j.status = h.running AND j.lease_token = h.token
       FOR UPDATE OF j SKIP LOCKED),
renewed AS (
    UPDATE jobs j SET lease_expires_at = {seconds_after('%(lease)s::float8')}
      FROM h
     WHERE j.id = ANY(ARRAY(SELECT id FROM free)) AND j.id = h.id AND j.status = h.running AND j.lease_token = h.token
    RETURNING j.id)
SELECT id, token FROM ours
"""


def renew(conn: psycopg.Connection[Any], held: Sequence[tuple[str, int]], *, lease_seconds: float) -> list[str]:
    """Push the expiry of held leases to now + ``lease_seconds``; the ids whose lease is lost.
    A lease whose row another transaction holds locked is left as it is (see _RENEW)."""
    if not held:
        return []
    ordered = by_id(held)
    ours = {(i, t) for i, t in conn.execute(_RENEW, {"ids": [i for i, _ in ordered], "tokens": [t for _, t in ordered],
                                                     "lease": float(lease_seconds)})}
    return [job_id for job_id, token in held if (job_id, token) not in ours]


_EXPIRED = """
SELECT id, lease_token, attempts, max_attempts, lease_owner, started_at IS NOT NULL, cancel_requested FROM jobs
 WHERE status = 'running' AND lease_expires_at < now()
 ORDER BY lease_expires_at
 LIMIT 10000
   FOR UPDATE SKIP LOCKED
"""
_RESCUE = f"""
WITH moved AS (
UPDATE jobs j
   SET status = r.status,
       run_after = CASE WHEN r.status = 'pending' AND r.started THEN {seconds_after('r.delay')} ELSE j.run_after END,
       error = coalesce(r.error, j.error),
       progress = CASE WHEN r.status = 'pending' THEN NULL ELSE j.progress END,
       progress_message = CASE WHEN r.status = 'pending' THEN NULL ELSE j.progress_message END,
       started_at = NULL, updated_at = {MS}, lease_owner = NULL, lease_expires_at = NULL, cancel_requested = false
  FROM (SELECT *, 'running'::text AS running
          FROM unnest(%(ids)s::text[], %(tokens)s::bigint[], %(statuses)s::text[], %(delays)s::float8[],
                      %(errors)s::text[], %(started)s::bool[]) AS r(id, token, status, delay, error, started) OFFSET 0) r
 WHERE j.id = ANY(ARRAY(SELECT unnest(%(ids)s::text[]))) AND j.id = r.id AND j.status = r.running AND j.lease_token = r.token
RETURNING j.id, j.status, j.has_children)
SELECT count(*), coalesce(array_agg(id) FILTER (WHERE has_children AND status = 'dead'), '{{}}'),
       coalesce(array_agg(id) FILTER (WHERE has_children AND status = 'cancelled'), '{{}}') FROM moved
"""
RESCUED_CANCEL = cancelled_running_error("its cancel was requested")


def rescue_expired(
    conn: psycopg.Connection[Any], *, base_seconds: float, rng: random.Random | None = None,
    spare: Collection[tuple[str, int]] = (),
) -> int:
    """running jobs whose lease ran out (their worker died, or lost them) → pending after a
    backoff, or dead when out of attempts, or cancelled if their cancel was requested; the
    leases ``spare`` (the caller still holds them) are left alone. Rescuers running at once
    take disjoint rows (SKIP LOCKED), and the fence moves each job once. Then the pending jobs
    of every type whose expires_at passed → cancelled (:func:`expire`). One transaction, which
    applies the edges of every job it ends."""
    return deadlocks_retried(conn, lambda: _rescue(conn, base_seconds=base_seconds, rng=rng, spare=spare))


def _rescue(conn: psycopg.Connection[Any], *, base_seconds: float, rng: random.Random | None,
            spare: Collection[tuple[str, int]]) -> int:
    expired = [row for row in conn.execute(_EXPIRED).fetchall() if (row[0], row[1]) not in spare]
    rescued = 0
    if expired:
        ids, tokens, statuses, delays, errors, started = [], [], [], [], [], []
        for job_id, token, attempts, max_attempts, owner, has_started, cancelling in by_id(expired):
            status, delay, error = "pending", 0.0, None
            if cancelling:  # its worker died before it stopped the job: never retried
                status, error = "cancelled", RESCUED_CANCEL
            elif has_started:
                decision = states.rescue(attempts=attempts, max_attempts=max_attempts, base_seconds=base_seconds,
                                         rng=rng)
                if decision.transition is states.Transition.RESCUE:
                    delay = decision.delay
                else:
                    status = "dead"
                error = f"lease expired: worker {owner or '?'} stopped renewing it during attempt {attempts}"
            # else: claimed ahead, never started: back in its place in line, its attempt never counted
            ids.append(job_id)
            tokens.append(token)
            statuses.append(status)
            delays.append(delay)
            errors.append(error)
            started.append(has_started)
        row = conn.execute(_RESCUE, {"ids": ids, "tokens": tokens, "statuses": statuses, "delays": delays,
                                     "errors": errors, "started": started}).fetchone()
        assert row is not None
        rescued, dead, cancelled = row
        retake(conn, [job_id for job_id, status in zip(ids, statuses) if status == "pending"])
        apply_edges(conn, [*((job_id, "dead") for job_id in dead), *((job_id, "cancelled") for job_id in cancelled)])
    return int(rescued) + expire(conn)


# -- control (issue 23): the worker side's ------------------------------------------------------

# the rows of jobs_cancel_requests only: none at all while nobody cancels a running job
_CANCEL_REQUESTS = """
SELECT id, lease_token FROM jobs WHERE cancel_requested AND status = 'running' AND lease_owner = %(owner)s ORDER BY id
"""


def cancel_requests(conn: psycopg.Connection[Any], owner: str) -> list[tuple[str, int]]:
    """(id, token) of the running jobs ``owner`` holds whose cancel was requested."""
    return [(job_id, token) for job_id, token in conn.execute(_CANCEL_REQUESTS, {"owner": owner})]


# Fenced as an outcome. Neither updated_at nor any other indexed column: the update can stay on
# the row's page (a HOT update), adding no index entry, however often a handler reports.
_PROGRESS = """
UPDATE jobs SET progress = %(fraction)s::float8, progress_message = %(message)s
 WHERE id = %(id)s AND status = 'running' AND lease_token = %(token)s
"""


def set_progress(conn: psycopg.Connection[Any], job_id: str, token: int, fraction: float, message: str | None) -> bool:
    """A running job's progress and message, if it still runs under ``token``; whether written."""
    return conn.execute(_PROGRESS, {"fraction": float(fraction), "message": _text(message), "id": job_id,
                                    "token": token}).rowcount == 1


# -- unknown types and the worker registry ---------------------------------------------------------

# the distinct types of pending jobs, one index seek each (a loose index scan of jobs_claim)
_PENDING_TYPES = """
WITH RECURSIVE t(job_type) AS (
    (SELECT job_type FROM jobs WHERE status = 'pending' ORDER BY job_type LIMIT 1)
    UNION ALL
    SELECT (SELECT j.job_type FROM jobs j WHERE j.status = 'pending' AND j.job_type > t.job_type ORDER BY j.job_type LIMIT 1)
      FROM t WHERE t.job_type IS NOT NULL
)
SELECT job_type FROM t WHERE job_type IS NOT NULL
"""
_LIVE = """
SELECT job_types FROM workers
 WHERE heartbeat_at >= now() - %(grace)s::float8 * interval '1 second'
    OR heartbeat_at + lease_seconds * interval '1 second' >= now()
"""
_BURY_TYPE = f"""
WITH gone AS (
UPDATE jobs SET status = 'dead', error = %(error)s, updated_at = {MS}, started_at = NULL
 WHERE status = 'pending' AND job_type = %(job_type)s AND run_after <= now() - %(grace)s::float8 * interval '1 second'
RETURNING id, has_children)
SELECT count(*), coalesce(array_agg(id) FILTER (WHERE has_children), '{{}}') FROM gone
"""


def bury_unknown_types(conn: psycopg.Connection[Any], known: set[str], *, grace_seconds: float) -> int:
    """Pending jobs of types neither ``known`` nor known to a worker alive within the grace
    (or by its own lease), due for longer than the grace → dead, with an error saying why; their
    edges applied in the same transaction."""
    return deadlocks_retried(conn, lambda: _bury(conn, known, grace_seconds=grace_seconds))


def _bury(conn: psycopg.Connection[Any], known: set[str], *, grace_seconds: float) -> int:
    unknown = [t for (t,) in conn.execute(_PENDING_TYPES) if t not in known]
    if not unknown:
        return 0
    live: set[str] = set()
    for (text,) in conn.execute(_LIVE, {"grace": float(grace_seconds)}):
        try:
            live.update(json.loads(text))
        except (ValueError, TypeError):
            continue
    n = 0
    for job_type in unknown:
        if job_type in live:
            continue
        error = (f"no worker handles job type {job_type!r}: no live process registers a handler for it "
                 "(it may be registered without one, or not at all); add a handler, then retry the job")
        row = conn.execute(_BURY_TYPE, {"error": error, "job_type": job_type, "grace": float(grace_seconds)}).fetchone()
        assert row is not None
        n += row[0]
        apply_edges(conn, [(job_id, "dead") for job_id in row[1]])
    return n


def bound_lock_waits(conn: psycopg.Connection[Any], *, seconds: float) -> None:
    """In the transaction under way: a lock not granted within ``seconds`` fails the statement
    (LockNotAvailable) instead of waiting on."""
    conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{max(int(seconds * 1000), 1)}ms",))


_BEAT = """
INSERT INTO workers (owner, job_types, started_at, heartbeat_at, lease_seconds) VALUES (%(owner)s, %(types)s, now(), now(), %(lease)s)
ON CONFLICT (owner) DO UPDATE SET job_types = EXCLUDED.job_types, heartbeat_at = EXCLUDED.heartbeat_at,
                                  lease_seconds = EXCLUDED.lease_seconds
"""


def beat(conn: psycopg.Connection[Any], owner: str, job_types: Iterable[str], *, lease_seconds: float) -> None:
    conn.execute(_BEAT, {"owner": owner, "types": json.dumps(sorted(job_types)), "lease": float(lease_seconds)})


def forget_worker(conn: psycopg.Connection[Any], owner: str) -> None:
    conn.execute("DELETE FROM workers WHERE owner = %s", (owner,))
