"""Per-type handler pools: bounded concurrency, a per-job timeout, outcomes as data.

Each job type with a handler gets a :class:`Pool`: ``concurrency`` worker tasks reading
one bounded channel that the Poller fills. A handler's result becomes an outcome the
queue writes through the Ledger:

* returns            → completed
* raises PermanentError → dead at once, no retry
* raises RetryLater  → pending again after the delay it asked for (or dead if out of attempts)
* raises anything else, or is cancelled at its timeout → pending after backoff, or dead
  (a handler that could not be cancelled and finished late keeps its own outcome, with a
  warning: its side effects are done and must not be repeated)
* cancelled by graceful shutdown → pending, the attempt not counted
* raises Snooze      → pending again after its delay, the attempt not counted (dead past WORKER_MAX_SNOOZES)
* its cancel was requested (Backend.cancel) → an async handler is cancelled (its scope), a sync one sees
  ``ctx.cancel_requested`` (and is abandoned at its timeout); unless it completed anyway, → cancelled

A handler's return value is the completed job's result (JSON, at most WORKER_RESULT_MAX_BYTES).

A payload that no longer decodes goes dead with an error that says why; the pool carries on.

A sync handler (a plain ``def``) runs in a worker thread, through the type's own
CapacityLimiter of ``concurrency`` threads, so it never blocks the trio loop. A thread cannot be
cancelled: at a timeout (or a lost lease, or the end of the shutdown grace) it is abandoned
(``abandon_on_cancel``), the job's outcome is decided as for a cancelled async handler, and
whatever the thread does later is ignored (its ``ctx.emit`` refused); it keeps its thread slot
until it returns, so a type's threads never outnumber its concurrency. The registry's
middleware wraps every call, sync or async, on the trio side.

An asyncio handler (``runtime="asyncio"``) runs as a task of the process's asyncio loop, which the
trio run is the guest of (engine/asyncio_host.py), created in a copy of its worker's context (the
middleware's context variables, the span). Its worker waits for it under the same scope as for a
trio handler: when that scope is cancelled, the task is cancelled (``asyncio.CancelledError``) and
waited for, so the job ends timeout / cancelled / released exactly as a trio one. A task that
catches its CancelledError and goes on is given ASYNCIO_GRACE seconds, then abandoned as a thread
is (a warning says so; what it does later is ignored, its ``ctx.emit`` refused).

A handler that uses the other runtime's library (asyncio in a trio handler: "no running event loop";
trio in an asyncio one: "must be called from async context") fails for good at its first attempt,
its error saying which ``runtime=`` to declare: running it again could never work.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
import random
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ... import states
from ...backends.base import Backend, Lease, Nudge, Settlement, StepRecord, expired_error, nudge, snoozed_too_often
from ...clock import to_epoch
from ...context import JobContext
from ..steps import LeaseGone, StepRefused, Suspended
from ...errors import InvalidPayload, PermanentError, PipelineError, RetryLater, Snooze, StoreError
from ...logs import JOB, enter_job
from ...states import Transition

if TYPE_CHECKING:
    from ...registry import JobSpec
    from ..asyncio_host import AsyncioHost

log = logging.getLogger("pipeline.jobs")

BLOCKING_GRACE = 0.5  # a timeout landing this much late means the handler did not yield
_BLOCKING = "blocking the event loop between checkpoints: run CPU-bound or blocking code in trio.to_thread.run_sync"
_LATE = (
    "the timeout took effect only when the handler next yielded to trio: it was either "
    + _BLOCKING
    + ", or waiting on such a thread, which a timeout cannot interrupt (it can stop one only where it calls "
    "trio.from_thread.check_cancelled, between steps)"
)
_LATE_ASYNCIO = (
    "its asyncio handler did not end when cancelled: it caught asyncio.CancelledError and went on (abandoned after "
    "the grace, see the warning before), or it blocked the event loop (run blocking code in asyncio.to_thread)"
)
SETTLE_RETRY_MAX = 5.0  # seconds between tries to write an outcome the database refused
# A rate-limited job its worker takes more than this many seconds after its claim was sent is handed
# back, not started: the claims count the window over a margin longer than this (poller.RATE_MARGIN),
# so that the starts keep the rate, not only the claims
RATE_LATE = 0.04
RATE_SLACK = 0.01  # a claim's margin (Pool.rate_margin) less the lateness it allows its jobs
# seconds an asyncio handler has to end once cancelled (its timeout, a cancel request, the end of a stop's
# grace) before it is abandoned: time for its own clean-up (asyncio's cancellation is delivered once, where
# trio's is delivered again at every checkpoint), bounded so that one swallowing it cannot hold a worker
ASYNCIO_GRACE = 2.0


@attrs.frozen
class Workers:
    """What every worker of this process uses: where outcomes go, how payloads decode, how
    failures back off, who hears of each outcome, and how a handler's context is made."""

    backend: Backend
    decode: Callable[[str, str], Any]
    backoff_base_seconds: float
    nudge_send: trio.MemorySendChannel[Nudge]  # a full pool that frees a slot tells the Poller
    observe: Callable[[Lease, Outcome, str | None, float], None]
    context: Callable[[Lease], JobContext]
    rng: random.Random = attrs.field(factory=random.Random)
    # a handler's return value as the JSON text to store (None for None); raises ResultRefused
    encode_result: Callable[[Any], str | None] = lambda value: None
    max_snoozes: int = 100  # WORKER_MAX_SNOOZES
    # a run ended: an event set once the job's last ctx.progress report is stored, or None if none waits
    # (the progress writer's ProgressBoard.flush); its outcome is written after it
    flush_progress: Callable[[str, int], trio.Event | None] = lambda job_id, token: None
    # the asyncio loop this trio run is the guest of, where asyncio handlers run; None under trio.run
    # (open_pipeline refuses asyncio handlers then)
    aio: AsyncioHost | None = None

    async def settle(self, lease: Lease, outcome: Outcome, start: Lease | None = None) -> tuple[str | None, bool]:
        """Write the outcome; what the job became, or None if the lease was stale. ``start``:
        a job claimed ahead that this worker takes next, whose start is written in the same
        transaction (it costs no round trip of its own); the bool says its lease held."""
        if outcome.kind == "lost":
            if start is None:
                return None, False
            return None, await self.start(start)
        if outcome.kind == "ok":
            item = Settlement(lease.id, lease.token, Transition.SUCCEED, result=outcome.result)
        elif outcome.kind == "released":
            item = Settlement(lease.id, lease.token, Transition.RELEASE)
        elif outcome.kind == "cancelled":
            item = Settlement(lease.id, lease.token, Transition.CANCEL, outcome.error)
        elif outcome.kind == "suspended":
            item = Settlement(lease.id, lease.token, Transition.SUSPEND, delay=math.inf if outcome.delay is None else outcome.delay,
                              step=outcome.step, awaiting=outcome.awaiting)
        elif outcome.kind == "snoozed":
            item = Settlement(lease.id, lease.token, Transition.SNOOZE, snoozed_too_often(self.max_snoozes),
                              outcome.delay or 0.0, snooze_limit=self.max_snoozes)
        else:
            decision = self._failure(lease, outcome)
            item = Settlement(lease.id, lease.token, decision.transition, outcome.error or outcome.kind, decision.delay)
        if start is None:
            (held,) = await self.backend.settle([item])
            return (_RESULT[item.transition] if held else None), False
        held, started = await self.backend.settle([item, Settlement(start.id, start.token, Transition.START)])
        return (_RESULT[item.transition] if held else None), started

    def decide(self, lease: Lease, outcome: Outcome) -> Outcome:
        """A failed attempt's retry delay, chosen once before its outcome is written: the
        outcome line says it, and a write tried again keeps it (``settle`` takes ``outcome.delay``)."""
        if outcome.kind in ("ok", "released", "lost", "cancelled", "snoozed", "suspended"):
            return outcome
        decision = self._failure(lease, outcome)
        return attrs.evolve(outcome, delay=decision.delay) if decision.transition is Transition.RETRY else outcome

    def _failure(self, lease: Lease, outcome: Outcome) -> states.FailureDecision:
        """What a failed attempt makes of its job: retried (after ``outcome.delay`` once decided) or dead."""
        return states.settle_failure(
            attempts=lease.attempts, max_attempts=lease.max_attempts, permanent=outcome.kind == "permanent",
            base_seconds=self.backoff_base_seconds, retry_delay=outcome.delay, rng=self.rng,
        )

    async def start(self, lease: Lease) -> bool:
        """Count the attempt of a job claimed ahead, before it runs; False if its lease is gone."""
        (held,) = await self.backend.settle([Settlement(lease.id, lease.token, Transition.START)])
        return held


