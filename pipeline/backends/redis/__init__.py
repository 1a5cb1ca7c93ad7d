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

Claim offers (base.ClaimOffer) are not taken: a claim here is its own script anyway, and the
Ledger's nudge sends the Poller to claim as soon as an insert is written.
"""

from __future__ import annotations

import builtins
import functools
import logging
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, ClassVar

import redis
import trio

from ...config import masked_url
from ...engine.health import Health
from ...errors import StoreError, UsageError
from ..base import NUDGE_BUFFER, ClaimOffer, NewJob, Nudge
from ..batches import Command, LedgerStats, ServerBackend
from . import retention, schedules, store
from .db import DRIVER_ERRORS, Database, client_for, describe, split_url
from .ledger import run_ledger
from .listener import run_listener

if TYPE_CHECKING:
    from ...engine.diagrams import Wiring

LEDGER_INBOX = 4096  # commands waiting for the Ledger before writers block
STAGE_CHUNK = 1000  # rows pushed to a bulk load's staging list per round trip

log = logging.getLogger("pipeline.redis")

__all__ = ["RedisBackend", "RedisLeaseRenewer", "open_redis_backend"]


class RedisBackend(ServerBackend[Database]):
    """:class:`~pipeline.backends.base.Backend` on a Redis server."""

    calls: ClassVar[Any] = store
    operators: ClassVar[Any] = store
    scheduling: ClassVar[Any] = schedules
    upkeep: ClassVar[Any] = retention


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
    """Stage rows in a list of the load's own, then commit it in one script: every row of the
    part, or none. A part is everything (``commit_every`` None) or ``commit_every`` rows; an
    error (a bad line raised by the iterable, a duplicate id) keeps the parts committed before
    it, drops the staged rows of its own part, and says so."""
    client, prefix = db.client, db.prefix
    key = f"{prefix}bulk:{uuid.uuid4().hex}"
    committed = 0
    try:
        rows = iter(jobs)
        while True:
            count = 0
            staged = False
            buffer: list[NewJob] = []
            for row in rows:
                buffer.append(row)
                count += 1
                if len(buffer) >= STAGE_CHUNK:
                    _stage(db, key, buffer)
                    staged = True
                    buffer = []
                if count == commit_every:
                    break
            held: builtins.list[tuple[str, str]] = []  # rows skipped: their unique key was held
            if staged:
                if buffer:
                    _stage(db, key, buffer)
                _, held = db.run_blocking(store.commit_staged, key)
            elif buffer:
                ids = db.run_blocking(store.insert, buffer)  # a part that fits one call: no staging
                held = [(row.id, stored) for row, stored in zip(buffer, ids) if stored != row.id]
            if duplicates is not None:
                duplicates.extend(held)
            committed += count - len(held)
            if count == 0 or commit_every is None:
                return committed
    except (UsageError, StoreError, *DRIVER_ERRORS) as exc:
        error = describe(exc, db.shown) if isinstance(exc, DRIVER_ERRORS) else exc
        try:
            client.delete(key)
        except DRIVER_ERRORS:
            pass  # it expires in a day
        if committed:
            kept = f"the {committed} jobs before it were enqueued (in parts of {commit_every}), nothing from there on"
            raise type(error)(f"{error}; {kept}") from None
        raise error from None


def _stage(db: Database, key: str, rows: Sequence[NewJob]) -> None:
    db.run_blocking(lambda client, prefix: store.stage(client, key, rows))


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
    wiring: Wiring | None = None,
    health: Health | None = None,
) -> AsyncIterator[RedisBackend]:
    """Connect, check the server's durability settings and the key layout's version, run the
    Ledger and (when someone listens for nudges) the listener until the block ends; then the
    Ledger writes whatever is still in its inbox and stops. ``offers_recv`` is closed at once:
    this backend takes no offers. The listener says in ``health`` while it cannot listen."""
    if offers_recv is not None:
        offers_recv.close()  # the Poller keeps its own end and takes back its offer itself
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
        raise
    stats = LedgerStats()
    try:
        async with trio.open_nursery() as tn:
            if wiring is not None:
                ledger_send, ledger_recv = wiring.channel("Backend", "Ledger", "commands (Redis)", LEDGER_INBOX)
                wiring.edge("Ledger", "Redis", "one round trip per batch")
            else:
                ledger_send, ledger_recv = trio.open_memory_channel[Command](LEDGER_INBOX)
            await tn.start(functools.partial(run_ledger, db, ledger_recv, nudge_send.clone(), stats))
            listener_scope = trio.CancelScope()
            if listening:
                async def listen(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                    with listener_scope:
                        await run_listener(driver_url, f"{prefix}wake", db.shown, nudge_send.clone(),
                                           health=health, task_status=task_status)

                await tn.start(listen)
            nudge_send.close()
            try:
                yield RedisBackend(db, ledger_send, stats)
            finally:
                listener_scope.cancel()
                ledger_send.close()  # the Ledger drains its inbox, writes, and ends
    finally:
        await trio.to_thread.run_sync(db.close)
