"""Dramatiq with its Redis broker on the workloads of bench.py, one measurement per process.

    python benchmarks/bench_dramatiq.py drain   --target redis://HOST:PORT/DB?prefix=NAME --jobs N --workers W
    python benchmarks/bench_dramatiq.py enqueue --target URL --jobs N --callers C
    python benchmarks/bench_dramatiq.py latency --target URL --samples N --workers W

Each prints one JSON object on stdout; bench.py --backend redis runs it next to the pipeline's
own measurements. Dramatiq is configured as its documentation shows: a ``RedisBroker`` (its
keys under the namespace NAME, flushed at the end), an actor with retries off (a no-op cannot
fail), a ``Worker`` with W threads whose idle poll is 0.5 s (``worker_timeout``), the
pipeline's own WORKER_POLL_INTERVAL_MS.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import threading
import time
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker


def make_broker(target: str) -> RedisBroker:
    url, _, name = target.partition("?prefix=")
    broker = RedisBroker(url=url, namespace=name or "dramatiq-bench")
    dramatiq.set_broker(broker)
    return broker


def start_worker(broker: RedisBroker, workers: int) -> Any:
    worker = dramatiq.Worker(broker, worker_threads=workers, worker_timeout=500)
    worker.start()
    return worker


def drain(target: str, jobs: int, workers: int) -> dict[str, float]:
    broker = make_broker(target)
    done = threading.Event()
    lock = threading.Lock()
    count = 0

    @dramatiq.actor(max_retries=0)
    def noop(n: int) -> None:
        nonlocal count
        with lock:
            count += 1
            if count == jobs:
                done.set()

    for i in range(jobs):  # the backlog, before the worker starts
        noop.send(i)
    t0 = time.perf_counter()
    worker = start_worker(broker, workers)
    done.wait()
    elapsed = time.perf_counter() - t0
    worker.stop()
    broker.flush_all()
    return {"drain": jobs / elapsed}


def enqueue(target: str, jobs: int, callers: int) -> dict[str, float]:
    broker = make_broker(target)

    @dramatiq.actor(max_retries=0)
    def noop(n: int) -> None:
        return None

    per_caller = jobs // callers
    start = threading.Barrier(callers + 1)

    def caller(k: int) -> None:
        start.wait()
        for i in range(per_caller):
            noop.send(k * per_caller + i)

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(callers)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    rate = per_caller * callers / (time.perf_counter() - t0)
    broker.flush_all()
    return {"enqueue": rate}


def latency(target: str, samples: int, workers: int, gap: float) -> dict[str, float]:
    broker = make_broker(target)
    started: dict[int, float] = {}
    seen = threading.Event()

    @dramatiq.actor(max_retries=0)
    def probe(n: int) -> None:
        started[n] = time.perf_counter()
        seen.set()

    worker = start_worker(broker, workers)
    time.sleep(0.5)
    from_return, from_call = [], []
    for i in range(samples):
        seen.clear()
        t_call = time.perf_counter()
        probe.send(i)
        t_return = time.perf_counter()
        if not seen.wait(30):
            raise SystemExit(f"dramatiq did not start job {i} within 30 s")
        from_return.append(started[i] - t_return)
        from_call.append(started[i] - t_call)
        time.sleep(gap)
    worker.stop()
    broker.flush_all()
    return percentiles(from_return, "latency") | percentiles(from_call, "latency_call")


def percentiles(values: list[float], name: str) -> dict[str, float]:
    ms = sorted(v * 1000 for v in values)
    return {f"{name}_p50": statistics.median(ms), f"{name}_p99": ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["drain", "enqueue", "latency"])
    parser.add_argument("--target", required=True, help="redis://HOST:PORT/DB?prefix=NAME")
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--callers", type=int, default=100)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--gap", type=float, default=0.005)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    if args.what == "drain":
        result = drain(args.target, args.jobs, args.workers)
    elif args.what == "enqueue":
        result = enqueue(args.target, args.jobs, args.callers)
    else:
        result = latency(args.target, args.samples, args.workers, args.gap)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