_RESULT = {Transition.SUCCEED: "completed", Transition.RELEASE: "released", Transition.RETRY: "retry", Transition.BURY: "dead",
           Transition.CANCEL: "cancelled", Transition.SNOOZE: "snoozed", Transition.SUSPEND: "suspended"}


@attrs.define(eq=False)
class Pool:
    """One job type's workers. Single-threaded trio state; the comments say who writes what."""

    spec: JobSpec
    concurrency: int
    capacity: int  # concurrency + prefetch: the most claimed-but-unsettled jobs at once
    timeout: float
    send: trio.MemorySendChannel[Lease]  # Poller's end
    recv: trio.MemoryReceiveChannel[Lease]  # workers' end
    outstanding: int = 0  # Poller +1 per claim, worker −1 per settle
    offered: int = 0  # Poller: room in its standing offer to the backend (see poller.Offer)
    # A job can be claimed again while an older run of it is still known here (its lease
    # expired and it was rescued), so everything but ``held`` is keyed by (id, lease token).
    held: dict[str, Lease] = attrs.field(factory=dict)  # Poller adds, worker removes: the heartbeat renews these
    # worker-owned: the scope a job runs under (its worker's, see run_worker), while it runs
    running: dict[tuple[str, int], trio.CancelScope] = attrs.field(factory=dict)
    # worker-owned, as running: when each run is cancelled (trio time), in the order they started;
    # stop() brings them forward; the pool's watch (run_timeouts) cancels them
    deadlines: dict[tuple[str, int], float] = attrs.field(factory=dict)
    watch: trio.Event = attrs.field(factory=trio.Event)  # wakes the watch (stop(); the last worker's end)
    live_workers: int = 0  # workers: how many of them run
    stopping: bool = False  # set by the wiring at shutdown: release, don't start
    # the type is paused (Backend.set_type_paused), as this process last learned it: by the canceller's
    # look at the store, or at once from this process's Pipeline.pause_type / resume_type. Its workers
    # start nothing meanwhile: what they take goes back to pending, its attempt not counted
    paused: bool = False
    # Pipeline.pause_type / resume_type, and the Poller's inference below: +1 each (a look read before one
    # is not applied)
    pause_marks: int = 0
    # trio time ``paused`` last became True. A claim sent after it that gets the type's jobs proves the store
    # resumed the type meanwhile (a claim skips a paused type in its own transaction): the Poller's deliver
    # then clears ``paused``, rather than have them handed back, claimed and handed back again until a look
    paused_at: float = float("inf")
    stop_deadline: float = float("inf")  # trio time by which the grace is over
    lost: set[tuple[str, int]] = attrs.field(factory=set)  # heartbeat: leases another process now holds
    # the canceller: leases whose cancel was requested (Backend.cancel_requests), until they settle
    cancelling: set[tuple[str, int]] = attrs.field(factory=set)
    # a sync handler's thread by lease, while it runs (the canceller tells it of a cancel request)
    threads: dict[tuple[str, int], _Thread] = attrs.field(factory=dict)
    settling: set[tuple[str, int]] = attrs.field(factory=set)  # worker: outcome on its way to the Ledger
    # workers: how many of them take the next job from the channel as soon as it is there (waiting
    # for one, or for the commit of their last outcome with no job in hand). The Poller counts
    # the attempt at the claim for that many jobs (less those already queued): they start as it
    # commits; the rest are claimed ahead, counted when they start (see Lease.started).
    takers: int = 0
    # at most this many of the type's jobs run at once across every process sharing the store
    # (the claim counts them: see Backend.claim's limits); None: no limit
    global_limit: int | None = None
    # (starts, window seconds): the type's rate limit across every process (see Backend.claim's rates); None: none
    rate: tuple[int, float] | None = None
    # at most this many of the type's jobs of one limit key run at once across every process; None: not keyed
    key_limit: int | None = None
    # Poller adds (a rate-limited type's leases), worker pops as it takes the job: trio time its claim was
    # sent, and how late after it the job may start (the margin that claim counted, less RATE_SLACK)
    claimed_at: dict[tuple[str, int], tuple[float, float]] = attrs.field(factory=dict)
    # seconds a rate-limited type's claims add to its window (poller.Claimer.rates): RATE_LATE + RATE_SLACK,
    # widened by a worker that takes a job later than its claim allowed (_late_for_its_rate), never narrowed:
    # a claim counts at least the margin of every claim before it, so each start stays in its windows.
    # Without it, a store whose claims take longer than RATE_LATE (a round trip of 40 ms) starved the type
    rate_margin: float = RATE_LATE + RATE_SLACK
    # a sync handler's threads: ``concurrency`` of them, an abandoned one holding its slot until
    # it returns (trio releases it then); unused by an async handler
    limiter: trio.CapacityLimiter = attrs.field(init=False)

    @limiter.default
    def _limiter(self) -> trio.CapacityLimiter:
        return trio.CapacityLimiter(self.concurrency)

    def hold(self, lease: Lease) -> None:
        """The Poller's: a newly claimed lease. A different lease of the same job still held
        here is stale (the job was rescued and claimed again): its run is cancelled."""
        old = self.held.get(lease.id)
        if old is not None and old.token != lease.token:
            self.mark_lost(old)
        self.held[lease.id] = lease

    def mark_lost(self, lease: Lease) -> bool:
        """Another process (or a newer claim) holds this job now: don't start it, cancel its run."""
        key = (lease.id, lease.token)
        if key in self.lost or key in self.settling:
            return False
        self.lost.add(key)
        scope = self.running.get(key)
        if scope is not None:
            scope.cancel()
        return True

    def request_cancel(self, job_id: str, token: int) -> bool:
        """The canceller's: this job's cancel was requested. An async handler's run is cancelled at
        once; a sync handler's thread sees ``ctx.cancel_requested`` (a thread cannot be stopped: its
        timeout abandons it); a job not started yet never starts. False if not held here (or already known)."""
        key = (job_id, token)
        lease = self.held.get(job_id)
        if lease is None or lease.token != token or key in self.cancelling or key in self.settling:
            return False
        self.cancelling.add(key)
        thread = self.threads.get(key)
        if thread is not None:
            thread.cancel_requested = True
        else:
            scope = self.running.get(key)
            if scope is not None:
                scope.cancel()
        return True

    @property
    def free(self) -> int:
        return self.capacity - self.outstanding - self.offered

    def stop(self, grace: float) -> None:
        """Stop starting jobs; give the running ones ``grace`` seconds, then cancel them."""
        self.stopping = True
        deadline = self.stop_deadline = trio.current_time() + grace
        for key, at in self.deadlines.items():
            self.deadlines[key] = min(at, deadline)
        for thread in self.threads.values():
            thread.deadline = min(thread.deadline, deadline)
        self.watch.set()


