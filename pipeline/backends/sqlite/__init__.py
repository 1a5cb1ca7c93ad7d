"""The SQLite backend: one file, one writer (the Ledger), readers in threads.

    async with open_sqlite_backend(path, ...) as backend:   # migrates, starts the Ledger
        await backend.insert(jobs)                          # → the Ledger's next batch

Every write of job state is a command to the Ledger (ledger.py), which groups whatever is
waiting into one ``BEGIN IMMEDIATE ... COMMIT``; reads run on pooled connections (db.py);
the lease heartbeat renews from its own thread and connection (:class:`SqliteLeaseRenewer`);
a bulk load takes a connection of its own (bulk.py). Nothing outside this package imports
its modules: the engine sees the :class:`~pipeline.backends.base.Backend` protocol.
"""

from __future__ import annotations

import builtins
import functools
import random
import sqlite3
import time
from collections.abc import AsyncIterator, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import trio

from ...clock import format_ts, now_ts, to_epoch
from ...errors import PipelineClosed, StoreError, UsageError
from ...replies import Reply
from ..base import (
    NUDGE_BUFFER,
    BatchMember,
    BatchRecord,
    ClaimOffer,
    JobRecord,
    Lease,
    NewBatch,
    NewJob,
    Nudge,
    ParentResult,
    ScheduleRecord,
    Settlement,
    StepRecord,
    Topology,
    WorkerRecord,
)
from ..trays import Tray, Trays
from . import durable, limits, migrations, queries, retention, schedules, store, workflows
from .bulk import BulkInsert
from .checkpoints import WalCheck, run_wal_check
from .db import Database, begin_immediate, describe, open_database
from .ledger import Command, LedgerStats, run_ledger
from .watch import Lookout, watch_commits

LEDGER_INBOX = 4096  # commands waiting for the Ledger before writers block

__all__ = ["SqliteBackend", "SqliteLeaseRenewer", "open_sqlite_backend"]


