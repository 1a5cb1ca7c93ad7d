"""The asyncio host: the pipeline's trio code as a guest of an asyncio event loop, and the two bridges
between them.

An asyncio handler (``runtime="asyncio"``) needs a real asyncio loop running in its thread: asyncpg,
redis.asyncio, aiohttp, ``asyncio.to_thread`` all look for one. The pipeline stays trio code; in a
process that runs asyncio handlers, its trio run is a *guest* of an asyncio loop
(``trio.lowlevel.start_guest_run``): both run in one thread, the asyncio loop drives, each trio tick is
a callback on it (``loop.call_soon``), and trio waits for its own I/O in a helper thread only while it
has nothing to run. A trio task can therefore start an asyncio task and be woken by that task's
done-callback directly, with no thread hop per job. A process without asyncio handlers keeps plain
``trio.run`` and pays nothing.

A trio task that starts an asyncio task (``run_asyncio``) runs the task's first step at once, inside
its own step, as Python 3.12's eager tasks do (``_start_task``), hiding that a trio task is running
meanwhile: a handler that ends without waiting (a no-op, a cached answer) has ended before the trio
task goes on, so its worker goes on as a trio handler's would, with no turn of the loop in between.
Started the usual way, on the loop's next turn, every such job took a tick of trio's more and its
outcome came a tick later than a trio handler's; the claims then found fewer workers ready and gave
more jobs ahead: 1.7 times the commits per job, and 1.5 times trio's CPU per no-op job against 1.2
(docs/performance.md).

Entry points::

    run(trio_main, *args, loop="asyncio")      # sync: a new loop ("asyncio" or "uvloop"), trio_main as its
                                               # guest; returns what trio_main returns (as trio.run does)
    await run_as_guest(trio_main, *args)       # from asyncio code: trio_main as a guest of the loop that is
                                               # running *now* (an asyncio app embedding the pipeline)
    current_host()                             # from trio code: this run's AsyncioHost, None under trio.run

    # trio code (a pool's worker): fn(*args) as an asyncio task on the host's loop, awaited
    value = await host.run_asyncio(fn, *args)
    # asyncio code on the host's loop (an asyncio handler's ctx.emit): fn(*args) as a trio task, awaited
    value = await host.run_trio(fn, *args)

To run the pipeline inside an asyncio application (``pipeline.aio.open_pipeline``), start
``run_as_guest(main)`` as a task of the app's running loop: ``main`` is trio code that opens the pipeline
and waits (trio side) until told to stop; the app reaches it through ``current_host()`` captured in
``main`` (``host.run_trio(pipeline.enqueue, job)`` from the app's tasks). Cancelling the task that awaits
``run_as_guest`` cancels ``main``'s trio scope and waits for the guest run to end (``main`` sees
``trio.Cancelled``: a graceful stop is the caller's, by telling ``main`` to leave its blocks). One trio run
per thread: a second ``run_as_guest`` in the same thread while one runs raises RuntimeError.

Each bridge copies the caller's context into the task it starts (``contextvars.copy_context()``): the
middleware's context variables and the OpenTelemetry span set in a trio task are current in the asyncio
handler it starts, and an asyncio handler's own in the trio work it asks for.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import signal
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar, cast

import attrs
import outcome
import sniffio
import trio

from ..errors import ConfigError

T = TypeVar("T")

LOOPS = ("asyncio", "uvloop")  # WORKER_ASYNCIO_LOOP's values
# at the end of run(): how long the asyncio tasks still running (handlers abandoned because they
# swallowed their cancellation) get to end once cancelled again, before the loop is closed under them
LEFTOVER_WAIT = 1.0

_HOST: trio.lowlevel.RunVar[AsyncioHost] = trio.lowlevel.RunVar("pipeline_asyncio_host")

# trio's record of the task it runs now (``.task``; private to trio, hence the guard): an asyncio task's
# first step run inside a trio task's (_start_task) hides it, so that the step sees what every asyncio
# task sees (in a trio run, in no trio task: host.on_loop(), pipeline.aio, trio's own refusals). Without
# it (a trio that moved it), tasks start the usual way, on the loop's next turn.
_TRIO_RUN: Any = getattr(getattr(getattr(trio, "_core", None), "_run", None), "GLOBAL_RUN_CONTEXT", None)


def current_host() -> AsyncioHost | None:
    """The asyncio host of this trio run; None under a plain ``trio.run`` (no asyncio loop runs here).
    A guest run that other code started (``trio.lowlevel.start_guest_run`` on an asyncio loop, not
    through :func:`run_as_guest`) gets one at its first call: its loop is the one running in this thread."""
    try:
        return _HOST.get()
    except LookupError:
        pass
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    host = AsyncioHost(loop, trio.lowlevel.current_trio_token())
    _HOST.set(host)
    return host


@attrs.define(eq=False)
class AsyncioHost:
    """The asyncio loop a trio run is the guest of, and the bridges between the two. Made by
    :func:`run_as_guest`; trio code finds it with :func:`current_host`."""

    loop: asyncio.AbstractEventLoop
    token: trio.lowlevel.TrioToken  # the guest run's: threads (asyncio.to_thread) reach trio through it
    # the guest's main task's scope: run_as_guest's caller cancelled ends the guest run through it
    main_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)

    def on_loop(self) -> bool:
        """Whether the caller runs in this host's thread outside a trio task: in an asyncio task (or a
        callback) of the loop, where trio's functions that wait cannot be awaited."""
        return trio.lowlevel.in_trio_run() and not trio.lowlevel.in_trio_task()

    async def run_asyncio(
        self, fn: Callable[..., Awaitable[T]], *args: Any, grace: float = math.inf,
        abandoned: Callable[[], None] | None = None,
    ) -> T:
        """From a trio task: run ``fn(*args)`` as an asyncio task on the loop, in a copy of the trio
        task's context, and return what it returns (or raise what it raises).

        When the trio task is cancelled (its scope: a timeout, a cancel request), the asyncio task is
        cancelled (``task.cancel()``: ``asyncio.CancelledError`` inside it) and waited for: if it ends
        cancelled, the trio task sees its ``trio.Cancelled``; if it caught the CancelledError and
        returned (or raised), that stands, as for a trio task that caught its Cancelled. One still
        running ``grace`` seconds after its cancellation is abandoned: ``abandoned()`` is called, the
        trio task sees its ``trio.Cancelled``, and the asyncio task runs on, whatever it does later
        ignored."""
        # (fn is an async def, or a partial or an object whose __call__ is one: its call is a coroutine)
        coro = cast("Coroutine[Any, Any, T]", fn(*args))
        waiting = _Waiting(trio.lowlevel.current_task())
        # the task's own coroutine wakes the trio task as it ends: no done-callback, so no loop iteration
        # of its own between the handler's return and the trio side's. Its first step runs now (see the
        # module's docstring): a handler that ends there has ended when _start_task returns
        task = _start_task(self.loop, _reporting(coro, waiting), contextvars.copy_context())
        if waiting.woken:
            return _unwrap(waiting, fn)
        # One yield before waiting, this task left runnable: trio's tick then ends with work to do, so its
        # next tick is queued on the loop (after the task's first step, queued above) instead of trio waiting
        # for I/O in its helper thread. A handler that ends in its first step (no I/O, or none that waits)
        # has ended when this task runs again (one whose first step could not run now: see _start_task).
        # Waiting at once, trio went to its thread with nothing left to run, and the handler's end had to
        # wake it there: a wake-up of the thread, then the thread's call back into the loop (two thread
        # hops, ~20 µs a job)
        await trio.lowlevel.cancel_shielded_checkpoint()
        if waiting.woken:
            return _unwrap(waiting, fn)
        waiting.parked = True

        def abort(_: Any) -> trio.lowlevel.Abort:
            waiting.cancelling = True
            task.cancel()
            if math.isfinite(grace):
                waiting.timer = self.loop.call_later(grace, waiting.give_up)
            return trio.lowlevel.Abort.FAILED  # the trio task waits for the asyncio task's end

        await trio.lowlevel.wait_task_rescheduled(abort)
        if waiting.ended is None:  # abandoned: the grace passed
            if abandoned is not None:
                abandoned()
            await trio.lowlevel.checkpoint()  # its scope was cancelled (abort ran): trio.Cancelled here
            raise RuntimeError(f"the asyncio task running {_name(fn)} was abandoned: it did not stop within "
                               f"{grace:g} s of its cancellation")
        if waiting.cancelling and isinstance(waiting.ended, outcome.Error) and isinstance(waiting.ended.error,
                                                                                        asyncio.CancelledError):
            await trio.lowlevel.checkpoint()  # trio.Cancelled, the cancellation that ended it
        return _unwrap(waiting, fn)

    async def run_trio(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """From asyncio code on the host's loop (an asyncio task): run ``fn(*args)`` as a trio task, in a
        copy of the asyncio task's context, and return what it returns (or raise what it raises). If
        the asyncio task is cancelled meanwhile, the trio task is cancelled too (``trio.Cancelled`` at
        its next checkpoint) and the CancelledError goes on. A trio run that ends first raises
        ``trio.RunFinishedError``."""
        future: asyncio.Future[T] = self.loop.create_future()
        scope = trio.CancelScope()

        async def call() -> None:
            try:
                with scope:
                    value = await fn(*args)
                    if not future.done():
                        future.set_result(value)
                    return
            except Exception as exc:  # the caller's to handle, in its own task (a system task must not raise)
                if not future.done():
                    future.set_exception(exc)
                return
            except BaseException:  # trio.Cancelled: the run is ending (the host's scope is the caller's)
                if not future.done():
                    future.set_exception(trio.RunFinishedError(f"the trio run ended before {_name(fn)} did"))
                raise
            finally:
                if not future.done():  # our scope caught its cancellation: the caller was cancelled
                    future.cancel()

        # a system task: run from a host callback, outside any trio task, it belongs to no nursery
        # of the caller's; the run's end cancels it (see call's BaseException)
        trio.lowlevel.spawn_system_task(call, name=_name(fn), context=contextvars.copy_context())
        try:
            return await future
        except asyncio.CancelledError:
            scope.cancel()
            raise


def _start_task(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any],
                context: contextvars.Context) -> asyncio.Task[Any]:
    """``loop.create_task(coro, context=context)`` from a trio task, the task's first step run before
    this returns, as Python 3.12's eager tasks run theirs (on every Python this supports): the step
    create_task hands the loop's ``call_soon`` is taken from it and run here, in the task's context.
    Meanwhile the trio task is hidden (``_TRIO_RUN``) and sniffio's trio mark cleared, so that the step
    sees what it would see on the loop's next turn: an asyncio task, in a trio run, in no trio task.
    A loop with a task factory of the app's makes the task as the factory does (an eager one, Python
    3.12's ``asyncio.eager_task_factory``, runs the step in create_task, the trio task hidden all the
    same); so does a loop whose ``call_soon`` cannot be overridden for the call, or one with an asyncio
    task running already (not a guest tick: nothing here runs then)."""
    trio_task = getattr(_TRIO_RUN, "task", None)
    if trio_task is None or asyncio.current_task(loop) is not None:
        return loop.create_task(coro, context=context)
    steps: list[tuple[Callable[..., Any], tuple[Any, ...], contextvars.Context | None]] = []

    def step_soon(callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None) -> None:
        steps.append((callback, args, context))  # (the C Task ignores what call_soon returns)

    take = loop.get_task_factory() is None
    if take:
        try:
            loop.call_soon = step_soon  # type: ignore[assignment]  # (an instance attribute: this call only)
        except AttributeError:  # a loop without instance attributes
            take = False
    library = sniffio.thread_local.name
    del _TRIO_RUN.task
    sniffio.thread_local.name = None
    try:
        try:
            task = loop.create_task(coro, context=context)
        finally:
            if take:
                del loop.call_soon
        if take:
            callback, args, step_context = steps[0] if len(steps) == 1 else (None, (), None)
            if callback is not None and step_context is not None and getattr(callback, "__self__", None) is task:
                step_context.run(callback, *args)
            else:  # (what Task() never does: scheduled as asked)
                for queued, queued_args, queued_context in steps:
                    loop.call_soon(queued, *queued_args, context=queued_context)
    finally:
        _TRIO_RUN.task = trio_task
        sniffio.thread_local.name = library
    return task


