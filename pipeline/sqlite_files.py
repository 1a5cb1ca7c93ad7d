"""SQLite files as the SQLite backend and the bundled site both open them: WAL, a busy
timeout, write transactions that take the lock up front, and numbered migrations each
applied once in its own transaction (safe when several processes start at once).
Nothing here knows about jobs or posts."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import trio

from .clock import now_ts
from .errors import DatabaseUnavailable, SchemaTooNew, StoreError

# The size the -wal file is truncated back to once a checkpoint has copied it all back (PRAGMA
# journal_size_limit; SQLite never shrinks it otherwise). Far above what it holds in normal running
# (a checkpoint every 1,000 pages, about 4 MB; a bulk load's transaction can take more), so that
# it is not truncated and grown again over and over; small enough that a WAL a stuck reader blew
# up to gigabytes gives the disk back once that reader is gone.
WAL_SIZE_LIMIT = 64 * 2**20


def resolved(path: Path | str) -> Path:
    """The database's path as SQLite itself sees it: absolute, every symlink followed (the
    file's folder's too, for a file not created yet). Taken once, when a database is opened:
    SQLite writes the ``-wal`` beside the target of a link (where the WAL watch must look),
    and a relative path would name another file once the application calls ``os.chdir``
    (for the connections opened later: readers, bulk loads, the lease renewer)."""
    return Path(os.path.realpath(path))


def connect(path: Path | str, *, busy_timeout_ms: int = 5000, synchronous: str = "full") -> sqlite3.Connection:
    """Open the database in autocommit mode with WAL and a busy timeout; say clearly what is wrong."""
    path = Path(path)
    if path.is_dir():
        raise DatabaseUnavailable(f"database {path} is a directory, not a SQLite file")
    if not path.parent.exists() and str(path.parent) != "":
        raise DatabaseUnavailable(f"cannot create database {path}: folder {path.parent} does not exist")
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=busy_timeout_ms / 1000)
    except sqlite3.Error as exc:
        raise DatabaseUnavailable(f"cannot open database {path}: {exc}") from None
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        mode = _journal_mode_wal(conn, busy_timeout_ms)
        if mode.lower() != "wal":
            raise DatabaseUnavailable(f"database {path} cannot use WAL mode (journal_mode is {mode})")
        conn.execute(f"PRAGMA synchronous = {'FULL' if synchronous == 'full' else 'NORMAL'}")
        conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")  # read at each connect: tests shrink it
        conn.execute("PRAGMA foreign_keys = ON")
    except sqlite3.DatabaseError as exc:
        conn.close()
        if "locked" in str(exc):
            raise StoreError(f"database {path} stayed locked by another process past busy_timeout: {exc}") from None
        raise DatabaseUnavailable(f"database {path} is unreadable or not a SQLite database: {exc}") from None
    return conn


def _journal_mode_wal(conn: sqlite3.Connection, busy_timeout_ms: int) -> str:
    """Switch to WAL. The switch does not wait out busy_timeout: when several processes
    open a new file at once it can answer "locked" at once, so wait here instead."""
    deadline = time.monotonic() + busy_timeout_ms / 1000
    delay = 0.005
    while True:
        try:
            return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


@contextlib.contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE ... COMMIT: take the write lock up front, so no upgrade can deadlock."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # SQLite may have rolled back already (disk full, I/O error)
            conn.execute("ROLLBACK")
        raise




T = TypeVar("T")


class ConnectionPool:
    """A few connections to one file, each used by one thread at a time: ``run(fn, ...)``
    calls ``fn(conn, ...)`` in a thread behind the pool's own limiter, so that slow queries
    cannot take the threads others need. A connection is opened when none is idle."""

    def __init__(
        self, path: Path, *, busy_timeout_ms: int, synchronous: str, size: int,
        describe: Callable[[sqlite3.Error], Exception],
    ) -> None:
        self.path = resolved(path)  # every connection, whenever opened, to the same file
        self.busy_timeout_ms = busy_timeout_ms
        self.synchronous = synchronous
        self._describe = describe  # a sqlite3 error as the exception callers should see
        self._limiter = trio.CapacityLimiter(size)
        self._idle: list[sqlite3.Connection] = []
        self._all: list[sqlite3.Connection] = []

    def connect(self) -> sqlite3.Connection:
        conn = connect(self.path, busy_timeout_ms=self.busy_timeout_ms, synchronous=self.synchronous)
        self._all.append(conn)
        return conn

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        def call() -> T:
            try:
                conn = self._idle.pop()
            except IndexError:  # none idle (another thread may have taken the last one)
                conn = self.connect()
            try:
                return fn(conn, *args)
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise self._describe(exc) from None
            finally:
                self._idle.append(conn)

        return await trio.to_thread.run_sync(call, limiter=self._limiter)

    def close(self) -> None:
        for conn in self._all:
            conn.close()
        self._all.clear()
        self._idle.clear()


# (version, name, SQL); or, for a step SQL alone cannot write (one that must read the schema
# first), a function given the connection inside the step's transaction
Migration = tuple[int, str, "str | Callable[[sqlite3.Connection], None]"]


def _ensure_table(conn: sqlite3.Connection, table: str) -> None:
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {table} (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
    )


def recorded_versions(conn: sqlite3.Connection, table: str) -> set[int]:
    """The versions recorded in ``table``; none for a new file. Reads only."""
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone():
        return set()
    return {int(v) for (v,) in conn.execute(f"SELECT version FROM {table}")}


def apply_migrations(
    conn: sqlite3.Connection, steps: Sequence[Migration], *, table: str, path: Path | str = "<database>",
    known: Sequence[int] = (), setting: str = "DATABASE_URL",
) -> list[int]:
    """Apply every step not yet recorded in ``table`` (a gap included); return the versions
    applied now. A file that records a version newer than every step (and ``known``) is
    refused: this code does not know what the newer one changed."""
    recorded = recorded_versions(conn, table)
    latest = max([number for number, _, _ in steps] + list(known))
    if recorded and max(recorded) > latest:
        raise SchemaTooNew(
            f"{path} has schema version {max(recorded)}, newer than this pipeline knows ({latest}); "
            f"upgrade the pipeline package, or point {setting} at another file"
        )
    applied = []
    for number, name, sql in steps:
        if number in recorded:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            _ensure_table(conn, table)
            # re-check inside the write lock: another process may have just applied it
            if conn.execute(f"SELECT 1 FROM {table} WHERE version = ?", (number,)).fetchone():
                conn.execute("COMMIT")
                continue
            if callable(sql):
                sql(conn)
            else:
                run_statements(conn, sql)
            conn.execute(f"INSERT INTO {table} (version, name, applied_at) VALUES (?, ?, ?)", (number, name, now_ts()))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        applied.append(number)
    return applied


def run_statements(conn: sqlite3.Connection, sql: str) -> None:
    """Run a migration's SQL, one statement at a time, in the caller's transaction."""
    for statement in _statements(sql):
        conn.execute(statement)


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
