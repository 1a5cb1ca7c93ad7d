"""The Postgres backend: job rows an operator can query, claims that skip each other's locks,
wake-ups across machines.

    async with open_postgres_backend(url, nudge_send=...) as backend:   # migrates, starts the actors
        await backend.insert(jobs)                                       # → the Ledger's next batch

psycopg 3's sync API in trio threads (db.py says why), on a pool sized for the Ledger, the
Poller's claims, the lease keeper and the operators' reads; the lease heartbeat and the
listener each hold a connection of their own. Outcomes and inserts go through the Ledger
(ledger.py), which writes each batch as one statement; claims run at once on a pooled
connection (``FOR UPDATE SKIP LOCKED``: concurrent claimers never wait on each other); the
listener (listener.py) turns NOTIFY into the Poller's nudge. Times are the server's
(``now()``): one clock for every process.

The Poller's claim offers (base.ClaimOffer) are taken by the Ledger: a batch that makes work
due claims for the Poller in its own transaction (ledger.py).

Workflows (issue 24): an insert with parents or a batch is a transaction of its own (graph.py),
not the Ledger's: it locks the parents it names; ending a job applies its edges in the same
transaction on every path (store.apply_edges).

Durable functions (issue 35, durable.py): STEP and SUSPEND outcomes ride the Ledger's batches, in a
statement of their own beside the other outcomes' (store.settle_durable); signals, steps and the
wake-up of suspended jobs run on pooled connections, each one statement or one short transaction.
"""

from __future__ import annotations

import builtins
import functools
import logging
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import psycopg
import trio

from ...clock import now_ts
from ...errors import CommitUnknown, StoreError, UsageError
from ...replies import Reply
from ..base import (
    ASK_AGAIN_PAUSE,
    ASK_AGAIN_TRIES,
    NUDGE_BUFFER,
    BatchMember,
    BatchRecord,
    ClaimOffer,
    HealthReport,
    Lease,
    NewBatch,
    NewJob,
    Nudge,
    ParentResult,
    Topology,
    asked_again,
    commit_unknown,
    connection_lost,
)
from ..batches import ClaimRequest, Command, LedgerStats, ServerBackend
from . import graph, queries, retention, schedules, schema, store, worker
from .db import Database, ServerSession, connect, describe, end_session, pending_session
from .ledger import run_ledger
from .listener import run_listener

LEDGER_INBOX = 4096  # commands waiting for the Ledger before writers block

log = logging.getLogger("pipeline.postgres")

__all__ = ["PostgresBackend", "PostgresLeaseRenewer", "open_postgres_backend"]


# How long a claim waits for the Ledger to take it into a batch (see PostgresBackend.claim): it takes one
# within a batch's time; past this it is busy with something slow, and the claim goes on its own.
CLAIM_RIDE_WAIT = 0.05


