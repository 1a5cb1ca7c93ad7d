"""The SQLite statements on ``scheduled_jobs`` (see pipeline/schedules.py), as named synchronous
functions. The ones that write run inside the Ledger's transaction, like the store's."""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Sequence

import attrs

from ...errors import UsageError
from ...schedules import check_advance
from ..base import NewJob, ScheduleRecord, code_schedule_writes, with_enabled
from . import store

_COLUMNS = (
    "name, job_type, payload, cron_expr, timezone, enabled, origin, next_run, last_run, last_job_id, declared, "
    "created_at, updated_at"
)


def _record(row: tuple[object, ...]) -> ScheduleRecord:
    values = list(row)
    values[5] = bool(values[5])  # enabled
    values[10] = bool(values[10])  # declared
    return ScheduleRecord(*values)  # type: ignore[arg-type]


def all_schedules(conn: sqlite3.Connection) -> list[ScheduleRecord]:
    return [_record(row) for row in conn.execute(f"SELECT {_COLUMNS} FROM scheduled_jobs ORDER BY name")]


def due_schedules(conn: sqlite3.Connection, now: str) -> list[ScheduleRecord]:
    rows = conn.execute(f"SELECT {_COLUMNS} FROM scheduled_jobs WHERE enabled = 1 AND next_run <= ? ORDER BY next_run",
                        (now,))
    return [_record(row) for row in rows]


def get_schedule(conn: sqlite3.Connection, name: str) -> ScheduleRecord | None:
    row = conn.execute(f"SELECT {_COLUMNS} FROM scheduled_jobs WHERE name = ?", (name,)).fetchone()
    return None if row is None else _record(row)


_UPSERT = f"""
INSERT INTO scheduled_jobs ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (name) DO UPDATE SET
    job_type = excluded.job_type, payload = excluded.payload, cron_expr = excluded.cron_expr,
    timezone = excluded.timezone, enabled = excluded.enabled, origin = excluded.origin, next_run = excluded.next_run,
    last_run = excluded.last_run, last_job_id = excluded.last_job_id, declared = excluded.declared,
    updated_at = excluded.updated_at
"""


def write_schedule(conn: sqlite3.Connection, record: ScheduleRecord) -> None:
    conn.execute(_UPSERT, attrs.astuple(record))


def add_schedule(conn: sqlite3.Connection, record: ScheduleRecord) -> ScheduleRecord:
    """UsageError if one of that name exists."""
    if get_schedule(conn, record.name) is not None:
        raise UsageError(f"a schedule named {record.name!r} already exists; remove it first, or pick another name")
    write_schedule(conn, record)
    return record


def remove_schedule(conn: sqlite3.Connection, name: str) -> None:
    if conn.execute("DELETE FROM scheduled_jobs WHERE name = ?", (name,)).rowcount == 0:
        raise LookupError(f"no schedule named {name!r}")


def set_enabled(conn: sqlite3.Connection, name: str, enabled: bool, *, now: str) -> ScheduleRecord:
    found = get_schedule(conn, name)
    if found is None:
        raise LookupError(f"no schedule named {name!r}")
    if found.enabled == enabled:
        return found
    changed = with_enabled(found, enabled, now=now)
    write_schedule(conn, changed)
    return changed


def sync_code(conn: sqlite3.Connection, records: Sequence[ScheduleRecord], *, now: str,
              owned: Collection[str] | None = None) -> None:
    for record in code_schedule_writes({record.name: record for record in all_schedules(conn)}, records, now=now,
                                       owned=owned):
        write_schedule(conn, record)


# the fence: still enabled, still due at the tick the caller read
_FIRE = """
UPDATE scheduled_jobs SET next_run = :next_run, last_run = :tick, last_job_id = :job_id, updated_at = :now
 WHERE name = :name AND enabled = 1 AND next_run = :tick
"""


def fire(conn: sqlite3.Connection, name: str, *, tick: str, next_run: str, job: NewJob, now: str) -> bool:
    """Move the schedule on and insert its job, or neither (UsageError for a next run that is not
    after the tick: see schedules.check_advance)."""
    check_advance(name, tick=tick, next_run=next_run)
    moved = conn.execute(_FIRE, {"next_run": next_run, "tick": tick, "job_id": job.id, "now": now, "name": name}).rowcount
    if moved:
        store.insert_jobs(conn, [job._replace(unique_key=None)])  # no unique key: see Backend.fire_schedule
    return bool(moved)