@attrs.frozen
class Outcome:
    kind: str  # "ok", "error", "permanent", "retry_later", "timeout", "released", "lost", "cancelled", "snoozed", "suspended"
    error: str | None = None
    delay: float | None = None  # "suspended": None for no deadline (a wait without a timeout)
    result: str | None = None  # "ok": the handler's return value as JSON text (None: it returned None)
    step: StepRecord | None = None  # "suspended": the sleep's or the wait's record, written with it
    awaiting: str | None = None  # "suspended": the signal's name its wait awaits
    steps: int = 0  # ctx.step values the run committed

    @classmethod
    def suspended(cls, how: Suspended) -> Outcome:
        return cls("suspended", None, None if how.delay == math.inf else how.delay, step=how.step, awaiting=how.awaiting)

    @classmethod
    def failed(cls, exc: BaseException) -> Outcome:
        if isinstance(exc, BaseExceptionGroup):  # raised from a handler's own nursery
            permanent = exc.subgroup(PermanentError)
            if permanent is not None:
                return cls.failed(_first_leaf(permanent))
            retry, rest = exc.split(RetryLater)
            if retry is not None and rest is None:
                return cls.failed(max(_leaves(retry), key=lambda e: e.delay))  # type: ignore[attr-defined]
            snooze, rest = exc.split(Snooze)
            if snooze is not None and rest is None:
                return cls.failed(max(_leaves(snooze), key=lambda e: e.delay))  # type: ignore[attr-defined]
        if isinstance(exc, Snooze):
            return cls("snoozed", None, exc.delay)
        if isinstance(exc, PermanentError):
            return cls("permanent", _text(f"permanent error: {exc}"))
        if isinstance(exc, RetryLater):
            return cls("retry_later", _text(str(exc)), exc.delay)
        tb = "".join(traceback.format_exception(exc, limit=-3)).strip()
        return cls("error", _text(f"{type(exc).__name__}: {exc}\n{tb}"))


def _text(message: str) -> str:
    """Error text as SQLite can store it: lone surrogates (from undecodable file names,
    say) become backslash escapes instead of failing the write of the outcome."""
    return message.encode("utf-8", "backslashreplace").decode("utf-8")


def _leaves(group: BaseException) -> list[BaseException]:
    if isinstance(group, BaseExceptionGroup):
        return [leaf for inner in group.exceptions for leaf in _leaves(inner)]
    return [group]


def _first_leaf(group: BaseException) -> BaseException:
    return _leaves(group)[0]