def _unwrap(waiting: _Waiting, fn: Any) -> Any:
    """What the asyncio task's coroutine returned, or its error raised; a CancelledError the trio side
    did not ask for (the task cancelled from within asyncio) as a RuntimeError saying so."""
    ended = waiting.ended
    assert ended is not None
    if isinstance(ended, outcome.Error) and isinstance(ended.error, asyncio.CancelledError):
        raise RuntimeError(f"the asyncio task running {_name(fn)} was cancelled from within asyncio, not by "
                           "its caller (did the coroutine cancel its own task, or the loop close?)")
    return ended.unwrap()


class _Waiting:
    """A trio task waiting for an asyncio task (run_asyncio): written on the loop's thread, by the
    task's coroutine as it ends (``finish``), the grace's timer (``give_up``) and the trio side."""

    __slots__ = ("cancelling", "ended", "parked", "timer", "trio_task", "woken")

    def __init__(self, trio_task: trio.lowlevel.Task) -> None:
        self.trio_task = trio_task
        self.woken = False  # the task ended (or was given up on): the trio side takes it from here
        # the trio task sleeps in wait_task_rescheduled, to be rescheduled once; False while it has not got
        # there yet (its yield after making the task): an end before then is only noted, the trio side reads it
        self.parked = False
        self.cancelling = False  # the trio side was cancelled: the asyncio task was asked to stop
        self.ended: outcome.Outcome[Any] | None = None  # what the coroutine returned or raised; None: abandoned
        self.timer: asyncio.TimerHandle | None = None

    def finish(self, ended: outcome.Outcome[Any]) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if not self.woken:  # (an abandoned task's end is nobody's business)
            self.woken = True
            self.ended = ended
            if self.parked:
                trio.lowlevel.reschedule(self.trio_task)

    def give_up(self) -> None:  # (only once the trio side was cancelled: it is parked)
        if not self.woken:
            self.woken = True
            trio.lowlevel.reschedule(self.trio_task)


