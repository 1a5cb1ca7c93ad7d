"""Rate limits with asyncio handlers, on each store (issue 33, item 2): an asyncio handler's starts, as
the handler itself times them, never exceed the type's rate in any window of the rate's length, as
tests/test_round4_limits.py checks for trio handlers. The trio worker checks the claim's margin, then
starts the asyncio task: its first step runs at once (engine/asyncio_host.py), or, on a loop with the
app's own task factory, at the loop's next turn, after the first steps of the tasks made before it; the
windows must hold at the handler's first line either way."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
from backends.kit import max_in_window
from backends.stores import BACKENDS
from jobkit import wait_status

import pipeline
from pipeline.engine import asyncio_host

POLL = 30.0  # seconds: a poll interval no test here waits for (as in test_round4_limits.py)


@dataclasses.dataclass
class Call:
    n: int = 0


FIRST_STEP = 0.02  # seconds the first starts' handlers hold the loop before their first await


def plain_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
    """An app's task factory: the loop's tasks then start on its next turn, not at once."""
    return asyncio.Task(coro, loop=loop, **kwargs)


@pytest.mark.parametrize("factory", [None, plain_factory], ids=["first-step-at-once", "app-task-factory"])
@pytest.mark.parametrize("store", sorted(BACKENDS))
def test_asyncio_handler_starts_never_exceed_the_rate_in_any_window_of_its_length(
        store: str, factory: Any, tmp_path: Path) -> None:
    """rate_limit="5/s", 15 jobs, ten workers, the handlers asyncio ones on a real asyncio loop (the
    pipeline's trio run its guest, as in a worker process): no window of a second (sliding, the whole
    second: no allowance for lag) holds more than 5 of the handlers' own starts. The first five
    handlers to start take 20 ms of CPU before their first await (time.sleep: parsing, say), so the
    loop reaches each next task of that claim later than the one before, as a busy loop would; the
    later ones are not. A job whose task begins later than its claim allowed is handed back unstarted
    and runs in a later window, its attempt not counted. (Checked to fail, with the app's task factory:
    with the lateness checked only as the trio worker takes the job, before the task is made, 7 or 8
    starts fell in one second.)"""
    reg = pipeline.Registry()
    starts: list[float] = []

    @reg.job(rate_limit="5/s", concurrency=10, runtime="asyncio")
    async def call_partner(job: Call, ctx: pipeline.JobContext) -> None:
        starts.append(time.monotonic())
        assert asyncio.current_task() is not None
        if len(starts) <= 5:
            time.sleep(FIRST_STEP)  # noqa: ASYNC251 - on purpose: a first step that holds the loop
        await asyncio.sleep(0)

    async def main() -> None:
        asyncio.get_running_loop().set_task_factory(factory)
        async with BACKENDS[store](tmp_path) as config:
            config = attrs.evolve(config, worker=attrs.evolve(config.worker, poll_interval_ms=int(POLL * 1000)))
            async with pipeline.open_pipeline(config, reg) as p:
                ids = await p.enqueue_many([Call(i) for i in range(15)])
                for job_id in ids:  # each ran once, to its end (a job handed back late is not counted)
                    record = await wait_status(p, job_id, "completed", "dead", timeout=POLL)
                    assert (record.status, record.attempts) == ("completed", 1), record.error

    asyncio_host.run(main)
    assert len(starts) == 15
    assert max_in_window(starts, 1.0) <= 5, [round(at - min(starts), 4) for at in sorted(starts)]
