"""The bundled site's tables, created only where the site runs: numbered migrations recorded
in ``site_migrations`` (the job engine's own are in ``schema_migrations``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Final

from ..sqlite_files import Migration, apply_migrations

MIGRATIONS: Final[list[Migration]] = [
    (
        1,
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
        2,
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


def migrate(conn: sqlite3.Connection, path: Path | str = "<database>") -> list[int]:
    """The trigger that removes a post's publication record with its job (version 2) goes
    only where the job table is in the same file; elsewhere it waits until one is."""
    has_jobs = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'jobs'").fetchone()
    steps = MIGRATIONS if has_jobs else MIGRATIONS[:1]
    return apply_migrations(conn, steps, table="site_migrations", path=path, known=[v for v, _, _ in MIGRATIONS],
                            setting="SITE_DATABASE_URL")
