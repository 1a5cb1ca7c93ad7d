"""Bulk load: many rows in one transaction while the caller goes on making them (the CLI's
``enqueue --from-file``)."""

from __future__ import annotations

import json
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...errors import StoreError
from ..base import NewJob
from .store import insert_jobs
from .workflows import linked

# One statement for a whole chunk of rows, read from a JSON array of NewJob arrays:
# SQLite runs it without taking the GIL back, so a thread inserts one chunk while Python
# checks the next (with executemany the two threads hand the GIL over for every row).
_FIELD = "value->>{}" if sqlite3.sqlite_version_info >= (3, 38) else "json_extract(value, '$[{}]')"
_INSERT_JSON = (
    "INSERT INTO jobs (id, job_type, payload, status, attempts, max_attempts, run_after, "
    "created_at, updated_at, priority) SELECT {0}, {1}, {2}, 'pending', 0, {3}, {4}, {6}, {6}, {5} "
    "FROM json_each(?)"  # json_each walks the array in order: rowids follow the file
).format(*(_FIELD.format(i) for i in range(7)))
# the same with each row's expiry (NewJob's tenth field), for chunks of which some have one
_INSERT_JSON_EXPIRING = (
    "INSERT INTO jobs (id, job_type, payload, status, attempts, max_attempts, run_after, "
    "created_at, updated_at, priority, expires_at) SELECT {0}, {1}, {2}, 'pending', 0, {3}, {4}, {6}, {6}, {5}, {9} "
    "FROM json_each(?)"
).format(*(_FIELD.format(i) for i in range(10)))

# the same with each row's expiry and limit key (NewJob's tenth and eleventh fields), for chunks of
# which some have a limit key (a type with per-key limits)
_INSERT_JSON_LIMITED = (
    "INSERT INTO jobs (id, job_type, payload, status, attempts, max_attempts, run_after, "
    "created_at, updated_at, priority, expires_at, limit_key) SELECT {0}, {1}, {2}, 'pending', 0, {3}, {4}, {6}, {6}, {5}, "
    "{9}, {10} FROM json_each(?)"
).format(*(_FIELD.format(i) for i in range(11)))

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class BulkInsert:
    """Insert rows in one transaction while the caller goes on making them.

    ``add`` collects rows; each full chunk is inserted on a worker thread as one statement
    while the caller builds the next, at most two chunks ahead. The write lock is taken
    with the first chunk and held until :meth:`commit`; :meth:`abort` (or leaving the
    ``with`` block by an exception) keeps nothing. Measured on 100,000 rows: 1.4 s for
    checking and inserting together against 1.9 s one after the other, in flat memory.
    """

    CHUNK_ROWS = 2000
    CHUNK_CHARS = 4 << 20  # of payload: each is up to 1 MiB, and a statement's text has a limit

    def __init__(self, conn: sqlite3.Connection, duplicates: list[tuple[str, str]] | None = None) -> None:
        self._conn = conn
        self._duplicates = duplicates  # (id, holder's id) of each row skipped for its unique key
        self.skipped = 0  # rows not inserted: their unique (or idempotency) key was held (written by the worker thread)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pipeline-insert")
        self._pending: list[Any] = []
        self._chunk: list[NewJob] = []
        self._chars = 0
        self._begun = False
        self._failed = False
        self.count = 0  # rows given to add

    def __enter__(self) -> BulkInsert:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    def add(self, row: NewJob) -> None:
        if not (_INT64_MIN <= row.max_attempts <= _INT64_MAX and _INT64_MIN <= row.priority <= _INT64_MAX):
            raise OverflowError("Python int too large to convert to SQLite INTEGER")  # as executemany says
        self._chunk.append(row)
        self.count += 1
        self._chars += len(row.payload)
        if len(self._chunk) >= self.CHUNK_ROWS or self._chars >= self.CHUNK_CHARS:
            self._send()

    def _send(self) -> None:
        rows = self._chunk
        self._chunk, self._chars = [], 0
        while len(self._pending) >= 2:
            self._pending.pop(0).result()  # an error of an earlier chunk surfaces here
        if not self._begun:
            self._conn.execute("BEGIN IMMEDIATE")
            self._begun = True
        if any(r.unique_key is not None or r.idempotency_key is not None or r.trace is not None or linked(r)
               for r in rows):
            # a row may find its key held (a unique key, or an idempotency key recorded before, in
            # this transaction too): this chunk goes through insert_jobs, which says so (and which
            # records the idempotency keys, writes a trace context, and a workflow's rows and edges,
            # which _INSERT_JSON leaves out; a row's parents may be in the chunks before: inserted already)
            self._pending.append(self._pool.submit(self._guarded, self._insert_keyed, rows))
        elif any("\x00" in r.payload or "\x00" in r.job_type for r in rows):
            # SQLite's JSON functions end text at a NUL character: this chunk goes row by row
            self._pending.append(self._pool.submit(self._guarded, insert_jobs, self._conn, rows))
        else:
            text = json.dumps(rows, ensure_ascii=False, separators=(",", ":"))
            if any(r.limit_key is not None for r in rows):
                sql = _INSERT_JSON_LIMITED
            else:
                sql = _INSERT_JSON_EXPIRING if any(r.expires_at is not None for r in rows) else _INSERT_JSON
            self._pending.append(self._pool.submit(self._guarded, self._conn.execute, sql, (text,)))

    def _insert_keyed(self, rows: list[NewJob]) -> None:
        for row, stored in zip(rows, insert_jobs(self._conn, rows)):
            if stored != row.id:
                self.skipped += 1
                if self._duplicates is not None:
                    self._duplicates.append((row.id, stored))

    def _guarded(self, fn: Any, *args: Any) -> None:
        """Run one chunk on the worker thread, only inside the transaction. After some errors
        (disk full, I/O) SQLite rolls the whole transaction back: the chunk queued behind
        would then run in autocommit mode and keep its rows."""
        if self._failed or not self._conn.in_transaction:
            raise StoreError("the transaction of this bulk insert was rolled back by an earlier error; nothing was kept")
        try:
            fn(*args)
        except BaseException:
            self._failed = True
            raise

    def commit(self) -> None:
        try:
            if self._chunk:
                self._send()
            for future in self._pending:
                future.result()
            if self._begun:
                self._conn.execute("COMMIT")
        except BaseException:
            self.abort()
            raise
        self._pool.shutdown()

    def abort(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)  # the connection is the caller's again
        if self._begun and self._conn.in_transaction:  # SQLite may have rolled back already
            self._conn.execute("ROLLBACK")
        self._begun = False


