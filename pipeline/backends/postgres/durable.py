"""Durable functions on Postgres (issue 35, docs/durable.md): a job's steps, the signals sent to
it, the wake-up of suspended jobs, and what removing or replaying a job does to its steps. (The
STEP and SUSPEND outcomes ride the Ledger's batches: store.settle_durable.)

Tables (schema.py, version 11): ``job_steps``, one row per (job, name) with the position it was
first written at; ``job_signals``, one row per signal sent, consumed oldest first per name;
``job_waits``, the signal a job awaited when it last suspended (its ``awaiting_signal`` while it is
suspended). A job that has rows in any is flagged ``durable`` (by its STEP or SUSPEND, or the signal
sent to it): removing jobs looks for their rows only when one of them is, so a plain job's removal
costs what it did.

Signals and suspensions meet on the job's row lock: :func:`send_signal` locks the row before it
writes the signal, and a SUSPEND's update locks it too; whichever comes second sees the other
(store._WOKEN_AT_ONCE says how the SUSPEND does), so a job never stays suspended awaiting a signal
that was sent to it and not consumed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from ...errors import SignalKeyUsed, UsageError
from ..base import StepRecord, signal_refused
from .store import CHANNEL, ENDED, FOREVER, MS, NOTIFY, _text

# -- steps ------------------------------------------------------------------------------------------

_STEPS = ("SELECT name, status, value, started_at, ended_at FROM job_steps WHERE job_id = %(id)s "
          "ORDER BY position")


def steps(conn: psycopg.Connection[Any], job_id: str) -> list[StepRecord]:
    """The job's steps in the order first written ([] for none, or an unknown job)."""
    return [StepRecord(*row) for row in conn.execute(_STEPS, {"id": job_id})]


# -- signals ----------------------------------------------------------------------------------------

# Fenced as an outcome (the job's row locked FOR SHARE: a rescue or a cancel waits for the commit, and
# a signal's sender, which locks the row first, has committed): the oldest unconsumed signal of the
# name, consumed, and the step written with its payload, in one statement. Its answer: whether the lease
# held, and the payload consumed (a row only if one was).
_TAKE = """
WITH j AS MATERIALIZED (
    SELECT id FROM jobs WHERE id = %(id)s AND status = 'running' AND lease_token = %(token)s FOR SHARE),
taken AS (
    UPDATE job_signals s SET consumed = true
     WHERE (s.job_id, s.seq) = (SELECT job_id, seq FROM job_signals
                                 WHERE job_id = (SELECT id FROM j) AND name = %(name)s AND NOT consumed
                                 ORDER BY seq LIMIT 1 FOR UPDATE)
    RETURNING s.job_id, s.payload),
stepped AS (
    INSERT INTO job_steps (job_id, name, status, value, started_at, ended_at)
    SELECT job_id, %(step)s, %(status)s, payload, %(started)s::timestamptz, %(ended)s::timestamptz FROM taken
    ON CONFLICT (job_id, name) DO UPDATE
       SET status = excluded.status, value = excluded.value, started_at = excluded.started_at, ended_at = excluded.ended_at)
SELECT EXISTS (SELECT 1 FROM j), EXISTS (SELECT 1 FROM taken), (SELECT payload FROM taken)
"""


def take_signal(conn: psycopg.Connection[Any], job_id: str, token: int, name: str,
                step: StepRecord) -> tuple[bool, str | None] | None:
    """If the job runs under ``token``: the oldest unconsumed signal ``name`` consumed and ``step``
    written with its payload as the value, (True, payload); (False, None) if none was sent (nothing
    written). None if the lease is stale (nothing changed)."""
    row = conn.execute(_TAKE, {"id": job_id, "token": token, "name": _text(name), "step": _text(step.name),
                               "status": step.status, "started": step.started_at, "ended": step.ended_at}).fetchone()
    assert row is not None
    held, taken, payload = row
    if not held:
        return None
    return (True, payload) if taken else (False, None)


_LOCK_JOB = "SELECT status FROM jobs WHERE id = %(id)s FOR UPDATE"
# (a statement of its own, after the lock: its snapshot sees the job_waits row of a SUSPEND that held the
# job's row until it committed, which a subquery of _LOCK_JOB, read in that statement's older snapshot,
# would not)
_AWAITED = "SELECT signal FROM job_waits WHERE job_id = %(id)s"
# whether a signal with this key was sent to the job (job_signals_key)
_KEY_USED = "SELECT 1 FROM job_signals WHERE job_id = %(id)s AND key = %(key)s"
# a signal with a key already used for the job inserts nothing (job_signals_key)
_SEND = f"""
INSERT INTO job_signals (job_id, name, payload, key, sent_at) VALUES (%(id)s, %(name)s, %(payload)s, %(key)s, {MS})
ON CONFLICT (job_id, key) WHERE key IS NOT NULL DO NOTHING RETURNING seq
"""
_FLAG = "UPDATE jobs SET durable = true WHERE id = %(id)s AND durable IS NOT TRUE"
# RESUME: the job awaited this signal; due now (its wait consumes the signal when it runs again)
_WAKE = f"""
UPDATE jobs SET status = 'pending', run_after = {MS}, updated_at = {MS}, durable = true
 WHERE id = %(id)s AND status = 'suspended'
"""


def awaited(conn: psycopg.Connection[Any], job_id: str) -> str | None:
    """The signal the job awaited when it last suspended (None: none); its awaiting_signal while it is
    suspended."""
    row = conn.execute(_AWAITED, {"id": job_id}).fetchone()
    return None if row is None else row[0]


