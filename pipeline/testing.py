"""Run your handlers in a test, without a service: the real engine on a throw-away SQLite store,
from whichever kind of test you write.

    async def test_resize() -> None:                      # pytest-trio, pytest-asyncio, anyio
        async with pipeline.testing.open_test_pipeline(registry) as p:
            job_id = await p.enqueue(ResizeAvatar("u42"))
            assert await p.result(job_id) == {"width": 64}  # decoded, as Client.result gives it
            (record,) = await p.drain()                    # every job run to its end: retries and delays included
            assert record.status == "completed"

    def test_resize_plain() -> None:                      # a plain pytest function
        with pipeline.testing.open_test_pipeline(registry) as p:
            job_id = p.enqueue(ResizeAvatar("u42"))
            assert p.result(job_id) == {"width": 64}
        record = pipeline.testing.run(registry, ResizeAvatar("u42"))   # or one job, in one call

``drain()`` makes every pending job due at once, again and again, until none is pending or running:
a retry's backoff, ``RetryLater(delay=...)`` and ``run_after`` are not waited out, and jobs that
handlers enqueue or emit run too. It returns every job's final record, oldest first. ``result(id)``
does the same until that job has ended.

Where the engine runs. The engine is trio code. Under trio it runs in the test's own run. Under
asyncio it runs as a guest of the test's asyncio loop (the asyncio host, pipeline/engine/asyncio_host.py:
one thread, the asyncio loop drives trio's ticks), so the registry's asyncio handlers and lifespan run
on the test's own loop, beside its fixtures. In a plain ``with`` it runs in a thread of its own, as
:class:`pipeline.Client`'s loop does (on a new asyncio loop when the registry has asyncio handlers,
as a worker process does), and each call blocks until that loop answers. A trio test whose registry
has asyncio handlers gets such a thread too (no asyncio loop runs in a trio run), its calls awaited. The registry's lifespan runs in each (``ctx.state``).
Errors come out as themselves (InvalidPayload, UsageError, JobFailed...), never wrapped in the
engine's nurseries' exception groups; several at once stay a group.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import attrs
import outcome
import sniffio
import trio

from .backends.base import BatchRecord, JobRecord
from .backends.sqlite import drain as store
from .config import Config
from .engine import asyncio_host
from .engine.asyncio_host import AsyncioHost, current_host, run_as_guest
from .engine.wiring import Pipeline, open_pipeline
from .errors import PipelineClosed, UsageError
from .registry import Registry
from .requests import check_job_id
from .sqlite_files import connect
from .workflows import Batch, decoded

__all__ = ["SyncTestPipeline", "TestJobRecord", "TestPipeline", "open_test_pipeline", "run"]

POLL_MS = 5  # how soon the engine finds a job drain() made due

T = TypeVar("T")


@attrs.frozen
class TestJobRecord(JobRecord):
    """A job's record as ``pipeline.testing`` hands it out: :class:`pipeline.JobRecord` with
    ``result`` decoded (``5``, not ``'5'``: what ``Client.result`` answers, read back as the handler's
    return annotation; None without one). The store's own ``JobRecord`` (the admin API, the CLI,
    ``Backend.get``) keeps the JSON text, and ``to_json()`` gives its JSON form."""

    __test__ = False  # not a test class, whatever pytest thinks of its name

    result: Any = None
    _stored: str | None = attrs.field(default=None, alias="stored", eq=False, repr=False)  # the result's JSON text

    @classmethod
    def of(cls, record: JobRecord, decode: Callable[[str, str | None], Any] | None = None) -> TestJobRecord:
        """``decode``: the registry's decode_result (None: the result's JSON form)."""
        fields = attrs.asdict(record, recurse=False)
        result = decoded(record.result) if decode is None else decode(record.job_type, record.result)
        return cls(**{**fields, "result": result}, stored=record.result)

    def to_json(self) -> dict[str, Any]:
        data = JobRecord.to_json(attrs.evolve(self, result=None))
        data["result"] = decoded(self._stored) if self._stored is not None else self.result
        return data


# -- the trio side: what runs on the pipeline's loop, whoever calls -------------------------------------


class _Engine:
    """The pipeline under test and what ``drain`` and ``result`` do on its loop."""

    def __init__(self, pipeline: Pipeline, path: Path) -> None:
        self.pipeline = pipeline
        self.path = path

    async def drain(self, timeout: float) -> list[TestJobRecord]:
        left: dict[str, int] = {}
        with trio.move_on_after(_seconds(timeout)):
            while left := await self._make_due():
                await trio.sleep(POLL_MS / 1000)
            records, _ = await self.pipeline.backend.list(limit=1_000_000_000)
            return [TestJobRecord.of(record, self.pipeline.registry.decode_result) for record in reversed(records)]
        raise TimeoutError(f"drain(): jobs still unfinished after {timeout:g} s ({_counted(left)}): a handler that hangs?")

    async def result(self, job_id: str, timeout: float) -> Any:
        check_job_id(job_id)
        with trio.move_on_after(_seconds(timeout)):
            while True:
                await self._make_due()
                try:  # woken as its outcome is written here; else looked at again once the jobs before it are due
                    return await self.pipeline.result(job_id, timeout=POLL_MS / 1000)
                except TimeoutError:
                    pass
        job = await self.pipeline.backend.get(job_id)
        raise TimeoutError(f"job {job_id} did not finish within {timeout:g} s (it is {job.status if job else 'gone'})")

    async def get(self, job_id: str) -> TestJobRecord | None:
        record = await self.pipeline.backend.get(check_job_id(job_id))
        return None if record is None else TestJobRecord.of(record, self.pipeline.registry.decode_result)

    async def _make_due(self) -> dict[str, int]:
        """Every pending job due now; what is left to run, by type. UsageError if some of it can never
        run here (its type has no handler in the registry under test), instead of waiting for ever."""
        left = await trio.to_thread.run_sync(self._make_due_here)
        unhandled = sorted(set(left) - set(self.pipeline.registry.handled()))
        if unhandled:
            raise UsageError(f"jobs of types no handler here runs are pending: {', '.join(unhandled)}; "
                             "register their handlers in the registry under test")
        return left

    def _make_due_here(self) -> dict[str, int]:
        conn = connect(self.path, synchronous="normal")
        try:
            return store.make_due(conn)
        finally:
            conn.close()


@asynccontextmanager
async def _open_engine(registry: Registry, config: Config) -> AsyncIterator[_Engine]:
    """The real engine (``open_pipeline``) on a new SQLite file in a temporary folder, removed
    afterwards. What leaves the block leaves as itself, not inside the nurseries' groups."""
    with tempfile.TemporaryDirectory(prefix="pipeline-test-") as folder:
        path = Path(folder) / "test.db"
        config = attrs.evolve(config, database_url=f"sqlite:///{path}", worker=attrs.evolve(config.worker, poll_interval_ms=POLL_MS))
        try:
            async with open_pipeline(config, registry) as pipeline:
                yield _Engine(pipeline, path)
        except BaseExceptionGroup as group:
            error = _lone(group)
        else:
            return
        raise error  # outside the except: its own context kept, not the group's (a test's own error is left as it was)


