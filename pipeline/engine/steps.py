"""Durable functions on the worker side (docs/durable.md): ``ctx.step``, ``ctx.sleep``, ``ctx.wait_for``.

A job that uses them is run again from the top whenever it resumes; each call finds what an earlier
run of the job committed (its steps, read once per run) and returns it without doing the work again.
The logic of each call is written once, as a generator that yields what it needs done (a store
operation, on the trio side; a call of the user's function, in the handler's own runtime) and is
driven by one of three drivers: a trio handler's (awaits both), an asyncio handler's (store operations
hop to trio, the user's function is awaited on asyncio), a sync handler's thread (store operations are
run on the loop with trio.from_thread).

A run leaves its handler by raising :class:`Suspended` (ctx.sleep, ctx.wait_for without its signal),
which the pool turns into a SUSPEND outcome: the job is ``suspended`` in the store, holding nothing,
until its time or its signal comes. A step whose commit finds its lease gone raises :class:`LeaseGone`:
another run has the job, this one stops writing.
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
import math
import time
import typing
from collections.abc import Callable, Generator
from typing import Any

import attrs
import trio

from ..backends.base import Backend, Settlement, StepRecord
from ..clock import format_ts, now_ts, to_epoch
from ..errors import SignalTimeout, UsageError
from ..texts import check_name
from ..states import Transition

MAX_STEP_NAME_CHARS = 200
MAX_SECONDS = 100 * 365.25 * 86400  # the longest sleep or wait timeout: a stored time stays a four-digit year
# the records a run writes of its own (a sleep, a wait) are named so that no step of the user's can be
SLEEP_PREFIX, WAIT_PREFIX = "@sleep#", "@wait:"


class Suspended(BaseException):
    """ctx.sleep / ctx.wait_for leaving the handler: the job is suspended, not failed. A BaseException, as
    trio's Cancelled is, so that a handler's ``except Exception`` does not swallow it (let it through)."""

    def __init__(self, delay: float, awaiting: str | None, step: StepRecord | None) -> None:
        super().__init__(f"suspended ({'awaiting ' + repr(awaiting) if awaiting else 'sleeping'})")
        self.delay, self.awaiting, self.step = delay, awaiting, step


class LeaseGone(BaseException):
    """A step's write found the job no longer running under this run's lease (rescued after a lost lease,
    cancelled, or taken over): this run stops; the job's current run goes on without it."""


class StepRefused(Exception):
    """A step's value that cannot be stored: the attempt fails for good (running it again would repeat
    the step's work to get a value that cannot be stored either)."""


@attrs.frozen
class Store:
    """A store operation a step's logic asks for: ``fn(*args)``, a trio coroutine function."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()


@attrs.frozen
class Call:
    """The user's function a step's logic asks to be called, in the handler's runtime (awaited if it returns an awaitable)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


Logic = Generator[Store | Call, Any, Any]


@attrs.define
class Durable:
    """What every durable run of this process uses: the store, how values are stored and read back, and
    the waker to tell when a job it suspends is due (so that a short sleep resumes on time)."""

    backend: Backend
    encode: Callable[[Any], str | None]  # a value as JSON text (Pipeline.encode_result: its size limit included)
    structure: Callable[[Any, Any], Any]  # the registry's converter's structure
    due: Callable[[float], None] = lambda seconds: None  # a job this process suspends is due in so many seconds