class PostgresBackend(ServerBackend[Database]):
    """:class:`~pipeline.backends.base.Backend` on a Postgres database."""

    calls: ClassVar[Any] = worker
    operators: ClassVar[Any] = queries
    scheduling: ClassVar[Any] = schedules
    upkeep: ClassVar[Any] = retention


    async def claim(
        self, wants: Mapping[str, int], *, owner: str, lease_seconds: float, start: Mapping[str, int] | None = None,
        limits: Mapping[str, int] | None = None, rates: Mapping[str, tuple[int, float]] | None = None,
        key_limits: Mapping[str, int] | None = None,
    ) -> builtins.list[Lease]:
        """Through the Ledger: a claim sent while outcomes wait for it rides their transaction (one
        commit and WAL flush for both; see ledger.py), at the price of waiting for the batch the Ledger
        is writing, where it ran beside it on a connection of its own (docs/scaling.md: the server's CPU
        per job 6 to 10 % less, one service's rate up to a tenth less). On a connection of the pool as
        before when the Ledger does not take it within CLAIM_RIDE_WAIT (busy with a batch that waits for
        a lock: a unique key held by another transaction), when its inbox is full, or once it has
        stopped (the pipeline going down). A claim of a type with a global, rate or key limit never
        goes through the Ledger: it takes the type's lock, which another process's claim may hold, and
        the Ledger's outcomes and inserts would wait with it."""
        if any(t in bound for bound in (limits, rates, key_limits) if bound for t in wants):
            return await super().claim(wants, owner=owner, lease_seconds=lease_seconds, start=start, limits=limits,
                                       rates=rates, key_limits=key_limits)
        request = ClaimRequest(ClaimOffer(dict(wants), owner, lease_seconds, start, limits, rates or None,
                                          key_limits or None))
        command = Command(Reply(), claim=request)
        try:
            self._ledger_send.send_nowait(command)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            request.withdrawn = True
        else:
            with trio.move_on_after(CLAIM_RIDE_WAIT):
                await request.taken.wait()
            if request.taken.is_set():
                leases: builtins.list[Lease] = await command.reply.wait()
                return leases
            request.withdrawn = True  # (the Ledger leaves it out when it comes to it)
        return await super().claim(wants, owner=owner, lease_seconds=lease_seconds, start=start, limits=limits,
                                   rates=rates, key_limits=key_limits)

    async def insert(self, jobs: Sequence[NewJob], *, batch: NewBatch | None = None) -> builtins.list[str]:
        """Plain rows through the Ledger (batched with other inserts and outcomes); rows with
        parents, or a batch's, in a transaction of their own (graph.insert_jobs), which wakes the
        Pollers by its NOTIFY (this process's too, through its listener); rows with idempotency keys
        too (store.insert_idempotent).

        A connection that drops while the commit is under way leaves its outcome unknown: the store
        is asked again, on a new connection, what the insert did (base.asked_again), and the answer
        is the real outcome (the ids, or the error saying nothing was written); CommitUnknown if it
        cannot be asked (still down after ASK_AGAIN_TRIES looks)."""
        try:
            return await self._insert(jobs, batch)
        except StoreError as exc:
            if not connection_lost(exc) or isinstance(exc, CommitUnknown):
                raise  # a refusal (a duplicate id, a constraint), not a connection lost on the way
            return await self._ask_again(builtins.list(jobs), exc)

    async def _ask_again(self, rows: builtins.list[NewJob], lost: StoreError) -> builtins.list[str]:
        known, session = pending_session(lost)
        for attempt in range(ASK_AGAIN_TRIES):
            if attempt:
                await trio.sleep(ASK_AGAIN_PAUSE)
            try:
                ended, found = await trio.to_thread.run_sync(self._ask, rows, known, session, limiter=self._db.limiter)
            except StoreError:
                continue
            ids = asked_again(rows, found)
            if ids is None and not ended:
                # nothing stored yet, and the session that ran the insert may still commit it
                who = f"session {session.pid}" if session is not None else "the server session"
                raise commit_unknown(rows, lost, f"database {self._db.shown}",
                                     f"the store, asked again, holds none of them yet, but {who} that ran the commit "
                                     "could not be ended or seen gone (it may still commit them)") from None
            if ids is None:
                raise StoreError(f"{lost}; nothing of this enqueue was written (the store, asked again, holds none of "
                                 "its jobs): enqueueing it again is safe") from None
            log.info("an insert of %d jobs whose answer was lost had been committed (asked again)", len(rows))
            return ids
        raise commit_unknown(rows, lost, f"database {self._db.shown}") from None

    def _ask(self, rows: builtins.list[NewJob], known: bool,
             session: ServerSession | None) -> tuple[bool, builtins.list[tuple[bool, str | None]]]:
        """Whether nothing can write the rows any more, and what the store holds of them. A look
        alone finds nothing while the dropped connection's server session still runs the insert
        (its statement waiting for a lock, or the server not yet aware that its client is gone),
        which then commits: so that session is ended first (db.end_session: its open transaction
        rolls back), and the look, made once it is gone, sees all it will ever have written."""
        # on a connection of its own, not the pool's: a pool whose server went away makes a caller
        # wait its whole timeout for a connection, where a connect of our own is refused at once
        conn = connect(self._db.url, self._db.role)
        try:
            ended = known and (session is None or end_session(conn, session))
            return ended, store.insert_outcome(conn, rows)
        except psycopg.Error as exc:
            raise describe(exc, self._db.url) from None
        finally:
            conn.close()

    async def _insert(self, jobs: Sequence[NewJob], batch: NewBatch | None) -> builtins.list[str]:
        if any(row.idempotency_key is not None for row in jobs):  # a transaction of its own too (store.insert_idempotent)
            return await self._db.run(store.insert_idempotent, list(jobs), _idempotent_rest(batch))
        if batch is None and not any(graph.is_linked(row) for row in jobs):
            return await super().insert(jobs)
        if not jobs:
            return []
        return await self._db.run(graph.insert_jobs, list(jobs), batch)

    async def bulk_insert(
        self, jobs: Iterable[NewJob], *, commit_every: int | None = None,
        duplicates: builtins.list[tuple[str, str]] | None = None,
    ) -> int:
        """COPY on a connection of its own, in a thread: the iterable is consumed as the rows stream."""
        return await trio.to_thread.run_sync(_bulk_load, self._db.url, self._db.role, jobs, commit_every, duplicates)

    async def rescue_waiting(self, *, limit: int = 500) -> int:
        return await self._db.run(functools.partial(graph.rescue_waiting, limit=limit))

    async def parent_results(self, job_id: str) -> dict[str, ParentResult]:
        return await self._db.run(graph.parent_results, job_id)  # (a handler's: never behind operators' reads)

    async def batch(self, batch_id: str) -> BatchRecord | None:
        return await self._db.run(graph.batch, batch_id)

    async def batch_jobs(self, batch_id: str, *, limit: int | None = None, offset: int = 0) -> builtins.list[BatchMember]:
        return await self._db.run(functools.partial(graph.batch_jobs, limit=limit, offset=offset), batch_id)

    def lease_renewer(self) -> PostgresLeaseRenewer:
        return PostgresLeaseRenewer(self._db.url)

    def counters(self) -> builtins.list[tuple[str, str, float]]:
        stats = self._stats
        return [
            ("pipeline_ledger_batches_total", "Transactions the Ledger committed.", stats.batches),
            ("pipeline_ledger_commands_total", "Commands (inserts, outcomes) the Ledger committed.", stats.commands),
            ("pipeline_ledger_failed_batches_total", "Ledger transactions the database refused.", stats.failed_batches),
        ]