def _lone(error: BaseException) -> BaseException:
    """The one exception inside nested single-exception groups (trio's strict groups wrap an error
    once per nursery it crosses); a group of several, as it is: those are several errors."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


def _seconds(timeout: float) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0:
        raise UsageError(f"timeout must be a number of seconds >= 0, got {timeout!r:.40}")
    return float(timeout)


def _counted(left: dict[str, int]) -> str:
    return ", ".join(f"{count} {job_type}" for job_type, count in sorted(left.items()))


# -- what a test holds ----------------------------------------------------------------------------------


class _Runs(Protocol):
    """How a call reaches the engine: awaited in the test's own trio run, or handed to the engine's run
    elsewhere (a guest of the test's asyncio loop, a thread). ``wait``: the call waits for jobs (drain, result), so a caller
    that stops waiting (cancelled) stops it; any other call (an enqueue) runs to its end."""

    def __call__(self, fn: Callable[[_Engine], Awaitable[T]], *, wait: bool = False) -> Awaitable[T]: ...


class TestPipeline:
    """What ``async with open_test_pipeline(...)`` yields, under trio or asyncio: every call awaited.

    ``enqueue``, ``enqueue_many`` (a :func:`pipeline.chain` too), ``enqueue_batch``, ``emit``, ``cancel``
    and ``batch`` take what :class:`pipeline.Pipeline`'s take; ``drain``, ``result`` and ``get`` are the
    test's own. ``pipeline`` (the :class:`pipeline.Pipeline` itself), ``backend`` and ``path`` (the
    SQLite file) are there for trio tests that look under the hood: their calls are trio's."""

    __test__ = False  # not a test class, whatever pytest thinks of its name

    def __init__(self, engine: _Engine, runs: _Runs) -> None:
        self.pipeline = engine.pipeline
        self.backend = engine.pipeline.backend
        self.path = engine.path
        self._runs = runs

    async def enqueue(self, job: Any, **options: Any) -> str:
        """Commit one job; its id. ``options``: :meth:`pipeline.Pipeline.enqueue`'s (``run_after``,
        ``priority``, ``unique_key``, ``after``, ``idempotency_key``...)."""
        options.setdefault("trace", self.pipeline.trace_context() or "")  # the caller's span, taken here
        return await self._runs(lambda e: e.pipeline.enqueue(job, **options))

    async def enqueue_many(self, jobs: Sequence[Any], **options: Any) -> list[str]:
        """Commit many jobs in one transaction (a :func:`pipeline.chain`: each waits for the one before)."""
        options.setdefault("trace", self.pipeline.trace_context() or "")
        return await self._runs(lambda e: e.pipeline.enqueue_many(jobs, **options))

    async def enqueue_batch(self, jobs: Sequence[Any], *, then: Any = None, **options: Any) -> Batch:
        """Commit a batch and its callback ``then`` (run once every job of the batch has ended)."""
        options.setdefault("trace", self.pipeline.trace_context() or "")
        return await self._runs(lambda e: e.pipeline.enqueue_batch(jobs, then=then, **options))

    async def emit(self, event: Any, *, trace: str | None = None) -> list[str]:
        """Route an event by the registry's routes; the ids of its jobs."""
        trace = (self.pipeline.trace_context() or "") if trace is None else trace
        return await self._runs(lambda e: e.pipeline.emit(event, trace=trace))

    async def cancel(self, job_id: str) -> str:
        """Cancel a job, as :meth:`pipeline.Pipeline.cancel`."""
        return await self._runs(lambda e: e.pipeline.cancel(job_id))

    async def batch(self, batch_id: str) -> BatchRecord | None:
        """A batch's progress: its jobs counted by status, its callback's status."""
        return await self._runs(lambda e: e.pipeline.batch(batch_id))

    async def signal(self, job_id: str, name: str, payload: Any = None, *, key: str | None = None) -> str:
        """Send a signal to a job, as :meth:`pipeline.Pipeline.signal` ("woken" or "kept"); then
        :meth:`drain` or :meth:`result` runs it on."""
        return await self._runs(lambda e: e.pipeline.signal(job_id, name, payload, key=key))

    async def drain(self, *, timeout: float = 30.0) -> list[TestJobRecord]:
        """Run every job until none is pending or running; every job's record, oldest first.
        TimeoutError if jobs are still unfinished after ``timeout`` seconds (a handler that hangs)."""
        return await self._runs(lambda e: e.drain(timeout), wait=True)

    async def result(self, job_id: str, *, timeout: float = 30.0) -> Any:
        """Run jobs (as :meth:`drain`) until this one has ended; its result, decoded. JobFailed (dead)
        or JobCancelled (cancelled) with its error; TimeoutError after ``timeout`` seconds."""
        return await self._runs(lambda e: e.result(job_id, timeout), wait=True)

    async def get(self, job_id: str) -> TestJobRecord | None:
        """The job's record as it is now (None: no such job); nothing is run."""
        return await self._runs(lambda e: e.get(job_id))


