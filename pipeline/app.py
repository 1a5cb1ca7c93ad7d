"""The wiring: ``open_pipeline`` builds the actors, opens the nurseries, creates the channels.

    business code ─emit─▶ EventBus ─▶ Enqueuer ─insert─▶ Ledger ─▶ SQLite
                                                           │ wake
                          Poller ─claim─▶ Ledger ◀─────────┘
                            │ per job type
                            ▼
                          Handler pools ─outcome─▶ Ledger

Nurseries nest so that shutdown flows downstream: the innermost holds the bus,
enqueuer, poller and workers; around it the lease keeper, which must renew until the
last worker is done; outermost the Ledger, which ends only when its inbox closes and
so writes the last batch.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from .bus import Envelope, run_event_bus
from .clock import to_ts
from .config import Config
from .db import open_database
from .diagrams import Wiring
from .enqueuer import run_enqueuer
from .errors import ConfigError, PipelineClosed, UsageError
from .ids import UUID7Factory
from .leases import run_lease_keeper
from .ledger import LedgerStats, Reply, run_ledger
from .poller import run_poller
from .pools import Outcome, Pool, describe_outcome, run_worker
from .queue import Lease, NewJob, SqliteJobQueue
from .registry import Registry

log = logging.getLogger("pipeline")

LEDGER_INBOX = 4096  # commands waiting for the Ledger before writers block
BUS_BUFFER = 256  # events waiting for the Enqueuer before emit blocks


class Pipeline:
    """What ``open_pipeline`` yields: enqueue and emit, plus the queue for operator reads."""

    def __init__(self, config: Config, registry: Registry, queue: SqliteJobQueue, ledger_stats: LedgerStats, wiring: Wiring) -> None:
        self.config = config
        self.wiring = wiring  # the channels the wiring created: diagrams/actors.mmd is drawn from it
        self.registry = registry
        self.queue = queue
        self.ledger_stats = ledger_stats
        self.closed = False
        self._bus_send: trio.MemorySendChannel[Envelope] | None = None  # set by the wiring
        self._wake_send: trio.MemorySendChannel[None] | None = None
        self._observers: list[Callable[[dict[str, Any]], None]] = []
        self.resources: dict[str, Any] = {}  # entered by open_pipeline from registry.resources()
        self.heartbeat: Any = None  # the lease heartbeat thread, while workers run (leases.Heartbeat)

    # -- producing work -------------------------------------------------------------------

    def new_job(
        self,
        job: Any,
        *,
        run_after: Any = None,
        max_attempts: int | None = None,
        priority: int = 5,
    ) -> NewJob:
        """Encode and validate a job object (UnknownJobType / InvalidPayload if it does not fit)."""
        job_type, payload = self.registry.encode(job)
        self.registry.decode(job_type, payload)  # round trip: what we store must load again
        spec = self.registry.spec(job_type)
        if max_attempts is None:
            max_attempts = spec.max_attempts or self.config.worker_default_max_attempts
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise UsageError(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise UsageError(f"priority must be an integer, got {priority!r}")
        if run_after is not None:
            try:
                run_after = to_ts(run_after)
            except (ValueError, TypeError, OverflowError) as exc:
                raise UsageError(f"run_after {run_after!r} is not a time (datetime, ISO 8601 text or epoch seconds): {exc}") from None
        return NewJob(job_type, payload, max_attempts, run_after, priority)

    async def enqueue(self, job: Any, *, run_after: Any = None, max_attempts: int | None = None, priority: int = 5) -> str:
        """Persist one job; returns its id once the row is committed."""
        self._check_open()
        return await self.queue.enqueue(self.new_job(job, run_after=run_after, max_attempts=max_attempts, priority=priority))

    async def enqueue_many(self, jobs: Sequence[Any], *, priority: int = 5) -> list[str]:
        """Persist many jobs in one transaction; returns their ids once committed."""
        self._check_open()
        return await self.queue.enqueue_many([self.new_job(job, priority=priority) for job in jobs])

    async def emit(self, event: Any) -> list[str]:
        """Publish a domain event; returns the ids of the jobs it routed to, once committed."""
        self._check_open()
        return await self.emit_from_job(event)

    async def emit_from_job(self, event: Any) -> list[str]:
        """``emit`` for handlers (``JobContext.emit``): still open during the shutdown grace,
        so a job that finishes in it can emit its follow-up events."""
        name = self.registry.event_name_of(event)
        if self._bus_send is None:
            raise PipelineClosed("the event bus is not running")
        reply = Reply()
        try:
            await self._bus_send.send(Envelope(name, event, reply))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise PipelineClosed("the pipeline is shutting down and takes no new events") from None
        return await reply.wait()

    def _check_open(self) -> None:
        if self.closed:
            raise PipelineClosed("the pipeline is shutting down and takes no new work")

    # -- internal hooks for the actors --------------------------------------------------------

    def wake_poller(self) -> None:
        if self._wake_send is not None:
            try:
                self._wake_send.send_nowait(None)
            except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                pass

    def add_observer(self, fn: Callable[[dict[str, Any]], None]) -> None:
        """Call ``fn(fields)`` for every job outcome (metrics, tests, benchmarks)."""
        self._observers.append(fn)

    def observe(self, lease: Lease, outcome: Outcome, result: str | None, duration: float) -> None:
        level = logging.INFO if outcome.kind == "ok" else logging.WARNING
        logged = log.isEnabledFor(level)
        if not logged and not self._observers:
            return  # nobody listens (LOG_LEVEL=warning, no admin): skip building the fields
        fields = describe_outcome(lease, outcome, result, duration)
        if logged:
            log.log(level, "job %(job_id)s %(job_type)s attempt %(attempt)s/%(max_attempts)s %(outcome)s → %(status)s in %(duration_ms)s ms%(err)s",
                    {**fields, "err": f": {fields['error']}" if fields["error"] else ""}, extra={"job": fields})
        for fn in self._observers:
            fn(fields)


def default_owner() -> str:
    """host:pid:nonce. The nonce tells apart pipelines opened one after another in one
    process: a pipeline never rescues its own leases, only those of others."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def _make_pools(config: Config, registry: Registry, wiring: Wiring) -> dict[str, Pool]:
    pools = {}
    for name, spec in registry.handled().items():
        concurrency = spec.concurrency or config.worker_concurrency
        capacity = concurrency + config.prefetch_for(concurrency)
        send, recv = wiring.channel("Poller", "Handler pools", "claimed jobs, one channel per type", capacity, size_label="workers + prefetch")
        timeout = spec.timeout or config.worker_job_timeout_seconds
        pools[name] = Pool(spec, concurrency, capacity, timeout, send, recv)
    return pools


