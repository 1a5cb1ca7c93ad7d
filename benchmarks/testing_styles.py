"""What one test pipeline costs in each style: `python benchmarks/testing_styles.py [--rounds 30]`.

Opens ``pipeline.testing.open_test_pipeline``, runs one job to its result and leaves the block, ``rounds``
times in each style, and prints the median (and the slowest) in ms: under trio (the engine in the test's own
run), under asyncio (a trio guest of the test's loop), in a plain ``with`` (a thread of its own), and under
trio for a registry with an asyncio handler (a thread hosting an asyncio loop). docs/testing.md shows them.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import pipeline  # noqa: E402
from pipeline.testing import open_test_pipeline  # noqa: E402


@attrs.frozen
class Add:
    a: int
    b: int


def registry(runtime: str) -> pipeline.Registry:
    reg = pipeline.Registry()

    @reg.job(runtime=runtime)
    async def add(job: Add, ctx: pipeline.JobContext) -> int:
        return job.a + job.b

    return reg


def trio_style(reg: pipeline.Registry, rounds: int) -> list[float]:
    async def main() -> list[float]:
        took = []
        for _ in range(rounds):
            started = time.perf_counter()
            async with open_test_pipeline(reg) as p:
                assert await p.result(await p.enqueue(Add(2, 3))) == 5
            took.append(time.perf_counter() - started)
        return took

    return trio.run(main)


def asyncio_style(reg: pipeline.Registry, rounds: int) -> list[float]:
    async def main() -> list[float]:
        took = []
        for _ in range(rounds):
            started = time.perf_counter()
            async with open_test_pipeline(reg) as p:
                assert await p.result(await p.enqueue(Add(2, 3))) == 5
            took.append(time.perf_counter() - started)
        return took

    return asyncio.run(main())


def plain_style(reg: pipeline.Registry, rounds: int) -> list[float]:
    took = []
    for _ in range(rounds):
        started = time.perf_counter()
        with open_test_pipeline(reg) as p:
            assert p.result(p.enqueue(Add(2, 3))) == 5
        took.append(time.perf_counter() - started)
    return took


STYLES: dict[str, tuple[Callable[[pipeline.Registry, int], list[float]], str]] = {
    "trio, the test's own run": (trio_style, "trio"),
    "asyncio, a guest of the test's loop": (asyncio_style, "trio"),
    "plain with, a thread of its own": (plain_style, "trio"),
    "trio, a registry with an asyncio handler": (trio_style, "asyncio"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args(argv)
    for name, (style, runtime) in STYLES.items():
        took = style(registry(runtime), args.rounds)
        print(f"{name:45} median {statistics.median(took) * 1000:6.1f} ms   slowest {max(took) * 1000:6.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