@attrs.define(eq=False)
class _Thread:
    """A sync handler's call in a worker thread, as the pool sees it. ``waiting`` and
    ``abandoned`` are the trio task's (it asked for a thread slot; it gave up on the thread);
    ``started`` and ``finished`` the thread's."""

    handler: Callable[..., Any]
    token: trio.lowlevel.TrioToken  # the loop, for the handler's emit from any thread
    waiting: bool = False
    started: bool = False
    finished: bool = False
    abandoned: bool = False
    # started and abandoned are decided under it: a thread that gets its slot as the attempt ends
    # either starts before it is abandoned (and is said to be), or does not run the handler at all
    lock: threading.Lock = attrs.field(factory=threading.Lock)
    scope: trio.CancelScope | None = None  # the attempt's (its worker's while it runs)
    deadline: float = math.inf  # the attempt's (trio time): its timeout, or the end of a stop's grace
    cancel_requested: bool = False  # set on the loop by the canceller; the handler reads ctx.cancel_requested
    value: Any = None  # what the handler returned

    def over(self) -> bool:
        """On the loop: the attempt ended, or its deadline passed or it was cancelled (its end is on the way)."""
        scope = self.scope
        return self.abandoned or (scope is not None and (scope.cancel_called or trio.current_time() >= self.deadline))

    def run(self, job: Any, ctx: JobContext) -> None:
        with self.lock:
            if self.abandoned:
                return  # the attempt ended before this thread got going: nothing of it runs
            self.started = True
        try:
            result = self.value = self.handler(job, ctx)
            if inspect.isawaitable(result):
                # a plain callable that only builds a coroutine (a lambda around an async def):
                # running it again would not help, so the job goes dead at once
                close = getattr(result, "close", None)
                if close is not None:
                    close()  # never awaited: no "coroutine was never awaited" warning
                name = getattr(self.handler, "__qualname__", None) or type(self.handler).__name__
                raise PermanentError(
                    f"the handler {name} is a plain callable, run in a thread, but returned {type(result).__name__} "
                    "instead of doing the work: register the `async def` function itself"
                )
        finally:
            self.finished = True


class ResultRefused(Exception):
    """A handler's return value that cannot be stored as its job's result (the attempt fails, saying why)."""


async def _invoke(workers: Workers, spec: JobSpec, pool: Pool, job: Any, ctx: JobContext, thread: _Thread | None,
                  start_by: tuple[float, float] | None = None) -> Outcome:
    outcome = await _outcome_of(workers, spec, pool, job, ctx, thread, start_by)
    run = ctx._run
    if run is None:
        return outcome
    if run.left is not None and outcome.kind not in ("suspended", "lost"):
        # ctx.sleep or ctx.wait_for left the run, and the handler caught it (except BaseException, gather with
        # return_exceptions) and went on as if it had slept or been signalled: for good, it would every time
        outcome = Outcome("permanent", _text(
            f"job type {spec.name}: the handler caught the suspension of its ctx.sleep or ctx.wait_for (a BaseException, "
            "as trio's Cancelled) and went on without waiting; let it through (catch Exception, not BaseException)"))
    if run.committed:  # a durable run: its steps counted with its outcome (metrics)
        return attrs.evolve(outcome, steps=run.committed)
    return outcome


def _seen(ctx: JobContext) -> None:
    """The run's suspension came out of its handler (it was not swallowed)."""
    if ctx._run is not None:
        ctx._run.left = None


async def _outcome_of(workers: Workers, spec: JobSpec, pool: Pool, job: Any, ctx: JobContext, thread: _Thread | None,
                      start_by: tuple[float, float] | None = None) -> Outcome:
    try:
        if not spec.middleware:
            value = await _call(workers, spec, pool, job, ctx, thread, start_by)
        else:
            async with contextlib.AsyncExitStack() as stack:
                for middleware in spec.middleware:  # the first registered outermost
                    await stack.enter_async_context(_entered(middleware, ctx))
                value = await _call(workers, spec, pool, job, ctx, thread, start_by)
        result = None if value is None else workers.encode_result(value)
    except ResultRefused as exc:
        # for good, not retried: a retry would run the handler again, side effects included, to
        # return what it returned this time
        return Outcome("permanent", _text(f"job type {spec.name}: the attempt fails for good, its result cannot be "
                                          f"stored (running it again would repeat its work): {exc}"))
    except StepRefused as exc:  # (as a result that cannot be stored)
        return Outcome("permanent", _text(f"job type {spec.name}: the attempt fails for good: {exc}"))
    except Suspended as how:  # ctx.sleep, ctx.wait_for: not a failure
        _seen(ctx)
        return Outcome.suspended(how)
    except LeaseGone:
        return Outcome("lost")
    except (Exception, SystemExit) as exc:  # handler exceptions are data (sys.exit() in one too); Cancelled is not
        if not spec.sync:  # (a thread may use either library as it likes)
            wrong = wrong_runtime(spec.name, spec.runtime, exc)
            if wrong is not None:
                return Outcome("permanent", _text(wrong))
        return Outcome.failed(exc)
    except BaseExceptionGroup as group:  # from a handler's own nursery or TaskGroup, with a suspension or a lost lease
        durable, rest = group.split((Suspended, LeaseGone))
        if durable is None:
            raise  # trio's Cancelled among them: the worker's scope takes it
        _seen(ctx)
        if rest is not None and not all(isinstance(e, Exception | SystemExit) for e in _leaves(rest)):
            raise rest from None  # a cancellation with them: the worker's scope takes it (and judges the run)
        if rest is not None:  # a handler's error beside them: the attempt failed
            return Outcome.failed(rest)
        if any(isinstance(e, LeaseGone) for e in _leaves(durable)):
            return Outcome("lost")
        return Outcome.suspended(_leaves(durable)[0])  # type: ignore[arg-type]
    return Outcome("ok", result=result)


async def _call(workers: Workers, spec: JobSpec, pool: Pool, job: Any, ctx: JobContext, thread: _Thread | None,
                start_by: tuple[float, float] | None = None) -> Any:
    if thread is None:
        if spec.runtime == "asyncio":
            return await _call_on_asyncio(workers, spec, pool, job, ctx, start_by)
        return await spec.handler(job, ctx)  # type: ignore[misc]
    thread.waiting = True
    await trio.to_thread.run_sync(
        thread.run, job, ctx, limiter=pool.limiter, abandon_on_cancel=True, thread_name=f"pipeline job {ctx.id} ({ctx.job_type})"
    )
    return thread.value