class SqliteBackend:
    """:class:`~pipeline.backends.base.Backend` on one SQLite file; writes go through the Ledger."""

    def __init__(
        self, db: Database, ledger_send: trio.MemorySendChannel[Command], stats: LedgerStats, *, url: str,
        rng: random.Random | None = None, wal: WalCheck | None = None,
    ) -> None:
        self.url = url
        self._db = db
        self._ledger_send = ledger_send
        self._stats = stats
        self._wal = wal if wal is not None else WalCheck(db.path)  # (its trouble set by run_wal_check)
        self._rng = rng or random.Random()
        self._trays = Trays(self._send_tray)  # outcomes waiting for the Ledger (see trays.Tray)

    @property
    def path(self) -> Path:
        return self._db.path

    # for this backend's own tests and benchmarks: the engine never looks past the protocol
    @property
    def database(self) -> Database:
        return self._db

    @property
    def ledger_stats(self) -> LedgerStats:
        return self._stats

    async def _call(self, kind: str, fn: Any, *, wakes_poller: bool = False, rows: list[NewJob] | None = None) -> Any:
        reply = Reply()
        try:
            await self._ledger_send.send(Command(kind, fn, reply, wakes_poller, rows=rows))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise PipelineClosed("the pipeline is shut down; the job store takes no more writes") from None
        return await reply.wait()

    # -- producing ----------------------------------------------------------------------------

    async def insert(self, jobs: Sequence[NewJob], *, batch: NewBatch | None = None) -> builtins.list[str]:
        if not jobs:
            return []
        ids: builtins.list[str]
        if batch is not None:  # the record and the jobs in one command of their own
            rows = list(jobs)

            def write(conn: sqlite3.Connection, now: str) -> builtins.list[str]:
                workflows.insert_batch(conn, batch)
                return store.insert_jobs(conn, rows)

            ids = await self._call("insert_batch", write, wakes_poller=True)
        else:
            ids = await self._call("insert", None, wakes_poller=True, rows=list(jobs))
        return ids

    async def bulk_insert(
        self, jobs: Iterable[NewJob], *, commit_every: int | None = None,
        duplicates: builtins.list[tuple[str, str]] | None = None,
    ) -> int:
        """On a connection of its own, in a thread: checking the next chunk (the iterable's
        work) overlaps inserting this one (see bulk.BulkInsert)."""
        db = self._db
        return await trio.to_thread.run_sync(_bulk_load, db.path, db.busy_timeout_ms, db.synchronous, jobs, commit_every,
                                             duplicates)

    # -- the worker side ------------------------------------------------------------------------

    async def claim(
        self, wants: Mapping[str, int], *, owner: str, lease_seconds: float, start: Mapping[str, int] | None = None,
        limits: Mapping[str, int] | None = None, rates: Mapping[str, tuple[int, float]] | None = None,
        key_limits: Mapping[str, int] | None = None,
    ) -> list[Lease]:
        return await self._call("claim", functools.partial(store.claim_leases, wants=dict(wants), owner=owner,
                                                             lease_seconds=lease_seconds, start=start, limits=limits,
                                                             rates=rates, key_limits=key_limits))

    async def rate_free_at(self, job_type: str, limit: int, window_seconds: float) -> float:
        """From the rate's records (limits.rate_free_at), on a read connection: no write, no wait for the Ledger."""
        return await self._db.read(lambda conn: limits.rate_free_at(conn, job_type, limit, window_seconds, now=time.time()))

    async def settle(self, outcomes: Sequence[Settlement]) -> list[bool]:
        """On the open tray, or a new one sent to the Ledger (see trays.Tray): concurrent
        callers share one command and one commit."""
        return await self._trays.settle(outcomes)

    async def _send_tray(self, tray: Tray) -> None:
        await self._ledger_send.send(Command("outcomes", None, tray.reply, tray=tray))

    async def rescue_expired(self, *, base_seconds: float, spare: Collection[tuple[str, int]] = ()) -> int:
        rng = self._rng
        spare = frozenset(spare)
        rescued = await self._call(
            "rescue",
            # no nudge: a rescued job is due only after its backoff (or dead), which a poll finds
            lambda conn, now: store.rescue_expired(conn, now=now, base_seconds=base_seconds, rng=rng, spare=spare),
        )
        return len(rescued)

    async def bury_unknown_types(self, known: Iterable[str], *, grace_seconds: float) -> int:
        known = set(known)

        def write(conn: sqlite3.Connection, now: str) -> int:
            unknown = [t for t in store.pending_job_types(conn) if t not in known]
            if not unknown:
                return 0
            return store.bury_unknown_types(conn, unknown, now=now, due_before=format_ts(to_epoch(now) - grace_seconds))

        return await self._call("bury_unknown", write)

    async def rescue_waiting(self, *, limit: int = 500) -> int:
        # (the jobs it wakes wake the Poller: see workflows.WOKEN)
        return await self._call("rescue_waiting", lambda conn, now: workflows.rescue_waiting(conn, limit=limit, now=now))

    def lease_renewer(self) -> SqliteLeaseRenewer:
        return SqliteLeaseRenewer(self._db.path, busy_timeout_ms=self._db.busy_timeout_ms, synchronous=self._db.synchronous)

    # -- operators ------------------------------------------------------------------------------

    async def get(self, job_id: str) -> JobRecord | None:
        return await self._db.read(queries.get_job_linked, job_id)

    async def list(
        self, *, status: str | None = None, job_type: str | None = None, limit: int = 50, offset: int = 0,
        priority: int | None = None, order: str = "newest",
    ) -> tuple[list[JobRecord], int]:
        return await self._db.read(
            functools.partial(queries.list_jobs, status=status, job_type=job_type, limit=limit, offset=offset,
                              priority=priority, order=order)
        )

    async def stats(self) -> dict[str, Any]:
        return await self._db.read(lambda conn: queries.operator_stats(conn, now=now_ts()))

    async def revive(self, job_id: str, *, from_step: str | None = None) -> JobRecord:
        return await self._call("revive", lambda conn, now: queries.revive(conn, job_id, now=now, from_step=from_step),
                                wakes_poller=True)

    # -- durable functions (issue 35): writes through the Ledger like revive (a job they make pending
    # wakes the Poller: durable.woke), reads on the read connections (see durable.py)

    async def steps(self, job_id: str) -> builtins.list[StepRecord]:
        return await self._db.read(durable.steps, job_id)

    async def signal_key_used(self, job_id: str, key: str) -> bool:
        return await self._db.read(durable.signal_key_used, job_id, key)

    async def take_signal(self, job_id: str, token: int, name: str, step: StepRecord) -> tuple[bool, str | None] | None:
        return await self._call("take_signal", lambda conn, now: durable.take_signal(conn, job_id, token, name, step))

    async def signal(self, job_id: str, name: str, payload: str | None, *, key: str | None = None) -> str:
        return await self._call("signal", lambda conn, now: durable.send_signal(conn, job_id, name, payload, key=key, now=now))

    async def wake_suspended(self, *, limit: int = 500) -> tuple[int, float | None]:
        """A look on a read connection first (every process makes it about once a second): the Ledger's
        write only when a suspended job is due."""
        after = await self._db.read(lambda conn: durable.next_due(conn, now=now_ts()))
        if after is None or after > 0:
            return 0, after
        return await self._call("wake_suspended", lambda conn, now: durable.wake_suspended(conn, limit=limit, now=now))

    # -- workflows (issue 24): reads on the read connections (see workflows.py)

    async def parent_results(self, job_id: str) -> dict[str, ParentResult]:
        return await self._db.read(workflows.parent_results, job_id)

    async def batch(self, batch_id: str) -> BatchRecord | None:
        return await self._db.read(_in_one_read, workflows.batch, batch_id)

    async def batch_jobs(self, batch_id: str, *, limit: int | None = None, offset: int = 0) -> builtins.list[BatchMember]:
        return await self._db.read(_in_one_read, functools.partial(workflows.batch_jobs, limit=limit, offset=offset), batch_id)

    # -- control (issue 23): writes through the Ledger like revive, reads on the read connections

    async def cancel(self, job_ids: Sequence[str], *, reason: str) -> builtins.list[str | None]:
        job_ids = list(job_ids)
        if not job_ids:
            return []
        return await self._call("cancel", lambda conn, now: queries.cancel(conn, job_ids, reason=reason, now=now))

    async def cancel_requests(self, owner: str) -> builtins.list[tuple[str, int]]:
        return await self._db.read(queries.cancel_requests, owner)

    async def set_progress(self, job_id: str, token: int, fraction: float, message: str | None) -> bool:
        return await self._call("progress", lambda conn, now: store.set_progress(conn, job_id, token, fraction, message))

    async def set_type_paused(self, job_type: str, paused: bool) -> None:
        # a resumed type's due jobs are claimed at once (other processes: the WAL watch wakes them)
        await self._call("pause" if paused else "resume",
                         lambda conn, now: queries.set_type_paused(conn, job_type, paused, now=now), wakes_poller=not paused)

    async def paused_types(self) -> builtins.set[str]:
        return await self._db.read(queries.paused_types)

    async def delete(self, job_id: str) -> None:
        await self._call("delete", lambda conn, now: queries.delete_job(conn, job_id, now=now))

    async def cleanup(self, *, statuses: Sequence[str] = ("completed", "dead"), older_than_seconds: float | None = None) -> int:
        statuses = tuple(statuses)

        def write(conn: sqlite3.Connection, now: str) -> int:
            cutoff = None if older_than_seconds is None else format_ts(to_epoch(now) - older_than_seconds)
            return queries.cleanup(conn, statuses=statuses, older_than=cutoff)

        return await self._call("cleanup", write)

    async def ping(self) -> None:
        await self._db.read(queries.ping)

    async def workers(self) -> builtins.list[WorkerRecord]:
        return await self._db.read(lambda conn: queries.workers(conn, now=now_ts()))

    # -- cron schedules ---------------------------------------------------------------------------

    async def schedules(self) -> builtins.list[ScheduleRecord]:
        return await self._db.read(schedules.all_schedules)

    async def due_schedules(self, now: str) -> builtins.list[ScheduleRecord]:
        return await self._db.read(schedules.due_schedules, now)

    async def put_schedule(self, record: ScheduleRecord) -> ScheduleRecord:
        return await self._call("put_schedule", lambda conn, now: schedules.add_schedule(conn, record))

    async def remove_schedule(self, name: str) -> None:
        await self._call("remove_schedule", lambda conn, now: schedules.remove_schedule(conn, name))

    async def set_schedule_enabled(self, name: str, enabled: bool) -> ScheduleRecord:
        return await self._call("schedule_enabled", lambda conn, now: schedules.set_enabled(conn, name, enabled, now=now))

    async def sync_code_schedules(self, records: Sequence[ScheduleRecord], *, owned: Collection[str] | None = None) -> None:
        records = list(records)
        if not records and owned is not None and not owned:
            # nothing to write (no schedule declared, none to retire): the opening of a process that only
            # enqueues stays read-only, so a web process may open its client inside its own transaction on
            # the same file (pipeline.contrib.django) without waiting for the write lock that transaction holds
            return
        await self._call("sync_schedules", lambda conn, now: schedules.sync_code(conn, records, now=now, owned=owned))

    async def fire_schedule(self, name: str, *, tick: str, next_run: str, job: NewJob) -> bool:
        # through the Ledger like any insert: the job wakes this process's Poller (and others' by the WAL watch)
        return await self._call("fire_schedule", lambda conn, now: schedules.fire(conn, name, tick=tick, next_run=next_run,
                                                                                  job=job, now=now), wakes_poller=True)

    # -- the engine's housekeeping -----------------------------------------------------------------

    async def retention_turn(self, *, interval_seconds: float) -> bool:
        return await self._call("retention_turn", lambda conn, now: retention.take_turn(conn, now=now,
                                                                                         interval_seconds=interval_seconds))

    async def prune(self, status: str, *, older_than_seconds: float, limit: int) -> int:
        return await self._call("prune", lambda conn, now: retention.prune(conn, status, now=now,
                                                                           older_than_seconds=older_than_seconds, limit=limit))

    async def prune_workers(self, *, older_than_seconds: float) -> int:
        return await self._call("prune_workers", lambda conn, now: retention.prune_workers(
            conn, now=now, older_than_seconds=older_than_seconds))

    def counters(self) -> builtins.list[tuple[str, str, float]]:
        """(metric name, help, value) for /metrics: the Ledger's own work."""
        stats = self._stats
        return [
            ("pipeline_ledger_batches_total", "Transactions the Ledger committed.", stats.batches),
            ("pipeline_ledger_commands_total", "Commands (inserts, claims, outcomes, ...) the Ledger committed.", stats.commands),
            ("pipeline_ledger_failed_batches_total", "Ledger transactions the database refused.", stats.failed_batches),
            ("pipeline_sqlite_wal_bytes", "Size of the SQLite file's write-ahead log (-wal) now; above 64 MiB and "
             "growing: a read transaction left open holds checkpoints back (/healthz says so).", self._wal.size()),
        ]

    def trouble(self) -> str | None:
        return self._stats.trouble or self._wal.trouble

    def begin_stop(self, grace: float) -> None:
        """A graceful stop began: a database locked by someone else holds it up for at most
        ``grace`` seconds more."""
        self._stats.give_up_at = trio.current_time() + grace