@attrs.define
class Run:
    """One attempt's durable state: the job's steps as the store had them when first asked (and as
    written since), the names used in this run, and how many sleeps and waits of each name it made."""

    durable: Durable
    job_id: str
    token: int
    steps: dict[str, StepRecord] | None = None
    used: set[str] = attrs.field(factory=set)
    counts: dict[str, int] = attrs.field(factory=dict)
    committed: int = 0  # steps this run committed (the outcome's "steps": metrics)
    inside: str | None = None  # the step whose function runs now (a durable call inside it is refused)
    left: Suspended | None = None  # the suspension this run raised (a handler that swallowed it is told)

    def next_name(self, prefix: str) -> str:
        n = self.counts.get(prefix, 0) + 1
        self.counts[prefix] = n
        return f"{prefix}#{n}" if prefix.startswith(WAIT_PREFIX) else f"{prefix}{n}"

    # -- store operations (trio) --

    async def load(self) -> dict[str, StepRecord]:
        if self.steps is None:
            self.steps = {step.name: step for step in await self.durable.backend.steps(self.job_id)}
        return self.steps

    async def commit(self, step: StepRecord) -> None:
        (held,) = await self.durable.backend.settle([Settlement(self.job_id, self.token, Transition.STEP, step=step)])
        if not held:
            raise LeaseGone(f"job {self.job_id}: its lease is gone, step {step.name!r} was not stored")
        assert self.steps is not None
        self.steps[step.name] = step

    async def take(self, name: str, step: StepRecord) -> tuple[bool, str | None]:
        got = await self.durable.backend.take_signal(self.job_id, self.token, name, step)
        if got is None:
            raise LeaseGone(f"job {self.job_id}: its lease is gone, its wait for {name!r} stops")
        if got[0]:
            assert self.steps is not None
            self.steps[step.name] = attrs.evolve(step, value=got[1])
        return got


def check_step_name(value: Any) -> str:
    name = check_name(value, "a step's name", MAX_STEP_NAME_CHARS)
    if name.startswith("@"):
        raise UsageError(f"step name {name!r}: names beginning with '@' are the pipeline's own (sleeps and waits)")
    return name


def seconds_of(value: Any, what: str) -> float:
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(f"{what} must be seconds (a number) or a timedelta, got {type(value).__name__}")
    else:
        seconds = float(value)
    if not 0 <= seconds < math.inf:
        raise UsageError(f"{what} must be a finite number of seconds >= 0, got {value!r:.40}")
    if seconds > MAX_SECONDS:
        raise UsageError(f"{what} must be at most {MAX_SECONDS:.0f} seconds (a hundred years), got {value!r:.40}"
                         + (" (for no timeout, leave it None)" if "timeout" in what else ""))
    return seconds


def _read_back(durable: Durable, fn: Callable[..., Any], text: str | None) -> Any:
    """A stored step value as ``fn`` returned it: through its return annotation, if it has one the
    registry's converter can structure; else as JSON gives it back."""
    if text is None:
        return None
    value = json.loads(text)
    try:
        hint = typing.get_type_hints(fn).get("return")
    except Exception:  # a forward reference that does not resolve, a builtin: the JSON form
        hint = None
    if hint is None or hint is Any or value is None:
        return value
    try:
        return durable.structure(value, hint)
    except Exception:  # stored by an earlier version of the function that returned something else
        return value


# -- the logic of each call ------------------------------------------------------------------------


def _not_inside(run: Run, call: str) -> None:
    if run.inside is not None:
        raise UsageError(f"{call} inside the function of step {run.inside!r}: a step's function runs once and is not "
                         "resumed; call it from the handler, between steps")


def _leave(run: Run, how: Suspended) -> Suspended:
    run.left = how
    return how


