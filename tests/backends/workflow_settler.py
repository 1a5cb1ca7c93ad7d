"""A separate process that ends parents and inserts children in a shared store on a schedule, with
others doing the same at once (for test_workflows.py).

    python workflow_settler.py DATABASE_URL PLAN

PLAN is a JSON file: ``{"pace": SECONDS, "steps": [STEP, ...]}``, each step ``[SLOT, "settle", ID,
TOKEN, "completed" | "dead"]`` (a SUCCEED or a BURY outcome of that lease) or ``[SLOT, "insert",
ROW]`` (one NewJob, :func:`encoded`). Opens the backend, prints "ready", waits for a line on stdin
(so that every process starts at once), then makes the steps in the order of their slots, one call
each, none before SLOT × pace seconds after the start (processes given the same pace keep in step);
prints "span FIRST LAST" (the wall-clock times of its first and last call) and "stale ID" for an
outcome that was not written, then "done".
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import trio

from pipeline import Config
from pipeline.backends import NewJob, Settlement, open_backend
from pipeline.states import Transition


def encoded(row: NewJob) -> list[Any]:
    return list(row)


def decoded(fields: list[Any]) -> NewJob:
    row = NewJob(*fields)
    return row._replace(after=tuple(row.after))


async def main(url: str, plan_path: str) -> None:
    plan = json.loads(Path(plan_path).read_text())
    steps = sorted(plan["steps"], key=lambda step: step[0])
    # the environment's settings (REDIS_ALLOW_NON_DURABLE for the test server), this URL
    config = Config.from_env({**os.environ, "DATABASE_URL": url}, env_file=None)
    lines = []
    async with open_backend(config) as backend:
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)
        start, first = trio.current_time(), time.time()
        for slot, kind, *args in steps:
            await trio.sleep_until(start + slot * plan["pace"])
            if kind == "settle":
                job_id, token, how = args
                outcome = (Settlement(job_id, token, Transition.SUCCEED) if how == "completed"
                           else Settlement(job_id, token, Transition.BURY, error="fatal"))
                if not (await backend.settle([outcome]))[0]:
                    lines.append(f"stale {job_id}")
            else:
                await backend.insert([decoded(args[0])])
        lines.append(f"span {first} {time.time()}")
    print("\n".join(lines), flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