class SyncTestPipeline:
    """What a plain ``with open_test_pipeline(...)`` yields: :class:`TestPipeline`'s calls, each a plain
    call that returns once the engine's loop (in a thread of its own) has answered."""

    __test__ = False

    def __init__(self, remote: _Remote) -> None:
        assert remote.engine is not None
        self.path = remote.engine.path
        self._remote = remote
        self._trace = remote.engine.pipeline.trace_context

    def enqueue(self, job: Any, **options: Any) -> str:
        """As :meth:`TestPipeline.enqueue`."""
        options.setdefault("trace", self._trace() or "")
        return self._remote.call(lambda e: e.pipeline.enqueue(job, **options))

    def enqueue_many(self, jobs: Sequence[Any], **options: Any) -> list[str]:
        """As :meth:`TestPipeline.enqueue_many`."""
        options.setdefault("trace", self._trace() or "")
        return self._remote.call(lambda e: e.pipeline.enqueue_many(jobs, **options))

    def enqueue_batch(self, jobs: Sequence[Any], *, then: Any = None, **options: Any) -> Batch:
        """As :meth:`TestPipeline.enqueue_batch`."""
        options.setdefault("trace", self._trace() or "")
        return self._remote.call(lambda e: e.pipeline.enqueue_batch(jobs, then=then, **options))

    def emit(self, event: Any, *, trace: str | None = None) -> list[str]:
        """As :meth:`TestPipeline.emit`."""
        trace = (self._trace() or "") if trace is None else trace
        return self._remote.call(lambda e: e.pipeline.emit(event, trace=trace))

    def cancel(self, job_id: str) -> str:
        """As :meth:`TestPipeline.cancel`."""
        return self._remote.call(lambda e: e.pipeline.cancel(job_id))

    def batch(self, batch_id: str) -> BatchRecord | None:
        """As :meth:`TestPipeline.batch`."""
        return self._remote.call(lambda e: e.pipeline.batch(batch_id))

    def signal(self, job_id: str, name: str, payload: Any = None, *, key: str | None = None) -> str:
        """As :meth:`TestPipeline.signal`."""
        return self._remote.call(lambda e: e.pipeline.signal(job_id, name, payload, key=key))

    def drain(self, *, timeout: float = 30.0) -> list[TestJobRecord]:
        """As :meth:`TestPipeline.drain`."""
        return self._remote.call(lambda e: e.drain(timeout), wait=True)

    def result(self, job_id: str, *, timeout: float = 30.0) -> Any:
        """As :meth:`TestPipeline.result`."""
        return self._remote.call(lambda e: e.result(job_id, timeout), wait=True)

    def get(self, job_id: str) -> TestJobRecord | None:
        """As :meth:`TestPipeline.get`."""
        return self._remote.call(lambda e: e.get(job_id))


