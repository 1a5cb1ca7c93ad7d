"""Huey's SQLite backend (or its Redis one) on the workloads of bench.py, one measurement per process.

    python benchmarks/bench_huey.py drain   --target F --jobs N --workers W
    python benchmarks/bench_huey.py enqueue --target F --jobs N --callers C
    python benchmarks/bench_huey.py latency --target F --samples N --workers W
    python benchmarks/bench_huey.py drain --redis --target redis://HOST:PORT/DB?prefix=NAME ...

With ``--redis``, ``RedisHuey`` on that server under the name NAME (its keys removed at the
end), for bench.py --backend redis.

Each prints one JSON object on stdout. bench.py runs it next to the pipeline's own
measurements, so both see the same machine at the same time. Huey is configured as
its documentation shows (``SqliteHuey``, a consumer with thread workers), with what
the comparison needs to be fair:

* ``fsync=True``: ``PRAGMA synchronous=FULL``, the pipeline's default durability;
* ``results=False``: a no-op task has nothing to return, so no result row is written;
* the consumer's poll backoff capped at 0.5 s (``max_delay``), the pipeline's own
  WORKER_POLL_INTERVAL_MS, instead of Huey's 10 s (first poll after 0.1 s as Huey's default).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import threading
import time
from pathlib import Path

from huey import Huey, SqliteHuey
from huey.consumer import Consumer

REDIS: list[str] = []  # the server's URL and the queue's name, with --redis


def make_huey(db: Path) -> Huey:
    if REDIS:
        from huey import RedisHuey

        url, name = REDIS
        return RedisHuey(name, url=url, results=False)
    return SqliteHuey("bench", filename=str(db), fsync=True, results=False)


def consumer_for(huey: Huey, workers: int) -> Consumer:
    # periodic=False: no periodic tasks here; check_worker_health=False: nothing to restart
    return huey.create_consumer(
        workers=workers, worker_type="thread", periodic=False, initial_delay=0.1, backoff=1.15, max_delay=0.5,
        check_worker_health=False,
    )


def drain(db: Path, jobs: int, workers: int) -> dict[str, float]:
    huey = make_huey(db)
    done = threading.Event()
    lock = threading.Lock()
    count = 0

    @huey.task()
    def noop(n: int) -> None:
        nonlocal count
        with lock:
            count += 1
            if count == jobs:
                done.set()

    for i in range(jobs):  # the backlog, before the consumer starts
        noop(i)
    consumer = consumer_for(huey, workers)
    t0 = time.perf_counter()
    consumer.start()
    done.wait()
    elapsed = time.perf_counter() - t0
    consumer.stop(graceful=True)
    return {"drain": jobs / elapsed}


def enqueue(db: Path, jobs: int, callers: int) -> dict[str, float]:
    huey = make_huey(db)

    @huey.task()
    def noop(n: int) -> None:
        return None

    per_caller = jobs // callers
    start = threading.Barrier(callers + 1)

    def caller(k: int) -> None:
        start.wait()
        for i in range(per_caller):
            noop(k * per_caller + i)

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(callers)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return {"enqueue": per_caller * callers / (time.perf_counter() - t0)}


def latency(db: Path, samples: int, workers: int, gap: float) -> dict[str, float]:
    """One job at a time: enqueue, wait for its task to start, pause ``gap``, again."""
    huey = make_huey(db)
    started: dict[int, float] = {}
    seen = threading.Event()

    @huey.task()
    def probe(n: int) -> None:
        started[n] = time.perf_counter()
        seen.set()

    consumer = consumer_for(huey, workers)
    consumer.start()
    time.sleep(0.3)  # let every worker make its first poll
    from_return, from_call = [], []
    for i in range(samples):
        seen.clear()
        t_call = time.perf_counter()
        probe(i)
        t_return = time.perf_counter()
        if not seen.wait(30):
            raise SystemExit(f"huey did not start job {i} within 30 s")
        from_return.append(started[i] - t_return)
        from_call.append(started[i] - t_call)
        time.sleep(gap)
    consumer.stop(graceful=True)
    return percentiles(from_return, "latency") | percentiles(from_call, "latency_call")


def percentiles(values: list[float], name: str) -> dict[str, float]:
    ms = sorted(v * 1000 for v in values)
    return {f"{name}_p50": statistics.median(ms), f"{name}_p99": ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["drain", "enqueue", "latency"])
    parser.add_argument("--target", "--db", dest="db", required=True, help="the SQLite file (or, with --redis, the URL)")
    parser.add_argument("--redis", action="store_true", help="RedisHuey on the URL given as --target")
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--callers", type=int, default=100)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--gap", type=float, default=0.005)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    if args.redis:
        url, _, name = args.db.partition("?prefix=")
        REDIS[:] = [url, name or "bench"]
    try:
        if args.what == "drain":
            result = drain(Path(args.db), args.jobs, args.workers)
        elif args.what == "enqueue":
            result = enqueue(Path(args.db), args.jobs, args.callers)
        else:
            result = latency(Path(args.db), args.samples, args.workers, args.gap)
    finally:
        if REDIS:
            make_huey(Path()).flush()  # the queue's keys: a fresh name per measurement, nothing left behind
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