async def _reporting(coro: Coroutine[Any, Any, Any], waiting: _Waiting) -> None:
    """The asyncio task's coroutine: ``coro``, its end handed to the waiting trio task. What it raised
    goes there, not into the task (nobody reads the task: no "exception was never retrieved")."""
    try:
        value = await coro
    except (KeyboardInterrupt, SystemExit) as exc:
        waiting.finish(outcome.Error(exc))
        raise  # the loop's to stop on, as asyncio does
    except BaseException as exc:  # noqa: BLE001 - CancelledError included: the trio side decides
        waiting.finish(outcome.Error(exc))
    else:
        waiting.finish(outcome.Value(value))


def _name(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn))


async def run_as_guest(trio_main: Callable[..., Awaitable[T]], *args: Any) -> T:
    """From asyncio code: run ``trio_main(*args)`` as a trio guest of the running loop, and return what
    it returns (or raise what it raises), as ``trio.run`` would. Inside, :func:`current_host` is the
    host. Cancelling the awaiting task cancels ``trio_main`` (its trio scope) and waits for the guest
    run to end before the CancelledError goes on."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[outcome.Outcome[Any]] = loop.create_future()
    made: list[AsyncioHost] = []

    async def main() -> T | None:
        host = AsyncioHost(loop, trio.lowlevel.current_trio_token())
        _HOST.set(host)
        made.append(host)
        with host.main_scope:
            return await trio_main(*args)
        return None  # cancelled by run_as_guest's caller, who goes on with its CancelledError

    def finished(result: outcome.Outcome[Any]) -> None:
        if not done.done():
            done.set_result(result)

    trio.lowlevel.start_guest_run(
        main,
        run_sync_soon_threadsafe=loop.call_soon_threadsafe,
        run_sync_soon_not_threadsafe=loop.call_soon,
        done_callback=finished,
        # the loop may have set signal.set_wakeup_fd (uvloop does, asyncio with add_signal_handler):
        # trio then leaves it alone (a signal wakes the loop, whose thread runs trio's Python handlers)
        host_uses_signal_set_wakeup_fd=_host_wakeup_fd(),
    )
    try:
        result = await asyncio.shield(done)
    except asyncio.CancelledError:
        if made:
            made[0].main_scope.cancel()
        while not done.done():
            try:
                await asyncio.shield(done)
            except asyncio.CancelledError:
                continue  # cancelled again: the guest run still has to end first
        raise
    value: T = result.unwrap()
    return value


def _host_wakeup_fd() -> bool:
    """Whether this thread's loop set a signal wakeup fd (only the main thread has one)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    fd = signal.set_wakeup_fd(-1)
    if fd != -1:
        signal.set_wakeup_fd(fd)
    return fd != -1


