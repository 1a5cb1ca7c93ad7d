"""What a user gets from the command line: `python benchmarks/service.py`.

20,000 jobs of the bundled site's cheapest type (`invalidate_cache` on the in-process cache)
are written to a file and loaded with `python -m pipeline enqueue --from-file`; then
`python -m pipeline` is started as a user starts it (WORKER_CONCURRENCY=32, as the issue that asked
for this measured; default logging: INFO, a line per job, to a file), and the script waits until every job is completed, reading the database from outside.
It does so with `--processes 1` and with the default (one worker process per core), alternating,
three rounds, and prints the medians. The drain rate counts from the first job completed to the
last (the service's start-up is printed apart).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = json.dumps({"job_type": "invalidate_cache", "payload": {"keys": ["k"]}})


def load(directory: Path, jobs: int, env: dict[str, str]) -> float:
    lines = directory / "jobs.jsonl"
    lines.write_text((JOB + "\n") * jobs)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pipeline", "enqueue", "--from-file", str(lines)], env=env, cwd=directory,
                   check=True, stdout=subprocess.DEVNULL)
    return jobs / (time.perf_counter() - started)


def completed(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT count(*) FROM jobs WHERE status = 'completed'").fetchone()[0]
    finally:
        conn.close()


def drain(directory: Path, jobs: int, env: dict[str, str], processes: str | None) -> tuple[float, float]:
    """(jobs/s from the first completion to the last, seconds from start to the first completion)."""
    db = directory / "pipeline.db"
    args = [sys.executable, "-m", "pipeline"] + (["--processes", processes] if processes else [])
    with (directory / "service.log").open("w") as log:
        started = time.perf_counter()
        service = subprocess.Popen(args, env=env, cwd=directory, stdout=subprocess.DEVNULL, stderr=log)
        try:
            first = None
            while True:
                n = completed(db)
                now = time.perf_counter()
                if n and first is None:
                    first = (now, n)
                if n >= jobs:
                    break
                if service.poll() is not None:
                    raise RuntimeError(f"the service exited with {service.returncode}: see {directory / 'service.log'}")
                time.sleep(0.02)
        finally:
            service.terminate()
            service.wait(60)
    assert first is not None
    return (jobs - first[1]) / (now - first[0]), first[0] - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32, help="WORKER_CONCURRENCY (default 32; the type's default is 2)")
    options = parser.parse_args()
    ways = {"--processes 1": "1", f"default ({os.cpu_count()} worker processes)": None}
    rates: dict[str, list[float]] = {way: [] for way in ways}
    loads: list[float] = []
    for _ in range(options.rounds):
        for way, processes in ways.items():
            with tempfile.TemporaryDirectory() as tmp:
                directory = Path(tmp)
                env = {k: v for k, v in os.environ.items() if not k.startswith(("ADMIN_", "WORKER_", "LOG_", "DATABASE_", "SQLITE_"))}
                env.update(DATABASE_URL=f"sqlite:///{directory / 'pipeline.db'}", ADMIN_PORT="0",
                           WORKER_CONCURRENCY=str(options.concurrency))
                loads.append(load(directory, options.jobs, env))
                rate, start_up = drain(directory, options.jobs, env, processes)
            rates[way].append(rate)
            print(f"{way}: {rate:,.0f} jobs/s (first job done {start_up:.2f} s after start)", flush=True)
    print(f"enqueue --from-file, {options.jobs:,} lines: {statistics.median(loads):,.0f} jobs/s (median)")
    for way, values in rates.items():
        print(f"python -m pipeline {way}, WORKER_CONCURRENCY={options.concurrency}, default logging: "
              f"{statistics.median(values):,.0f} jobs/s (median)")


if __name__ == "__main__":
    main()
