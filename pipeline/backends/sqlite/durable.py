"""Durable functions on SQLite (issue 35): a job's steps, the signals sent to it, and the suspended jobs'
way back to pending.

A step is a row of ``job_steps`` per (job, name), written under the job's lease by a STEP or SUSPEND
outcome (store.settle) or by :func:`take_signal`, and replaced whole when written again, keeping its
``position`` (its rowid: the order first written). A signal is a row of ``job_signals``, numbered per
job in the order sent; a wait consumes the oldest of its name. A suspended job goes pending when its
signal is sent (:func:`send_signal`) or its time comes (:func:`wake_suspended`); either adds it to
workflows.WOKEN, so that the Ledger nudges its Poller once the batch committed, as for an insert.

Nothing here knows about trio; the functions that write expect the caller's write transaction (a
Ledger batch), the reads a read connection.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

import attrs

from ...clock import to_epoch
from ...errors import SignalKeyUsed, UsageError
from ..base import FOREVER, StepRecord, signal_refused
from . import workflows

# -- steps ------------------------------------------------------------------------------------------

# A step upserted under the lease (?6, ?7: the job's id and token): nothing is written unless the job
# runs under that token. A new name takes the next position (the rowid: see migration 17); a name
# written before keeps its own. (The WHERE clause also settles SQLite's reading of INSERT ... SELECT ...
# ON CONFLICT.)
PUT_STEP = (
    "INSERT INTO job_steps (job_id, name, status, value, started_at, ended_at) "
    "SELECT id, ?1, ?2, ?3, ?4, ?5 FROM jobs WHERE id = ?6 AND status = 'running' AND lease_token = ?7 "
    "ON CONFLICT (job_id, name) DO UPDATE SET status = excluded.status, value = excluded.value, "
    "started_at = excluded.started_at, ended_at = excluded.ended_at"
)


def step_params(job_id: str, token: int, step: StepRecord) -> tuple[object, ...]:
    """:data:`PUT_STEP`'s parameters."""
    return (step.name, step.status, step.value, step.started_at, step.ended_at, job_id, token)


_STEPS = "SELECT name, status, value, started_at, ended_at FROM job_steps WHERE job_id = ? ORDER BY position"


def signal_key_used(conn: sqlite3.Connection, job_id: str, key: str) -> bool:
    """Whether a signal with ``key`` was sent to the job (its unique key per job: one index look)."""
    return conn.execute("SELECT 1 FROM job_signals WHERE job_id = ? AND key = ?", (job_id, key)).fetchone() is not None


def steps(conn: sqlite3.Connection, job_id: str) -> list[StepRecord]:
    """The job's steps in the order first written ([] for none, or an unknown job)."""
    return [StepRecord(*row) for row in conn.execute(_STEPS, (job_id,))]


def replay_from(conn: sqlite3.Connection, job_id: str, name: str) -> None:
    """Remove the step ``name`` and every step first written after it (a replay); UsageError naming
    the job's steps if it has none of that name (nothing removed)."""
    row = conn.execute("SELECT position FROM job_steps WHERE job_id = ? AND name = ?", (job_id, name)).fetchone()
    if row is None:
        names = [step.name for step in steps(conn, job_id)]
        have = f"its steps are {', '.join(map(repr, names))}" if names else "it has no steps"
        raise UsageError(f"job {job_id} has no step {name!r} to replay from: {have}")
    conn.execute("DELETE FROM job_steps WHERE job_id = ? AND position >= ?", (job_id, row[0]))


# -- signals ----------------------------------------------------------------------------------------

# the oldest signal of a name sent to a job and not consumed yet (idx_signals_unconsumed)
_WAITING_SIGNAL = "SELECT seq, payload FROM job_signals WHERE job_id = ? AND name = ? AND consumed = 0 ORDER BY seq LIMIT 1"
_HAS_SIGNAL = "SELECT EXISTS (SELECT 1 FROM job_signals WHERE job_id = ? AND name = ? AND consumed = 0)"
_SEND = (
    "INSERT INTO job_signals (job_id, seq, name, payload, key, sent_at) "
    "VALUES (?1, (SELECT coalesce(max(seq) + 1, 1) FROM job_signals WHERE job_id = ?1), ?2, ?3, ?4, ?5)"
)
# RESUME by a signal: the job waiting for it is due now, whatever its deadline was
_RESUME_NOW = (
    "UPDATE jobs SET status = 'pending', awaiting_signal = NULL, run_after = ?1, updated_at = ?1 "
    "WHERE id = ?2 AND status = 'suspended'"
)


def has_signal(conn: sqlite3.Connection, job_id: str, name: str) -> bool:
    """Whether a signal ``name`` sent to the job waits to be consumed (SUSPEND's look)."""
    return bool(conn.execute(_HAS_SIGNAL, (job_id, name)).fetchone()[0])