@asynccontextmanager
async def open_pipeline(config: Config | None = None, registry: Registry | None = None, *, owner: str | None = None) -> AsyncIterator[Pipeline]:
    """Run the pipeline's actors inside the caller's trio program.

    Leaving the block shuts down gracefully: no new claims; in-flight jobs get
    WORKER_SHUTDOWN_TIMEOUT seconds, then are returned to pending without counting the
    attempt; everything waiting for the Ledger is written.
    """
    config = config or Config.from_env()
    if registry is None:
        from .handlers import default_registry

        registry = default_registry(config)
    if config.backend != "sqlite":
        raise ConfigError(f"DATABASE_URL={config.database_url!r}: only sqlite:/// is available in this version")
    ledger_stats = LedgerStats()
    wiring = Wiring()
    async with open_database(
        config.database_path, busy_timeout_ms=config.sqlite_busy_timeout_ms, synchronous=config.sqlite_synchronous
    ) as db:
        ledger_send, ledger_recv = wiring.channel("JobQueue", "Ledger", "commands", LEDGER_INBOX)
        wake_send, wake_recv = wiring.channel("Ledger", "Poller", "wake: due work committed", 1)
        wiring.edge("Ledger", "SQLite", "one writer: BEGIN IMMEDIATE per batch")
        queue = SqliteJobQueue(
            db,
            ledger_send,
            owner=owner or default_owner(),
            lease_seconds=config.worker_lease_seconds,
            backoff_base_seconds=config.backoff_base_seconds,
            new_id=UUID7Factory(),
        )
        pipeline = Pipeline(config, registry, queue, ledger_stats, wiring)
        async with contextlib.AsyncExitStack() as resources, trio.open_nursery() as ledger_tn:
            for name, factory in registry.resources().items():
                pipeline.resources[name] = await resources.enter_async_context(factory(pipeline))
            await ledger_tn.start(
                functools.partial(run_ledger, db, ledger_recv, wake_send.clone(), ledger_stats, eager=queue.eager_command)
            )
            pipeline._wake_send = wake_send
            try:
                async with trio.open_nursery() as keeper_tn:
                    pools = _make_pools(config, registry, wiring) if config.worker_enabled else {}
                    keeper = None
                    if config.worker_enabled:
                        wiring.edge("Lease keeper", "JobQueue", "rescue expired leases, bury unknown types")
                        wiring.edge("Lease heartbeat (thread)", "SQLite", "renew this process's leases")
                        keeper = await keeper_tn.start(run_lease_keeper, pipeline, pools)
                    # the bus and the Enqueuer outlive the workers: a job finishing in the
                    # shutdown grace can still emit its follow-up events
                    bus_send, bus_recv = wiring.channel("business code", "EventBus", "emit", BUS_BUFFER)
                    events_send, events_recv = wiring.channel("EventBus", "Enqueuer", "events", BUS_BUFFER)
                    await keeper_tn.start(run_event_bus, bus_recv, [events_send])
                    wiring.edge("Enqueuer", "JobQueue", "insert routed jobs")
                    await keeper_tn.start(run_enqueuer, pipeline, events_recv)
                    pipeline._bus_send = bus_send
                    async with trio.open_nursery() as tn:
                        claiming = None
                        if config.worker_enabled:
                            for pool in pools.values():
                                for _ in range(pool.concurrency):
                                    await tn.start(run_worker, pipeline, pool, pool.recv.clone())
                                pool.recv.close()
                            wiring.edge("Poller", "JobQueue", "claim up to free capacity")
                            wiring.edge("Handler pools", "JobQueue", "outcome")
                            claiming = await tn.start(run_poller, pipeline, pools, wake_recv.clone())
                        wake_recv.close()
                        try:
                            yield pipeline
                        finally:
                            # graceful shutdown flows downstream. (If the caller's own scope
                            # is being cancelled, the actors are cancelled too: running jobs
                            # stay running until their lease expires and another run rescues them.)
                            pipeline.closed = True  # enqueue and emit from outside refuse from now on
                            # a database locked by someone else must not hold the stop up for long
                            ledger_stats.give_up_at = trio.current_time() + config.worker_shutdown_timeout + 1
                            if claiming is not None:
                                claiming.cancel()  # the poller closes the pools' channels
                            for pool in pools.values():
                                pool.stop(config.worker_shutdown_timeout)
                    # every worker has settled or released its jobs
                    bus_send.close()  # the bus, then the Enqueuer, drain and close in turn
                    if keeper is not None:
                        keeper.cancel()
            finally:
                pipeline._wake_send = None
                wake_send.close()
                queue.close()  # the Ledger drains its inbox, commits, and ends

