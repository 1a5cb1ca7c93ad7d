"""What a producer outside trio gets: ``pipeline.Client.enqueue`` latency from one thread (p50, p99)
and ``pipeline.AsyncClient`` throughput from 100 concurrent asyncio tasks, on one store.

    python benchmarks/clients.py [--backend sqlite|postgres|redis] [--jobs 5000] [--rounds 3]

SQLite: a fresh file with the defaults (synchronous=FULL: every commit is fsynced). Postgres: a
fresh schema in the server at PIPELINE_TEST_POSTGRES_URL (default postgres@127.0.0.1:5432).
Redis: a key prefix of its own on 127.0.0.1:6379 (REDIS_ALLOW_NON_DURABLE=true, as the machine's
server keeps nothing on disk). Each round prints its figures; the last line gives the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import attrs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pipeline  # noqa: E402


@attrs.frozen
class Noop:
    n: int


async def noop(job: Noop, ctx: pipeline.JobContext) -> None:
    pass


def make_registry() -> pipeline.Registry:
    reg = pipeline.Registry()
    reg.register("noop", Noop, noop)
    return reg


def store_url(backend: str, folder: str) -> tuple[str, dict[str, str]]:
    if backend == "sqlite":
        return f"sqlite:///{folder}/clients.db", {}
    if backend == "redis":
        return f"redis://127.0.0.1:6379/0?prefix=bench-{uuid.uuid4().hex[:8]}", {"REDIS_ALLOW_NON_DURABLE": "true"}
    import psycopg

    base = os.environ.get("PIPELINE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return f"{base}?options=-csearch_path%3D{schema}", {}


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one_round(backend: str, jobs: int) -> tuple[float, float, float, float]:
    with tempfile.TemporaryDirectory() as folder:
        url, extra = store_url(backend, folder)
        config = pipeline.Config.from_env({"DATABASE_URL": url, "LOG_LEVEL": "warning", **extra}, env_file=None)
        reg = make_registry()
        with pipeline.Client(registry=reg, config=config) as client:
            for n in range(50):  # warm up: connections, statements
                client.enqueue(Noop(n))
            times = []
            for n in range(jobs // 5):
                started = time.perf_counter()
                client.enqueue(Noop(n))
                times.append(time.perf_counter() - started)
        times.sort()
        p50, p99 = times[len(times) // 2] * 1000, times[int(len(times) * 0.99)] * 1000

        async def app() -> float:
            async with pipeline.AsyncClient(registry=reg, config=config) as client:
                await asyncio.gather(*(client.enqueue(Noop(n)) for n in range(100)))  # warm up
                queue = list(range(jobs))

                async def task() -> None:
                    while queue:
                        await client.enqueue(Noop(queue.pop()))

                started = time.perf_counter()
                await asyncio.gather(*(task() for _ in range(100)))
                return time.perf_counter() - started

        before = cpu()
        elapsed = asyncio.run(app())
        spent = cpu() - before
        return p50, p99, jobs / elapsed, spent / jobs * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "redis"], default="sqlite")
    parser.add_argument("--jobs", type=int, default=5000, help="jobs the asyncio app enqueues per round (a fifth of it: the sync latency)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results = []
    for n in range(args.rounds):
        p50, p99, rate, cpu_us = one_round(args.backend, args.jobs)
        results.append((p50, p99, rate, cpu_us))
        print(f"round {n + 1}: Client.enqueue p50 {p50:.2f} ms, p99 {p99:.2f} ms; "
              f"AsyncClient from 100 asyncio tasks {rate:,.0f} jobs/s ({cpu_us:.0f} µs CPU a job, client side)")
    med = [statistics.median(column) for column in zip(*results)]
    print(f"{args.backend} medians of {args.rounds}: Client.enqueue p50 {med[0]:.2f} ms, p99 {med[1]:.2f} ms; "
          f"AsyncClient {med[2]:,.0f} jobs/s, {med[3]:.0f} µs CPU a job")


if __name__ == "__main__":
    main()
