"""The bundled site's content database (users, posts, media, the search index), opened as
the ``"content"`` resource: handlers reach it as ``ctx.resources["content"]``, never
through the job backend.

It is a SQLite file (FTS5 keeps the search index), ``SITE_DATABASE_URL`` (settings.SiteSettings); by default the
job database's own file when jobs are in SQLite, so that one file holds everything.
Queries run in threads on a few pooled connections behind their own limiter, so a slow
one cannot hold up the job backend's threads.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import trio

from ..config import Config
from ..errors import StoreError
from ..sqlite_files import connect
from . import schema
from .settings import SiteSettings

T = TypeVar("T")
RESOURCE = "content"
READERS = 4  # threads (and connections) the content handlers use at once


class ContentDatabase:
    def __init__(self, path: Path, *, busy_timeout_ms: int, synchronous: str, readers: int = READERS) -> None:
        self.path = path
        self._busy_timeout_ms = busy_timeout_ms
        self._synchronous = synchronous
        self._limiter = trio.CapacityLimiter(readers)
        self._idle: list[sqlite3.Connection] = []
        self._all: list[sqlite3.Connection] = []

    def _connect(self) -> sqlite3.Connection:
        conn = connect(self.path, busy_timeout_ms=self._busy_timeout_ms, synchronous=self._synchronous)
        self._all.append(conn)
        return conn

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(conn, *args)`` on a pooled connection, in a thread; sqlite3 errors become StoreError.
        Functions that write open their own write transaction."""

        def call() -> T:
            try:
                conn = self._idle.pop()
            except IndexError:
                conn = self._connect()
            try:
                return fn(conn, *args)
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise StoreError(f"content database {self.path}: {exc}") from None
            finally:
                self._idle.append(conn)

        return await trio.to_thread.run_sync(call, limiter=self._limiter)

    def close(self) -> None:
        for conn in self._all:
            conn.close()
        self._all.clear()
        self._idle.clear()


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