def step_logic(run: Run, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Logic:
    _not_inside(run, f"ctx.step({name!r})")
    if name in run.used:
        raise UsageError(f"step {name!r} is used twice in one run of job {run.job_id}: each step needs a name of its own "
                         "(a loop's steps: put the index in the name)")
    run.used.add(name)
    steps = yield Store(run.load)
    found = steps.get(name)
    if found is not None and found.status == "completed":
        return _read_back(run.durable, fn, found.value)
    started = now_ts()
    run.inside = name
    try:
        value = yield Call(fn, args, kwargs)
    finally:
        run.inside = None
    try:
        text = run.durable.encode(value)
    except Exception as exc:  # ResultRefused (too large, no JSON form): say it is the step's
        raise StepRefused(f"step {name!r}: its value cannot be stored: {exc}") from None
    yield Store(run.commit, (StepRecord(name, "completed", text, started, now_ts()),))
    run.committed += 1
    return value


def sleep_logic(run: Run, seconds: float) -> Logic:
    _not_inside(run, "ctx.sleep")
    name = run.next_name(SLEEP_PREFIX)
    steps = yield Store(run.load)
    if name in steps:  # written as the job suspended: it slept
        return None
    now = time.time()
    until = format_ts(now + seconds)
    # written with the SUSPEND: the job leaves suspended only when this time comes (or it is cancelled)
    raise _leave(run, Suspended(seconds, None, StepRecord(name, "completed", json.dumps(until), format_ts(now), until)))


def wait_logic(run: Run, name: str, timeout: float | None) -> Logic:
    _not_inside(run, f"ctx.wait_for({name!r})")
    key = run.next_name(WAIT_PREFIX + name)
    steps = yield Store(run.load)
    found = steps.get(key)
    if found is not None and found.status == "completed":
        return None if found.value is None else json.loads(found.value)
    if found is not None and found.status == "timed_out":
        raise SignalTimeout(run.job_id, name, timeout)
    now = time.time()
    started = found.started_at if found is not None else format_ts(now)
    got, payload = yield Store(run.take, (name, StepRecord(key, "completed", None, started, format_ts(now))))
    if got:
        return None if payload is None else json.loads(payload)
    if found is not None:  # waited before: its deadline is the first wait's
        until = json.loads(found.value or "null")
        deadline = None if until is None else to_epoch(until)
    else:
        deadline = None if timeout is None else now + timeout
    if deadline is not None and now >= deadline:
        yield Store(run.commit, (StepRecord(key, "timed_out", None, started, format_ts(now)),))
        raise SignalTimeout(run.job_id, name, timeout)
    until_text = None if deadline is None else format_ts(deadline)
    raise _leave(run, Suspended(math.inf if deadline is None else max(deadline - now, 0.0), name,
                                StepRecord(key, "waiting", json.dumps(until_text), started, None)))


# -- the drivers -------------------------------------------------------------------------------------

_OVER = ("the attempt is over (it ended, or its thread or asyncio task was abandoned at its timeout, a cancel or "
         "shutdown): its steps, sleeps and waits are refused")


async def _kept(fn: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
    """A store operation on the trio side for an asyncio task: a lost lease comes back as a value (a
    BaseException raised in the host's trio task would end the whole run, not the handler's)."""
    try:
        return True, await fn(*args)
    except LeaseGone as gone:
        return False, gone


async def drive_async(logic: Logic, run_trio: Callable[..., Any] | None = None,
                      over: Callable[[], bool] = lambda: False) -> Any:
    """An async handler's: the user's function awaited here. A trio handler's store operations are
    awaited here too; an asyncio handler's hop to the trio side (``run_trio``), and ``over`` says its
    attempt has ended (its task abandoned after its cancellation): nothing more of it runs."""
    sent: Any = None
    while True:
        try:
            ask = logic.send(sent)
        except StopIteration as stop:
            return stop.value
        if over():
            raise UsageError(_OVER)
        if isinstance(ask, Store):
            if run_trio is None:
                sent = await ask.fn(*ask.args)
                continue
            done, sent = await run_trio(_kept, ask.fn, *ask.args)
            if not done:
                raise sent
        else:
            sent = ask.fn(*ask.args, **ask.kwargs)
            if inspect.isawaitable(sent):
                sent = await sent


def drive_thread(logic: Logic, token: trio.lowlevel.TrioToken | None, over: Callable[[], bool]) -> Any:
    """A sync handler's (or a thread's): store operations run on the loop; the user's function here,
    which must be a plain one."""
    sent: Any = None
    while True:
        try:
            ask = logic.send(sent)
        except StopIteration as stop:
            return stop.value
        if isinstance(ask, Store):
            if over():
                raise UsageError(_OVER)
            sent = trio.from_thread.run(ask.fn, *ask.args, trio_token=token)
        else:
            sent = ask.fn(*ask.args, **ask.kwargs)
            if inspect.isawaitable(sent):
                close = getattr(sent, "close", None)
                if close is not None:
                    close()
                raise UsageError(f"a sync handler's step {getattr(ask.fn, '__qualname__', ask.fn)!r} returned an awaitable: "
                                 "in a plain `def` handler, a step's function must be a plain function too")
