"""The bundled site's content database (users, posts, media, the search index), opened as
the ``"content"`` resource: handlers reach it as ``ctx.resources["content"]``, never
through the job backend.

It is a SQLite file (FTS5 keeps the search index), ``SITE_DATABASE_URL`` (settings.SiteSettings); by default the
job database's own file when jobs are in SQLite, so that one file holds everything.
Queries run in threads on a few pooled connections behind their own limiter, so a slow
one cannot hold up the job backend's threads.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

from ..config import Config
from ..errors import StoreError
from ..sqlite_files import ConnectionPool
from . import schema
from .settings import SiteSettings

T = TypeVar("T")
RESOURCE = "content"
READERS = 4  # threads (and connections) the content handlers use at once


class ContentDatabase(ConnectionPool):
    """``await content.run(fn, *args)``: ``fn(conn, *args)`` on a pooled connection, in a
    thread; sqlite3 errors become StoreError. Functions that write open their own write
    transaction."""

    def __init__(self, path: Path, *, busy_timeout_ms: int, synchronous: str, readers: int = READERS) -> None:
        super().__init__(path, busy_timeout_ms=busy_timeout_ms, synchronous=synchronous, size=readers,
                         describe=lambda exc: StoreError(f"content database {path}: {exc}"))


def content_path(config: Config) -> Path:
    """Where the site's content lives (see the module docstring)."""
    return config.section(SiteSettings).database_path(config)


@asynccontextmanager
async def open_content_database(config: Config) -> AsyncIterator[ContentDatabase]:
    """Open the content database, creating or migrating the site's tables."""
    db = ContentDatabase(content_path(config), busy_timeout_ms=config.sqlite.busy_timeout_ms, synchronous=config.sqlite.synchronous)
    try:
        await db.run(schema.migrate, db.path)
        yield db
    finally:
        db.close()