def signal_key_used(conn: psycopg.Connection[Any], job_id: str, key: str) -> bool:
    """Whether a signal with ``key`` was sent to the job (job_signals_key: one index look)."""
    return conn.execute(_KEY_USED, {"id": job_id, "key": _text(key)}).fetchone() is not None


def send_signal(conn: psycopg.Connection[Any], job_id: str, name: str, payload: str | None, *,
                key: str | None = None) -> str:
    """Send the signal ``name`` to a job, in one transaction: kept for the job, and "woken" if the job
    was suspended awaiting it (pending, due now; NOTIFY as an insert does), else "kept" (a job not at
    its wait yet consumes it when it gets there: see module docstring for the race with a SUSPEND).
    LookupError for an unknown job; SignalKeyUsed if a signal with ``key`` was sent to it already,
    whatever became of the job since (a used link says so, before the job's end); else UsageError for a
    finished job (base.signal_refused). Nothing is written but the signal (and the wake)."""
    used = SignalKeyUsed(f"job {job_id}: a signal with key {key!r} was sent to it already (a link works once); "
                         "nothing was sent")
    with conn.transaction():
        row = conn.execute(_LOCK_JOB, {"id": job_id}).fetchone()
        if row is None:
            raise LookupError(f"no job with id {job_id!r}")
        (status,) = row
        if status in ENDED:
            if key is not None and conn.execute(_KEY_USED, {"id": job_id, "key": _text(key)}).fetchone() is not None:
                raise used
            raise UsageError(signal_refused(job_id, status))
        sent = conn.execute(_SEND, {"id": job_id, "name": _text(name), "payload": _text(payload),
                                    "key": _text(key)}).fetchone()
        if sent is None:
            raise used
        if status == "suspended" and awaited(conn, job_id) == _text(name):
            conn.execute(_WAKE, {"id": job_id})
            conn.execute(NOTIFY)
            return "woken"
        conn.execute(_FLAG, {"id": job_id})
        return "kept"


# -- the wake-up of suspended jobs ------------------------------------------------------------------

# Up to n due suspended jobs → pending, oldest due first (jobs_suspended; SKIP LOCKED: processes waking at
# once take disjoint rows, and none waits for a SUSPEND or a signal under way), keeping their run_after
# (their place in the claim order); NOTIFY if any. Then the next suspended job's due time among those left
# (the rows this statement woke still read as suspended in its snapshot: skipped by id), through the same
# index: NULL when none has a deadline (FOREVER).
_WAKE_DUE = f"""
WITH due AS MATERIALIZED (
    SELECT id FROM jobs WHERE status = 'suspended' AND run_after <= now()
     ORDER BY run_after LIMIT %(limit)s FOR UPDATE SKIP LOCKED),
woken AS (
    UPDATE jobs j SET status = 'pending', updated_at = {MS}
     WHERE j.id = ANY(ARRAY(SELECT id FROM due)) AND j.status = 'suspended'
    RETURNING j.id),
later AS (
    SELECT run_after FROM jobs WHERE status = 'suspended' AND NOT (id = ANY(ARRAY(SELECT id FROM due)))
     ORDER BY run_after LIMIT 1)
SELECT (SELECT count(*) FROM woken),
       (SELECT greatest(extract(epoch FROM run_after - now()), 0)::float8 FROM later WHERE run_after < {FOREVER}),
       (SELECT pg_notify('{CHANNEL}', current_schema()) WHERE EXISTS (SELECT 1 FROM woken))
"""


def wake_suspended(conn: psycopg.Connection[Any], *, limit: int = 500) -> tuple[int, float | None]:
    """Up to ``limit`` suspended jobs whose time came → pending (RESUME), waking the Pollers; how many,
    and the seconds until the next suspended job is due (0: more are due now; None: none has a
    deadline). One statement; free while nothing is due (an index holds only suspended rows)."""
    row = conn.execute(_WAKE_DUE, {"limit": max(int(limit), 0)}).fetchone()
    assert row is not None
    woken, after, _ = row
    return int(woken), (None if after is None else float(after))


# -- removing and replaying -------------------------------------------------------------------------

_FORGET = ("WITH steps AS (DELETE FROM job_steps WHERE job_id = ANY(%(ids)s::text[])), "
           "signals AS (DELETE FROM job_signals WHERE job_id = ANY(%(ids)s::text[])) "
           "DELETE FROM job_waits WHERE job_id = ANY(%(ids)s::text[])")


def forget(conn: psycopg.Connection[Any], ids: Sequence[str]) -> None:
    """In the transaction that removed jobs: the steps, signals and wait of those of ``ids`` (the removed
    jobs flagged durable), one statement."""
    if ids:
        conn.execute(_FORGET, {"ids": list(ids)})


# the named step and every step first written after it
_FORGET_FROM = """
DELETE FROM job_steps WHERE job_id = %(id)s
   AND position >= (SELECT position FROM job_steps WHERE job_id = %(id)s AND name = %(name)s)
RETURNING name
"""
_NAMES = "SELECT name FROM job_steps WHERE job_id = %(id)s ORDER BY position"


def forget_from(conn: psycopg.Connection[Any], job_id: str, name: str) -> None:
    """In the caller's transaction (a replay): the step ``name`` of the job and every step first written
    after it removed; UsageError naming the job's steps if it has none of that name."""
    if conn.execute(_FORGET_FROM, {"id": job_id, "name": _text(name)}).fetchone() is None:
        names = [step for (step,) in conn.execute(_NAMES, {"id": job_id})]
        has = f"its steps are {', '.join(repr(n) for n in names)}" if names else "it has no steps"
        raise UsageError(f"job {job_id} has no step named {name!r} to retry from; {has}")
