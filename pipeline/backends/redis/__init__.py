"""The Redis backend: a hash per job, sorted sets for order, leases and the operators'
indexes, and one Lua script per transition, fenced on the server as SQLite fences in SQL.

    async with open_redis_backend(url, prefix=..., nudge_send=...) as backend:  # checks, starts the actors
        await backend.insert(jobs)                                               # → the Ledger's next batch

redis-py's sync client in trio threads (db.py says why), on a blocking pool; the lease
heartbeat and the listener each hold a connection of their own. Outcomes and inserts go
through the Ledger (ledger.py), which writes each batch in one round trip; claims run at once,
one script each (atomic on the server: concurrent claimers never take a job twice); the
listener (listener.py) turns PUBLISH into the Poller's nudge. Times are the server's
(``TIME`` inside every script): one clock for every process. Key layout: scripts.py.

Claim offers (base.ClaimOffer) are taken only for jobs that a batch's outcomes woke (a chain's next
job: the Ledger claims it at once; it PUBLISHes only what that claim left, with its process's own
payload, which its listener skips: it nudges its Poller itself); for an insert, a claim here is its
own script anyway, and the Ledger's nudge sends the Poller to claim as soon as it is written.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import redis
import trio

from ...config import masked_url
from ...errors import StoreError, UsageError
from ..base import (
    ASK_AGAIN_PAUSE,
    ASK_AGAIN_TRIES,
    NUDGE_BUFFER,
    BatchMember,
    BatchRecord,
    ClaimOffer,
    HealthReport,
    NewBatch,
    NewJob,
    Nudge,
    ParentResult,
    Topology,
    asked_again,
    check_after,
    commit_unknown,
    connection_lost,
)
from ..batches import Command, LedgerStats, ServerBackend
from . import retention, schedules, store
from .db import DRIVER_ERRORS, Database, client_for, describe, split_url
from .ledger import run_ledger
from .listener import run_listener

LEDGER_INBOX = 4096  # commands waiting for the Ledger before writers block
STAGE_CHUNK = 1000  # rows pushed to a bulk load's staging list per round trip
COMMIT_SECONDS_PER_ROW = 0.001  # what a bulk load's commit may take beyond the socket timeout (~100x its cost)
COMMIT_RETRY_PAUSE = 0.1  # between asks for a commit's lost answer

log = logging.getLogger("pipeline.redis")

__all__ = ["RedisBackend", "RedisLeaseRenewer", "open_redis_backend"]


class RedisBackend(ServerBackend[Database]):
    """:class:`~pipeline.backends.base.Backend` on a Redis server."""

    calls: ClassVar[Any] = store
    operators: ClassVar[Any] = store
    scheduling: ClassVar[Any] = schedules
    upkeep: ClassVar[Any] = retention

    async def insert(self, jobs: Sequence[NewJob], *, batch: NewBatch | None = None) -> builtins.list[str]:
        """Through the Ledger (ServerBackend.insert), its rows' dependencies checked first
        (base.check_after); an insert with a batch record is one script of its own on a pooled
        connection (the Ledger's commands carry rows only), which PUBLISHes wake as any insert does."""
        if any(job.after or job.on_parent_failure is not None for job in jobs):
            check_after(jobs)
        try:
            if batch is None:
                return await super().insert(jobs)
            return await self._db.run(store.insert, builtins.list(jobs), batch)
        except StoreError as exc:
            # the connection dropped with the script sent: it may have run (its answer lost). Asked
            # again, on a new connection, what it did (base.asked_again), as the bulk load's commit is
            if not connection_lost(exc):
                raise
            return await self._ask_again(builtins.list(jobs), exc)

    async def _ask_again(self, rows: builtins.list[NewJob], lost: StoreError) -> builtins.list[str]:
        for attempt in range(ASK_AGAIN_TRIES):
            if attempt:
                await trio.sleep(ASK_AGAIN_PAUSE)
            try:
                found = await trio.to_thread.run_sync(self._ask, rows, limiter=self._db.limiter)
            except (StoreError, *DRIVER_ERRORS):
                continue
            ids = asked_again(rows, found)
            if ids is None:
                raise StoreError(f"{lost}; nothing of this enqueue was written (the store, asked again, holds none of "
                                 "its jobs): enqueueing it again is safe") from None
            log.info("an insert of %d jobs whose answer was lost had been committed (asked again)", len(rows))
            return ids
        raise commit_unknown(rows, lost, f"redis {self._db.shown}") from None

    def _ask(self, rows: builtins.list[NewJob]) -> builtins.list[tuple[bool, str | None]]:
        # on the client directly, not through Database.run_blocking, whose back-off after the drop
        # would refuse the look for a while without trying
        found = store.insert_outcome(self._db.client, self._db.prefix, rows)
        self._db.answered()
        return found

    async def rescue_waiting(self, *, limit: int = 500) -> int:
        return await self._db.run(store.rescue_waiting, limit)

    async def parent_results(self, job_id: str) -> dict[str, ParentResult]:
        return await self._db.run(store.parent_results, job_id)

    async def batch(self, batch_id: str) -> BatchRecord | None:
        return await self._db.run(store.batch, batch_id)

    async def batch_jobs(self, batch_id: str, *, limit: int | None = None, offset: int = 0) -> builtins.list[BatchMember]:
        return await self._db.run(store.batch_jobs, batch_id, limit, offset)

    async def bulk_insert(
        self, jobs: Iterable[NewJob], *, commit_every: int | None = None,
        duplicates: builtins.list[tuple[str, str]] | None = None,
    ) -> int:
        """In a thread, on a pooled connection: the iterable is consumed as rows are staged."""
        db = self._db
        return await trio.to_thread.run_sync(_bulk_load, db, jobs, commit_every, duplicates, limiter=db.limiter)

    def lease_renewer(self) -> RedisLeaseRenewer:
        return RedisLeaseRenewer(self._db)

    def counters(self) -> builtins.list[tuple[str, str, float]]:
        stats = self._stats
        return [
            ("pipeline_ledger_batches_total", "Round trips the Ledger wrote.", stats.batches),
            ("pipeline_ledger_commands_total", "Commands (inserts, outcomes) the Ledger wrote.", stats.commands),
            ("pipeline_ledger_failed_batches_total", "Ledger round trips the server refused or lost.", stats.failed_batches),
        ]

    def trouble(self) -> str | None:
        return self._stats.trouble or self._db.trouble


def _bulk_load(db: Database, jobs: Iterable[NewJob], commit_every: int | None,
               duplicates: builtins.list[tuple[str, str]] | None = None) -> int:
    """Stage each part's rows in a list of its own, then commit it in one script (_commit):
    every row of the part, or none. A part is everything (``commit_every`` None) or
    ``commit_every`` rows; an error (a bad line raised by the iterable, a duplicate id) keeps
    the parts committed before it, drops the staged rows of its own part, and says so."""
    rows = iter(jobs)
    committer = _Committer(db)
    try:
        return _load_parts(db, rows, commit_every, duplicates, committer)
    finally:
        committer.close()


def _load_parts(db: Database, rows: Iterator[NewJob], commit_every: int | None,
                duplicates: builtins.list[tuple[str, str]] | None, committer: _Committer) -> int:
    committed = 0
    while True:
        key = f"{db.prefix}bulk:{uuid.uuid4().hex}"
        count = 0
        first: str | None = None  # a row of the part that no unique key can keep out: named if unsure
        flow = False  # a row of the part has parents or a batch (staged in key:flow too)
        try:
            buffer: list[NewJob] = []
            for row in rows:
                if row.idempotency_key is not None:  # (the staging list's rows have no room for one)
                    raise UsageError(
                        f"the job with idempotency_key {row.idempotency_key!r} (type {row.job_type}): a bulk load on "
                        "Redis (enqueue --from-file) takes no idempotency keys, its rows are staged and committed by "
                        "one script that has no room for one; leave the field out of the file, or enqueue such jobs "
                        "one at a time (enqueue TYPE --idempotency-key KEY, Client.enqueue(..., idempotency_key=KEY))"
                        + ("" if committed else "; nothing was enqueued"))
                buffer.append(row)
                count += 1
                if first is None and row.unique_key is None:
                    first = row.id
                if len(buffer) >= STAGE_CHUNK:
                    flow = _stage(db, key, buffer) or flow
                    buffer = []
                if count == commit_every:
                    break
            if buffer:
                flow = _stage(db, key, buffer) or flow
            if count == 0:
                return committed
            inserted, held = _commit(db, committer, key, count, first, flow)  # held: rows skipped, their unique key was held
        except (UsageError, StoreError, *DRIVER_ERRORS) as exc:
            error = store.refused(exc, db.shown) if isinstance(exc, DRIVER_ERRORS) else exc
            unsure = isinstance(error, _MaybeCommitted)
            if not unsure:
                try:
                    db.client.delete(key, f"{key}:flow")
                except DRIVER_ERRORS:
                    pass  # they expire in a day
            if committed:
                after = f"this part of {count} may have been, nothing after it" if unsure else "nothing from there on"
                kept = f"the {committed} jobs before it were enqueued (in parts of {commit_every}), {after}"
                raise (StoreError if unsure else type(error))(f"{error}; {kept}") from None
            if unsure:
                raise StoreError(str(error)) from None
            raise error from None
        if duplicates is not None:
            duplicates.extend(held)
        committed += inserted
        if commit_every is None:
            return committed


class _MaybeCommitted(StoreError):
    """A commit whose answer never came: it may have run (_commit's; said as a StoreError)."""


class _Committer:
    """The connection a bulk load commits its parts on, whose socket waits as long as a part's
    commit may take: one for the whole load (a new one only for a part that needs a longer wait)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._client: Any = None
        self._patience = 0.0

    def client(self, patience: float) -> Any:
        if self._client is None or self._patience < patience:
            self.close()
            self._client, self._patience = client_for(self._db.url, size=1, socket_timeout=patience), patience
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client.connection_pool.disconnect()
            self._client = None


def _commit(db: Database, committer: _Committer, key: str, rows: int,
            first: str | None, flow: bool = False) -> tuple[int, builtins.list[tuple[str, str]]]:
    """Commit a staged part on a connection of its own that waits for it: one script over
    150,000 rows may outlast the socket timeout, and its end is no failure, since the
    script runs on. The wait is the socket timeout plus COMMIT_SECONDS_PER_ROW a row. An
    answer lost even so (the connection dropped, or that wait ran out) is asked for again, for
    as long again: the script is idempotent (run again, it answers what the first run did,
    inserting nothing more; while the first still runs the server answers BUSY, or queues it).
    Only with no answer at all does it raise, saying that the rows may have been committed and
    how to check."""
    answer_key = f"{key}:answer"
    patience = db.socket_timeout + rows * COMMIT_SECONDS_PER_ROW
    client = committer.client(patience)
    deadline: float | None = None
    while True:
        try:
            answer = store.commit_staged(client, db.prefix, key, answer_key, flow=flow)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            if deadline is None and _never_sent(exc):  # the first try never reached the server: nothing ran
                raise
            lost: BaseException = exc
        except redis.exceptions.ResponseError as exc:
            if not str(exc).startswith("BUSY"):  # a refusal: the script wrote nothing
                raise
            lost = exc
        else:
            with contextlib.suppress(*DRIVER_ERRORS):
                client.delete(answer_key)  # heard: nobody needs it any more
            return answer
        now = time.monotonic()
        deadline = now + patience if deadline is None else deadline
        if now >= deadline:
            job = f"; or `python -m pipeline jobs show {first}` finds a job of the part" if first else ""
            text = (str(lost).strip().splitlines() or [type(lost).__name__])[0]
            raise _MaybeCommitted(
                f"redis {db.shown}: no answer to the commit of {rows} staged jobs ({text}): they may have been committed "
                f"(all or none of them); check before retrying: `redis-cli -u {db.shown} GET '{answer_key}'` "
                f"shows what the commit inserted if it ran (kept for a day), nil if it did not{job}") from None
        time.sleep(COMMIT_RETRY_PAUSE)


def _never_sent(exc: BaseException) -> bool:
    """A driver error that came before the command was sent: the connection was refused, or the
    server refused the credentials (redis-py's messages for a connect say "connecting to")."""
    return isinstance(exc, redis.exceptions.AuthenticationError) or " connecting to " in str(exc)


def _stage(db: Database, key: str, rows: Sequence[NewJob]) -> bool:
    """Stage a chunk of a part (store.stage); True if a row of it has parents or a batch. Rows with
    parents are checked first (base.check_after), within the chunk: a parent further on in the load
    is not in the store when its child is committed, and the commit refuses it as unknown."""
    if any(row.after or row.on_parent_failure is not None for row in rows):
        check_after(rows)
    return db.run_blocking(lambda client, prefix: store.stage(client, key, rows))


class RedisLeaseRenewer:
    """The heartbeat thread's connection: renews leases (fenced by token) and keeps this
    worker in the ``workers`` hash, in one script. A dropped connection is replaced at the next beat."""

    def __init__(self, db: Database) -> None:
        self._url = db.url
        self._prefix = db.prefix
        self._shown = db.shown
        self._client: redis.Redis | None = None

    def _run(self, fn: Any, *args: Any) -> Any:
        if self._client is None:
            self._client = client_for(self._url, size=1)
        try:
            return fn(self._client, self._prefix, *args)
        except DRIVER_ERRORS as exc:
            if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError | OSError):
                self.close()
            raise describe(exc, self._shown) from None

    def renew(self, owner: str, job_types: Sequence[str], held: Sequence[tuple[str, int]], *, lease_seconds: float) -> builtins.list[str]:
        lost: builtins.list[str] = self._run(functools.partial(store.renew, lease_seconds=lease_seconds), owner, job_types, held)
        return lost

    def forget(self, owner: str) -> None:
        self._run(store.forget_worker, owner)

    def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            client.close()
            client.connection_pool.disconnect()


@asynccontextmanager
async def open_redis_backend(
    url: str,
    *,
    key_prefix: str = "pipeline",
    allow_non_durable: bool = False,
    nudge_send: trio.MemorySendChannel[Nudge] | None = None,
    offers_recv: trio.MemoryReceiveChannel[ClaimOffer] | None = None,
    wiring: Topology | None = None,
    health: HealthReport | None = None,
) -> AsyncIterator[RedisBackend]:
    """Connect, check the server's durability settings and the key layout's version, run the
    Ledger and (when someone listens for nudges) the listener until the block ends; then the
    Ledger writes whatever is still in its inbox and stops. The Ledger takes the Poller's offers
    from ``offers_recv`` for the jobs its outcomes wake (ledger._apply_batch); an insert's claim
    is not taken with it (a claim here is a script of its own anyway). The listener says in
    ``health`` while it cannot listen."""
    listening = nudge_send is not None
    if nudge_send is None:
        nudge_send, nudge_recv = trio.open_memory_channel[Nudge](NUDGE_BUFFER)
        nudge_recv.close()  # nobody listens: nudges are dropped
    driver_url, prefix = split_url(url, key_prefix)
    db = Database(driver_url, prefix, shown=masked_url(url))
    try:
        await trio.to_thread.run_sync(functools.partial(db.open, allow_non_durable=allow_non_durable))
    except BaseException:
        await trio.to_thread.run_sync(db.close)
        nudge_send.close()
        if offers_recv is not None:
            offers_recv.close()  # (the Ledger that closes it never starts)
        raise
    stats = LedgerStats()
    try:
        async with trio.open_nursery() as tn:
            if wiring is not None:
                ledger_send, ledger_recv = wiring.channel("Backend", "Ledger", "commands (Redis)", LEDGER_INBOX)
                wiring.edge("Ledger", "Redis", "one round trip per batch")
            else:
                ledger_send, ledger_recv = trio.open_memory_channel[Command](LEDGER_INBOX)
            own = f"{os.getpid()}:{uuid.uuid4().hex}"  # what this process's Ledger PUBLISHes, which its listener skips
            await tn.start(functools.partial(run_ledger, db, ledger_recv, nudge_send.clone(), stats, offers_recv=offers_recv,
                                             own=own))
            listener_scope = trio.CancelScope()
            if listening:
                async def listen(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                    with listener_scope:
                        await run_listener(driver_url, f"{prefix}wake", db.shown, nudge_send.clone(),
                                           health=health, own=own, task_status=task_status)

                await tn.start(listen)
            nudge_send.close()
            try:
                yield RedisBackend(db, ledger_send, stats)
            finally:
                listener_scope.cancel()
                ledger_send.close()  # the Ledger drains its inbox, writes, and ends
    finally:
        await trio.to_thread.run_sync(db.close)