def _in_one_read(conn: sqlite3.Connection, fn: Any, *args: Any) -> Any:
    """``fn(conn, *args)`` in one read transaction: its statements read one snapshot."""
    conn.execute("BEGIN")
    try:
        return fn(conn, *args)
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")


def _bulk_load(path: Path, busy_timeout_ms: int, synchronous: str, jobs: Iterable[NewJob], commit_every: int | None,
               duplicates: builtins.list[tuple[str, str]] | None = None) -> int:
    """All of ``jobs`` in one transaction, or ``commit_every`` at a time; an error (a bad line
    raised by the iterable, the database) keeps the parts committed before it and says so."""
    conn = store.connect(path, busy_timeout_ms=busy_timeout_ms, synchronous=synchronous)
    committed = 0
    try:
        migrations.migrate(conn, path)
        rows = iter(jobs)
        while True:
            with BulkInsert(conn, duplicates) as bulk:  # one transaction: everything, or commit_every of it
                for row in rows:
                    bulk.add(row)
                    if bulk.count == commit_every:
                        break
            committed += bulk.count - bulk.skipped
            if bulk.count == 0 or commit_every is None:
                return committed
    except (UsageError, StoreError, sqlite3.Error) as exc:
        if isinstance(exc, sqlite3.Error):
            exc = describe(exc, path)
        if committed:
            kept = f"the {committed} jobs before it were enqueued (in parts of {commit_every}), nothing from there on"
            raise type(exc)(f"{exc}; {kept}") from None
        raise exc from None
    finally:
        conn.close()