# -- the engine's loop elsewhere: a guest of the test's asyncio loop, or a thread of its own -------------


class _Left(Exception):
    """The test's block raised: the engine stops as a trio block does then (its running jobs cancelled)."""


class _Remote:
    """The engine's trio run when the test's code does not run in it: :meth:`main` runs it (a guest of the
    test's asyncio loop, or ``trio.run`` / the asyncio host's ``run`` in a thread). Calls reach it through
    its token (or the asyncio host's bridge) and are answered on the caller's side."""

    def __init__(self, registry: Registry, config: Config) -> None:
        self._args = (registry, config)
        self.engine: _Engine | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._host: AsyncioHost | None = None  # the asyncio loop this run is the guest of, if any
        self._nursery: trio.Nursery | None = None  # the calls handed over by token (from other threads)
        self._leave: trio.Event | None = None
        self._scope = trio.CancelScope()  # the whole run: cancelled when its caller stops waiting for it
        self._failed = False  # the test's block raised (read on the loop once _leave is set)
        self.thread: threading.Thread | None = None  # the run's thread, when it has one of its own

    async def main(self, opened: Callable[[], None]) -> None:
        self._token, self._host = trio.lowlevel.current_trio_token(), current_host()
        with self._scope:
            async with _open_engine(*self._args) as engine, trio.open_nursery() as tn:
                self.engine, self._nursery, self._leave = engine, tn, trio.Event()
                opened()
                await self._leave.wait()  # then the nursery waits for the calls in flight
                if self._failed:
                    raise _Left

    def leave(self, *, failed: bool) -> None:
        """From any thread: close the pipeline (gracefully, or as a failed block does)."""
        def now() -> None:
            self._failed = failed
            if self._leave is not None:
                self._leave.set()
        self._to_loop(now)

    def cancel(self) -> None:
        """From any thread: stop the run at once (its caller stopped waiting for it)."""
        self._to_loop(self._scope.cancel)

    def _to_loop(self, fn: Callable[[], None]) -> None:
        if self._token is None:  # main has not started: it starts cancelled
            self._scope.cancel()
            return
        try:
            self._token.run_sync_soon(fn)
        except trio.RunFinishedError:
            pass

    def _open(self) -> _Engine:
        if self.engine is None or self._leave is None or self._leave.is_set():
            raise PipelineClosed("the test pipeline is closed")
        return self.engine

    # -- calls from asyncio code on the loop this run is the guest of -----------------------------------------

    async def call_on_host(self, fn: Callable[[_Engine], Awaitable[T]], *, wait: bool = False) -> T:
        """``fn(engine)`` as a trio task, through the asyncio host's bridge (the caller's context copied
        into it). A caller cancelled meanwhile cancels a ``wait``; any other call runs to its end."""
        engine = self._open()
        assert self._host is not None

        async def call() -> T:
            with trio.CancelScope(shield=not wait):
                return await fn(engine)
            raise AssertionError("unreachable: a shielded call is not cancelled")  # pragma: no cover

        return await self._host.run_trio(call)

    # -- calls from another thread, or from another trio run -----------------------------------------------

    def start(self, fn: Callable[[_Engine], Awaitable[T]], done: Callable[[outcome.Outcome[T]], None], *,
              wait: bool) -> Callable[[], None]:
        """Run ``fn(engine)`` as a task on the run; ``done(its outcome)`` there once it ends. Returns
        ``abandon``, for a caller that stops waiting: a ``wait`` is cancelled; any other call runs on."""
        scope = trio.CancelScope()
        closed = outcome.Error(PipelineClosed("the test pipeline is closed"))

        async def task() -> None:
            answer: outcome.Outcome[Any] = closed
            try:
                with scope:
                    try:
                        answer = outcome.Value(await fn(self._open()))
                    except Exception as exc:  # noqa: BLE001 - the caller's to raise; Cancelled is not caught
                        answer = outcome.Error(exc)
            finally:
                done(answer)

        def spawn() -> None:
            if self._nursery is None or self._leave is None or self._leave.is_set():
                done(closed)
            else:
                self._nursery.start_soon(task)

        if self._token is None:
            raise PipelineClosed("the test pipeline is not open")
        try:
            self._token.run_sync_soon(spawn)
        except trio.RunFinishedError:
            raise PipelineClosed("the test pipeline is closed") from None
        return (lambda: self._to_loop(scope.cancel)) if wait else _nothing

    def call(self, fn: Callable[[_Engine], Awaitable[T]], *, wait: bool = False) -> T:
        """``fn(engine)`` from plain code in another thread, blocking until it is answered."""
        answered = threading.Event()
        box: list[outcome.Outcome[T]] = []

        def done(result: outcome.Outcome[T]) -> None:
            box.append(result)
            answered.set()

        abandon = self.start(fn, done, wait=wait)
        try:
            while not answered.wait(1.0):
                if self.thread is not None and not self.thread.is_alive() and not answered.is_set():
                    raise PipelineClosed("the test pipeline's loop ended before it answered")
        except BaseException:  # KeyboardInterrupt in the wait: a drain or result stops too
            abandon()
            raise
        return box[0].unwrap()

    async def call_from_trio(self, fn: Callable[[_Engine], Awaitable[T]], *, wait: bool = False) -> T:
        """``fn(engine)`` awaited from the test's own trio run (not this one), woken through its token."""
        token, answered = trio.lowlevel.current_trio_token(), trio.Event()
        box: list[outcome.Outcome[T]] = []

        def done(result: outcome.Outcome[T]) -> None:
            box.append(result)
            try:
                token.run_sync_soon(answered.set)
            except trio.RunFinishedError:
                pass  # the test's run ended: nobody waits

        abandon = self.start(fn, done, wait=wait)
        try:
            await answered.wait()
        except BaseException:  # trio.Cancelled: a drain or result stops too
            abandon()
            raise
        return box[0].unwrap()


