"""Numbered schema migrations, applied at start-up, recorded in ``schema_migrations``.

Each migration runs in its own ``BEGIN IMMEDIATE`` transaction together with the row
that records it, so two processes starting at once cannot both apply one, and a crash
mid-migration leaves nothing half-done. A database whose recorded version is newer
than :data:`LATEST` is refused: this code does not know what the newer one changed.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Final

from .clock import now_ts
from .errors import SchemaTooNew

MIGRATIONS: Final[list[tuple[int, str, str]]] = [
    (
        1,
        "jobs",
        """
        -- the seed's migrations/006_jobs.sql, with what leases and priorities need
        CREATE TABLE IF NOT EXISTS jobs (
            id               TEXT PRIMARY KEY,                  -- UUID v7
            job_type         TEXT NOT NULL,
            payload          TEXT NOT NULL,                     -- JSON object
            status           TEXT NOT NULL DEFAULT 'pending'
                             CHECK (status IN ('pending', 'running', 'completed', 'dead')),
            attempts         INTEGER NOT NULL DEFAULT 0,
            max_attempts     INTEGER NOT NULL DEFAULT 3 CHECK (max_attempts >= 1),
            -- never NULL, so the claim index can range-scan it; "now" when not delayed
            run_after        TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
            error            TEXT,
            created_at       TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
            updated_at       TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
            priority         INTEGER NOT NULL DEFAULT 5,        -- lower runs first (seed 13)
            lease_owner      TEXT,                              -- worker holding a running job
            lease_token      INTEGER NOT NULL DEFAULT 0,        -- +1 per claim, never reset: fences outcomes
            lease_expires_at TEXT                               -- running jobs: rescue after this
        );
        CREATE INDEX IF NOT EXISTS idx_jobs_status ON jobs(status);
        CREATE INDEX IF NOT EXISTS idx_jobs_run_after ON jobs(run_after) WHERE status = 'pending';
        CREATE INDEX IF NOT EXISTS idx_jobs_type ON jobs(job_type);
        -- serves the claim query: equality on job_type, then already in claim order,
        -- so LIMIT n reads n entries instead of sorting every pending row
        CREATE INDEX IF NOT EXISTS idx_jobs_claim ON jobs(job_type, priority, run_after) WHERE status = 'pending';
        """,
    ),
]

LATEST: Final = MIGRATIONS[-1][0]

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at TEXT NOT NULL
)
"""


def current_version(conn: sqlite3.Connection) -> int:
    conn.execute(_CREATE_TABLE)
    (version,) = conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
    return int(version)


def migrate(conn: sqlite3.Connection, path: Path | str = "<database>") -> list[int]:
    """Apply every migration not yet recorded; return the versions applied now."""
    applied = []
    version = current_version(conn)
    if version > LATEST:
        raise SchemaTooNew(
            f"{path} has schema version {version}, newer than this pipeline knows ({LATEST}); "
            "upgrade the pipeline package, or point DATABASE_URL at another file"
        )
    for number, name, sql in MIGRATIONS:
        if number <= version:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            # re-check inside the write lock: another process may have just applied it
            if conn.execute("SELECT 1 FROM schema_migrations WHERE version = ?", (number,)).fetchone():
                conn.execute("COMMIT")
                continue
            for statement in _statements(sql):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                (number, name, now_ts()),
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        applied.append(number)
    return applied


def _statements(sql: str) -> list[str]:
    """Split a migration into statements (sqlite3's execute takes one at a time).

    executescript would COMMIT our transaction first; complete_statement keeps
    triggers' inner semicolons together.
    """
    out, buf = [], ""
    for line in sql.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip():
                out.append(buf.strip())
            buf = ""
    if buf.strip() and not buf.strip().startswith("--"):
        out.append(buf.strip())
    return out