class SqliteLeaseRenewer:
    """The heartbeat thread's connection: renews leases and keeps this worker in ``workers``.
    It writes one column of the jobs table, ``lease_expires_at``, only of rows whose token
    matches: the Ledger stays the only writer of job status."""

    def __init__(self, path: Path, *, busy_timeout_ms: int, synchronous: str) -> None:
        self._path = path
        self._busy_timeout_ms = busy_timeout_ms
        self._synchronous = synchronous
        self._conn: sqlite3.Connection | None = None
        self._renewed_at: float | None = None  # monotonic time the last renewal that committed began

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = store.connect(self._path, busy_timeout_ms=self._busy_timeout_ms, synchronous=self._synchronous)
        return self._conn

    def renew(self, owner: str, job_types: Sequence[str], held: Sequence[tuple[str, int]], *, lease_seconds: float) -> builtins.list[str]:
        conn = self._connection()
        began = time.monotonic()
        # another writer's lock is waited for at most half of what is left of the leases (and
        # at most busy_timeout_ms): a renewal that fails is tried again at once (leases.Heartbeat),
        # and the next try must still fit before the leases run out
        wait_ms = self._busy_timeout_ms
        if self._renewed_at is not None:
            wait_ms = max(0, min(wait_ms, int((self._renewed_at + lease_seconds - began) * 1000 / 2)))
        with self._transaction(conn, wait_ms):
            now = time.time()
            store.beat(conn, owner, job_types, now=format_ts(now), lease_seconds=lease_seconds)
            lost = store.renew(conn, held, expires=format_ts(now + lease_seconds))
        self._renewed_at = began
        return lost

    def forget(self, owner: str) -> None:
        conn = self._connection()
        with self._transaction(conn, self._busy_timeout_ms):
            store.forget_worker(conn, owner)

    @staticmethod
    @contextmanager
    def _transaction(conn: sqlite3.Connection, wait_ms: int) -> Iterator[None]:
        begin_immediate(conn, wait_ms)
        try:
            yield
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:  # SQLite may have rolled back already (disk full, I/O error)
                conn.execute("ROLLBACK")
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


