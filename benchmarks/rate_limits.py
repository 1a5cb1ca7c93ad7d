"""A rate limit across processes, as a user runs it: `python benchmarks/rate_limits.py --backend sqlite`.

Starts `python -m pipeline --app` with WORKER_PROCESSES worker processes (3) on a fresh store, with
one job type limited to RATE (20/s) by `rate_limit=`; a backlog of jobs larger than the run can
start is loaded first, then the type is resumed and the service runs for DURATION seconds (60). Every
handler appends its start time to a file. Prints, per store: the most starts seen in any window of the
limit's length (sliding: every interval, not calendar seconds; it must never exceed the limit, up to
the few milliseconds between a claim and its handler's start, which the window is shortened by), the
throughput against the limit (the promise: within 10 % with a backlog), and in how many processes the
jobs ran. ``--backend`` may be given more than once (default: all three, one after another).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SLACK = 0.05  # seconds a window is shortened by: a claim is recorded a few ms before its handler starts

APP = textwrap.dedent('''
    import dataclasses
    import os
    import time

    import pipeline

    registry = pipeline.Registry()


    @dataclasses.dataclass
    class Call:
        n: int = 0


    @registry.job(rate_limit=os.environ["BENCH_RATE"], concurrency=8)
    async def call_partner(job: Call, ctx: pipeline.JobContext) -> None:
        line = f"{time.time():.6f} {os.getpid()}\\n"
        fd = os.open(os.environ["BENCH_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
''')


def parse_rate(text: str) -> tuple[int, float]:
    n, _, unit = text.partition("/")
    return int(n), {"s": 1.0, "m": 60.0, "h": 3600.0}[unit]


def max_in_window(times: list[float], window: float) -> int:
    times = sorted(times)
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= window:
            first += 1
        most = max(most, last - first + 1)
    return most


def run(database_url: str, *, rate: str = "20/s", duration: float = 60.0, processes: int = 3,
        folder: Path | None = None, env_extra: dict[str, str] | None = None) -> dict[str, Any]:
    """One run on the store at ``database_url`` (empty); the figures as a dict."""
    limit, window = parse_rate(rate)
    with tempfile.TemporaryDirectory() as scratch:
        folder = folder or Path(scratch)
        app = folder / "rate_app"
        app.mkdir(parents=True, exist_ok=True)
        (app / "rate_bench_app.py").write_text(APP)
        log = folder / "starts.log"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("ADMIN_", "WORKER_", "LOG_", "DATABASE_", "PIPELINE_", "REDIS_", "SQLITE_"))}
        env.update(DATABASE_URL=database_url, PYTHONPATH=f"{ROOT}:{app}", WORKER_PROCESSES=str(processes),
                   BENCH_RATE=rate, BENCH_LOG=str(log), ADMIN_ENABLED="false", WORKER_SHUTDOWN_TIMEOUT="2",
                   REDIS_ALLOW_NON_DURABLE="true", **(env_extra or {}))
        pipe = [sys.executable, "-m", "pipeline", "--app", "rate_bench_app:registry"]
        backlog = int(limit / window * duration * 1.5) + limit
        subprocess.run([*pipe, "types", "pause", "call_partner"], cwd=app, env=env, check=True, capture_output=True)
        lines = "".join(json.dumps({"job_type": "call_partner", "payload": {"n": i}}) + "\n" for i in range(backlog))
        subprocess.run([*pipe, "enqueue", "--from-file", "-"], cwd=app, env=env, input=lines, text=True, check=True,
                       capture_output=True)
        service = subprocess.Popen(pipe, cwd=app, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(2.0 + 0.3 * processes)  # every worker process up before the window opens
            subprocess.run([*pipe, "types", "resume", "call_partner"], cwd=app, env=env, check=True, capture_output=True)
            time.sleep(duration)
        finally:
            service.send_signal(2)
            try:
                service.wait(timeout=30)
            except subprocess.TimeoutExpired:
                service.kill()
        records = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    starts = sorted(float(at) for at, _ in records)
    pids = {pid for _, pid in records}
    if len(starts) < 2:
        return {"starts": len(starts), "processes": len(pids), "max_in_window": len(starts), "limit": limit,
                "throughput": 0.0, "of_limit": 0.0}
    # throughput over the whole windows between the first start and the last
    whole = max(int((starts[-1] - starts[0]) // window), 1)
    in_whole = sum(1 for at in starts if at < starts[0] + whole * window)
    per_second = in_whole / (whole * window)
    return {"starts": len(starts), "processes": len(pids), "limit": limit, "window": window,
            "max_in_window": max_in_window(starts, window - SLACK), "throughput": round(per_second, 2),
            "of_limit": round(per_second / (limit / window), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", action="append", choices=["sqlite", "postgres", "redis"])
    parser.add_argument("--rate", default="20/s")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--processes", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    import trio
    from backends.stores import BACKENDS  # the test suite's throw-away stores: a file, a schema, a key prefix

    for name in args.backend or ["sqlite", "postgres", "redis"]:
        async def one(name: str = name) -> dict[str, Any]:
            with tempfile.TemporaryDirectory() as scratch:
                async with BACKENDS[name](Path(scratch)) as config:
                    return await trio.to_thread.run_sync(
                        lambda: run(config.database_url, rate=args.rate, duration=args.duration, processes=args.processes))

        figures = trio.run(one)
        print(f"{name:9} {args.rate} over {args.duration:g} s, {figures['processes']} processes: {figures['starts']} starts, "
              f"at most {figures['max_in_window']} in any window (limit {figures['limit']}), "
              f"{figures['throughput']} jobs/s = {figures['of_limit']:.1%} of the limit")


if __name__ == "__main__":
    main()