def new_loop(name: str = "asyncio") -> asyncio.AbstractEventLoop:
    """A new event loop of WORKER_ASYNCIO_LOOP's kind: "asyncio" (the standard library's) or "uvloop"
    (ConfigError, naming the variable and the install, when it is not installed)."""
    check_loop(name)
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def check_loop(name: str) -> None:
    """ConfigError unless the loop WORKER_ASYNCIO_LOOP names can be made here."""
    if name not in LOOPS:
        raise ConfigError(f"WORKER_ASYNCIO_LOOP={name!r} is not valid: expected one of {', '.join(LOOPS)}")
    if name != "uvloop":
        return
    try:
        import uvloop  # noqa: F401 - imported once here, made use of by new_loop
    except ImportError:
        raise ConfigError("WORKER_ASYNCIO_LOOP=uvloop, but uvloop is not installed: pip install 'trio-pipeline[asyncio]' "
                          "(or pip install uvloop), or unset WORKER_ASYNCIO_LOOP for the standard library's loop") from None


def run(trio_main: Callable[..., Awaitable[T]], *args: Any, loop: str = "asyncio") -> T:
    """``trio.run(trio_main, *args)``, on a new asyncio loop (``loop``: "asyncio" or "uvloop") whose guest
    it is; returns (or raises) what ``trio_main`` does. The loop is this thread's event loop while it
    runs. At the end, as ``asyncio.run`` does: the asyncio tasks still running are cancelled (and given
    LEFTOVER_WAIT seconds), async generators and the default executor are shut down, the loop closed."""
    event_loop = new_loop(loop)
    try:
        asyncio.set_event_loop(event_loop)
        return event_loop.run_until_complete(run_as_guest(trio_main, *args))
    finally:
        try:
            _cancel_leftovers(event_loop)
            event_loop.run_until_complete(event_loop.shutdown_asyncgens())
            event_loop.run_until_complete(_bounded(event_loop.shutdown_default_executor(), LEFTOVER_WAIT))
        finally:
            asyncio.set_event_loop(None)
            event_loop.close()


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    loop.run_until_complete(asyncio.wait(tasks, timeout=LEFTOVER_WAIT))
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: the app's own tasks' errors at exit are not worth a log line each


async def _bounded(work: Awaitable[None], seconds: float) -> None:
    # a thread of asyncio.to_thread that never returns must not hold the process's exit for ever
    try:
        await asyncio.wait_for(work, seconds)
    except TimeoutError:
        pass
