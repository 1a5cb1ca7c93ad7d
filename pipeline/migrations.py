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
    (
        2,
        "content",
        """
        -- The minimal content the built-in handlers work on (users, posts, media), so that
        -- `python -m pipeline` works on its own. A host application owns these tables and
        -- may add columns; the handlers read only the ones named here.
        CREATE TABLE IF NOT EXISTS users (
            id         TEXT PRIMARY KEY,
            email      TEXT NOT NULL UNIQUE,
            username   TEXT NOT NULL,
            created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
        );
        CREATE TABLE IF NOT EXISTS posts (
            id           TEXT PRIMARY KEY,
            title        TEXT NOT NULL,
            body         TEXT NOT NULL DEFAULT '',
            slug         TEXT NOT NULL UNIQUE,                 -- the sitemap's URL is SITE_URL/posts/<slug>
            status       TEXT NOT NULL DEFAULT 'draft'
                         CHECK (status IN ('draft', 'scheduled', 'published')),
            publish_at   TEXT,                                 -- scheduled posts: when scheduled_publish publishes
            published_at TEXT,                                 -- set by whoever published it
            created_at   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
            updated_at   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))  -- the sitemap's lastmod
        );
        -- the sitemap reads published posts in publication order, so its parts stay stable
        CREATE INDEX IF NOT EXISTS idx_posts_published ON posts(published_at, id) WHERE status = 'published';
        CREATE TABLE IF NOT EXISTS media (
            id         TEXT PRIMARY KEY,
            path       TEXT NOT NULL,                          -- the uploaded file, relative to MEDIA_DIR
            mime_type  TEXT,
            size       INTEGER,                                -- bytes
            -- the image handlers' outputs, a JSON object of name -> path relative to MEDIA_DIR,
            -- e.g. {"thumbnail_300": "derived/<id>/thumbnail_300.jpg"}
            derived    TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(derived)),
            created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
            updated_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
        );
        -- Full-text index of the published posts, written only by rebuild_search_index.
        -- It keeps its own copy of title and body (not external-content, not contentless):
        -- the host application updates and deletes posts with its own SQL and only tells
        -- us by events, so an external-content index would need the old values to delete
        -- rows it can no longer see, and would break on VACUUM (posts has no integer key);
        -- a contentless one cannot produce snippet(). post_id is UNINDEXED: not searchable,
        -- found by a scan when a post's row is refreshed (~30 ms at 50,000 posts).
        CREATE VIRTUAL TABLE IF NOT EXISTS posts_fts USING fts5(
            post_id UNINDEXED,
            title,
            body,
            tokenize = 'porter unicode61 remove_diacritics 2'
        );
        -- Which scheduled_publish job published which post. Written in the transaction that
        -- publishes, so a retried job can tell its own earlier publish (whose PostPublished
        -- emit failed) from someone else's, and emit again.
        CREATE TABLE IF NOT EXISTS post_publications (
            job_id       TEXT PRIMARY KEY,
            post_id      TEXT NOT NULL,
            published_at TEXT NOT NULL
        );
        """,
    ),
    (
        3,
        "workers",
        """
        -- The worker processes on this file and the job types each knows, kept fresh by each
        -- one's lease heartbeat. A pending job of a type no process here knows goes dead only
        -- if no live worker knows it either (another process's backlog is not ours to bury).
        CREATE TABLE IF NOT EXISTS workers (
            owner        TEXT PRIMARY KEY,       -- host:pid, as in jobs.lease_owner
            job_types    TEXT NOT NULL,          -- JSON array
            started_at   TEXT NOT NULL,
            heartbeat_at TEXT NOT NULL
        );
        """,
    ),
    (
        4,
        "post_publications follow their job",
        """
        -- A publication record is needed only while its job may run again; when the job row
        -- goes (cleanup, delete) its record goes too, whichever connection deletes it.
        CREATE TRIGGER IF NOT EXISTS jobs_delete_publications AFTER DELETE ON jobs
        BEGIN
            DELETE FROM post_publications WHERE job_id = old.id;
        END;
        DELETE FROM post_publications WHERE job_id NOT IN (SELECT id FROM jobs);
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
    """The highest version recorded; 0 for a new file. Reads only."""
    exists = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'").fetchone()
    if not exists:
        return 0
    (version,) = conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
    return int(version)


def _recorded(conn: sqlite3.Connection) -> set[int]:
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'").fetchone():
        return set()
    return {int(v) for (v,) in conn.execute("SELECT version FROM schema_migrations")}


def migrate(conn: sqlite3.Connection, path: Path | str = "<database>") -> list[int]:
    """Apply every migration not yet recorded; return the versions applied now."""
    applied = []
    version = current_version(conn)
    if version > LATEST:
        raise SchemaTooNew(
            f"{path} has schema version {version}, newer than this pipeline knows ({LATEST}); "
            "upgrade the pipeline package, or point DATABASE_URL at another file"
        )
    recorded = _recorded(conn)
    for number, name, sql in MIGRATIONS:
        if number in recorded:  # every one not recorded, a gap included
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(_CREATE_TABLE)
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
