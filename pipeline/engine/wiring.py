"""The wiring: ``open_pipeline`` opens the backend, creates the channels, starts the actors.

    business code ─emit─▶ EventBus ─▶ Enqueuer ─insert─▶ Backend (SQLite: the Ledger)
                                                           │ nudge, offer's claim
                          Poller ─claim─▶ Backend ◀────────┘
                            │ per job type
                            ▼
                          Handler pools ─outcome─▶ Backend

Each actor gets its channels and the few things it calls, never this module's objects.
Context managers nest so that shutdown flows downstream: innermost the Poller and the
workers; around them the bus and the Enqueuer (a job finishing in the shutdown grace can
still emit) and the lease keeper (which renews until the last worker is done); then the
handlers' resources; outermost the backend, whose Ledger ends only when its inbox closes
and so writes the last batch.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import secrets
import socket
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import attrs
import cattrs
import trio

from ..backends import Backend, ClaimOffer, JobRecord, Lease, NewJob, Nudge, open_backend
from ..backends.base import (
    NUDGE_BUFFER,
    PRIORITY_DEFAULT,
    PRIORITY_MAX,
    PRIORITY_MIN,
    BatchRecord,
    NewBatch,
    ScheduleRecord,
    check_after,
)
from ..clock import now_ts
from ..config import Config
from ..context import JobContext
from ..durable import check_signal_name, encode_signal_payload
from ..errors import JobCancelled, JobFailed, PipelineClosed, UsageError
from ..ids import UUID7Factory
from ..limits import global_limits, rate_limits
from ..logs import outcome_extra, outcome_lines, outcome_message
from ..registry import Registry
from ..replies import Reply
from ..requests import check_expires_at, check_job_id, check_text, check_time, check_unique_key, check_unique_while, limit_key_of
from ..states import TERMINAL, Status
from ..workflows import MAX_PARENTS, Batch, BatchOutcome, Chain, batch_outcome, check_on_parent_failure, check_parents
from .actors.bus import Envelope, run_event_bus
from .actors.control import ProgressBoard, run_canceller, run_progress_writer
from .actors.enqueuer import run_enqueuer
from .actors.leases import run_lease_keeper
from .actors.poller import run_poller
from .actors.pools import Outcome, Pool, ResultRefused, Workers, describe_outcome, run_timeouts, run_worker
from .actors.retention import run_retention
from .actors.scheduler import run_scheduler
from .actors.waker import Waker, run_waker
from .asyncio_host import current_host
from .diagrams import Wiring
from .health import Health
from .lifespan import open_lifespan, require_loop
from .steps import Durable

log = logging.getLogger("pipeline")


def check_idempotency_key(value: Any, what: str = "idempotency_key") -> str | None:
    """An enqueue's idempotency key as given (None: none): bounded text as a unique key is (not
    empty, at most 200 characters, no NUL, no lone surrogate); UsageError naming ``what`` otherwise."""
    return check_unique_key(value, what)

BUS_BUFFER = 256  # events waiting for the Enqueuer before emit blocks
# a stored trace context: a W3C traceparent (55 characters), a space and a tracestate (at most
# 32 members, 512 characters as propagators keep it): room for both, and a bound on what a row holds
MAX_TRACE_CHARS = 1024


@attrs.frozen
class Enqueued:
    """What :meth:`Pipeline.enqueue_unique` answers. ``duplicate``: a pending or running job of
    the same type held the key, nothing was inserted, and ``id`` is that job's."""

    id: str
    duplicate: bool