def _idempotent_rest(batch: NewBatch | None = None, later: set[str] | None = None) -> Any:
    """How store.insert_idempotent inserts the rows its keys let through, in its transaction: the
    rows of a workflow (or with ``batch``) by graph's plan, the others as the Ledger would."""
    def insert(conn: psycopg.Connection[Any], rows: builtins.list[NewJob]) -> builtins.list[str]:
        if batch is None and not any(graph.is_linked(row) for row in rows):
            return store.insert_jobs(conn, rows, notify=True)
        return store.run_plan(conn, graph.insert_plan(rows, batch, later=later))

    return insert


KEYED_CHUNK = 1000  # rows with a unique key inserted per statement during a bulk load


def _bulk_load(url: str, role: str, jobs: Iterable[NewJob], commit_every: int | None,
               duplicates: builtins.list[tuple[str, str]] | None = None) -> int:
    """COPY every row in one transaction, or ``commit_every`` at a time; an error (a bad line
    raised by the iterable, a duplicate id) keeps the parts committed before it and says so.
    Rows with a unique key cannot be copied (COPY has no ON CONFLICT): the COPY stops every
    KEYED_CHUNK of them, and they are inserted by store.insert_unique, in the same transaction
    (rows with a trace context, an expiry or a limit key too, whose columns the COPY leaves out: store.insert_special;
    and rows with parents or a batch, after the others: graph.insert_plan, whose parents may be rows copied or
    committed before them: read without a lock an outcome waits for, then locked just before the commit,
    graph.confirm_parents)."""
    conn = connect(url, role)
    committed = 0
    try:
        rows = iter(jobs)
        while True:
            count = skipped = 0
            due = False
            later: set[str] = set()  # parents named outside their chunk, locked at the end (graph.confirm_parents)
            now = now_ts()
            with conn.transaction():  # everything, or commit_every of it
                ended = False
                while not ended:
                    keyed: builtins.list[NewJob] = []
                    with conn.cursor().copy(store.COPY_COLUMNS) as copy:
                        for row in rows:
                            if (row.unique_key is None and row.trace is None and row.expires_at is None
                                    and row.limit_key is None and not graph.is_linked(row) and row.idempotency_key is None):
                                copy.write_row((row.id, row.job_type, row.payload, row.max_attempts, row.run_after,
                                                row.priority, row.created_at, row.created_at))
                            else:
                                keyed.append(row)
                            count += 1
                            due = due or row.run_after <= now
                            if count == commit_every:
                                ended = True
                                break
                            if len(keyed) >= KEYED_CHUNK:
                                break
                        else:
                            ended = True
                    if keyed:
                        once = [row for row in keyed if row.idempotency_key is not None]
                        keyed = [row for row in keyed if row.idempotency_key is None]
                        linked = [row for row in keyed if graph.is_linked(row)]
                        stored = store.insert_special(conn, [row for row in keyed if not graph.is_linked(row)])
                        if once:  # (their own statements, in this transaction: a savepoint)
                            stored.update(zip((row.id for row in once), store.insert_idempotent(
                                conn, once, _idempotent_rest(later=later))))
                        if linked:  # (after the others: a parent may be one of them, or a row copied above)
                            stored.update(zip((row.id for row in linked),
                                              store.run_plan(conn, graph.insert_plan(linked, later=later))))
                        for job_id, holder in stored.items():
                            if holder != job_id:
                                skipped += 1
                                if duplicates is not None:
                                    duplicates.append((job_id, holder))
                if later:
                    graph.confirm_parents(conn, later)
                if due:
                    conn.execute(store.NOTIFY)
            committed += count - skipped
            if count == 0 or commit_every is None:
                return committed
    except (UsageError, StoreError, psycopg.Error) as exc:
        error = describe(exc, url) if isinstance(exc, psycopg.Error) else exc
        if committed:
            kept = f"the {committed} jobs before it were enqueued (in parts of {commit_every}), nothing from there on"
            raise type(error)(f"{error}; {kept}") from None
        raise error from None
    finally:
        conn.close()