async def _call_on_asyncio(workers: Workers, spec: JobSpec, pool: Pool, job: Any, ctx: JobContext,
                           start_by: tuple[float, float] | None = None) -> Any:
    """An asyncio handler's call: a task of the host's loop in a copy of this worker's context,
    cancelled with the worker's scope (see engine/asyncio_host.py, AsyncioHost.run_asyncio).
    ``start_by``: a rate-limited job's claim (trio time it was sent, how late after it the job may
    start), checked again as the task starts (see _on_time)."""
    aio = workers.aio
    if aio is None:  # open_pipeline refuses asyncio handlers without a host: a bug if it comes to this
        raise RuntimeError(f"job type {spec.name} has runtime='asyncio', but this trio run has no asyncio loop")

    def abandoned() -> None:
        key = (ctx.id, ctx._token)
        why = ("its cancel was requested" if key in pool.cancelling else "the shutdown's grace ended" if pool.stopping
               else "it lost its lease to another run" if key in pool.lost else f"it timed out after {pool.timeout:g} s")
        log.warning(
            "job %s (%s), attempt %d: %s, and its asyncio handler did not end within %g s of its cancellation (it caught "
            "asyncio.CancelledError and went on): it was abandoned. It keeps running on the loop and may still finish "
            "its work (side effects included); what it returns or raises is ignored, its ctx.emit is refused, and a "
            "retry may run beside it. Let CancelledError propagate (clean up in finally) to stop at once.",
            ctx.id, ctx.job_type, ctx.attempt, why, ASYNCIO_GRACE,
        )

    handler = spec.handler if start_by is None else _on_time(spec.handler, *start_by)
    return await aio.run_asyncio(handler, job, ctx, grace=ASYNCIO_GRACE, abandoned=abandoned)  # type: ignore[arg-type]


class _StartedLate(BaseException):
    """A rate-limited asyncio handler's task began later than its claim allowed: it did not run.
    A BaseException, as trio.Cancelled is, so that a middleware's ``except Exception`` neither records
    it as the handler's failure nor swallows it into a success; _execute makes it the outcome."""

    def __init__(self, late: float, allowed: float) -> None:
        super().__init__(late, allowed)
        self.late, self.allowed = late, allowed


def _on_time(handler: Any, sent: float, allowed: float) -> Callable[[Any, JobContext], Any]:
    """``handler``, checking as its asyncio task begins that it is no later after its claim was sent
    than ``allowed`` (_StartedLate otherwise). The worker checked as it took the job (_begin); the task's
    first step mostly runs right then (engine/asyncio_host.py, _start_task), but on a loop with the
    app's own task factory it runs at the loop's next turn, after the first steps of every task made
    in the same tick: five handlers whose first step took 20 ms began up to 80 ms after the check, and
    7 or 8 starts fell in one second of a 5/s rate (tests/test_asyncio_handlers_limits.py)."""

    async def on_time(job: Any, ctx: JobContext) -> Any:
        late = trio.current_time() - sent  # (trio's clock reads fine from the loop: the guest run is current)
        if late > allowed:
            raise _StartedLate(late, allowed)
        return await handler(job, ctx)

    on_time.__qualname__ = getattr(handler, "__qualname__", None) or type(handler).__name__  # (in the bridge's messages)
    return on_time


# What a handler raises when it uses the other runtime's library: asyncio from trio (under trio.run, or
# trio's answer to an asyncio future yielded to it in guest mode), trio from an asyncio task
_ASYNCIO_IN_TRIO = ("no running event loop", "There is no current event loop", "trio.run received unrecognized yield message")
_TRIO_IN_ASYNCIO = ("must be called from async context", "Task got bad yield")


def wrong_runtime(name: str, runtime: str, exc: BaseException) -> str | None:
    """The error of a handler that failed because it used the other runtime's library, saying what to
    declare; None for any other failure. Looks through the exception's causes and a group's leaves."""
    signs, other = (_ASYNCIO_IN_TRIO, "asyncio") if runtime == "trio" else (_TRIO_IN_ASYNCIO, "trio")
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending and len(seen) < 32:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        elif isinstance(current, (RuntimeError, TypeError)) and any(sign in str(current) for sign in signs):
            first = str(current).splitlines()[0][:200]
            if runtime == "trio":
                fix = ('declare the job type with runtime="asyncio" (@registry.job(runtime="asyncio"), or '
                       'pipeline.Registry(runtime="asyncio")) to run it as a task of the worker process\'s asyncio loop')
            else:
                fix = ('await asyncio\'s own calls in it (asyncio.sleep, asyncio.to_thread), or declare the job type with '
                       'runtime="trio" to run it on trio')
            return (f"job type {name}: its handler runs on {runtime} (runtime={runtime!r}) but used {other} "
                    f"({type(current).__name__}: {first}); this can never work, so the job is not retried: {fix}")
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                pending.append(linked)
    return None


def _entered(middleware: Callable[[JobContext], Any], ctx: JobContext) -> contextlib.AbstractAsyncContextManager[Any]:
    manager = middleware(ctx)
    if not hasattr(manager, "__aenter__") or not hasattr(manager, "__aexit__"):
        close = getattr(manager, "close", None)
        if inspect.iscoroutine(manager) and close is not None:
            close()
        name = getattr(middleware, "__qualname__", None) or repr(middleware)
        raise TypeError(
            f"middleware {name} returned {type(manager).__name__}, not an async context manager "
            "(write it as an async generator decorated with @contextlib.asynccontextmanager)"
        )
    return manager


@attrs.define(eq=False)
class _Run:
    """A job that runs now: what its worker needs after the run, however the run ended."""

    lease: Lease
    key: tuple[str, int]
    started: float  # time.monotonic() as its worker took it
    job: Any
    ctx: JobContext
    thread: _Thread | None
    # a rate-limited asyncio handler's claim: (trio time it was sent, how late after it the job may start),
    # checked again as its task begins (_on_time); None for every other job
    start_by: tuple[float, float] | None = None