def _nothing() -> None:
    """``abandon`` for a call that runs to its end whoever waits."""


def _raise_unless_left(result: outcome.Outcome[Any]) -> None:
    """The end of the engine's run, as the test's block should see it: a failed block's own stop
    (_Left) is no error of its own; anything else is raised (a group of several, as a group)."""
    if isinstance(result, outcome.Error):
        error = result.error
        if isinstance(error, BaseExceptionGroup):
            rest = error.split(_Left)[1]
            if rest is None:
                return
            error = _lone(rest)
        if not isinstance(error, _Left):
            raise error


@asynccontextmanager
async def _open_as_guest(registry: Registry, config: Config) -> AsyncIterator[TestPipeline]:
    """For asyncio tests: the engine's trio run as a guest of the test's running asyncio loop, through
    the asyncio host (engine/asyncio_host.py): the registry's asyncio handlers and lifespan run on the
    test's own loop, beside its fixtures."""
    import asyncio

    if trio.lowlevel.in_trio_run():  # this loop hosts a trio guest already (pipeline.aio.open_pipeline)
        raise UsageError("this asyncio loop already runs a trio guest (pipeline.aio.open_pipeline?), and a thread runs one "
                         "trio run at a time: open the test pipeline in a test without it, or test with that pipeline")
    loop = asyncio.get_running_loop()
    remote = _Remote(registry, config)
    opened: asyncio.Future[None] = loop.create_future()

    def now_open() -> None:
        if not opened.done():
            opened.set_result(None)

    guest = loop.create_task(run_as_guest(remote.main, now_open))

    async def ended() -> outcome.Outcome[None]:
        """The guest run's end, waited for however often the caller is cancelled meanwhile (the loop
        must not close under a guest still running: trio's rule); a cancelled caller stops the run
        at once, and is cancelled once it has ended."""
        cancelled = False
        while not guest.done():
            try:
                await asyncio.wait([guest])
            except asyncio.CancelledError:
                cancelled = True
                guest.cancel()  # run_as_guest cancels the run's main scope, and waits for its end
        if cancelled:
            raise asyncio.CancelledError
        return outcome.capture(guest.result)

    try:
        waits: list[asyncio.Future[Any]] = [opened, guest]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        guest.cancel()
        await ended()
        raise
    if not opened.done():  # it ended before it opened: why
        (await ended()).unwrap()
    assert remote.engine is not None
    try:
        yield TestPipeline(remote.engine, remote.call_on_host)
    except BaseException:
        remote.leave(failed=True)
        _raise_unless_left(await ended())
        raise
    remote.leave(failed=False)
    (await ended()).unwrap()


