"""What the asyncio host's bridge costs: `python benchmarks/asyncio_bridge.py [--loop asyncio|uvloop]`.

32 trio tasks, guests of an asyncio loop (pipeline/engine/asyncio_host.py), call ``host.run_asyncio`` on a
no-op coroutine 40,000 times in all: CPU µs per call. Beside it, in the same process: a trio checkpoint
per call (what a trio handler's no-op costs its worker), and plain asyncio awaiting a task per call
(``await asyncio.create_task(noop())``, 32 tasks), the floor of running anything as an asyncio task.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import trio

from pipeline.engine import asyncio_host

CALLS, TASKS = 40_000, 32


async def noop() -> None:
    return None


async def bridge() -> tuple[float, float]:
    host = asyncio_host.current_host()
    assert host is not None

    async def calls() -> None:
        for _ in range(CALLS // TASKS):
            await host.run_asyncio(noop)

    async def checkpoints() -> None:
        for _ in range(CALLS // TASKS):
            await noop()
            await trio.lowlevel.checkpoint()

    per_call = []
    for work in (calls, checkpoints):
        started = time.process_time()
        async with trio.open_nursery() as tn:
            for _ in range(TASKS):
                tn.start_soon(work)
        per_call.append((time.process_time() - started) / CALLS * 1e6)
    return per_call[0], per_call[1]


async def plain_asyncio() -> float:
    async def calls() -> None:
        for _ in range(CALLS // TASKS):
            await asyncio.create_task(noop())

    started = time.process_time()
    await asyncio.gather(*(calls() for _ in range(TASKS)))
    return (time.process_time() - started) / CALLS * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", choices=asyncio_host.LOOPS, default="asyncio")
    options = parser.parse_args()
    run_asyncio, checkpoint = asyncio_host.run(bridge, loop=options.loop)
    floor = asyncio.run(plain_asyncio())
    print(f"{options.loop}'s loop: host.run_asyncio {run_asyncio:.2f} µs a call; a trio checkpoint {checkpoint:.2f} µs; "
          f"await asyncio.create_task(...) alone {floor:.2f} µs")


if __name__ == "__main__":
    main()
