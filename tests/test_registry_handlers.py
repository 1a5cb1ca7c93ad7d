"""Registry.register refuses, at registration, a handler a worker could only find out about by
running it: a plain ``def`` ran its side effect in full, then ``await`` failed on its None
("object NoneType can't be used in 'await' expression") and the job was retried, side effect
and all. What runs as a coroutine is still accepted, and runs."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from jobkit import Echo, wait_status

import pipeline
from pipeline import Config

SYNC = "sync handlers are not supported yet"


def _refusal(reg: pipeline.Registry, handler: Any) -> str:
    with pytest.raises(TypeError) as caught:
        reg.register("echo", Echo, handler)
    assert "echo" not in reg.handled()
    return str(caught.value)


def test_a_plain_def_is_refused_and_never_run() -> None:
    side_effects: list[str] = []

    def send_invoice(job: Echo, ctx: pipeline.JobContext) -> None:
        side_effects.append(job.text)  # a mail sent, a card charged

    reg = pipeline.Registry()
    message = _refusal(reg, send_invoice)
    assert "job type 'echo'" in message and "send_invoice" in message and "plain (sync) function" in message
    assert "async def" in message and SYNC in message and "trio.to_thread.run_sync" in message
    with pytest.raises(TypeError, match=SYNC):  # the decorator form goes through the same check
        reg.register("echo", Echo)
        reg.handle("echo")(send_invoice)
    assert "echo" not in reg.handled() and side_effects == []


def test_what_only_returns_an_awaitable_is_refused_too() -> None:
    """A sync callable cannot be told from one with side effects without calling it: refused."""

    async def inner(job: Echo, ctx: pipeline.JobContext) -> None:
        return None

    class SyncCall:
        def __call__(self, job: Echo, ctx: pipeline.JobContext) -> Any:
            return inner(job, ctx)

    async def yields(job: Echo, ctx: pipeline.JobContext) -> Any:
        yield None

    class AsyncCall:
        async def __call__(self, job: Echo, ctx: pipeline.JobContext) -> None:
            return None

    reg = pipeline.Registry()
    refusals = {
        "plain (sync) function": lambda job, ctx: inner(job, ctx),
        "SyncCall object whose __call__ is not async def": SyncCall(),
        "async generator function": yields,
        "is a class (": AsyncCall,  # the class, not an instance of it
        "not callable (got str)": "echo",
        "print is a plain (sync) function": functools.partial(print, "x"),
    }
    for expected, handler in refusals.items():
        message = _refusal(reg, handler)
        assert expected in message and SYNC in message, message

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