async def _execute(workers: Workers, pool: Pool, run: _Run, scope: trio.CancelScope) -> Outcome:
    """Run the handler under ``scope``, its worker's (see run_worker): registered in ``pool.running``
    while it runs, with its deadline in ``pool.deadlines`` (the pool's timeout watch cancels the
    scope then: see run_timeouts). A cancellation of the scope propagates."""
    key = run.key
    deadline = min(trio.current_time() + pool.timeout, pool.stop_deadline)
    pool.deadlines[key] = deadline
    pool.running[key] = scope
    thread = run.thread
    if thread is not None:
        thread.deadline = deadline
        thread.scope = scope
        pool.threads[key] = thread
    # the records its middleware and handler make (and whatever runs in a copy of this context) carry the job (logs.py)
    in_job = enter_job(run.ctx.id, run.ctx.job_type, run.ctx.attempt)
    try:
        return await _invoke(workers, pool.spec, pool, run.job, run.ctx, thread, run.start_by)
    except _StartedLate as late:  # (an asyncio handler's task began too late for its rate: see _on_time)
        return _late_for_its_rate(pool, run.lease, late.late, late.allowed)
    finally:
        JOB.reset(in_job)
        del pool.running[key]
        del pool.deadlines[key]
        if thread is not None:
            del pool.threads[key]


def _judge(pool: Pool, run: _Run, ran_as: Outcome | None, *, cancelled: bool, cancel_called: bool) -> Outcome:
    """The outcome of a run that ended. ``ran_as``: what the handler returned or raised (None when
    the cancellation ended it); ``cancelled``: its scope caught a cancellation (its
    ``cancelled_caught``); ``cancel_called``: its scope was cancelled, caught or not."""
    lease, key, thread = run.lease, run.key, run.thread
    ran = time.monotonic() - run.started
    if key in pool.lost:
        outcome = Outcome("lost")
    elif key in pool.cancelling and (ran_as is None or ran_as.kind != "ok" or thread is not None):
        # its cancel was requested: whatever ended the run (the cancellation, the timeout
        # of a sync handler, what a sync handler returned or raised on seeing
        # ctx.cancel_requested), it ends cancelled, never retried; an async handler that
        # completed anyway (the request landed as it returned) keeps its result
        outcome = Outcome("cancelled", _cancelled(lease, started=True))
    elif cancelled and pool.stopping:
        outcome = Outcome("released")  # shutdown: back to pending, attempt not counted
    elif cancelled and thread is not None and _never_started(thread):
        # every thread of the type is held by handlers abandoned at their timeouts: this job
        # never ran, so it goes back without its attempt (it waits its timeout again each time)
        outcome = Outcome("released")
        log.warning("job %s (%s): none of the type's %d threads came free within its timeout of %g s (all held by "
                    "handlers abandoned at their timeouts that have not returned yet); handed back, its attempt "
                    "not counted", lease.id, lease.job_type, pool.concurrency, pool.timeout)
    elif cancelled:
        message = f"timed out after {pool.timeout:g} s (attempt {lease.attempts})"
        if ran > pool.timeout + BLOCKING_GRACE:
            # The cancellation could only land when the handler next reached a checkpoint.
            # From here the two causes look alike (a loop blocked by the handler; a thread
            # the task waited on, which the loop cannot interrupt): the message names both.
            message += f"; it ran {ran:.1f} s: {_LATE_ASYNCIO if pool.spec.runtime == 'asyncio' else _LATE}"
        outcome = Outcome("timeout", message)
    else:
        assert ran_as is not None
        outcome = ran_as
    if ran > pool.timeout and not cancelled and outcome is ran_as:
        # It finished after its deadline without being cancelled: it never yielded, or
        # waited on a thread that cannot be interrupted (a mail being sent). Whatever it
        # did is done: its own outcome stands, rather than a timeout that would do it again.
        log.warning(
            "job %s (%s) finished after %.1f s, past its timeout of %g s, without being cancelled: %s",
            lease.id, lease.job_type, ran, pool.timeout,
            # cancel_called: the loop ran after the deadline and asked, in vain
            "the timeout's cancellation did not stop it: it waited on work that cannot be interrupted "
            "(a thread), or caught the Cancelled exception" if cancel_called else _BLOCKING,
        )
    if thread is not None and _end_attempt(thread):
        _abandon(lease, outcome, pool.timeout)
    return outcome


async def _finish(
    workers: Workers, pool: Pool, lease: Lease, outcome: Outcome, started: float,
    recv: trio.MemoryReceiveChannel[Lease] | None,
) -> tuple[Lease | None, bool]:
    """Write a job's outcome (``started``: time.monotonic() as its worker took it). With ``recv``,
    the job this worker runs next is taken before the outcome is written, and, if it was claimed
    ahead, its start is counted in the same write: returned with whether it is counted."""
    if outcome.kind not in _NO_PROGRESS:
        flushed = workers.flush_progress(lease.id, lease.token)
        if flushed is not None:
            await flushed.wait()
    following: Lease | None = None
    if recv is not None and not pool.stopping and not pool.paused:
        try:
            following = recv.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel):
            pass
    if following is None:
        # free once this outcome commits: a claim sent from now on commits after it, so the
        # job it gives this worker starts as the claim commits (see Pool.takers)
        pool.takers += 1
        try:
            await _settle(workers, pool, lease, outcome, time.monotonic() - started)
        finally:
            pool.takers -= 1
        return None, True
    if following.started or _expired(following):  # (an expired one is not counted: _begin ends it)
        await _settle(workers, pool, lease, outcome, time.monotonic() - started)
        return following, following.started
    return following, await _settle(workers, pool, lease, outcome, time.monotonic() - started, start=following)


_NO_PROGRESS = ("lost", "released", "snoozed", "suspended")  # outcomes that leave no progress to keep (or no lease)


