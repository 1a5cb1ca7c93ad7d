"""Drain N no-op jobs through every actor (claim → handler → outcome → Ledger) and print jobs/s.

    python benchmarks/drain.py [--jobs 20000] [--concurrency 256] [--runs 3] [--synchronous full]

Also measures durable enqueue: C concurrent callers each awaiting ``enqueue`` (row
committed before it returns), and one bulk ``enqueue_many``. Each run uses a fresh
SQLite file in a temporary folder; the table shows the median and the spread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import attrs
import trio

import pipeline


@attrs.frozen
class Noop:
    n: int


async def noop(job: Noop, ctx: pipeline.JobContext) -> None:
    return None


def make(db: Path, concurrency: int, synchronous: str, workers: bool = True) -> tuple[pipeline.Config, pipeline.Registry]:
    registry = pipeline.Registry()
    registry.register("noop", Noop, noop, concurrency=concurrency)
    config = pipeline.Config(
        database_url=f"sqlite:///{db}", worker_enabled=workers, sqlite_synchronous=synchronous,
        worker_poll_interval_ms=50, log_level="warning",
    )
    return config, registry


async def drain_once(db: Path, jobs: int, concurrency: int, synchronous: str) -> dict[str, float]:
    config, registry = make(db, concurrency, synchronous)
    done = trio.Event()
    count = 0

    def seen(fields: dict) -> None:
        nonlocal count
        count += 1
        if count == jobs:
            done.set()

    # fill the table first with workers off, so the drain measures only the drain
    async with pipeline.open_pipeline(attrs.evolve(config, worker_enabled=False), registry) as p:
        t0 = time.perf_counter()
        await p.enqueue_many([Noop(i) for i in range(jobs)])
        bulk = jobs / (time.perf_counter() - t0)
    async with pipeline.open_pipeline(config, registry) as p:
        p.add_observer(seen)
        t0 = time.perf_counter()
        await done.wait()
        elapsed = time.perf_counter() - t0
        batches, commands = p.ledger_stats.batches, p.ledger_stats.commands
    return {"drain": jobs / elapsed, "bulk": bulk, "jobs_per_commit": jobs / max(batches, 1), "commands": commands}


async def enqueue_once(db: Path, jobs: int, callers: int, synchronous: str) -> float:
    config, registry = make(db, 1, synchronous, workers=False)
    per_caller = jobs // callers
    async with pipeline.open_pipeline(config, registry) as p:

        async def caller(k: int) -> None:
            for i in range(per_caller):
                await p.enqueue(Noop(k * per_caller + i))

        t0 = time.perf_counter()
        async with trio.open_nursery() as tn:
            for k in range(callers):
                tn.start_soon(caller, k)
        return per_caller * callers / (time.perf_counter() - t0)


def summary(values: list[float]) -> str:
    med = statistics.median(values)
    return f"{med:>10,.0f}  (min {min(values):,.0f}, max {max(values):,.0f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=256, help="workers for the no-op job type")
    parser.add_argument("--callers", type=int, default=100, help="concurrent enqueue callers")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--synchronous", choices=["full", "normal"], default="full")
    args = parser.parse_args(argv)
    drains, bulks, per_commit, enqueues = [], [], [], []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            r = trio.run(drain_once, Path(tmp) / "bench.db", args.jobs, args.concurrency, args.synchronous)
            drains.append(r["drain"])
            bulks.append(r["bulk"])
            per_commit.append(r["jobs_per_commit"])
        with tempfile.TemporaryDirectory() as tmp:
            enqueues.append(trio.run(enqueue_once, Path(tmp) / "bench.db", args.jobs, args.callers, args.synchronous))
        print(f"run {run + 1}: drain {drains[-1]:,.0f} jobs/s, {args.callers} callers enqueue {enqueues[-1]:,.0f} jobs/s", file=sys.stderr)
    print(f"pipeline {pipeline.__name__}: {args.jobs:,} no-op jobs, {args.concurrency} workers, synchronous={args.synchronous}, {args.runs} runs")
    print(f"drain (jobs/s)                    {summary(drains)}")
    print(f"durable enqueue, {args.callers} callers (jobs/s) {summary(enqueues)}")
    print(f"bulk enqueue, one call (jobs/s)   {summary(bulks)}")
    print(f"jobs per commit while draining    {statistics.median(per_commit):>10,.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
