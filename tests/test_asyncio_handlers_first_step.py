"""The asyncio host runs an asyncio task's first step at once, inside the trio task that starts it
(engine/asyncio_host.py, ``_start_task``): a handler that ends without waiting has ended before its
trio worker goes on, with no turn of the loop in between (what keeps an asyncio no-op job's CPU near a
trio one's: docs/performance.md); and that first step sees what any asyncio task sees."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest
import sniffio
import trio

from pipeline.engine import asyncio_host

REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("REQUEST", default="none")


@pytest.mark.parametrize("loop", asyncio_host.LOOPS)
def test_a_task_that_ends_in_its_first_step_has_ended_with_no_turn_of_the_loop(loop: str) -> None:
    """A callback queued on the loop before the call has not run when the call returns: the handler ran
    and ended inside the trio task's step. One that waits is waited for as before (the callback ran)."""

    async def noop(n: int) -> int:
        return n + 1

    async def waits(n: int) -> int:
        await asyncio.sleep(0.001)
        return n + 2

    async def main() -> tuple[list[str], int, list[str], int]:
        host = asyncio_host.current_host()
        assert host is not None
        turns: list[str] = []
        host.loop.call_soon(turns.append, "turn")
        ended = await host.run_asyncio(noop, 1)
        before = list(turns)
        waited = await host.run_asyncio(waits, 1)
        return before, ended, turns, waited

    before, ended, turns, waited = asyncio_host.run(main, loop=loop)
    assert (before, ended) == ([], 2)
    assert (turns, waited) == (["turn"], 3)


def test_the_first_step_sees_an_asyncio_task_in_no_trio_task_and_the_callers_context() -> None:
    """In its first step (before any await), the handler is an asyncio task, sniffio says asyncio, trio
    says a run but no task (so the host's bridges and trio's refusals see what they see later on),
    and the caller's context variables are there; the trio task's own view is back once it returns."""

    def look() -> dict[str, Any]:
        return {"task": asyncio.current_task() is not None, "library": sniffio.current_async_library(),
                "trio_run": trio.lowlevel.in_trio_run(), "trio_task": trio.lowlevel.in_trio_task(),
                "request": REQUEST.get()}

    async def first_step(host: asyncio_host.AsyncioHost) -> dict[str, Any]:
        seen = look()
        seen["on_loop"] = host.on_loop()
        seen["from_trio"] = await host.run_trio(trio_side)  # a bridge back, from the first step
        return seen

    async def trio_side() -> str:
        await trio.lowlevel.checkpoint()
        return sniffio.current_async_library()

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        host = asyncio_host.current_host()
        assert host is not None
        REQUEST.set("r-1")
        seen = await host.run_asyncio(first_step, host)
        return seen, look()

    seen, after = asyncio_host.run(main)
    assert seen == {"task": True, "library": "asyncio", "trio_run": True, "trio_task": False, "request": "r-1",
                    "on_loop": True, "from_trio": "trio"}
    assert after == {"task": False, "library": "trio", "trio_run": True, "trio_task": True, "request": "r-1"}


def test_trio_in_the_first_step_fails_as_it_does_later_on() -> None:
    """trio's own calls in an asyncio task's first step fail as on the loop: no trio task to act for."""

    async def uses_trio() -> None:
        trio.lowlevel.current_task()

    async def main() -> None:
        host = asyncio_host.current_host()
        assert host is not None
        await host.run_asyncio(uses_trio)

    with pytest.raises(RuntimeError, match="must be called from async context"):
        asyncio_host.run(main)


def test_an_apps_task_factory_makes_the_tasks_and_what_it_schedules_is_scheduled() -> None:
    """A loop with the app's own task factory: the factory makes every task, and what it schedules (here:
    a note) is scheduled as it asked; its tasks start as it starts them (this one: on the loop's turn)."""
    made: list[str] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        made.append("task")
        if made.count("task") == 2:
            loop.call_soon(made.append, "note")
        return asyncio.Task(coro, loop=loop, **kwargs)

    async def noop() -> str:
        return "done"

    async def main() -> list[str]:
        host = asyncio_host.current_host()
        assert host is not None
        host.loop.set_task_factory(factory)
        try:
            return [await host.run_asyncio(noop) for _ in range(3)]
        finally:
            host.loop.set_task_factory(None)

    assert asyncio_host.run(main) == ["done"] * 3
    assert made == ["task", "task", "note", "task"]


# Python 3.12's eager task factory: the test exists where the factory does (on 3.11 there is nothing to
# run; a skip would fail .ci/run, where nothing may skip)
if hasattr(asyncio, "eager_task_factory"):
    def test_an_apps_eager_task_factory_runs_the_first_step_in_no_trio_task_either() -> None:
        """An app's loop with Python 3.12's eager task factory runs the step inside create_task: the trio
        task is hidden for that too, and the task has ended with no turn of the loop."""

        async def first_step() -> tuple[bool, bool, str]:
            return asyncio.current_task() is not None, trio.lowlevel.in_trio_task(), sniffio.current_async_library()

        async def main() -> tuple[tuple[bool, bool, str], list[str]]:
            host = asyncio_host.current_host()
            assert host is not None
            host.loop.set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined]
            turns: list[str] = []
            try:
                host.loop.call_soon(turns.append, "turn")
                return await host.run_asyncio(first_step), list(turns)
            finally:
                host.loop.set_task_factory(None)

        assert asyncio_host.run(main) == ((True, False, "asyncio"), [])
