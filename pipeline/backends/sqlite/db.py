"""A small trio adapter for sqlite3: blocking calls run in threads, never on the trio loop.

Two kinds of access:

* the **writer**: one connection, one thread at a time (a CapacityLimiter of 1), used
  only by the Ledger for job state;
* **readers** (and handlers' own content writes): a few pooled connections behind their
  own limiter, so a slow admin query or image handler cannot hold up the Ledger.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import trio

from ...errors import DatabaseUnavailable, StoreError
from ...sqlite_files import ConnectionPool, resolved
from . import migrations

T = TypeVar("T")

FINE_WAIT = 0.025  # seconds of the lock wait spent looking again every LOOK_EVERY, before SQLite's busy handler
LOOK_EVERY = 0.0002


def begin_immediate(conn: sqlite3.Connection, wait_ms: int) -> None:
    """``BEGIN IMMEDIATE``, waiting at most ``wait_ms`` for another writer's lock: for its first
    FINE_WAIT by looking again every LOOK_EVERY, then through SQLite's busy handler. The busy
    handler sleeps 1, 2, 5, 10, 15 ms... between its looks: a lock held for one commit of another
    process (a few ms) cost a batch up to 18 ms, the tail of the pickup from another process
    and a brake on two processes taking the lock in turns."""
    started = time.monotonic()
    conn.execute("PRAGMA busy_timeout = 0")
    while True:
        try:
            conn.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            waited = time.monotonic() - started
            if waited >= FINE_WAIT or waited * 1000 >= wait_ms:
                break
            time.sleep(LOOK_EVERY)
    conn.execute(f"PRAGMA busy_timeout = {max(0, int(wait_ms - (time.monotonic() - started) * 1000))}")
    conn.execute("BEGIN IMMEDIATE")



def describe(exc: sqlite3.Error, path: Path) -> StoreError:
    """A sqlite3 error as a StoreError that names the file and what to do."""
    text = str(exc)
    if "full" in text:
        return StoreError(f"database {path} is full ({text}); free disk space (or raise max_page_count) and retry")
    if "locked" in text or "busy" in text:
        return StoreError(f"database {path} is locked by another writer ({text}); retry later")
    if isinstance(exc, sqlite3.DatabaseError) and ("malformed" in text or "not a database" in text):
        return DatabaseUnavailable(f"database {path} is corrupt or not a SQLite database: {text}")
    return StoreError(f"database {path}: {text}")


class Database:
    def __init__(self, path: Path, *, busy_timeout_ms: int, synchronous: str, readers: int = 4) -> None:
        # resolved once (see sqlite_files.resolved): every connection of the backend, the
        # WAL watch's file and the bulk loads' and lease renewer's connections follow it
        self.path = path = resolved(path)
        self.busy_timeout_ms = busy_timeout_ms
        self.synchronous = synchronous
        self._writer: sqlite3.Connection | None = None
        self._write_limiter = trio.CapacityLimiter(1)  # one thread at a time on the writing connection
        self._readers = ConnectionPool(path, busy_timeout_ms=busy_timeout_ms, synchronous=synchronous, size=readers,
                                       describe=lambda exc: describe(exc, path))

    async def open(self) -> None:
        def setup() -> sqlite3.Connection:
            conn = self._readers.connect()  # closed with the pool's
            try:
                migrations.migrate(conn, self.path)
            except sqlite3.Error as exc:
                raise describe(exc, self.path) from None
            return conn

        self._writer = await trio.to_thread.run_sync(setup, limiter=self._write_limiter)

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(conn, *args)`` on the writing connection (the Ledger's)."""
        assert self._writer is not None, "Database.open() first"
        return await trio.to_thread.run_sync(fn, self._writer, *args, limiter=self._write_limiter)

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(conn, *args)`` on a pooled connection; sqlite3 errors become StoreError."""
        return await self._readers.run(fn, *args)

    def close(self) -> None:
        self._readers.close()
        self._writer = None


@asynccontextmanager
async def open_database(path: Path | str, *, busy_timeout_ms: int = 5000, synchronous: str = "full") -> AsyncIterator[Database]:
    db = Database(Path(path), busy_timeout_ms=busy_timeout_ms, synchronous=synchronous)
    try:
        await db.open()
        yield db
    finally:
        db.close()
