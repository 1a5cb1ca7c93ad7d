"""The pipeline inside an asyncio application: ``pipeline.aio.open_pipeline``.

    registry = pipeline.Registry(runtime="asyncio")      # your job types, as for `python -m pipeline --app`

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):                     # a FastAPI / Starlette lifespan, aiohttp's cleanup_ctx
        async with pipeline.aio.open_pipeline(registry=registry) as p:
            app.state.pipeline = p
            yield                                         # the app serves; the jobs run in this process

    @app.post("/thumbnails")
    async def make(request: Request) -> dict:
        job_id = await request.app.state.pipeline.enqueue(Thumbnail("u42"))
        return {"job": job_id, "result": await request.app.state.pipeline.result(job_id, timeout=10)}

``open_pipeline(config=None, registry=...)`` runs the same actors as :func:`pipeline.open_pipeline`
(the store and its Ledger, the workers of every job type: trio, asyncio and thread handlers; the
wake-ups, the lease keeper, the scheduler, retention, the canceller) in the app's own process and
thread: the pipeline's trio code is a guest of the app's running asyncio loop
(engine/asyncio_host.py, ``run_as_guest``), so an asyncio handler is a task of the app's loop and
shares its pools, and the :class:`Pipeline` it yields is awaited from the app's asyncio tasks.
``config=None``: ``Config.from_env()``. With ``WORKER_ENABLED=false`` it only enqueues (no worker,
no lifespan), for a web app whose jobs ``python -m pipeline --app ...`` runs.

Leaving the block (the app's shutdown: uvicorn on SIGTERM runs the lifespan's exit) stops as the
service does: no new claims, the running jobs get WORKER_SHUTDOWN_TIMEOUT seconds to finish, then are
handed back to ``pending`` with their attempt not counted, and everything committed is written;
nothing is left ``running``. A cancellation of the task leaving it (or of the one inside it:
``asyncio.timeout``, a TaskGroup) is held until that stop is done, then raised: the pipeline still
stops cleanly. Errors come as themselves (``InvalidPayload``, ``UnknownJobType``, ``LookupError``,
``JobFailed``...), never wrapped in ExceptionGroups. Should the pipeline fail while the block runs (a
defect, not a store that is down for a while: that is retried), the task that entered the block is
cancelled, as a TaskGroup cancels its host task, and the block raises the pipeline's error.

One pipeline per event loop thread (one trio run per thread). From another thread or event loop, use
``pipeline.AsyncClient`` or ``pipeline.Client``; from trio code, ``pipeline.open_pipeline``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import attrs
import trio

from .backends.base import PRIORITY_DEFAULT, BatchRecord, JobRecord
from .config import Config
from .engine import wiring
from .engine.asyncio_host import AsyncioHost, current_host, run_as_guest
from .errors import PipelineClosed, UsageError
from .registry import Registry
from .requests import check_job_id
from .workflows import Batch

__all__ = ["Pipeline", "open_pipeline"]

log = logging.getLogger("pipeline")

T = TypeVar("T")


@asynccontextmanager
async def open_pipeline(config: Config | None = None, registry: Registry | None = None, *, owner: str | None = None,
                        role: str | None = None) -> AsyncIterator[Pipeline]:
    """Run the pipeline's actors on the running asyncio loop, in this process; yield the
    :class:`Pipeline` to enqueue, emit and wait on from asyncio tasks. See the module docstring.
    ``owner``, ``role``: as :func:`pipeline.open_pipeline`'s."""
    loop = _running_loop()
    config = config if config is not None else Config.from_env()
    run = _Run(loop.create_future())

    async def main() -> None:  # trio, the guest's main task
        run.stop = trio.Event()
        async with wiring.open_pipeline(config, registry, owner=owner, role=role) as pipeline:
            run.host = current_host()
            if not run.opened.done():
                run.opened.set_result(pipeline)
            if not run.stopping:  # (asked while it opened: it stops at once)
                await run.stop.wait()

    guest = loop.create_task(run_as_guest(main), name="pipeline.aio")
    run.guest = guest
    try:
        await asyncio.wait((run.opened, guest), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        await run.stop_gracefully()  # cancelled while it opened: what opened stops as it would have
        run.raise_failure()
        raise
    if not run.opened.done():  # it ended before it opened: why, as itself
        run.opened.cancel()
        raise run.failure() or PipelineClosed("the pipeline stopped before it opened")
    host = run.host
    assert host is not None  # (set by main, in its guest run)
    p = Pipeline(run.opened.result(), host, run)
    run.entered = asyncio.current_task()
    guest.add_done_callback(run.ended)
    try:
        yield p
    finally:
        held = await run.stop_gracefully()
        run.raise_failure()  # (a failure goes on rather than a cancellation, as from a TaskGroup)
        if held:
            raise asyncio.CancelledError


@attrs.define(eq=False)
class _Run:
    """One ``open_pipeline``'s guest run, seen from both sides. Both run in the app's thread, one
    callback at a time, so plain fields do: ``main`` (trio) writes ``stop``, ``host`` and ``opened``;
    the asyncio side writes the rest."""

    opened: asyncio.Future[wiring.Pipeline]  # the engine's pipeline, once open
    guest: asyncio.Task[None] | None = None  # the task awaiting run_as_guest: done once the trio run ended
    stop: trio.Event | None = None  # main waits on it; set through the host's token
    host: AsyncioHost | None = None
    stopping: bool = False  # a stop was asked (main reads it once open, in case it was asked before)
    entered: asyncio.Task[Any] | None = None  # the task that entered the block
    cancelled_entered: bool = False  # the pipeline failed while open and we cancelled ``entered``

    def request_stop(self) -> None:
        self.stopping = True
        if self.stop is not None and self.host is not None:
            try:
                self.host.token.run_sync_soon(self.stop.set)
            except trio.RunFinishedError:
                pass  # it ended already

    async def stop_gracefully(self) -> bool:
        """Ask the trio side to leave its block (the graceful stop) and wait until the guest run has
        ended; a cancellation meanwhile is held (the stop is bounded: WORKER_SHUTDOWN_TIMEOUT, then the
        running jobs are handed back): whether one came, for the caller to raise once it has."""
        assert self.guest is not None
        self.request_stop()
        cancelled = False
        while not self.guest.done():
            try:
                await asyncio.wait((self.guest,))
            except asyncio.CancelledError:
                cancelled = True
                self.request_stop()  # (main may have set up its stop since)
        if not self.opened.done():
            self.opened.cancel()
        return cancelled

    def raise_failure(self) -> None:
        """Raise the guest run's error, if it failed, in the task leaving the block; if that task is the
        one we cancelled to carry it here, that cancellation is taken back."""
        failure = self.failure()
        if failure is None:
            return
        current = asyncio.current_task()
        if self.cancelled_entered and current is not None and current is self.entered:
            self.cancelled_entered = False
            current.uncancel()
        raise failure

    def failure(self) -> BaseException | None:
        """The guest run's error, as itself; None if it ended as asked."""
        assert self.guest is not None
        if not self.guest.done() or self.guest.cancelled():
            return None
        error = self.guest.exception()
        return None if error is None else _as_itself(error)

    def ended(self, guest: asyncio.Task[None]) -> None:
        """The guest run ended: if nobody asked it to, it failed; like a TaskGroup's failing child,
        it cancels the task that entered the block, which raises the failure on leaving it."""
        if self.stopping:
            return
        error = self.failure()
        if error is None:  # its task was cancelled: asyncio.run's end, a forced exit
            log.warning("pipeline.aio: the pipeline's run was cancelled from outside its block (is the loop shutting "
                        "down?): jobs still running go back to pending when their leases expire")
        else:
            log.error("pipeline.aio: the pipeline stopped on its own (%r); the task that opened it is cancelled",
                      error, exc_info=error)
        self.stopping = True
        if self.entered is not None and not self.entered.done():
            self.cancelled_entered = True
            self.entered.cancel()


class Pipeline:
    """What :func:`open_pipeline` yields: :class:`pipeline.Pipeline`'s calls, awaited from asyncio
    tasks of the loop that opened it (an endpoint, a background task, an asyncio handler). Each call
    runs as a trio task of the pipeline's guest run, on the same thread, and answers as the trio
    call does: the same checks, results and errors.

    A caller cancelled while it waits (a client that went away, ``asyncio.timeout``) stops waiting at
    once; a wait (``result``, ``get``, ``batch``) stops with it, while a write (an enqueue, an emit,
    a cancel, a pause) still completes, as :class:`pipeline.AsyncClient`'s do: what was asked is not
    left half done, and the caller may learn of it with a later read."""

    def __init__(self, pipeline: wiring.Pipeline, host: AsyncioHost, run: _Run) -> None:
        self.trio_pipeline = pipeline  # the engine's own, for trio code in this run (a trio handler has ctx)
        self._host = host
        self._run = run

    @property
    def config(self) -> Config:
        return self.trio_pipeline.config

    @property
    def registry(self) -> Registry:
        return self.trio_pipeline.registry

    @property
    def owner(self) -> str:
        """host:pid:nonce, as in the leases this process holds."""
        return self.trio_pipeline.owner

    @property
    def state(self) -> Any:
        """What the registry's ``@registry.lifespan`` yielded (every handler's ``ctx.state``): the app's
        endpoints may share its pools. None without a lifespan, or with WORKER_ENABLED=false."""
        return self.trio_pipeline.state

    @property
    def closed(self) -> bool:
        """True once the block is being left (or the pipeline stopped): calls raise PipelineClosed."""
        return self.trio_pipeline.closed or self._run.stopping

    # -- producing ------------------------------------------------------------------------------------

    async def enqueue(self, job: Any, *, run_after: Any = None, max_attempts: int | None = None, priority: int = PRIORITY_DEFAULT,
                      unique_key: str | None = None, trace: str | None = None, expires_at: Any = None,
                      unique_while: str | None = None, after: Any = None, on_parent_failure: str | None = None,
                      idempotency_key: str | None = None) -> str:
        """As :meth:`pipeline.Pipeline.enqueue`: the job's id, once committed."""
        return await self._write(self.trio_pipeline.enqueue, job, run_after=run_after, max_attempts=max_attempts,
                                 priority=priority, unique_key=unique_key, trace=trace, expires_at=expires_at,
                                 unique_while=unique_while, after=after, on_parent_failure=on_parent_failure,
                                 idempotency_key=idempotency_key)

    async def enqueue_unique(self, job: Any, *, unique_key: str | None, run_after: Any = None,
                             max_attempts: int | None = None, priority: int = PRIORITY_DEFAULT,
                             unique_while: str | None = None) -> wiring.Enqueued:
        """As :meth:`pipeline.Pipeline.enqueue_unique`."""
        return await self._write(self.trio_pipeline.enqueue_unique, job, unique_key=unique_key, run_after=run_after,
                                 max_attempts=max_attempts, priority=priority, unique_while=unique_while)

    async def enqueue_many(self, jobs: Sequence[Any], *, priority: int = PRIORITY_DEFAULT,
                           unique_keys: Sequence[str | None] | None = None, trace: str | None = None,
                           expires_at: Any = None, idempotency_keys: Sequence[str | None] | None = None) -> list[str]:
        """As :meth:`pipeline.Pipeline.enqueue_many`: one transaction; a chain's jobs each wait for the one before."""
        return await self._write(self.trio_pipeline.enqueue_many, jobs, priority=priority, unique_keys=unique_keys,
                                 trace=trace, expires_at=expires_at, idempotency_keys=idempotency_keys)

    async def enqueue_batch(self, jobs: Sequence[Any], *, then: Any = None, priority: int = PRIORITY_DEFAULT,
                            trace: str | None = None) -> Batch:
        """As :meth:`pipeline.Pipeline.enqueue_batch`: the jobs and their callback ``then`` in one transaction."""
        return await self._write(self.trio_pipeline.enqueue_batch, jobs, then=then, priority=priority, trace=trace)

    async def emit(self, event: Any, *, trace: str | None = None) -> list[str]:
        """As :meth:`pipeline.Pipeline.emit`: the ids of the jobs the event routed to, once committed."""
        return await self._write(self.trio_pipeline.emit, event, trace=trace)

    # -- reading and waiting --------------------------------------------------------------------------

    async def get(self, job_id: str) -> JobRecord | None:
        """The job's record (status, attempts, error, progress; ``result`` as stored JSON text), or None."""
        check_job_id(job_id)
        return await self._wait(self.trio_pipeline.backend.get, job_id)

    async def result(self, job_id: str, *, timeout: float | None = None) -> Any:
        """As :meth:`pipeline.Pipeline.result`: the job's result once it finished (JobFailed, JobCancelled,
        LookupError, TimeoutError after ``timeout`` seconds). A job run by this process wakes the wait
        as its outcome is written."""
        return await self._wait(self.trio_pipeline.result, job_id, timeout=timeout)

    async def batch(self, batch_id: str) -> BatchRecord | None:
        """As :meth:`pipeline.Pipeline.batch`: a batch's progress, None if unknown."""
        return await self._wait(self.trio_pipeline.batch, batch_id)

    # -- control --------------------------------------------------------------------------------------

    async def cancel(self, job_id: str, *, reason: str = "cancelled by the application") -> str:
        """As :meth:`pipeline.Pipeline.cancel`: "cancelled" (it was pending), "cancelling" (it runs,
        here or elsewhere: it stops within a second or so), or a finished job's status."""
        return await self._write(self.trio_pipeline.cancel, job_id, reason=reason)

    async def pause_type(self, job_type: str) -> None:
        """As :meth:`pipeline.Pipeline.pause_type`: no new job of the type starts, in any process."""
        await self._write(self.trio_pipeline.pause_type, job_type)

    async def resume_type(self, job_type: str) -> None:
        await self._write(self.trio_pipeline.resume_type, job_type)

    # -- the bridge -----------------------------------------------------------------------------------

    async def _write(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """``fn`` on the trio side, run to its end even if the caller stops waiting."""

        async def shielded() -> T:
            with trio.CancelScope(shield=True):
                value = await fn(*args, **kwargs)
            return value

        return await self._call(shielded)

    async def _wait(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """``fn`` on the trio side, stopped when the caller stops waiting."""

        async def call() -> T:
            return await fn(*args, **kwargs)

        return await self._call(call)

    async def _call(self, fn: Callable[[], Awaitable[T]]) -> T:
        self._check_caller()
        if self._run.guest is None or self._run.guest.done():
            error = self._run.failure()
            raise PipelineClosed("the pipeline has stopped" + (f" ({error!r})" if error is not None else "")
                                 + ": its open_pipeline block was left") from error
        try:
            return await self._host.run_trio(fn)
        except trio.RunFinishedError:
            raise PipelineClosed("the pipeline stopped before this call finished") from None

    def _check_caller(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if trio.lowlevel.in_trio_run() and trio.lowlevel.in_trio_task():
            raise UsageError("pipeline.aio's Pipeline is for asyncio tasks; trio code in the same run (a trio handler, "
                             "trio middleware) awaits the engine's own: p.trio_pipeline.enqueue(...), or ctx.emit(...)")
        if loop is not self._host.loop:
            raise UsageError("this pipeline.aio Pipeline belongs to the event loop that opened it, and is awaited only "
                             "from that loop's tasks; from another thread or loop use pipeline.AsyncClient (asyncio) "
                             "or pipeline.Client (sync code)")


def _running_loop() -> asyncio.AbstractEventLoop:
    if trio.lowlevel.in_trio_run() and trio.lowlevel.in_trio_task():
        raise UsageError("pipeline.aio.open_pipeline is for asyncio code; in a trio program use pipeline.open_pipeline")
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise UsageError("pipeline.aio.open_pipeline needs a running asyncio loop: `async with` it in asyncio code "
                         "(a FastAPI or Starlette lifespan, aiohttp's cleanup_ctx, asyncio.run(main()))") from None
    if trio.lowlevel.in_trio_run():  # a guest run on this loop already: trio runs one per thread
        raise UsageError("this event loop already hosts a pipeline (a pipeline.aio.open_pipeline block, or a worker "
                         "process's own): one per loop. Share the Pipeline it yields (app.state.pipeline), or open "
                         "pipeline.AsyncClient for a second store")
    return loop


def _as_itself(error: BaseException) -> BaseException:
    """An error out of the trio side's nurseries, as itself: an ExceptionGroup of one (nested or
    not) is its one exception; a group of several is kept (each is a separate failure)."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error