class Pipeline:
    """What ``open_pipeline`` yields: enqueue and emit, and the backend for operator reads."""

    def __init__(self, config: Config, registry: Registry, backend: Backend, wiring: Wiring, *, owner: str,
                 health: Health | None = None) -> None:
        self.config = config
        self.registry = registry
        self.backend = backend
        self.owner = owner  # host:pid:nonce, as in the leases this process holds
        self.global_limits = global_limits(config, registry)  # by job type: WORKER_GLOBAL_LIMITS over global_limit=
        self.rate_limits = rate_limits(config, registry)  # by job type: (starts, window seconds), WORKER_RATE_LIMITS over rate_limit=
        self.wiring = wiring  # the channels the wiring created: diagrams/actors.mmd is drawn from it
        self.resources: dict[str, Any] = {}  # entered by open_pipeline from registry.resources()
        self.closed = False  # set by the wiring when a graceful stop begins
        self.health = health if health is not None else Health()  # what the actors (the backend's listener too) cannot do right now (/healthz)
        self.pruned: dict[str, int] = {}  # rows retention removed here, by status and "workers" (/metrics)
        # under a supervisor (--processes): its worker processes' job counters, and how many run
        self.external_metrics: Callable[[], list[dict[str, Any]]] | None = None
        self.worker_processes: Callable[[], int] | None = None
        self._new_id = UUID7Factory()
        self._clock = trio.lowlevel.current_clock()  # the loop's: handlers' contexts read their deadlines on it
        self._bus_send: trio.MemorySendChannel[Envelope] | None = None  # set once the bus runs
        self._observers: list[Callable[[dict[str, Any]], None]] = []
        self.progress_board = ProgressBoard()  # ctx.progress reports, until the progress writer stores them
        self.pools: Mapping[str, Pool] = {}  # the handler pools, once made (a producer-only pipeline has none)
        self._finished: dict[str, trio.Event] = {}  # result(): jobs waited for, set as an outcome of theirs is seen here
        self.state: Any = None  # what the registry's lifespan yielded (ctx.state), once open_pipeline opened it
        self.aio = current_host()  # the asyncio loop this trio run is the guest of (asyncio handlers'), or None
        # durable functions (docs/durable.md): what ctx.step/sleep/wait_for use, and the waker of suspended jobs
        self.waker = Waker()
        self.durable = Durable(backend, lambda value: None if value is None else self.encode_result(value),
                               registry.converter.structure, self.waker.due)

    # -- producing work -------------------------------------------------------------------

    def new_job(self, job: Any, *, run_after: Any = None, max_attempts: int | None = None, priority: int = PRIORITY_DEFAULT,
                now: str | None = None, unique_key: str | None = None, trace: str | None = None,
                expires_at: Any = None, unique_while: str | None = None, after: Any = None,
                on_parent_failure: str | None = None, idempotency_key: str | None = None) -> NewJob:
        """Encode and validate a job object (UnknownJobType / InvalidPayload / UsageError if it does not fit).
        ``trace``: the trace context to store with it (see pipeline/otel.py); None: the caller's,
        as the registry's ``trace_context`` hook tells (none without one); "": none. ``after``,
        ``on_parent_failure``, ``idempotency_key``: as :meth:`enqueue`'s."""
        if trace is None:
            trace = self.trace_context()
        elif not isinstance(trace, str) or len(trace) > MAX_TRACE_CHARS:
            raise UsageError(f"trace must be W3C traceparent text of at most {MAX_TRACE_CHARS} characters, got {trace!r:.80}")
        if trace:
            check_text(trace, "trace")  # a lone surrogate here ended the Postgres and Redis write loops
        if isinstance(job, Chain):  # (enqueue_many spreads a chain before its jobs come here)
            raise UsageError(f"a chain of {len(job)} jobs is enqueued with enqueue_many(chain) (or enqueue_batch), which "
                             "answers their ids in the chain's order; enqueue takes one job (docs/workflows.md)")
        job_type, payload = self.registry.encode(job)
        self.registry.decode(job_type, payload)  # round trip: what we store must load again
        spec = self.registry.spec(job_type)
        if max_attempts is None:
            max_attempts = spec.max_attempts or self.config.worker.default_max_attempts
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise UsageError(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
        if isinstance(priority, bool) or not isinstance(priority, int) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
            raise UsageError(f"priority must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX}, got {priority!r}")
        now = now or now_ts()
        if run_after is not None:
            run_after = check_time(run_after, "run_after")  # a naive datetime is refused (pipeline/requests.py)
        if unique_key is not None:
            unique_key = check_unique_key(unique_key)
        if unique_while is not None:
            unique_while = check_unique_while(unique_while, unique_key)
        if expires_at is not None:
            expires_at = check_expires_at(expires_at, run_after=run_after or now, now=now)
        limit_key = None if spec.limit_key is None else limit_key_of(spec, job)
        if after is None and on_parent_failure is None and idempotency_key is None:
            return NewJob(self._new_id(), job_type, payload, max_attempts, run_after or now, priority, now, unique_key,
                          trace or None, expires_at, limit_key, unique_while)
        parents = check_parents(after)
        return NewJob(self._new_id(), job_type, payload, max_attempts, run_after or now, priority, now, unique_key,
                      trace or None, expires_at, limit_key, unique_while, parents,
                      check_on_parent_failure(on_parent_failure, parents),
                      idempotency_key=check_idempotency_key(idempotency_key),
                      idempotency_seconds=self.config.retention.idempotency_seconds)

    def new_rows(self, jobs: Sequence[Any], *, priority: int = PRIORITY_DEFAULT, now: str | None = None,
                 unique_keys: Sequence[str | None] | None = None, trace: str | None = None, run_after: Any = None,
                 max_attempts: int | None = None, expires_at: Any = None, unique_while: str | None = None,
                 idempotency_keys: Sequence[str | None] | None = None) -> list[NewJob]:
        """The rows of ``enqueue_many``'s jobs, in order: a :func:`pipeline.chain` among them is spread
        out, each of its jobs after the one before. ``unique_keys``, ``idempotency_keys``: one per job
        once chains are spread."""
        if isinstance(jobs, Chain):
            jobs = [jobs]
        flat: list[tuple[Any, bool]] = []  # (job, waits for the one before)
        for item in jobs:
            if isinstance(item, Chain):
                flat += [(job, i > 0) for i, job in enumerate(item)]
            else:
                flat.append((item, False))
        if unique_keys is not None and len(unique_keys) != len(flat):
            raise UsageError(f"unique_keys must give one key (or None) per job: {len(unique_keys)} for {len(flat)} jobs"
                             + (" (a chain's jobs counted one by one)" if len(flat) != len(jobs) else ""))
        if idempotency_keys is not None and len(idempotency_keys) != len(flat):
            raise UsageError(f"idempotency_keys must give one key (or None) per job: {len(idempotency_keys)} for "
                             f"{len(flat)} jobs" + (" (a chain's jobs counted one by one)" if len(flat) != len(jobs) else ""))
        keys = unique_keys if unique_keys is not None else [None] * len(flat)
        once = idempotency_keys if idempotency_keys is not None else [None] * len(flat)
        now = now or now_ts()
        rows: list[NewJob] = []
        for (job, chained), key, idempotency_key in zip(flat, keys, once):
            rows.append(self.new_job(job, priority=priority, now=now, unique_key=key, trace=trace, run_after=run_after,
                                     max_attempts=max_attempts, expires_at=expires_at, unique_while=unique_while,
                                     after=(rows[-1].id,) if chained else None, idempotency_key=idempotency_key))
        if len(flat) != len(jobs):
            check_after(rows)  # a chained job with a unique (or idempotency) key is refused here, before anything is written
        return rows


    def trace_context(self) -> str | None:
        """The calling code's trace context, by the registry's hook (None without one). Producers
        that hand a call to another thread or loop (pipeline.Client) capture it first, in the
        caller's thread, and pass it on as ``trace=``."""
        hook = self.registry.trace_context
        return None if hook is None else hook()

    async def enqueue(self, job: Any, *, run_after: Any = None, max_attempts: int | None = None, priority: int = PRIORITY_DEFAULT,
                      unique_key: str | None = None, trace: str | None = None, expires_at: Any = None,
                      unique_while: str | None = None, after: Any = None, on_parent_failure: str | None = None,
                      idempotency_key: str | None = None) -> str:
        """Persist one job; returns its id once it is committed. With ``unique_key``: while a
        job of the same type and key is pending or running, nothing is inserted and that
        job's id is returned (:meth:`enqueue_unique` says which happened). ``trace``: as
        :meth:`new_job`'s. ``expires_at`` (a datetime, ISO 8601 text or epoch seconds): a job not
        started by then never starts; it ends cancelled, its error saying it expired. ``unique_while``:
        "pending_or_running" (the default: the key is held until the job finishes) or "pending" (the
        key frees when the job starts, so an enqueue made while it runs inserts a new job).

        ``after``: a job id or ids: the job is stored ``waiting`` and becomes pending once every one
        of them has completed (its own ``run_after`` still holds). ``on_parent_failure``: what a
        parent that ends dead or cancelled (or is deleted) does to it: "cancel" (the default: it ends
        cancelled, and so do the jobs waiting for it) or "run" (it runs once every parent has ended).
        An unknown id is refused (UsageError) and nothing is written. See docs/workflows.md.

        ``idempotency_key``: text naming this enqueue (at most 200 characters): a second enqueue of
        the same job type and key within JOB_IDEMPOTENCY_SECONDS (a day) of the first inserts
        nothing and returns the first one's id, whatever its job's status (even once retention
        removed it), so an enqueue whose answer was lost (:class:`~pipeline.errors.CommitUnknown`,
        a timeout, a crash) can be sent again safely. See docs/jobs.md, "Retrying an enqueue safely"."""
        self._check_open()
        row = self.new_job(job, run_after=run_after, max_attempts=max_attempts, priority=priority, unique_key=unique_key,
                           trace=trace, expires_at=expires_at, unique_while=unique_while, after=after,
                           on_parent_failure=on_parent_failure, idempotency_key=idempotency_key)
        (stored,) = await self.backend.insert([row])
        return stored

    async def enqueue_unique(self, job: Any, *, unique_key: str | None, run_after: Any = None,
                             max_attempts: int | None = None, priority: int = PRIORITY_DEFAULT,
                             unique_while: str | None = None) -> Enqueued:
        """:meth:`enqueue`, answering whether the job was a duplicate of a pending or running
        job of its type and key (then nothing was inserted and the id is that job's)."""
        self._check_open()
        row = self.new_job(job, run_after=run_after, max_attempts=max_attempts, priority=priority, unique_key=unique_key,
                           unique_while=unique_while)
        (stored,) = await self.backend.insert([row])
        return Enqueued(stored, stored != row.id)

    async def enqueue_many(self, jobs: Sequence[Any], *, priority: int = PRIORITY_DEFAULT,
                           unique_keys: Sequence[str | None] | None = None, trace: str | None = None,
                           expires_at: Any = None, idempotency_keys: Sequence[str | None] | None = None) -> list[str]:
        """Persist many jobs in one transaction; returns their ids once committed. ``unique_keys``,
        one per job (None: no key), as :meth:`enqueue`'s: a duplicate's id is the holder's.
        ``idempotency_keys``, one per job (None: no key), as :meth:`enqueue`'s ``idempotency_key``.
        ``trace``: as :meth:`new_job`'s, for every job. A :func:`pipeline.chain` (as ``jobs``, or
        among them) enqueues its jobs each waiting for the one before; its ids are in the answer
        in its order."""
        self._check_open()
        if trace is None:
            trace = self.trace_context() or ""  # captured once for the lot
        rows = self.new_rows(jobs, priority=priority, unique_keys=unique_keys, trace=trace, expires_at=expires_at,
                             idempotency_keys=idempotency_keys)
        return await self.backend.insert(rows)

    def batch_rows(self, jobs: Sequence[Any], *, then: Any = None, priority: int = PRIORITY_DEFAULT,
                   trace: str | None = None) -> tuple[list[NewJob], NewBatch]:
        """The rows of :meth:`enqueue_batch` and the batch record; writes nothing."""
        if isinstance(jobs, Chain) or not jobs:
            raise UsageError("enqueue_batch takes a list of one job or more (a chain may be one of them)")
        now = now_ts()
        batch_id = self._new_id()
        members = [row._replace(batch_id=batch_id) for row in self.new_rows(jobs, priority=priority, now=now, trace=trace)]
        if len(members) > MAX_PARENTS and then is not None:
            raise UsageError(f"a batch with a callback holds at most {MAX_PARENTS} jobs, got {len(members)}")
        callback = None
        if then is not None:
            if isinstance(then, Chain):
                raise UsageError("then= takes one job (its own jobs may enqueue more)")
            callback = self.new_job(then, priority=priority, now=now, trace=trace, after=[m.id for m in members],
                                    on_parent_failure="run")._replace(batch_id=batch_id)
        rows = members + ([callback] if callback is not None else [])
        return rows, NewBatch(batch_id, None if callback is None else callback.id, now)

    async def enqueue_batch(self, jobs: Sequence[Any], *, then: Any = None, priority: int = PRIORITY_DEFAULT,
                            trace: str | None = None) -> Batch:
        """Persist a batch of jobs in one transaction, and with ``then`` (a job) its callback: it is
        enqueued with the batch, waits, and runs exactly once after every job of the batch has
        ended (completed, dead or cancelled); it reads their outcome with ``await ctx.batch()``.
        The batch's progress: :meth:`batch`, ``GET /admin/batches/{id}``, ``batches show ID``.
        A chain may be one of the jobs (the batch holds its jobs)."""
        self._check_open()
        if trace is None:
            trace = self.trace_context() or ""
        rows, batch = self.batch_rows(jobs, then=then, priority=priority, trace=trace)
        ids = await self.backend.insert(rows, batch=batch)
        return Batch(batch.id, tuple(ids[: len(ids) - (batch.callback_id is not None)]), batch.callback_id)

    async def batch(self, batch_id: str) -> BatchRecord | None:
        """A batch's progress: its jobs counted by status, its callback's status; None if unknown."""
        return await self.backend.batch(check_job_id(batch_id, "batch id"))

    async def parent_results(self, job_id: str) -> dict[str, Any]:
        """{parent id: result} of a job's parents (``after``) still in the store; a parent that did not
        complete has None. ``ctx.parent_results()`` in a handler."""
        return {parent: self.registry.decode_result(job_type, result)
                for parent, (job_type, result) in (await self.backend.parent_results(job_id)).items()}

    async def batch_of(self, job_id: str) -> BatchOutcome:
        """The outcome of the batch ``job_id`` belongs to (as its callback or as one of its jobs):
        ``ctx.batch()`` in a handler. UsageError if it belongs to none."""
        job = await self.backend.get(job_id)
        batch_id = None if job is None else job.batch_id
        record = None if batch_id is None else await self.backend.batch(batch_id)
        if batch_id is None or record is None:
            raise UsageError(f"job {job_id} belongs to no batch: ctx.batch() is for a batch's callback (enqueue_batch's "
                             "then=) and its jobs")
        # the counts only; the jobs with their results a page at a time (BatchOutcome.members)
        return batch_outcome(record, lambda limit, offset: self.backend.batch_jobs(batch_id, limit=limit, offset=offset),
                             decode=self.registry.decode_result)

    async def emit(self, event: Any, *, trace: str | None = None) -> list[str]:
        """Publish a domain event; returns the ids of the jobs it routed to, once committed.
        ``trace``: as :meth:`new_job`'s, for each of them."""
        self._check_open()
        return await self._emit(event, trace=trace)

    async def _emit(self, event: Any, *, trace: str | None = None) -> list[str]:
        """``emit`` for handlers (``JobContext.emit``): still open during the shutdown grace,
        so a job that finishes in it can emit its follow-up events."""
        name = self.registry.event_name_of(event)
        if self._bus_send is None:
            raise PipelineClosed("the event bus is not running")
        if trace is None:  # the emitter's, here: the Enqueuer routes it in a task of its own
            trace = self.trace_context()
        if trace:
            check_text(trace, "trace")  # refused here, to the emitter, not in the Enqueuer's task
        reply = Reply()
        try:
            await self._bus_send.send(Envelope(name, event, reply, trace or None))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise PipelineClosed("the pipeline is shutting down and takes no new events") from None
        return await reply.wait()

    def route(self, event: Any, trace: str | None = None) -> list[NewJob]:
        """The routing table applied to one event: its jobs, encoded and ready to insert, with
        the emitter's trace context (None: none)."""
        now = now_ts()
        return [self.new_job(r.job, run_after=r.run_after, now=now, unique_key=r.unique_key, trace=trace or "")
                for r in self.registry.route(event, self.config)]

    def _check_open(self) -> None:
        if self.closed:
            raise PipelineClosed("the pipeline is shutting down and takes no new work")

    # -- outcomes ------------------------------------------------------------------------------

    def add_observer(self, fn: Callable[[dict[str, Any]], None]) -> None:
        """Call ``fn(fields)`` for every job outcome (metrics, tests, benchmarks)."""
        self._observers.append(fn)

    def observe(self, lease: Lease, outcome: Outcome, result: str | None, duration: float) -> None:
        """The one log line per job outcome, and the observers."""
        if self._finished:
            self._wake_waiters(lease)
        if outcome.kind == "suspended" and result is not None and outcome.delay is not None:
            self.waker.due(outcome.delay)  # (a sleep of this process resumes on time, not at the next look)
        level = logging.INFO if outcome.kind in ("ok", "snoozed", "cancelled", "suspended") else logging.WARNING
        logged = log.isEnabledFor(level)
        if not logged and not self._observers:
            return  # nobody listens (LOG_LEVEL=warning, no admin): skip building the fields
        fields = describe_outcome(lease, outcome, result, duration)
        if logged:
            lines = outcome_lines()
            if lines is not None:  # the service's own logging: batched, off the hot path (see logs.py)
                lines.write(level, outcome_message(fields), fields)
            else:
                log.log(level, "%s", outcome_message(fields), extra=outcome_extra(fields))
        for fn in self._observers:
            fn(fields)

    def _wake_waiters(self, lease: Lease) -> None:
        finished = self._finished.pop(lease.id, None)
        if finished is not None:
            finished.set()

    def context_for(self, lease: Lease) -> JobContext:
        pool = self.pools.get(lease.job_type)
        return JobContext(lease.id, lease.job_type, lease.attempts, lease.max_attempts, self._emit, self.resources, self.config,
                          trace=lease.trace, report=self.progress_board.report, token=lease.token,
                          cancelling=None if pool is None else pool.cancelling, workflows=self,
                          deadlines=None if pool is None else pool.deadlines, clock=self._clock, state=self.state,
                          aio=self.aio if pool is not None and pool.spec.runtime == "asyncio" else None,
                          durable=self.durable)

    def encode_result(self, value: Any) -> str | None:
        """A handler's return value as the JSON text stored as its job's result (JSON's values, attrs
        instances, dataclasses, pydantic models and the types of docs/jobs.md's table, through the
        registry's converter: Registry.encode_result); ResultRefused saying why not."""
        try:
            text = self.registry.encode_result(value)
        except RecursionError:
            raise ResultRefused("the handler's return value is nested too deeply (or refers to itself) to store as its "
                                "result") from None
        except (TypeError, ValueError, cattrs.BaseValidationError) as exc:
            raise ResultRefused(f"the handler's return value (a {type(value).__qualname__}) cannot be stored as its result "
                                f"(JSON's values, attrs instances, dataclasses, pydantic models and the types of "
                                f"docs/jobs.md's table can): {exc}") from None
        size = len(text.encode("utf-8", "surrogatepass"))
        limit = self.config.worker.result_max_bytes
        if size > limit:
            raise ResultRefused(f"the handler's return value is {size} bytes as JSON, over WORKER_RESULT_MAX_BYTES={limit}: "
                                "store large results elsewhere (a file, a bucket) and return where")
        return text.encode("utf-8", "backslashreplace").decode("utf-8")

    # -- control: cancel, results, pauses ----------------------------------------------------------

    async def cancel(self, job_id: str, *, reason: str = "cancelled by the application") -> str:
        """Cancel a job: a pending one at once ("cancelled"); a running one is stopped in whichever
        process runs it, within a second or so ("cancelling": see :meth:`result` to wait for its end);
        a finished one is left as it is (its status is returned). LookupError for an unknown id."""
        (answer,) = await self.backend.cancel([check_job_id(job_id)], reason=reason)
        if answer is None:
            raise LookupError(f"no job with id {job_id!r}")
        return answer

    async def result(self, job_id: str, *, timeout: float | None = None) -> Any:
        """Wait for a job's final state and return its result (the handler's return value as JSON:
        dicts, lists, numbers, text; None if it returned None). JobFailed (dead) or JobCancelled
        (cancelled) with the job's error if it did not complete; LookupError for an unknown id;
        TimeoutError after ``timeout`` seconds (>= 0: a finished job's result is returned even at 0). A job
        run by this process wakes the wait as its outcome is written; one run elsewhere is looked at every
        0.1 s at first, then every 0.5 s at most. A cancelled wait stops at once."""
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0):
            raise UsageError(f"timeout must be a number of seconds >= 0 (or None: no limit), got {timeout!r:.40}")
        check_job_id(job_id)
        deadline = trio.current_time() + (math.inf if timeout is None else timeout)
        pause = 0.1
        while True:
            # registered before the read: an outcome written here meanwhile wakes the wait below
            finished = self._finished.setdefault(job_id, trio.Event())
            try:
                # the read is not bounded by the deadline, only the wait is: a job that has finished
                # answers its result whatever the timeout (0 included)
                job = await self.backend.get(job_id)
                if job is None:
                    raise LookupError(f"no job with id {job_id!r}")
                if job.status in TERMINAL:
                    return _result_of(job, self.registry)
                if trio.current_time() >= deadline:
                    raise TimeoutError(f"job {job_id} did not finish within {timeout:g} s (it is {job.status})")
                with trio.move_on_at(min(deadline, trio.current_time() + pause)):
                    await finished.wait()
            finally:
                if self._finished.get(job_id) is finished and not finished.statistics().tasks_waiting:
                    del self._finished[job_id]
            pause = min(pause * 1.5, 0.5)

    async def signal(self, job_id: str, name: str, payload: Any = None, *, key: str | None = None) -> str:
        """Send the signal ``name`` to a job (docs/durable.md): a job suspended in ``ctx.wait_for(name)``
        resumes ("woken"); one that has not reached its wait yet keeps it for that wait ("kept"); each
        signal is consumed by one wait. ``payload``: any JSON value, what the wait returns. ``key``: a
        signal with this key was sent to the job already → SignalKeyUsed, nothing sent (make a retried
        send safe). LookupError for an unknown job; UsageError for a finished one."""
        check_job_id(job_id)
        check_signal_name(name)
        if key is not None:
            check_unique_key(key, "the signal's key")
        return await self.backend.signal(job_id, name, encode_signal_payload(payload), key=key)

    def _known_type(self, job_type: str) -> str:
        known = self.registry.job_types()
        if job_type not in known:
            raise UsageError(f"unknown job type {job_type!r}; known: {', '.join(known) or 'none'}")
        return job_type

    async def pause_type(self, job_type: str) -> None:
        """No new job of this type starts, in any process sharing the store, until :meth:`resume_type`
        (kept in the store, across restarts); enqueues are still accepted; running jobs finish."""
        await self._set_paused(job_type, True)

    async def resume_type(self, job_type: str) -> None:
        await self._set_paused(job_type, False)

    async def _set_paused(self, job_type: str, paused: bool) -> None:
        # this process acknowledges its own pause at once (others at their canceller's next look):
        # once pause_type returns, no job of the type starts here, those claimed ahead go back
        await self.backend.set_type_paused(self._known_type(job_type), paused)
        pool = self.pools.get(job_type)
        if pool is not None:
            pool.paused = paused
            pool.pause_marks += 1
            if paused:
                pool.paused_at = trio.current_time()