def _start_thread(remote: _Remote, registry: Registry, config: Config) -> tuple[threading.Event, list[outcome.Outcome[None]]]:
    """The engine's run in a thread of its own: ``trio.run``, or, for a registry with asyncio handlers
    (or an asyncio lifespan), a trio guest of a new asyncio loop (WORKER_ASYNCIO_LOOP's kind), as a
    worker process runs them. Returns the event set once it opened (or ended), and where its end goes."""
    opened = threading.Event()
    ended: list[outcome.Outcome[None]] = []

    def run_loop() -> None:
        try:
            if registry.uses_asyncio():
                ended.append(outcome.capture(asyncio_host.run, remote.main, opened.set, loop=config.worker.asyncio_loop))
            else:
                ended.append(outcome.capture(trio.run, remote.main, opened.set))
        finally:
            opened.set()

    remote.thread = threading.Thread(target=run_loop, name="pipeline-test", daemon=True)
    remote.thread.start()
    return opened, ended


@contextmanager
def _open_in_thread(registry: Registry, config: Config) -> Iterator[SyncTestPipeline]:
    """For plain (sync) tests: the engine's run in a thread of its own, as pipeline.Client's loop."""
    remote = _Remote(registry, config)
    opened, ended = _start_thread(remote, registry, config)
    assert remote.thread is not None
    try:
        opened.wait()
    except BaseException:  # KeyboardInterrupt
        remote.cancel()
        remote.thread.join()
        raise
    if ended:  # it ended before it opened: why
        ended[0].unwrap()
    try:
        yield SyncTestPipeline(remote)
    except BaseException:
        remote.leave(failed=True)
        remote.thread.join()
        _raise_unless_left(ended[0])
        raise
    remote.leave(failed=False)
    remote.thread.join()
    ended[0].unwrap()


@asynccontextmanager
async def _open_in_thread_from_trio(registry: Registry, config: Config) -> AsyncIterator[TestPipeline]:
    """For trio tests of a registry with asyncio handlers: no asyncio loop runs in the test's trio run,
    so the engine runs in a thread of its own on one (as for a plain test), answering on the test's run."""
    remote = _Remote(registry, config)
    opened, ended = _start_thread(remote, registry, config)
    thread = remote.thread
    assert thread is not None

    async def ended_here() -> None:
        with trio.CancelScope(shield=True):  # the block is not left before the engine has stopped
            await trio.to_thread.run_sync(thread.join)

    try:
        await trio.to_thread.run_sync(opened.wait)
    except BaseException:  # cancelled while it opened
        remote.cancel()
        await ended_here()
        raise
    if ended:  # it ended before it opened: why
        ended[0].unwrap()
    assert remote.engine is not None
    try:
        yield TestPipeline(remote.engine, remote.call_from_trio)
    except BaseException:
        remote.leave(failed=True)
        await ended_here()
        _raise_unless_left(ended[0])
        raise
    remote.leave(failed=False)
    await ended_here()
    ended[0].unwrap()


