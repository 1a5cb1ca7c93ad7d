"""What a producer outside trio gets: ``pipeline.Client.enqueue`` latency from one thread (p50, p99)
and ``pipeline.AsyncClient`` throughput from 100 concurrent asyncio tasks, on one store.

    python benchmarks/clients.py [--backend sqlite|postgres|redis] [--jobs 5000] [--rounds 3] [--peers]

SQLite: a fresh file with the defaults (synchronous=FULL: every commit is fsynced). Postgres: a
fresh schema in the server at PIPELINE_TEST_POSTGRES_URL (default postgres@127.0.0.1:5432).
Redis: a key prefix of its own on 127.0.0.1:6379 (REDIS_ALLOW_NON_DURABLE=true, as the machine's
server keeps nothing on disk). Each round prints its figures; the last line gives the medians.

--peers (with --backend redis): in the same rounds, on the same server (database 15, flushed),
Celery's ``task.delay()`` and Dramatiq's ``actor.send()`` from one thread (their p50), and from an
asyncio app with 100 tasks, each call in ``asyncio.to_thread`` (neither has an asyncio API; that is
what such an app does). Both are in the ``bench`` extra.
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


PEER_URL = "redis://127.0.0.1:6379/15"


def peer_senders() -> dict[str, object]:
    """name -> a function that enqueues one no-op job with that library's producer."""
    import celery
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    app = celery.Celery("bench", broker=PEER_URL)
    app.conf.broker_connection_retry_on_startup = True

    @app.task(name="noop")
    def celery_noop(n: int) -> None:
        pass

    broker = RedisBroker(url=PEER_URL)
    dramatiq.set_broker(broker)

    @dramatiq.actor(queue_name="bench")
    def dramatiq_noop(n: int) -> None:
        pass

    return {"Celery .delay()": celery_noop.delay, "Dramatiq .send()": dramatiq_noop.send}


def flush_peers() -> None:
    import redis

    redis.Redis.from_url(PEER_URL).flushdb()


def peer_round(send: object, jobs: int) -> tuple[float, float, float]:
    for n in range(50):
        send(n)  # type: ignore[operator]
    times = []
    for n in range(jobs // 5):
        started = time.perf_counter()
        send(n)  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    times.sort()

    async def app() -> float:
        queue = list(range(jobs))

        async def task() -> None:
            while queue:
                await asyncio.to_thread(send, queue.pop())  # type: ignore[arg-type]

        started = time.perf_counter()
        await asyncio.gather(*(task() for _ in range(100)))
        return time.perf_counter() - started

    elapsed = asyncio.run(app())
    flush_peers()
    return times[len(times) // 2] * 1000, times[int(len(times) * 0.99)] * 1000, jobs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "redis"], default="sqlite")
    parser.add_argument("--jobs", type=int, default=5000, help="jobs the asyncio app enqueues per round (a fifth of it: the sync latency)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peers", action="store_true", help="Celery and Dramatiq on the same Redis, same rounds")
    args = parser.parse_args()
    if args.peers and args.backend != "redis":
        parser.error("--peers measures the peers' Redis producers: use it with --backend redis")
    peers = peer_senders() if args.peers else {}
    results = []
    peer_results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in peers}
    for n in range(args.rounds):
        p50, p99, rate, cpu_us = one_round(args.backend, args.jobs)
        results.append((p50, p99, rate, cpu_us))
        print(f"round {n + 1}: Client.enqueue p50 {p50:.2f} ms, p99 {p99:.2f} ms; "
              f"AsyncClient from 100 asyncio tasks {rate:,.0f} jobs/s ({cpu_us:.0f} µs CPU a job, client side)")
        for name, send in peers.items():
            peer_results[name].append(peer_round(send, args.jobs))
            q50, q99, qrate = peer_results[name][-1]
            print(f"         {name} p50 {q50:.2f} ms, p99 {q99:.2f} ms; from 100 asyncio tasks {qrate:,.0f} jobs/s")
    med = [statistics.median(column) for column in zip(*results)]
    print(f"{args.backend} medians of {args.rounds}: Client.enqueue p50 {med[0]:.2f} ms, p99 {med[1]:.2f} ms; "
          f"AsyncClient {med[2]:,.0f} jobs/s, {med[3]:.0f} µs CPU a job")
    for name, rows in peer_results.items():
        q = [statistics.median(column) for column in zip(*rows)]
        print(f"{' ' * len(args.backend)} medians of {args.rounds}: {name} p50 {q[0]:.2f} ms, p99 {q[1]:.2f} ms; "
              f"from 100 asyncio tasks {q[2]:,.0f} jobs/s")


if __name__ == "__main__":
    main()