class PostgresLeaseRenewer:
    """The heartbeat thread's connection: renews leases and keeps this worker in ``workers``,
    in one transaction. It writes one column of the jobs table, ``lease_expires_at``, only of
    rows whose token matches, and never waits for a row another transaction holds locked
    (store.renew). A dropped connection is replaced at the next beat."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: psycopg.Connection[Any] | None = None

    def _run(self, fn: Any) -> Any:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self.close()
            self._conn = connect(self._url, "heartbeat")
        try:
            return fn(self._conn)
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError) or self._conn.broken:
                self.close()
            raise describe(exc, self._url) from None

    def renew(self, owner: str, job_types: Sequence[str], held: Sequence[tuple[str, int]], *, lease_seconds: float) -> builtins.list[str]:
        def write(conn: psycopg.Connection[Any]) -> builtins.list[str]:
            with conn.transaction():
                # rows locked by others are skipped (store.renew); any other lock (the worker's own
                # row, a table another process migrates) is waited for a sixth of the lease at
                # most: the renewal fails and is tried again while the leases still hold
                store.bound_lock_waits(conn, seconds=lease_seconds / 6)
                store.beat(conn, owner, job_types, lease_seconds=lease_seconds)
                return store.renew(conn, held, lease_seconds=lease_seconds)

        lost: builtins.list[str] = self._run(write)
        return lost

    def forget(self, owner: str) -> None:
        self._run(lambda conn: store.forget_worker(conn, owner))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


@asynccontextmanager
async def open_postgres_backend(
    url: str,
    *,
    nudge_send: trio.MemorySendChannel[Nudge] | None = None,
    offers_recv: trio.MemoryReceiveChannel[ClaimOffer] | None = None,
    wiring: Topology | None = None,
    health: HealthReport | None = None,
    role: str = "worker",
) -> AsyncIterator[PostgresBackend]:
    """Open the pool, create or migrate the tables, run the Ledger and (when someone listens
    for nudges) the listener until the block ends; then the Ledger writes whatever is still in
    its inbox and stops. The Ledger takes the Poller's offers from ``offers_recv``; the
    listener says in ``health`` while it cannot listen. ``role``: what this process is to the
    store, in its sessions' application_name (``pipeline-worker``; db.session_name)."""
    listening = nudge_send is not None
    if nudge_send is None:
        nudge_send, nudge_recv = trio.open_memory_channel[Nudge](NUDGE_BUFFER)
        nudge_recv.close()  # nobody listens: nudges are dropped
    db = Database(url, role=role)
    try:
        await trio.to_thread.run_sync(db.open)
        await db.run(schema.migrate, db.shown)
    except BaseException:
        await trio.to_thread.run_sync(db.close)
        nudge_send.close()
        if offers_recv is not None:
            offers_recv.close()
        raise
    stats = LedgerStats()
    try:
        async with trio.open_nursery() as tn:
            if wiring is not None:
                ledger_send, ledger_recv = wiring.channel("Backend", "Ledger", "commands (Postgres)", LEDGER_INBOX)
                wiring.edge("Ledger", "Postgres", "one statement per batch")
            else:
                ledger_send, ledger_recv = trio.open_memory_channel[Command](LEDGER_INBOX)
            await tn.start(functools.partial(run_ledger, db, ledger_recv, nudge_send.clone(), stats, offers_recv=offers_recv))
            listener_scope = trio.CancelScope()
            if listening:
                async def listen(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                    with listener_scope:
                        await run_listener(url, nudge_send.clone(), health=health, task_status=task_status)

                await tn.start(listen)
            nudge_send.close()
            try:
                yield PostgresBackend(db, ledger_send, stats)
            finally:
                listener_scope.cancel()
                ledger_send.close()  # the Ledger drains its inbox, writes, and ends
    finally:
        await trio.to_thread.run_sync(db.close)
