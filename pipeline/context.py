"""What a handler gets besides its job: :class:`JobContext`.

Its own module, beneath the registry (which names it in a handler's type) and the handler pools
(which make one per attempt), so that neither imports the other.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
from collections.abc import Awaitable, Callable, Container, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import trio

from .errors import UsageError

MAX_PROGRESS_MESSAGE = 500  # characters of a progress message kept

if TYPE_CHECKING:
    from .config import Config
    from .engine.steps import Durable, Logic, Run
    from .workflows import BatchOutcome


class HandlerThread(Protocol):
    """A sync handler's call in a worker thread, as its context needs it (the pool's own record)."""

    token: trio.lowlevel.TrioToken  # the loop, for the handler's emit from any thread
    abandoned: bool  # the attempt is over (its outcome decided, the thread given up on if it still runs)
    cancel_requested: bool  # the job's cancel was requested while it ran
    deadline: float  # the attempt's end on the loop's clock: its timeout, or sooner the end of a stop's grace

    def over(self) -> bool:
        """On the loop: whether the attempt is over, or past its deadline (its end is on the way)."""


class LoopHost(Protocol):
    """The asyncio loop an asyncio handler runs on, as its context needs it (engine/asyncio_host.py's
    AsyncioHost): how its ctx reaches the trio side from the handler's asyncio task, or from a thread
    it started (``asyncio.to_thread``)."""

    token: trio.lowlevel.TrioToken

    def on_loop(self) -> bool:
        """In the loop's thread, outside a trio task (an asyncio task)."""

    def run_trio(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Awaitable[Any]:
        """From an asyncio task: ``fn(*args)`` as a trio task, awaited."""


class Workflows(Protocol):
    """What a context reads of the workflow graph (the pipeline's methods of these names)."""

    async def parent_results(self, job_id: str) -> dict[str, Any]: ...

    async def batch_of(self, job_id: str) -> BatchOutcome: ...


@attrs.frozen
class JobContext:
    """What a handler gets besides its job: which run this is, and what it may use."""

    id: str  # the job's id: make side effects idempotent with it (execution is at-least-once)
    job_type: str
    attempt: int  # 1 for the first run
    max_attempts: int
    _emit: Callable[[Any], Awaitable[list[str]]] = attrs.field(alias="emit")  # the pipeline's emit (trio)
    resources: Mapping[str, Any]  # what the registry's resources opened (an HTTP client, a mailer)
    config: Config
    # a sync handler's call (set by the pool, through attrs.evolve): how its emit reaches the
    # loop from other threads, and whether the attempt is over. None for an async handler.
    _thread: HandlerThread | None = attrs.field(default=None, eq=False, repr=False)
    # the trace context of the code that enqueued the job (NewJob.trace: W3C traceparent, then a
    # space and the tracestate if any), the same for every attempt; None if it had none
    trace: str | None = None
    # where ctx.progress goes: (job id, lease token, fraction, message), on the loop (the pipeline's
    # ProgressBoard.report); None: not reported (a context made outside a pipeline)
    _report: Callable[[str, int, float, str | None], None] | None = attrs.field(default=None, alias="report", eq=False,
                                                                                repr=False)
    _token: int = attrs.field(default=0, alias="token", eq=False, repr=False)  # the lease's fencing token
    # the pool's leases (id, token) whose cancel was requested (Pool.cancelling): read by an async
    # handler's cancel_requested; None outside a pool
    _cancelling: Container[tuple[str, int]] | None = attrs.field(default=None, alias="cancelling", eq=False, repr=False)
    # where parent_results() and batch() read (the pipeline); None outside a pipeline
    _workflows: Workflows | None = attrs.field(default=None, alias="workflows", eq=False, repr=False)
    # the pool's runs (id, token) → when each is cancelled (Pool.deadlines), on the loop's ``clock``:
    # read by time_left; None outside a pool
    _deadlines: Mapping[tuple[str, int], float] | None = attrs.field(default=None, alias="deadlines", eq=False,
                                                                     repr=False)
    _clock: trio.abc.Clock | None = attrs.field(default=None, alias="clock", eq=False, repr=False)
    # what the registry's lifespan yielded (``@registry.lifespan``), the same object in every handler of
    # the process; None without one
    state: Any = attrs.field(default=None, eq=False, repr=False)
    # an asyncio handler's loop (runtime="asyncio"): its awaits (emit, progress, parent_results, batch)
    # are asyncio's, reaching the trio side through it. None for a trio or sync handler.
    _aio: LoopHost | None = attrs.field(default=None, alias="aio", eq=False, repr=False)
    # durable functions (engine/steps.py): the pipeline's, and this attempt's own state, made on first use
    _durable: Durable | None = attrs.field(default=None, alias="durable", eq=False, repr=False)
    _run: Run | None = attrs.field(default=None, alias="run", eq=False, repr=False)

    # -- durable functions (docs/durable.md) --------------------------------------------------------

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once for this job and return its value: committed with the job
        (fenced by its lease) before this returns, and returned from the store, without calling ``fn``,
        whenever the job runs again (a retry, a rescue after a crash, a resume after ``sleep`` or
        ``wait_for``). ``fn`` raising commits nothing (the job's retries apply). Names are unique within a
        run. ``await ctx.step(...)`` in an async handler (``fn`` sync or async); a plain call in a sync
        one. At least once: if the process dies after ``fn`` ran and before its value was committed, it
        runs again (give the outside call an idempotency key: ``ctx.id`` and the step's name)."""
        from .engine.steps import check_step_name, step_logic  # (steps.py reads what imports this module)

        check_step_name(name)
        if not callable(fn):
            raise UsageError(f"step {name!r}: fn must be callable, got {type(fn).__name__}")
        return self._drive(step_logic(self._durable_run(), name, fn, args, kwargs))

    def sleep(self, duration: float | dt.timedelta) -> Any:
        """Sleep durably: the job leaves its worker and every limit slot, ``suspended`` in the store, and
        runs again from the top when the time comes (this call then returns at once); the attempt is not
        counted. ``await ctx.sleep(3600)`` in an async handler; a plain call in a sync one."""
        from .engine.steps import seconds_of, sleep_logic

        return self._drive(sleep_logic(self._durable_run(), seconds_of(duration, "ctx.sleep's duration")))

    def wait_for(self, name: str, *, timeout: float | dt.timedelta | None = None) -> Any:
        """Wait for the signal ``name`` (sent by ``Client.signal``, ``jobs signal``, the admin API or a
        signed link) and return its payload. A signal sent earlier is taken at once; else the job is
        ``suspended``, holding nothing, until it comes. ``timeout``: seconds (or a timedelta) from the
        first time this wait was reached; past it, pipeline.SignalTimeout is raised here. Each signal is
        consumed by one wait. ``await ctx.wait_for("approval", timeout=86400)``; a plain call in a sync handler."""
        from .durable import check_signal_name
        from .engine.steps import seconds_of, wait_logic

        check_signal_name(name)
        seconds = None if timeout is None else seconds_of(timeout, "wait_for's timeout")
        return self._drive(wait_logic(self._durable_run(), name, seconds))

    def _durable_run(self) -> Run:
        from .engine.steps import Run

        run = self._run
        if run is None:
            if self._durable is None:
                raise UsageError("this context belongs to no pipeline: there is no store for its steps")
            run = Run(self._durable, self.id, self._token)
            object.__setattr__(self, "_run", run)  # (this attempt's, made on first use)
        return run

    def _drive(self, logic: Logic) -> Any:
        from .engine.steps import drive_async, drive_thread

        aio = self._aio
        if aio is not None:
            if aio.on_loop():
                return drive_async(logic, aio.run_trio, self._attempt_over)
            if not trio.lowlevel.in_trio_run():  # a thread the asyncio handler started
                return drive_thread(logic, aio.token, self._attempt_over)
        if trio.lowlevel.in_trio_run():
            return drive_async(logic)
        thread = self._thread
        if thread is None:
            return drive_thread(logic, None, lambda: False)
        return drive_thread(logic, thread.token, lambda: thread.abandoned)

    def time_left(self) -> float:
        """Seconds until this attempt is cancelled: its timeout (``timeout=``, WORKER_JOB_TIMEOUT_SECONDS),
        or sooner once the pipeline stops, the end of the stop's grace; 0.0 once the attempt is over,
        ``inf`` for a context made outside a pipeline. Bound your own waits with it (an HTTP call's
        timeout, a ``trio.move_on_after``): the attempt's timeout is not a trio deadline, so
        ``trio.current_effective_deadline()`` does not show it. A plain call, on the loop or from any
        thread (a sync handler's, or one a handler started)."""
        clock, deadlines, thread = self._clock, self._deadlines, self._thread
        if clock is None or deadlines is None:
            return math.inf
        if thread is not None:
            if thread.abandoned:
                return 0.0
            deadline = thread.deadline
        else:
            deadline = deadlines.get((self.id, self._token), -math.inf)  # gone: the attempt is over
        return max(0.0, deadline - clock.current_time())

    def parent_results(self) -> Any:
        """{parent id: result} of the jobs this one waited for (``after=``, a chain's previous job), in
        the order they were named: each completed parent's return value (as JSON gives it back); None
        for one that ended otherwise (``on_parent_failure="run"``). ``await ctx.parent_results()`` in an
        async handler; a plain call from a sync one. A parent removed since (by retention) is left out."""
        return self._read(lambda w: w.parent_results(self.id))

    def batch(self) -> Any:
        """The outcome of the batch this job belongs to (a :class:`pipeline.BatchOutcome`), read now: in
        a batch's callback, every job has ended. It holds the jobs counted by status (``counts``,
        ``total``, ``succeeded``), read without any result; ``outcome.members()`` reads the jobs with
        their results a page at a time (``async for`` in an async handler, ``for`` in a sync one).
        ``await ctx.batch()`` in an async handler; a plain call from a sync one. UsageError for a job
        of no batch."""
        def paged(outcome: BatchOutcome) -> BatchOutcome:  # members() reads each page from where it runs
            page = outcome._page
            if page is None:  # an outcome made without a store to page through
                return outcome
            return attrs.evolve(outcome, fetch=lambda limit, offset: self._read(lambda w: page(limit, offset)))

        if trio.lowlevel.in_trio_run():
            async def read() -> BatchOutcome:
                return paged(await self._read(lambda w: w.batch_of(self.id)))

            return read()
        return paged(self._read(lambda w: w.batch_of(self.id)))

    def _read(self, read: Callable[[Workflows], Awaitable[Any]]) -> Any:
        workflows = self._workflows
        if workflows is None:
            raise UsageError("this context belongs to no pipeline: there is no store to read")
        aio = self._aio
        if aio is not None:  # an asyncio handler: from its task, an asyncio awaitable; from its threads, the value
            if aio.on_loop():
                return aio.run_trio(read, workflows)
            if not trio.lowlevel.in_trio_run():
                return trio.from_thread.run(read, workflows, trio_token=aio.token)
        if trio.lowlevel.in_trio_run():
            return read(workflows)
        thread = self._thread
        if thread is None:
            return trio.from_thread.run(read, workflows)
        if thread.abandoned:
            raise self._over()
        return trio.from_thread.run(read, workflows, trio_token=thread.token)

    @property
    def cancel_requested(self) -> bool:
        """Whether this job's cancel was requested while it runs (``jobs cancel``, ``Client.cancel``).
        An async handler is cancelled at once (trio's Cancelled, at its next checkpoint); a sync handler
        cannot be, so it should look at this between steps and return (or raise) soon: whatever it does
        then, the job ends cancelled, unless it completed. If it goes on, its timeout abandons it."""
        thread = self._thread
        if thread is not None:
            return thread.cancel_requested
        return self._cancelling is not None and (self.id, self._token) in self._cancelling

    def progress(self, fraction: float, message: str | None = None) -> Any:
        """Say how far the job got: ``fraction`` from 0 to 1, and a short message. Stored with the
        job at most once a second (the latest value wins), shown by ``jobs show``, the admin API and
        the dashboard. ``await ctx.progress(0.5)`` in an async handler; a plain call from a sync one."""
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction <= 1.0:
            raise UsageError(f"progress must be a number from 0 to 1, got {fraction!r:.40}")
        if message is not None:
            if not isinstance(message, str):
                raise UsageError(f"a progress message must be text, got {type(message).__name__}")
            message = message[:MAX_PROGRESS_MESSAGE].encode("utf-8", "backslashreplace").decode("utf-8")
        fraction = float(fraction)
        aio = self._aio
        if aio is not None:
            if aio.on_loop():
                return self._report_asyncio(fraction, message)
            if not trio.lowlevel.in_trio_run():  # a thread the asyncio handler started
                if self._report is not None and not self._attempt_over():
                    trio.from_thread.run_sync(self._report, self.id, self._token, fraction, message, trio_token=aio.token)
                return None
        if trio.lowlevel.in_trio_run():
            return self._report_async(fraction, message)
        thread = self._thread
        if thread is None or thread.abandoned or self._report is None:
            return None
        try:
            trio.from_thread.run_sync(self._report, self.id, self._token, fraction, message, trio_token=thread.token)
        except trio.RunFinishedError:
            pass
        return None

    async def _report_async(self, fraction: float, message: str | None) -> None:
        if self._report is not None:
            self._report(self.id, self._token, fraction, message)
        await trio.lowlevel.checkpoint()

    async def _report_asyncio(self, fraction: float, message: str | None) -> None:
        # on the loop's thread, where the trio run is: the board is written directly (no hop)
        if self._report is not None and not self._attempt_over():
            self._report(self.id, self._token, fraction, message)
        await asyncio.sleep(0)

    def _attempt_over(self) -> bool:
        """An asyncio handler's attempt has ended (its run left the pool: it was abandoned)."""
        deadlines = self._deadlines
        return deadlines is not None and (self.id, self._token) not in deadlines

    def emit(self, event: Any) -> Any:
        """Publish a domain event: the ids of the jobs it routed to, once committed. In an
        async handler, ``await ctx.emit(event)``; from a thread (a sync handler, or a thread it
        started), ``ctx.emit(event)`` blocks until committed and returns the ids. Refused
        (UsageError) once the attempt is over, from any thread (one the pool abandoned at a timeout,
        or one the handler started and left running): its retry emits instead."""
        aio = self._aio
        if aio is not None:  # an asyncio handler: from its task, an asyncio awaitable; from its threads, the ids
            if aio.on_loop():
                return aio.run_trio(self._emit_in_run, event)
            if not trio.lowlevel.in_trio_run():
                return trio.from_thread.run(self._emit_in_run, event, trio_token=aio.token)
        if trio.lowlevel.in_trio_run():  # on the loop: the coroutine, to await
            return self._emit(event)
        thread = self._thread
        if thread is None:
            return trio.from_thread.run(self._emit, event)
        if thread.abandoned:
            raise self._over()
        return trio.from_thread.run(self._emit_in_attempt, event, thread, trio_token=thread.token)

    async def _emit_in_attempt(self, event: Any, thread: HandlerThread) -> list[str]:
        # looked at again on the loop, where the attempt ends: an emit the thread sent as its
        # deadline passed is refused, not committed beside the job's timeout
        if thread.over():
            raise self._over()
        return await self._emit(event)

    async def _emit_in_run(self, event: Any) -> list[str]:
        # an asyncio handler's: refused once its run left the pool (abandoned after its cancellation)
        if self._attempt_over():
            raise self._over()
        return await self._emit(event)

    def _over(self) -> UsageError:
        return UsageError(f"job {self.id} ({self.job_type}): attempt {self.attempt} is over (it ended, or its thread or "
                          "asyncio task was abandoned at its timeout, a cancel, a lost lease or shutdown); its emit is refused")
