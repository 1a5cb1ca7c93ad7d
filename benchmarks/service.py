"""What a user gets from the command line: `python benchmarks/service.py [--backend sqlite|postgres|redis]`.

20,000 jobs of the bundled site's cheapest type (`invalidate_cache` on the in-process cache) are
written to a file and loaded with `python -m pipeline enqueue --from-file`; then `python -m
pipeline` is started as a user starts it (WORKER_CONCURRENCY=32, default logging: INFO, a line per
job, to a file), and the script waits until every job is completed, reading the store from outside.
It does so with `--processes 1` and with the default (one worker process per core). In the same
rounds, Huey's consumer as its documentation starts it (`huey_consumer app.huey -w 2 -k process`,
one worker process per core, `-q`) drains as many no-op tasks from its SQLite backend (`--backend
sqlite`, `fsync=True`) or its Redis one (`--backend redis`), and on Redis Dramatiq's worker as its
documentation starts it (`dramatiq app`: a process per core, 8 threads each). Three rounds, alternating,
medians.
A drain rate counts from the first job done to the last (the start-up is printed apart).
`--logging-cost` adds, in the same rounds, the default way with `LOG_LEVEL=warning` (no line per job),
and prints what the line per job costs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from stores import BACKENDS, Stores, open_stores  # noqa: E402

JOB = json.dumps({"job_type": "invalidate_cache", "payload": {"keys": ["k"]}})
HUEY_APP = """
from huey import RedisHuey, SqliteHuey

if {redis!r}:
    huey = RedisHuey({name!r}, url={redis!r}, results=False)
else:
    huey = SqliteHuey("bench", filename={db!r}, fsync=True, results=False)


@huey.task()
def noop():
    pass
"""


def settings(stores: Stores, url: str, concurrency: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ADMIN_", "WORKER_", "LOG_", "DATABASE_", "SQLITE_", "REDIS_"))}
    env.update(stores.settings, DATABASE_URL=url, ADMIN_PORT="0", WORKER_CONCURRENCY=str(concurrency))
    return env


def load(directory: Path, jobs: int, env: dict[str, str]) -> float:
    lines = directory / "jobs.jsonl"
    lines.write_text((JOB + "\n") * jobs)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pipeline", "enqueue", "--from-file", str(lines)], env=env, cwd=directory,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return jobs / (time.perf_counter() - started)


def watch(args: list[str], env: dict[str, str], log: Path, done: Callable[[], int], jobs: int) -> tuple[float, float]:
    """Start ``args``; (jobs/s from the first job done to the last, seconds from start to the first)."""
    with log.open("w") as out:
        started = time.perf_counter()
        process = subprocess.Popen(args, env=env, cwd=log.parent, stdout=out, stderr=out)
        try:
            first = None
            while True:
                n = done()
                now = time.perf_counter()
                if n and first is None:
                    first = (now, n)
                if n >= jobs:
                    break
                if process.poll() is not None:
                    raise RuntimeError(f"{args[0]} exited with {process.returncode}: see {log}")
                time.sleep(0.02)
        finally:
            process.terminate()
            process.wait(60)
    assert first is not None
    if first[1] >= jobs:  # all done by the first look (a tiny backlog): the rate counts the start-up too
        return jobs / max(now - started, 1e-9), first[0] - started
    return (jobs - first[1]) / max(now - first[0], 1e-9), first[0] - started


def pipeline_drain(stores: Stores, directory: Path, jobs: int, concurrency: int, processes: str | None,
                   log_level: str | None = None) -> tuple[float, float, float]:
    url = stores.fresh("service")
    try:
        env = settings(stores, url, concurrency)
        if log_level:
            env["LOG_LEVEL"] = log_level
        loaded = load(directory, jobs, env)
        args = [sys.executable, "-m", "pipeline"] + (["--processes", processes] if processes else [])
        rate, start_up = watch(args, env, directory / "service.log", lambda: stores.completed(url), jobs)
        return rate, start_up, loaded
    finally:
        stores.drop(url)


def huey_drain(backend: str, stores: Stores, directory: Path, jobs: int) -> tuple[float, float]:
    """Huey's consumer, one worker process per core; done = taken off its queue (Huey deletes a task
    as it dequeues it; at most one per worker is still running when the queue is empty)."""
    redis_url = getattr(stores, "server_url", "") if backend == "redis" else ""
    name = f"bench_huey_{os.getpid()}_{time.monotonic_ns()}"
    (directory / "huey_app.py").write_text(HUEY_APP.format(redis=redis_url, name=name, db=str(directory / "huey.db")))
    sys.path.insert(0, str(directory))
    try:
        sys.modules.pop("huey_app", None)
        import huey_app  # type: ignore[import-not-found]

        huey = huey_app.huey
        for _ in range(jobs):
            huey_app.noop()
        env = dict(os.environ, PYTHONPATH=str(directory))
        consumer = str(Path(sys.executable).with_name("huey_consumer"))
        args = [consumer, "huey_app.huey", "-w", str(os.cpu_count() or 1), "-k", "process", "-q", "-n",
                "-d", "0.1", "-b", "1.15", "-m", "0.5"]
        return watch(args, env, directory / "huey.log", lambda: jobs - huey.pending_count(), jobs)
    finally:
        sys.path.remove(str(directory))
        if backend == "redis":
            huey_app.huey.storage.flush_all()


DRAMATIQ_APP = """
import dramatiq
from dramatiq.brokers.redis import RedisBroker

dramatiq.set_broker(RedisBroker(url={redis!r}, namespace={name!r}))


@dramatiq.actor(max_retries=0)
def noop():
    pass
