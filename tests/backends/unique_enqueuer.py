"""A separate process that enqueues jobs with unique keys into a shared store, several at once
(for test_unique_processes.py).

    python unique_enqueuer.py DATABASE_URL TASKS KEY [KEY ...]

Opens a pipeline (no workers) on the store, prints "ready", waits for a line on stdin (so that
every process starts at once), then runs TASKS concurrent enqueuers for every KEY, all at once,
through Pipeline.enqueue_unique; prints "KEY ID DUPLICATE(0/1)" per enqueue, then "done".
"""

from __future__ import annotations

import os
import sys

import trio

from pipeline import Config, open_pipeline
from pipeline.site import types_registry
from pipeline.site.jobs import GenerateSitemap


async def main(url: str, tasks: int, keys: list[str]) -> None:
    # the environment's settings (REDIS_ALLOW_NON_DURABLE for the test server), this URL, no workers
    config = Config.from_env({**os.environ, "DATABASE_URL": url, "WORKER_ENABLED": "false"}, env_file=None)
    lines: list[str] = []
    async with open_pipeline(config, types_registry()) as pipeline:
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)

        async def enqueue(key: str) -> None:
            answer = await pipeline.enqueue_unique(GenerateSitemap(), unique_key=key)
            lines.append(f"{key} {answer.id} {int(answer.duplicate)}")

        async with trio.open_nursery() as tn:
            for key in keys:
                for _ in range(tasks):
                    tn.start_soon(enqueue, key)
    print("\n".join(lines), flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]), sys.argv[3:])
