"""procrastinate on the workloads of bench.py, on the same Postgres server, one measurement per process.

    python benchmarks/bench_procrastinate.py drain   --target URL --jobs N --workers W
    python benchmarks/bench_procrastinate.py enqueue --target URL --jobs N --callers C
    python benchmarks/bench_procrastinate.py latency --target URL --samples N --workers W

``URL`` names a fresh, empty database (bench.py makes and drops it). Each prints one JSON
object on stdout. procrastinate is configured as its documentation shows: an ``App`` on a
``PsycopgConnector``, its schema applied, an asyncio worker with ``concurrency`` W running
async tasks, LISTEN/NOTIFY on (its default), finished jobs kept (its default, as ours).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import time

import procrastinate


def make_app(url: str) -> procrastinate.App:
    return procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))


async def drain(url: str, jobs: int, workers: int) -> dict[str, float]:
    app = make_app(url)

    @app.task(name="noop")
    async def noop(n: int) -> None:
        return None

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for start in range(0, jobs, 1000):  # the backlog, before the worker starts
            await noop.batch_defer_async(*({"n": i} for i in range(start, min(jobs, start + 1000))))
        t0 = time.perf_counter()
        # wait=False: the worker stops once it has caught up with the queue
        await app.run_worker_async(concurrency=workers, wait=False, install_signal_handlers=False)
        elapsed = time.perf_counter() - t0
    return {"drain": jobs / elapsed}


async def enqueue(url: str, jobs: int, callers: int) -> dict[str, float]:
    app = make_app(url)

    @app.task(name="noop")
    async def noop(n: int) -> None:
        return None

    per_caller = jobs // callers
    async with app.open_async():
        await app.schema_manager.apply_schema_async()

        async def caller(k: int) -> None:
            for i in range(per_caller):
                await noop.defer_async(n=k * per_caller + i)

        t0 = time.perf_counter()
        await asyncio.gather(*(caller(k) for k in range(callers)))
        elapsed = time.perf_counter() - t0
    return {"enqueue": per_caller * callers / elapsed}


async def latency(url: str, samples: int, workers: int, gap: float) -> dict[str, float]:
    """One job at a time: defer, wait for its task to start, pause ``gap``, again."""
    app = make_app(url)
    started: dict[int, float] = {}
    seen = asyncio.Event()

    @app.task(name="probe")
    async def probe(n: int) -> None:
        started[n] = time.perf_counter()
        seen.set()

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        worker = asyncio.create_task(app.run_worker_async(concurrency=workers, install_signal_handlers=False))
        await asyncio.sleep(0.5)  # the worker listens and has made its first fetch
        from_return, from_call = [], []
        for i in range(samples):
            seen.clear()
            t_call = time.perf_counter()
            await probe.defer_async(n=i)
            t_return = time.perf_counter()
            await asyncio.wait_for(seen.wait(), 30)
            from_return.append(started[i] - t_return)
            from_call.append(started[i] - t_call)
            await asyncio.sleep(gap)
        worker.cancel()
        try:
            await worker
        except asyncio.CancelledError:
            pass
    return percentiles(from_return, "latency") | percentiles(from_call, "latency_call")


def percentiles(values: list[float], name: str) -> dict[str, float]:
    ms = sorted(v * 1000 for v in values)
    return {f"{name}_p50": statistics.median(ms), f"{name}_p99": ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["drain", "enqueue", "latency"])
    parser.add_argument("--target", required=True, help="the database's URL")
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--callers", type=int, default=100)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--gap", type=float, default=0.005)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    if args.what == "drain":
        result = asyncio.run(drain(args.target, args.jobs, args.workers))
    elif args.what == "enqueue":
        result = asyncio.run(enqueue(args.target, args.jobs, args.callers))
    else:
        result = asyncio.run(latency(args.target, args.samples, args.workers, args.gap))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