async def _begin(workers: Workers, pool: Pool, lease: Lease, counted: bool | None, started: float) -> Outcome | _Run:
    """What a job its worker takes becomes: an outcome at once (it does not run), or a run, its
    attempt counted first if it is not yet (a job claimed ahead: ``counted`` False; None: as the
    lease says). ``started``: time.monotonic() as its worker took it."""
    key = (lease.id, lease.token)
    claim_sent = pool.claimed_at.pop(key, None)
    if key in pool.lost:
        return Outcome("lost")  # another process took it over before it started here
    if key in pool.cancelling:
        return Outcome("cancelled", _cancelled(lease, started=False))
    if pool.stopping or pool.paused:  # (paused: it goes back, and is claimed again once the type is resumed)
        return Outcome("released")
    if _expired(lease):  # claimed before its expiry, taken by its worker after it: it never starts
        assert lease.expires_at is not None
        return Outcome("cancelled", expired_error(lease.expires_at))
    if not (lease.started if counted is None else counted) and not await _count_start(workers, pool, lease):
        return Outcome("released") if pool.stopping else Outcome("lost")
    if claim_sent is not None and trio.current_time() - claim_sent[0] > claim_sent[1]:
        return _late_for_its_rate(pool, lease, trio.current_time() - claim_sent[0], claim_sent[1])
    try:
        job = workers.decode(lease.job_type, lease.payload)
    except InvalidPayload as exc:
        return Outcome("permanent", f"payload no longer decodes: {exc}")
    ctx = workers.context(lease)
    thread = None
    spec = pool.spec
    if spec.sync and spec.handler is not None:
        thread = _Thread(spec.handler, trio.lowlevel.current_trio_token())
        ctx = attrs.evolve(ctx, thread=thread)
    return _Run(lease, key, started, job, ctx, thread, claim_sent if spec.runtime == "asyncio" else None)


def _expired(lease: Lease) -> bool:
    """Its ``expires_at`` passed: as its worker takes it, a job claimed before then does not start.
    (The claim ends the expired jobs it finds; this is the check for those it held meanwhile.)"""
    return lease.expires_at is not None and _due_epoch(lease.expires_at) <= time.time()


def _late_for_its_rate(pool: Pool, lease: Lease, late: float, allowed: float) -> Outcome:
    """A rate-limited job taken too long after its claim (see RATE_LATE): back to pending, its attempt
    not counted, its claim still spending a start of the window (the safe side). The type's claims
    count a margin wide enough for this lateness from now on (half the window at most), so that a
    store this slow (or far away) costs the type some of its rate, not all of it."""
    assert pool.rate is not None
    widest = max(RATE_LATE + RATE_SLACK, pool.rate[1] / 2)
    pool.rate_margin = min(widest, max(pool.rate_margin, late * 1.5 + RATE_SLACK))
    log.warning("job %s (%s) reached its worker %.3f s after its claim was sent, past the %.3f s its rate limit "
                "allowed (its window was counted from the claim): handed back to pending, it starts in a later "
                "window; the type's claims now count a window %.3f s longer than its rate's. Often: the store is "
                "far away or slow, or the event loop was (a handler blocking the loop)",
                lease.id, lease.job_type, late, allowed, pool.rate_margin)
    return Outcome("released")


def _cancelled(lease: Lease, *, started: bool) -> str:
    if started:
        return f"cancelled while running (cancel requested during attempt {lease.attempts})"
    return "cancelled before it started here (cancel requested while it waited for a worker)"


def _never_started(thread: _Thread) -> bool:
    """The attempt is over and its thread never ran the handler (and now never will)."""
    with thread.lock:
        thread.abandoned = True
        return not thread.started


def _end_attempt(thread: _Thread) -> bool:
    """The attempt is over: its emit is refused from now on, from any thread; True if its
    handler still runs (abandoned)."""
    with thread.lock:
        thread.abandoned = True
        return thread.started and not thread.finished


def _abandon(lease: Lease, outcome: Outcome, timeout: float) -> None:
    """A sync handler's thread is still running after its attempt ended: say so, once."""
    why = {
        "timeout": f"timed out after {timeout:g} s",
        "released": "was stopped by the shutdown before it finished (back to pending)",
        "lost": "lost its lease to another run",
    }.get(outcome.kind, "ended")
    log.warning(
        "job %s (%s), attempt %d, %s while its sync handler still ran: the thread cannot be stopped and was "
        "abandoned. It may still finish its work (side effects included); what it returns or raises is "
        "ignored, its ctx.emit is refused, and a retry may run beside it. It keeps one of the type's "
        "threads until it returns.",
        lease.id, lease.job_type, lease.attempts, why,
    )


async def _count_start(workers: Workers, pool: Pool, lease: Lease) -> bool:
    """Write the START of a job claimed ahead, trying again while the store refuses; False
    if its lease is gone (or the pipeline stops meanwhile: the job is released)."""
    delay = 0.05
    while not pool.stopping:
        try:
            return await workers.start(lease)
        except StoreError as exc:
            log.warning("job %s: could not record its start yet: %s", lease.id, exc)
            await trio.sleep(delay)
            delay = min(delay * 2, SETTLE_RETRY_MAX)
        except PipelineError:
            return False
    return False


async def _settle(workers: Workers, pool: Pool, lease: Lease, outcome: Outcome, duration: float, start: Lease | None = None) -> bool:
    """Write the outcome, trying again while the store refuses it; with ``start``, the START
    of the job this worker runs next, in the same write: whether it was counted."""
    delay = 0.05
    result: Any = None
    counted = False
    key = (lease.id, lease.token)
    pool.settling.add(key)
    outcome = workers.decide(lease, outcome)
    while True:
        try:
            result, counted = await workers.settle(lease, outcome, start)
            break
        except StoreError as exc:
            # the outcome is not written yet: keep it and try again; the lease keeps the
            # job ours meanwhile (and if we die, rescue takes over). The next job's start is
            # left to its own write: one of the two may have been written.
            start = None
            if pool.stopping and trio.current_time() > pool.stop_deadline + 1:
                log.error("job %s: giving up recording outcome %s at shutdown (%s); its lease will return it", lease.id, outcome.kind, exc)
                break
            log.warning("job %s: could not record outcome %s yet: %s", lease.id, outcome.kind, exc)
            await trio.sleep(delay)
            delay = min(delay * 2, SETTLE_RETRY_MAX)
        except PipelineError:
            break  # shut down under us: the lease will expire and rescue the job
        except Exception:  # a bug, not the database: don't take the pool down; the lease returns the job
            log.exception("job %s: recording outcome %s failed", lease.id, outcome.kind)
            break
    if pool.held.get(lease.id) is lease:  # not a newer claim of the same job
        del pool.held[lease.id]
    pool.lost.discard(key)
    pool.cancelling.discard(key)
    pool.settling.discard(key)
    # full of claimed jobs (room held by the offer does not count: it claims with the next insert)
    was_full = pool.capacity - pool.outstanding <= 0
    pool.outstanding -= 1
    workers.observe(lease, outcome, result, duration)
    if was_full or pool.global_limit is not None or pool.key_limit is not None:
        # room here; or a slot of a global or per-key limit is free, which this process may be the
        # only one to know of soon (on Postgres and Redis another process learns of it by polling):
        # a key's next job waited a whole poll interval for its slot (issue 32)
        nudge(workers.nudge_send)
    if start is not None and not counted:
        pool.mark_lost(start)  # its lease is gone: it does not start here
    return counted