def send_signal(conn: sqlite3.Connection, job_id: str, name: str, payload: str | None, *, key: str | None,
                now: str) -> str:
    """Keep the signal for the job; "woken" if the job was suspended waiting for this name (now pending,
    due now), else "kept". LookupError for an unknown job; SignalKeyUsed if ``key`` was used for this job
    already (looked at before its status); UsageError (base.signal_refused) for a finished one. Nothing
    written for those."""
    row = conn.execute("SELECT status, awaiting_signal FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if row is None:
        raise LookupError(f"no job with id {job_id!r}")
    status, awaiting = row
    # the key first: a link pressed again after its signal finished the job is "used", not "finished"
    if key is not None and conn.execute("SELECT 1 FROM job_signals WHERE job_id = ? AND key = ?", (job_id, key)).fetchone():
        raise SignalKeyUsed(f"job {job_id}: a signal with key {key!r} was sent to it already (a link works once); "
                            "nothing was sent")
    if status in workflows.FINAL:
        raise UsageError(signal_refused(job_id, status))
    conn.execute(_SEND, (job_id, name, payload, key, now))
    if status == "suspended" and awaiting == name and conn.execute(_RESUME_NOW, (now, job_id)).rowcount:
        woke([job_id])
        return "woken"
    return "kept"


def take_signal(conn: sqlite3.Connection, job_id: str, token: int, name: str, step: StepRecord) -> tuple[bool, str | None] | None:
    """Fenced by the lease (None: not running under ``token``, nothing changed): the oldest signal
    ``name`` not yet consumed is consumed and ``step`` written with its payload as the value:
    (True, payload); (False, None) if there is none."""
    running = conn.execute("SELECT 1 FROM jobs WHERE id = ? AND status = 'running' AND lease_token = ?",
                           (job_id, token)).fetchone()
    if running is None:
        return None
    found = conn.execute(_WAITING_SIGNAL, (job_id, name)).fetchone()
    if found is None:
        return False, None
    seq, payload = found
    conn.execute("UPDATE job_signals SET consumed = 1 WHERE job_id = ? AND seq = ?", (job_id, seq))
    conn.execute(PUT_STEP, step_params(job_id, token, attrs.evolve(step, value=payload)))
    return True, payload


# -- waking -----------------------------------------------------------------------------------------

# The suspended job due first (idx_jobs_suspended): one seek
_NEXT_DUE = "SELECT run_after FROM jobs INDEXED BY idx_jobs_suspended WHERE status = 'suspended' ORDER BY run_after LIMIT 1"
# RESUME by time: run_after as it was (due already: it keeps its place in the claim order)
_WAKE_DUE = (
    "UPDATE jobs SET status = 'pending', awaiting_signal = NULL, updated_at = ?1 "
    "WHERE rowid IN (SELECT rowid FROM jobs INDEXED BY idx_jobs_suspended "
    "WHERE status = 'suspended' AND run_after <= ?1 ORDER BY run_after LIMIT ?2) RETURNING id"
)


def next_due(conn: sqlite3.Connection, *, now: str) -> float | None:
    """Seconds until the first suspended job is due (0: due now); None: none has a deadline."""
    row = conn.execute(_NEXT_DUE).fetchone()
    if row is None or row[0] >= FOREVER:
        return None
    return max(0.0, to_epoch(row[0]) - to_epoch(now))


def wake_suspended(conn: sqlite3.Connection, *, limit: int, now: str) -> tuple[int, float | None]:
    """Up to ``limit`` suspended jobs due by ``now`` → pending, the first due first; how many, and
    :func:`next_due` after them."""
    woken = [job_id for (job_id,) in conn.execute(_WAKE_DUE, (now, limit))]
    woke(woken)
    return len(woken), next_due(conn, now=now)


def woke(job_ids: Sequence[str]) -> None:
    """Tell the Ledger's batch in hand that these jobs are pending now (it nudges its Poller)."""
    tally = workflows.WOKEN.get()
    if tally is not None and job_ids:
        tally.extend(job_ids)


# -- removing jobs ----------------------------------------------------------------------------------


def in_use(conn: sqlite3.Connection) -> bool:
    """Whether the store holds any step or signal: removing jobs has more to do only then."""
    return conn.execute("SELECT EXISTS (SELECT 1 FROM job_steps) OR EXISTS (SELECT 1 FROM job_signals)").fetchone()[0] == 1


_FORGET_STEPS = "DELETE FROM job_steps WHERE job_id IN (SELECT value FROM json_each(?))"
_FORGET_SIGNALS = "DELETE FROM job_signals WHERE job_id IN (SELECT value FROM json_each(?))"


def forget(conn: sqlite3.Connection, job_ids: Sequence[str]) -> None:
    """After jobs were removed: their steps and signals."""
    if not job_ids:
        return
    ids = json.dumps(list(job_ids))
    conn.execute(_FORGET_STEPS, (ids,))
    conn.execute(_FORGET_SIGNALS, (ids,))