KEYS_UNLIMITED = 2**31 - 1  # the key limit of a type with limit_key and no key_limit: round-robin alone


def _result_of(job: JobRecord, registry: Registry) -> Any:
    """A final job's result (read back as its type's ``returns``), or the error that says why it has none."""
    if job.status == Status.COMPLETED:
        return registry.decode_result(job.job_type, job.result)
    if job.status == Status.CANCELLED:
        raise JobCancelled(job.id, job.status, job.error)
    raise JobFailed(job.id, job.status, job.error)


def _flush_outcome_lines() -> None:
    lines = outcome_lines()
    if lines is not None:
        lines.flush()


def default_owner() -> str:
    """host:pid:nonce. The nonce tells apart pipelines opened one after another in one
    process: a pipeline never rescues its own leases, only those of others."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def _make_pools(config: Config, registry: Registry, wiring: Wiring) -> dict[str, Pool]:
    pools = {}
    limits = global_limits(config, registry)
    rates = rate_limits(config, registry)
    for name, spec in registry.handled().items():
        concurrency = spec.concurrency or config.worker.concurrency
        capacity = concurrency + config.worker.prefetch_for(concurrency)
        limit = limits.get(name)
        rate = rates.get(name)
        if rate is not None:
            capacity = concurrency  # no prefetch: a job claimed ahead would spend a start of the window
        if limit is not None:
            # No more workers than the limit, and no prefetch: a job claimed ahead of a free
            # worker would hold one of the type's few slots while workers of other processes idle.
            concurrency = capacity = min(concurrency, limit)
        send, recv = wiring.channel("Poller", "Handler pools", "claimed jobs, one channel per type", capacity, size_label="workers + prefetch")
        timeout = spec.timeout or config.worker.job_timeout_seconds
        key_limit = None if spec.limit_key is None else (spec.key_limit or KEYS_UNLIMITED)
        pools[name] = Pool(spec, concurrency, capacity, timeout, send, recv, global_limit=limit, rate=rate,
                           key_limit=key_limit)
    return pools


@asynccontextmanager
async def _open_resources(pipeline: Pipeline) -> AsyncIterator[None]:
    """Enter every resource the registry declares (an HTTP client, the mailer, the content
    database) before any actor starts; exit them after the last one stopped."""
    async with AsyncExitStack() as stack:
        for name, factory in pipeline.registry.resources().items():
            pipeline.resources[name] = await stack.enter_async_context(factory(pipeline.config, pipeline.registry))
        yield


@asynccontextmanager
async def _run_keeper_and_bus(pipeline: Pipeline, pools: Mapping[str, Pool]) -> AsyncIterator[None]:
    """The lease keeper (with its heartbeat thread), the EventBus and the Enqueuer: they
    outlive the workers, so the keeper renews and a job in its shutdown grace can emit."""
    config, wiring, backend = pipeline.config, pipeline.wiring, pipeline.backend
    # two nurseries: the keeper is cancelled at the end, the bus and the Enqueuer drain
    async with trio.open_nursery() as tn, trio.open_nursery() as keeper_tn:
        if config.worker.enabled:
            wiring.edge("Lease keeper", "Backend", "rescue expired leases, bury unknown types")
            wiring.edge("Lease heartbeat (thread)", "Backend", "renew this process's leases")
            await keeper_tn.start(functools.partial(
                run_lease_keeper, backend, pools, owner=pipeline.owner, job_types=sorted(pools),  # the types handled here
                lease_seconds=config.worker.lease_seconds, backoff_base_seconds=config.worker.backoff_base_seconds,
                unknown_type_grace_seconds=config.worker.unknown_type_grace_seconds,
            ))
            # every worker process fires due cron schedules; the store lets one win each tick
            wiring.edge("Scheduler", "Backend", "fire due cron schedules: insert the job, move next_run on")
            tick_job = functools.partial(pipeline.new_job, trace="")  # a tick's job: no producer's trace context
            await keeper_tn.start(functools.partial(run_scheduler, backend, pipeline.registry, tick_job,
                                                    health=pipeline.health))
            wiring.edge("Retention", "Backend", "remove finished jobs and dead workers' entries past their retention")
            await keeper_tn.start(functools.partial(run_retention, backend, kept_for=config.retention.kept_for(),
                                                    interval=config.retention.interval_seconds, pruned=pipeline.pruned))
            wiring.edge("Canceller", "Backend", "read the cancel requests of this process's running jobs")
            wiring.edge("Canceller", "Handler pools", "stop a job whose cancel was requested")
            await keeper_tn.start(functools.partial(run_canceller, backend, pools, owner=pipeline.owner))
            wiring.edge("Progress writer", "Backend", "store ctx.progress, once a second per job at most")
            await keeper_tn.start(run_progress_writer, backend, pipeline.progress_board)
            wiring.edge("Waker", "Backend", "suspended jobs back to pending when their time comes")
            await keeper_tn.start(functools.partial(run_waker, backend, pipeline.waker, interval=config.worker.poll_interval))
        bus_send, bus_recv = wiring.channel("business code", "EventBus", "emit", BUS_BUFFER)
        events_send, events_recv = wiring.channel("EventBus", "Enqueuer", "events", BUS_BUFFER)
        await tn.start(run_event_bus, bus_recv, [events_send])
        wiring.edge("Enqueuer", "Backend", "insert routed jobs")
        await tn.start(run_enqueuer, backend, pipeline.route, events_recv)
        pipeline._bus_send = bus_send
        try:
            yield
        finally:
            bus_send.close()  # the bus, then the Enqueuer, drain and close in turn
            keeper_tn.cancel_scope.cancel()  # every worker has settled or released its jobs


@asynccontextmanager
async def _run_workers(
    pipeline: Pipeline,
    pools: Mapping[str, Pool],
    nudge_send: trio.MemorySendChannel[Nudge],
    nudge_recv: trio.MemoryReceiveChannel[Nudge],
    offers_send: trio.MemorySendChannel[ClaimOffer],
    offers_recv: trio.MemoryReceiveChannel[ClaimOffer],
) -> AsyncIterator[None]:
    """The handler pools' workers and the Poller that feeds them; on leaving, no new claims,
    and running jobs get WORKER_SHUTDOWN_TIMEOUT before they are released."""
    config, wiring, backend = pipeline.config, pipeline.wiring, pipeline.backend
    decode = functools.partial(pipeline.registry.decode, stored=True)
    workers = Workers(backend, decode, config.worker.backoff_base_seconds, nudge_send,
                      pipeline.observe, pipeline.context_for, encode_result=pipeline.encode_result,
                      max_snoozes=config.worker.max_snoozes, flush_progress=pipeline.progress_board.flush, aio=pipeline.aio)
    async with trio.open_nursery() as tn, nudge_send:  # the workers' nudges end with the workers
        for pool in pools.values():
            for _ in range(pool.concurrency):
                await tn.start(run_worker, workers, pool, pool.recv.clone())
            pool.recv.close()
            await tn.start(run_timeouts, pool)  # (ends with the pool's last worker)
        wiring.edge("Poller", "Backend", "claim up to free capacity")
        wiring.edge("Handler pools", "Backend", "outcome")
        wiring.edge("Handler pools", "Poller", "nudge: a full pool has room")
        claiming = await tn.start(functools.partial(
            run_poller, backend, pools, nudge_recv, offers_send, offers_recv, owner=pipeline.owner,
            lease_seconds=config.worker.lease_seconds, interval=config.worker.poll_interval, health=pipeline.health,
        ))
        try:
            yield
        finally:
            claiming.cancel()  # the Poller closes the pools' channels
            for pool in pools.values():
                pool.stop(config.worker.shutdown_timeout)


@asynccontextmanager
async def open_pipeline(config: Config | None = None, registry: Registry | None = None, *, owner: str | None = None,
                        role: str | None = None) -> AsyncIterator[Pipeline]:
    """Run the pipeline's actors inside the caller's trio program. ``role``: what this process is to
    the store, as its Postgres sessions say (application_name ``pipeline-ROLE``): by default
    ``worker`` with WORKER_ENABLED, else ``client``.

    Leaving the block shuts down gracefully: no new claims; in-flight jobs get
    WORKER_SHUTDOWN_TIMEOUT seconds, then are returned to pending without counting the
    attempt; everything waiting for the backend is written.
    """
    config = config or Config.from_env()
    registry = registry if registry is not None else Registry()
    global_limits(config, registry)  # refused before anything opens
    rate_limits(config, registry)
    working = config.worker.enabled
    if working:
        require_loop(registry)  # asyncio handlers, and no asyncio loop to run them on
    wiring = Wiring()
    health = Health()  # the backend's listener reports in it too
    # the Poller's two channels across the backend boundary (see backends.base.ClaimOffer)
    nudge_send, nudge_recv = wiring.channel("Backend", "Poller", "nudge: work due, or the offer's claim", NUDGE_BUFFER)
    offers_send, offers_recv = wiring.channel("Poller", "Backend", "offer: free capacity for the next insert", 1)
    async with AsyncExitStack() as stack:
        stack.callback(_flush_outcome_lines)  # the last outcomes' lines are out once the block is left
        backend = await stack.enter_async_context(open_backend(
            config, nudge_send=nudge_send.clone() if working else None, offers_recv=offers_recv.clone() if working else None,
            wiring=wiring, health=health, role=role,
        ))
        pipeline = Pipeline(config, registry, backend, wiring, owner=owner or default_owner(), health=health)
        # the schedules declared in code, written at start; a code schedule no longer declared is
        # disabled only by a process that runs its type's jobs: a process that only enqueues (a web
        # app, the supervisor) or another service's workers never retire this one's schedules
        await backend.sync_code_schedules([ScheduleRecord.of(schedule, origin="code") for schedule in registry.schedules()],
                                          owned=set(registry.handled()) if working else set())
        await stack.enter_async_context(_open_resources(pipeline))
        if working:  # the registry's lifespan, once per process that runs jobs: ctx.state (closed after the last job)
            pipeline.state = await stack.enter_async_context(open_lifespan(registry, config))
        pools = pipeline.pools = _make_pools(config, registry, wiring) if working else {}
        await stack.enter_async_context(_run_keeper_and_bus(pipeline, pools))
        if working:
            await stack.enter_async_context(_run_workers(pipeline, pools, nudge_send.clone(), nudge_recv.clone(),
                                                         offers_send.clone(), offers_recv.clone()))
        for end in (nudge_send, nudge_recv, offers_send, offers_recv):
            end.close()
        try:
            yield pipeline
        finally:
            # graceful shutdown flows downstream as the stack unwinds. (If the caller's own
            # scope is being cancelled, the actors are cancelled too: running jobs stay
            # running until their lease expires and another run rescues them.)
            pipeline.closed = True  # enqueue and emit from outside refuse from now on
            backend.begin_stop(config.worker.shutdown_timeout + 1)