async def run_worker(
    workers: Workers, pool: Pool, recv: trio.MemoryReceiveChannel[Lease], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """One of a pool's ``concurrency`` tasks; ends when the Poller closes the pool's channel.

    Its jobs share one cancel scope: entering a scope of its own for each job (with the timeout as
    its deadline) was a fifth of the event loop's CPU per job. A run is cancelled through
    ``pool.running``, which holds the scope only while that job runs: at its timeout by the pool's
    watch (run_timeouts), at a lost lease, a cancel request, the end of a stop's grace. A scope once
    cancelled is left (its job's outcome written outside it) and the next job runs under a new one."""
    with recv:
        pool.live_workers += 1
        try:
            task_status.started()
            lease: Lease | None = None
            counted = False
            while True:
                run: _Run | None = None  # the job running under the scope, until it ended
                ran_as: Outcome | None = None
                try:
                    with trio.CancelScope() as scope:
                        while True:
                            if lease is None:
                                pool.takers += 1
                                try:
                                    lease = await recv.receive()
                                except trio.EndOfChannel:
                                    return
                                finally:
                                    pool.takers -= 1
                                counted = lease.started
                            started = time.monotonic()
                            begun = await _begin(workers, pool, lease, counted, started)
                            if isinstance(begun, Outcome):
                                lease, counted = await _finish(workers, pool, lease, begun, started, recv)
                                continue
                            run, ran_as = begun, None  # (not the last job's: _judge reads it if this run is cancelled)
                            ran_as = await _execute(workers, pool, run, scope)
                            if scope.cancel_called:
                                break  # cancelled as it returned: the scope is spent (its next checkpoint would raise)
                            outcome = _judge(pool, run, ran_as, cancelled=False, cancel_called=False)
                            finished, run = run, None
                            lease, counted = await _finish(workers, pool, finished.lease, outcome, finished.started, recv)
                except Exception as exc:
                    if run is None:
                        raise
                    # what is left of a group mixing handler errors and the scope's Cancelled, once
                    # the scope took the Cancelled out: it can only be caught out here
                    ran_as = Outcome.failed(exc)
                if run is None:  # only a run registered in pool.running is ever cancelled (a bug otherwise)
                    raise RuntimeError(f"a worker of {pool.spec.name} was cancelled between jobs")
                outcome = _judge(pool, run, ran_as, cancelled=scope.cancelled_caught, cancel_called=scope.cancel_called)
                lease, counted = await _finish(workers, pool, run.lease, outcome, run.started, recv)
        finally:
            pool.live_workers -= 1
            if not pool.live_workers:
                pool.watch.set()  # (its watch ends with the last worker)


async def run_timeouts(pool: Pool, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """The pool's timeout watch: cancels each run at its deadline (``pool.deadlines``, in the order
    the runs started: one timeout for the type, so that is the order of their deadlines, a stop's
    grace only bringing them forward), sleeping until the first one to come (Pool.stop wakes it).
    Ends with the pool's last worker."""
    task_status.started()
    while pool.live_workers:
        now = trio.current_time()
        # a run that starts from now on has its deadline no sooner than this (no wake-up per run);
        # once stopping, none starts (each is released): the runs in pool.deadlines are all there is
        wake_at = math.inf if pool.stopping else now + pool.timeout
        for key, deadline in pool.deadlines.items():
            if deadline > now:
                wake_at = deadline
                break
            scope = pool.running.get(key)
            if scope is not None and not scope.cancel_called:
                scope.cancel()
        pool.watch = trio.Event()
        with trio.move_on_at(wake_at):
            await pool.watch.wait()


def describe_outcome(lease: Lease, outcome: Outcome, result: str | None, duration: float) -> dict[str, Any]:
    """The fields of the one log line per job outcome."""
    first_line = (outcome.error or "").splitlines()[0] if outcome.error else None
    fields: dict[str, Any] = {
        "job_id": lease.id,
        "job_type": lease.job_type,
        "attempt": lease.attempts,
        "max_attempts": lease.max_attempts,
        "outcome": outcome.kind,
        "status": result or "stale",
        "duration_ms": round(duration * 1000, 3) if math.isfinite(duration) else None,
        "waited_ms": _waited_ms(lease, duration),
        "error": first_line,
        # the wait before the next attempt (backoff, or what RetryLater asked); None unless retried
        "retry_delay_ms": round(outcome.delay * 1000, 3) if result in ("retry", "snoozed") and outcome.delay is not None else None,
    }
    if outcome.steps:
        fields["steps"] = outcome.steps  # (durable runs only: a plain job's line is as it was)
    return fields


@functools.lru_cache(maxsize=256)
def _due_epoch(run_after: str) -> float:
    """``to_epoch`` once per distinct time: the jobs of one insert share their run_after,
    and parsing it was a twentieth of the trio thread's work per job when draining."""
    return to_epoch(run_after)


def _waited_ms(lease: Lease, duration: float) -> float | None:
    """Queue wait: from the job being due (run_after) to its run starting. The start is
    taken as now − duration, so it includes the few ms the outcome took to commit."""
    try:
        waited = time.time() - duration - _due_epoch(lease.run_after)
    except ValueError:  # a run_after written by other SQL that is not ISO 8601
        return None
    return round(max(waited, 0.0) * 1000, 3) if math.isfinite(waited) else None