@asynccontextmanager
async def _open_on_trio(registry: Registry, config: Config) -> AsyncIterator[TestPipeline]:
    """For trio tests: the engine in the test's own trio run, each call awaited there."""
    async with _open_engine(registry, config) as engine:
        yield TestPipeline(engine, _direct(engine))


def _direct(engine: _Engine) -> _Runs:
    def runs(fn: Callable[[_Engine], Awaitable[T]], *, wait: bool = False) -> Awaitable[T]:
        return fn(engine)
    return runs


# -- the entry ------------------------------------------------------------------------------------------


class _TestPipelineOpener:
    """What :func:`open_test_pipeline` returns. One name for three kinds of test, so its enter picks
    the loop the engine runs on from the caller's: each is an ``@asynccontextmanager`` (or a
    ``@contextmanager``) that owns its nurseries; this class only chooses and forwards."""

    def __init__(self, registry: Registry, config: Config) -> None:
        self._args = (registry, config)
        self._async: Any = None
        self._sync: Any = None

    async def __aenter__(self) -> TestPipeline:
        library = sniffio.current_async_library()
        registry, _ = self._args
        if library == "trio" and registry.uses_asyncio() and current_host() is None:
            self._async = _open_in_thread_from_trio(*self._args)  # its asyncio handlers need a loop
        elif library == "trio":
            self._async = _open_on_trio(*self._args)
        elif library == "asyncio":
            self._async = _open_as_guest(*self._args)
        else:
            raise UsageError(f"open_test_pipeline runs under trio or asyncio, not {library}")
        return await self._async.__aenter__()

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        opened, self._async = self._async, None
        return await opened.__aexit__(*exc_info)

    def __enter__(self) -> SyncTestPipeline:
        try:
            library = sniffio.current_async_library()
        except sniffio.AsyncLibraryNotFoundError:
            pass
        else:  # the jobs would wait on the engine while the test's own loop stood still
            raise UsageError(f"a plain `with open_test_pipeline(...)` blocks the {library} loop this code runs on: "
                             "write `async with open_test_pipeline(...)` and await its calls")
        self._sync = _open_in_thread(*self._args)
        return self._sync.__enter__()

    def __exit__(self, *exc_info: Any) -> bool | None:
        opened, self._sync = self._sync, None
        return opened.__exit__(*exc_info)


def open_test_pipeline(registry: Registry, config: Config | None = None, **settings: Any) -> _TestPipelineOpener:
    """The real engine (``open_pipeline``) on a new SQLite file in a temporary folder, removed
    afterwards: ``async with`` under trio or asyncio (a :class:`TestPipeline`), a plain ``with`` in
    sync code (a :class:`SyncTestPipeline`). ``config`` or ``settings`` (variables in lower case,
    e.g. ``worker_concurrency=4``) for anything else; the environment and ``.env`` are not read.
    Leaving the block stops it as a service stops; an error in the block stops it at once."""
    if config is not None and settings:
        raise UsageError("give a config or settings, not both")
    if config is None:  # not the environment's: a test runs the same on every machine
        config = Config.from_env({"SQLITE_SYNCHRONOUS": "normal", **{name.upper(): str(value) for name, value in settings.items()}},
                                 env_file=None)
    return _TestPipelineOpener(registry, config)


def run(registry: Registry, job: Any, **settings: Any) -> TestJobRecord:
    """Enqueue ``job`` on a new test pipeline, drain it, and return the job's final record (a
    plain function, for test suites that are not async). A job that is not of a registered type,
    or does not fit it, raises UnknownJobType or InvalidPayload, as enqueue does."""
    with open_test_pipeline(registry, **settings) as p:
        job_id = p.enqueue(job)
        records = p.drain()
    return next(record for record in records if record.id == job_id)
