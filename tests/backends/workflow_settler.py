"""A separate process that ends parents and inserts children in shared stores on a schedule, with
others doing the same at once (for test_workflows.py).

    python workflow_settler.py DATABASE_URL PLAN [DATABASE_URL PLAN ...]

One PLAN per store, run side by side (a task each): a JSON file ``{"pace": SECONDS, "steps": [STEP,
...]}``, each step one of

* ``[SLOT, "settle", ID, TOKEN, "completed" | "dead"]``: a SUCCEED or a BURY outcome of that lease;
* ``[SLOT, "chase", PARENT_TYPE, N]``: up to N times, as fast as it goes, insert a job of type "c"
  naming the first two running jobs of PARENT_TYPE in claim order (the ones another process is about
  to end), every third with on_parent_failure="run"; until none runs;
* ``[SLOT, "named", ID]``: wait (10 s at most) until job ID has a child (another process's chase
  began); the plan's later slots count from then.

Opens the backends, prints "ready", waits for a line on stdin, then starts at the next tenth of a
second of the wall clock that is at least 50 ms away (so that processes told "go" a few milliseconds
apart start together, but for one start in twenty or so), and makes each plan's steps in the order of
their slots, none before SLOT × pace seconds after that start. Prints, each line preceded by the
plan's place in the arguments (0, 1, ...) and a space: "child ID" per job a chase inserted, "stale ID"
per outcome that was not written, "span FIRST LAST" (the wall-clock times of its first and last step);
then "done".
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import trio

from pipeline import Config
from pipeline.backends import Backend, NewJob, Settlement, open_backend
from pipeline.clock import now_ts
from pipeline.ids import UUID7Factory
from pipeline.states import Transition

new_id = UUID7Factory()


async def chase(backend: Backend, parent_type: str, n: int, say: Any) -> None:
    for i in range(n):
        front, _ = await backend.list(status="running", job_type=parent_type, order="claim", limit=2)
        if not front:
            return
        now = now_ts()
        child = NewJob(id=new_id(), job_type="c", payload="{}", max_attempts=3, run_after=now, priority=5, created_at=now,
                       after=tuple(job.id for job in front), on_parent_failure="run" if i % 3 == 0 else None)
        await backend.insert([child])
        say(f"child {child.id}")


async def run_plan(backend: Backend, plan: dict[str, Any], start: float, say: Any) -> None:
    pace = plan["pace"]
    first = None
    for slot, kind, *args in sorted(plan["steps"], key=lambda step: step[0]):
        await trio.sleep(max(0.0, start + slot * pace - time.time()))
        first = first or time.time()
        if kind == "named":
            with trio.move_on_after(10):
                while not (await backend.get(args[0])).child_count:  # type: ignore[union-attr]
                    await trio.sleep(0.002)
            start = time.time() - slot * pace
        elif kind == "settle":
            job_id, token, how = args
            outcome = (Settlement(job_id, token, Transition.SUCCEED) if how == "completed"
                       else Settlement(job_id, token, Transition.BURY, error="fatal"))
            if not (await backend.settle([outcome]))[0]:
                say(f"stale {job_id}")
        else:
            await chase(backend, args[0], args[1], say)
    say(f"span {first} {time.time()}")


async def main(pairs: list[str]) -> None:
    lines: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        work = []
        for n, (url, plan_path) in enumerate(zip(pairs[::2], pairs[1::2])):
            # the environment's settings (REDIS_ALLOW_NON_DURABLE for the test server), this URL
            config = Config.from_env({**os.environ, "DATABASE_URL": url}, env_file=None)
            backend = await stack.enter_async_context(open_backend(config))
            work.append((n, backend, json.loads(Path(plan_path).read_text())))
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)
        start = math.ceil((time.time() + 0.05) * 10) / 10
        async with trio.open_nursery() as nursery:
            for n, backend, plan in work:
                nursery.start_soon(run_plan, backend, plan, start, lambda line, n=n: lines.append(f"{n} {line}"))
    print("\n".join(lines), flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1:])