@asynccontextmanager
async def open_sqlite_backend(
    path: Path | str,
    *,
    url: str | None = None,
    busy_timeout_ms: int = 5000,
    synchronous: str = "full",
    nudge_send: trio.MemorySendChannel[Nudge] | None = None,
    offers_recv: trio.MemoryReceiveChannel[ClaimOffer] | None = None,
    wiring: Topology | None = None,
) -> AsyncIterator[SqliteBackend]:
    """Open (and migrate) the file, run the Ledger until the block ends; then the Ledger
    writes whatever is still in its inbox and stops.

    ``nudge_send`` and ``offers_recv`` are the Poller's channels (see base.ClaimOffer);
    without them nobody is told of new work (the CLI, the admin API alone)."""
    listening = nudge_send is not None
    if nudge_send is None:
        nudge_send, nudge_recv = trio.open_memory_channel[Nudge](NUDGE_BUFFER)
        nudge_recv.close()  # nobody listens: nudges and offers' answers are dropped
    stats = LedgerStats()
    async with open_database(path, busy_timeout_ms=busy_timeout_ms, synchronous=synchronous) as db, trio.open_nursery() as tn:
        if wiring is not None:
            ledger_send, ledger_recv = wiring.channel("Backend", "Ledger", "commands (SQLite)", LEDGER_INBOX)
            wiring.edge("Ledger", "SQLite", "one writer: BEGIN IMMEDIATE per batch")
        else:
            ledger_send, ledger_recv = trio.open_memory_channel[Command](LEDGER_INBOX)
        lookout = Lookout()
        await tn.start(functools.partial(run_ledger, db, ledger_recv, nudge_send, stats, offers_recv=offers_recv, lookout=lookout))
        wal, checking, watching = WalCheck(db.path), trio.CancelScope(), trio.CancelScope()

        async def check_wal(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with checking:
                await run_wal_check(db, wal, task_status=task_status)

        await tn.start(check_wal)

        async def watch(task_status: trio.TaskStatus[bool] = trio.TASK_STATUS_IGNORED) -> None:
            with watching:
                await watch_commits(db, nudge_send, lookout, task_status=task_status)

        # a Poller listens: wake it when another process commits
        if listening and await tn.start(watch) and wiring is not None:
            wiring.edge("SQLite", "Poller", "the WAL was written (inotify): another process committed")
        try:
            yield SqliteBackend(db, ledger_send, stats, url=url or f"sqlite:///{path}", wal=wal)
        finally:
            checking.cancel()
            watching.cancel()
            ledger_send.close()  # the Ledger drains its inbox, commits, and ends
