"""The Postgres statements on ``scheduled_jobs`` (see pipeline/schedules.py), as named synchronous
functions on a pooled connection (autocommit: each function that writes more than once opens
its own transaction)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import attrs
import psycopg

from ...clock import now_ts
from ...errors import UsageError
from ...schedules import check_advance
from ..base import NewJob, ScheduleRecord, code_schedule_writes, with_enabled
from . import store

_COLUMNS = (
    "name, job_type, payload, cron_expr, timezone, enabled, origin, next_run, last_run, last_job_id, declared, "
    "created_at, updated_at"
)
_SELECT = f"SELECT {_COLUMNS} FROM scheduled_jobs"


def all_schedules(conn: psycopg.Connection[Any]) -> list[ScheduleRecord]:
    return [ScheduleRecord(*row) for row in conn.execute(f"{_SELECT} ORDER BY name").fetchall()]


def due_schedules(conn: psycopg.Connection[Any], now: str) -> list[ScheduleRecord]:
    rows = conn.execute(f"{_SELECT} WHERE enabled AND next_run <= %s::timestamptz ORDER BY next_run", (now,)).fetchall()
    return [ScheduleRecord(*row) for row in rows]


def _get(conn: psycopg.Connection[Any], name: str, *, lock: bool = False) -> ScheduleRecord | None:
    row = conn.execute(f"{_SELECT} WHERE name = %s{' FOR UPDATE' if lock else ''}", (name,)).fetchone()
    return None if row is None else ScheduleRecord(*row)


_UPSERT = f"""
INSERT INTO scheduled_jobs ({_COLUMNS})
VALUES (%s, %s, %s, %s, %s, %s, %s, %s::timestamptz, %s::timestamptz, %s, %s, %s::timestamptz, %s::timestamptz)
ON CONFLICT (name) DO UPDATE SET
    job_type = excluded.job_type, payload = excluded.payload, cron_expr = excluded.cron_expr,
    timezone = excluded.timezone, enabled = excluded.enabled, origin = excluded.origin, next_run = excluded.next_run,
    last_run = excluded.last_run, last_job_id = excluded.last_job_id, declared = excluded.declared,
    updated_at = excluded.updated_at
"""


def _write(conn: psycopg.Connection[Any], record: ScheduleRecord) -> None:
    conn.execute(_UPSERT, attrs.astuple(record))


def add_schedule(conn: psycopg.Connection[Any], record: ScheduleRecord) -> ScheduleRecord:
    """UsageError if one of that name exists (the unique name decides, not a read before)."""
    row = conn.execute(
        f"INSERT INTO scheduled_jobs ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s::timestamptz, %s::timestamptz, "
        "%s, %s, %s::timestamptz, %s::timestamptz) ON CONFLICT (name) DO NOTHING RETURNING 1", attrs.astuple(record),
    ).fetchone()
    if row is None:
        raise UsageError(f"a schedule named {record.name!r} already exists; remove it first, or pick another name")
    return record


def remove_schedule(conn: psycopg.Connection[Any], name: str) -> None:
    if conn.execute("DELETE FROM scheduled_jobs WHERE name = %s", (name,)).rowcount == 0:
        raise LookupError(f"no schedule named {name!r}")


def set_enabled(conn: psycopg.Connection[Any], name: str, enabled: bool) -> ScheduleRecord:
    with conn.transaction():
        found = _get(conn, name, lock=True)
        if found is None:
            raise LookupError(f"no schedule named {name!r}")
        if found.enabled == enabled:
            return found
        changed = with_enabled(found, enabled, now=now_ts())
        _write(conn, changed)
        return changed


def sync_code(conn: psycopg.Connection[Any], records: Sequence[ScheduleRecord], *, owned: Collection[str] | None = None) -> None:
    """In one transaction, under a lock of its own: processes starting at once merge one after the other."""
    now = now_ts()
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('pipeline schedules ' || current_schema()))")
        # FOR UPDATE: a Scheduler firing one of these meanwhile waits for this merge and then finds
        # next_run as the merge left it; without the row locks, the merge wrote back the next_run it
        # had read, and a tick fired in between was due again (it fired twice)
        stored = {r.name: r for r in (ScheduleRecord(*row) for row in conn.execute(f"{_SELECT} ORDER BY name FOR UPDATE"))}
        for record in code_schedule_writes(stored, records, now=now, owned=owned):
            _write(conn, record)


# the fence: still enabled, still due at the tick the caller read (a row lock: a second firer
# waits for the first one's commit, then finds next_run moved and changes nothing)
_FIRE = """
UPDATE scheduled_jobs SET next_run = %(next_run)s::timestamptz, last_run = %(tick)s::timestamptz,
       last_job_id = %(job_id)s, updated_at = %(now)s::timestamptz
 WHERE name = %(name)s AND enabled AND next_run = %(tick)s::timestamptz
RETURNING 1
"""


def fire(conn: psycopg.Connection[Any], name: str, *, tick: str, next_run: str, job: NewJob) -> bool:
    """Move the schedule on and insert its job (and NOTIFY), or neither (UsageError for a next run
    that is not after the tick: see schedules.check_advance)."""
    check_advance(name, tick=tick, next_run=next_run)
    with conn.transaction():
        moved = conn.execute(_FIRE, {"next_run": next_run, "tick": tick, "job_id": job.id, "now": now_ts(),
                                     "name": name}).fetchone()
        if moved is None:
            return False
        # a schedule's job has no unique key (see Backend.fire_schedule): one job per tick, always
        store.insert_jobs(conn, [job._replace(unique_key=None)], notify=True)  # (a nested transaction: a savepoint)
        return True
