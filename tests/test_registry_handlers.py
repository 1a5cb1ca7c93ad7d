"""Registry.register sorts handlers at registration: what runs as a coroutine runs on the trio
loop; a plain callable is a sync handler, run in a thread (tests/test_handlers_sync.py); what
calling could never run a job (a class, a generator, an async generator, what is not callable)
is refused with a TypeError naming the job type and what the handler is."""

from __future__ import annotations

import functools
import gc
from typing import Any

import pytest
from jobkit import Echo, wait_status

import pipeline
from pipeline import Config


def _refusal(reg: pipeline.Registry, handler: Any) -> str:
    with pytest.raises(TypeError) as caught:
        reg.register("echo", Echo, handler)
    assert "echo" not in reg.handled()
    return str(caught.value)


def test_what_could_never_run_a_job_is_refused_at_registration() -> None:
    async def yields(job: Echo, ctx: pipeline.JobContext) -> Any:
        yield None

    def generates(job: Echo, ctx: pipeline.JobContext) -> Any:
        yield None

    class AsyncCall:
        async def __call__(self, job: Echo, ctx: pipeline.JobContext) -> None:
            return None

    class YieldingCall:
        async def __call__(self, job: Echo, ctx: pipeline.JobContext) -> Any:
            yield None

    reg = pipeline.Registry()
    refusals = {
        "yields is an async generator function": yields,
        "generates is a generator function": generates,
        "YieldingCall.__call__ is an async generator function": YieldingCall(),
        "is a class (": AsyncCall,  # the class, not an instance of it
        "not callable (got str)": "echo",
    }
    for expected, handler in refusals.items():
        message = _refusal(reg, handler)
        assert expected in message and "job type 'echo'" in message, message
    with pytest.raises(TypeError, match="async generator"):  # the decorator forms go through the same check
        reg.register("echo", Echo)
        reg.handle("echo")(yields)
    assert "echo" not in reg.handled()


def test_plain_callables_are_sync_handlers() -> None:
    def send_invoice(job: Echo, ctx: pipeline.JobContext) -> None:
        pass

    class SyncCall:
        def __call__(self, job: Echo, ctx: pipeline.JobContext) -> None:
            pass

    for handler in [send_invoice, SyncCall(), functools.partial(print, "x"), lambda job, ctx: None]:
        reg = pipeline.Registry()
        reg.register("echo", Echo, handler)
        spec = reg.handled()["echo"]
        assert spec.handler is handler and spec.sync


async def test_a_plain_callable_returning_a_coroutine_goes_dead_at_once_saying_why(
    config: Config, recwarn: pytest.WarningsRecorder
) -> None:
    """What a sync callable returns cannot be known before calling it: a lambda around an async
    def is run in a thread, returns a coroutine that nothing would await, and the job is dead at
    once (retrying would not help), with the coroutine closed."""
    ran: list[str] = []

    async def inner(job: Echo, ctx: pipeline.JobContext) -> None:
        ran.append(job.text)

    class SyncCall:
        def __call__(self, job: Echo, ctx: pipeline.JobContext) -> Any:
            return inner(job, ctx)

    for handler in [lambda job, ctx: inner(job, ctx), SyncCall()]:
        reg = pipeline.Registry()
        reg.register("echo", Echo, handler)
        async with pipeline.open_pipeline(config, reg) as p:
            job = await wait_status(p, await p.enqueue(Echo("hi")), "completed", "dead")
        assert (job.status, job.attempts, ran) == ("dead", 1, [])
        assert job.error is not None and "returned coroutine" in job.error and "async def" in job.error, job.error
    gc.collect()
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


async def test_coroutine_callables_are_accepted_and_run(config: Config) -> None:
    ran: list[str] = []

    async def by_function(job: Echo, ctx: pipeline.JobContext, tag: str = "function") -> None:
        ran.append(f"{tag}:{job.text}")

    class Sender:
        async def send(self, job: Echo, ctx: pipeline.JobContext) -> None:
            ran.append(f"method:{job.text}")

    class Callable:
        async def __call__(self, job: Echo, ctx: pipeline.JobContext) -> None:
            ran.append(f"object:{job.text}")

    handlers: list[Any] = [by_function, Sender().send, Callable(), functools.partial(by_function, tag="partial"),
                           functools.partial(Callable())]
    for handler in handlers:
        reg = pipeline.Registry()
        reg.register("echo", Echo, handler)
        assert reg.handled()["echo"].handler is handler
    # one of them end to end: an object with an async __call__ runs like a function
    reg = pipeline.Registry()
    reg.register("echo", Echo, Callable())
    async with pipeline.open_pipeline(config, reg) as p:
        job = await wait_status(p, await p.enqueue(Echo("hi")), "completed", "dead")
    assert (job.status, job.attempts, ran) == ("completed", 1, ["object:hi"])


def test_an_async_handler_behind_a_functools_wraps_decorator_runs_as_async() -> None:
    """A plain `def` wrapper made with functools.wraps around an `async def` (a common decorator
    shape) was taken for a sync handler: run in a thread, it returned the coroutine and the job went
    dead. What it wraps decides: it runs on the loop, as before sync handlers existed."""
    from pipeline.testing import run

    ran: list[str] = []

    def logged(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(job: Echo, ctx: pipeline.JobContext) -> Any:
            ran.append(ctx.id)
            return fn(job, ctx)

        return wrapper

    @logged
    async def echo(job: Echo, ctx: pipeline.JobContext) -> None:
        pass

    reg = pipeline.Registry()
    reg.register("echo", Echo, echo)
    assert reg.spec("echo").sync is False
    record = run(reg, Echo("wrapped"))
    assert (record.status, ran) == ("completed", [record.id]), record