"""


def dramatiq_drain(stores: Stores, directory: Path, jobs: int) -> tuple[float, float]:
    """Dramatiq's worker as its documentation starts it (`dramatiq app`: one process per core, 8
    threads each), on the same Redis; done = acknowledged (gone from the queue's message hash)."""
    name = f"bench_dramatiq_{os.getpid()}_{time.monotonic_ns()}"
    (directory / "dramatiq_app.py").write_text(DRAMATIQ_APP.format(redis=stores.server_url, name=name))  # type: ignore[attr-defined]
    sys.path.insert(0, str(directory))
    try:
        sys.modules.pop("dramatiq_app", None)
        import dramatiq_app  # type: ignore[import-not-found]

        broker = dramatiq_app.dramatiq.get_broker()
        for _ in range(jobs):
            dramatiq_app.noop.send()
        client = broker.client
        messages = f"{name}:default.msgs"
        env = dict(os.environ, PYTHONPATH=str(directory))
        args = [str(Path(sys.executable).with_name("dramatiq")), "dramatiq_app"]
        return watch(args, env, directory / "dramatiq.log", lambda: jobs - client.hlen(messages), jobs)
    finally:
        sys.path.remove(str(directory))
        dramatiq_app.dramatiq.get_broker().flush_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=BACKENDS, default="sqlite")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32, help="WORKER_CONCURRENCY (default 32; the type's default is 2)")
    parser.add_argument("--no-huey", action="store_true", help="leave out Huey's consumer")
    parser.add_argument("--no-dramatiq", action="store_true", help="leave out Dramatiq's worker (--backend redis)")
    parser.add_argument("--logging-cost", action="store_true", help="also the default way with LOG_LEVEL=warning")
    options = parser.parse_args()
    default = f"default ({os.cpu_count()} worker processes)"
    quiet = f"{default} with LOG_LEVEL=warning"
    ways: dict[str, tuple[str | None, str | None]] = {"--processes 1": ("1", None), default: (None, None)}
    if options.logging_cost:
        ways[quiet] = (None, "warning")
    rates: dict[str, list[float]] = {way: [] for way in ways}
    loads: list[float] = []
    peer = options.backend != "postgres" and not options.no_huey
    if peer:
        try:
            import huey  # noqa: F401
        except ImportError:
            print("huey is not installed (pip install -e '.[bench]'): no peer in this run", flush=True)
            peer = False
    hueys: list[float] = []
    dramatiqs: list[float] = []
    with_dramatiq = options.backend == "redis" and not options.no_dramatiq
    if with_dramatiq:
        try:
            import dramatiq  # noqa: F401
        except ImportError:
            print("dramatiq is not installed (pip install -e '.[bench]'): no Dramatiq in this run", flush=True)
            with_dramatiq = False
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "stores").mkdir()
        stores = open_stores(options.backend, Path(tmp) / "stores")
        try:
            for _ in range(options.rounds):
                for way, (processes, log_level) in ways.items():
                    with tempfile.TemporaryDirectory(dir=tmp) as work:
                        rate, start_up, loaded = pipeline_drain(stores, Path(work), options.jobs, options.concurrency, processes,
                                                                log_level)
                    rates[way].append(rate)
                    loads.append(loaded)
                    print(f"{way}: {rate:,.0f} jobs/s (first job done {start_up:.2f} s after start)", flush=True)
                if peer:
                    with tempfile.TemporaryDirectory(dir=tmp) as work:
                        rate, start_up = huey_drain(options.backend, stores, Path(work), options.jobs)
                    hueys.append(rate)
                    print(f"huey_consumer -w {os.cpu_count()} -k process: {rate:,.0f} tasks/s "
                          f"(first task done {start_up:.2f} s after start)", flush=True)
                if with_dramatiq:
                    with tempfile.TemporaryDirectory(dir=tmp) as work:
                        rate, start_up = dramatiq_drain(stores, Path(work), options.jobs)
                    dramatiqs.append(rate)
                    print(f"dramatiq app: {rate:,.0f} messages/s (first done {start_up:.2f} s after start)", flush=True)
        finally:
            stores.close()
    print(f"backend {options.backend}, {options.jobs:,} jobs, medians of {options.rounds} rounds:")
    print(f"enqueue --from-file, {options.jobs:,} lines: {statistics.median(loads):,.0f} jobs/s")
    huey = statistics.median(hueys) if hueys else None
    dramatiq_rate = statistics.median(dramatiqs) if dramatiqs else None
    for way, values in rates.items():
        ratios = [f"{statistics.median(values) / peer:.1f}× {label}" for label, peer in (("Huey", huey), ("Dramatiq", dramatiq_rate))
                  if peer]
        ratio = f" ({', '.join(ratios)})" if ratios else ""
        logging_ = "" if way == quiet else ", default logging"
        print(f"python -m pipeline {way}, WORKER_CONCURRENCY={options.concurrency}{logging_}: "
              f"{statistics.median(values):,.0f} jobs/s{ratio}")
    if options.logging_cost:
        costs = [1 - with_lines / without for with_lines, without in zip(rates[default], rates[quiet])]
        print(f"the line per job costs {statistics.median(costs):.0%} of the drain rate "
              f"(median of the rounds' costs: {', '.join(f'{c:.0%}' for c in costs)})")
    if huey:
        print(f"Huey consumer ({options.backend}), {os.cpu_count()} worker processes, -q: {huey:,.0f} tasks/s")
    if dramatiq_rate:
        print(f"Dramatiq worker (redis), {os.cpu_count()} processes of 8 threads: {dramatiq_rate:,.0f} messages/s")


if __name__ == "__main__":
    main()
