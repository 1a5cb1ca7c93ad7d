"""Chaos on one job store: kill -9 workers at random while a producer enqueues, then check the books.

    python benchmarks/chaos.py [--backend sqlite|postgres|redis] [--jobs 20000] [--workers 3] [--duration 60] [--kill-every 2]

The store is a fresh one made for the run and removed after it (benchmarks/stores.py): a
SQLite file, a Postgres database (CREATE/DROP DATABASE on ``--postgres-url``), or a Redis key
prefix (on ``--redis-url``, with REDIS_ALLOW_NON_DURABLE=true: the shared server keeps nothing
on disk); every process gets its DATABASE_URL.

One producer enqueues the jobs (in small committed batches, spread over the run) while
``--workers`` worker processes run them. Every ``--kill-every`` seconds a random worker
gets SIGKILL and is started again. Each job's handler appends ``start``/``end`` lines with
its id, attempt and pid to a side file (O_APPEND), and each worker appends a ``settled``
line once the run's outcome is committed (an outcome observer). At the end every job must
be completed (none lost, none stuck running, none dead), and every duplicate execution must
be explained by a kill that came while the repeated run was in flight: its worker was
killed after the run started, before its outcome was committed (the handler's ``end``
line is not the end: a kill between it and the commit repeats the job too), and before
the job's next run started. Prints a one-line summary; exit 0 when the books balance, 1
when they do not.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import trio

import pipeline
from pipeline.backends import Backend, open_backend
from pipeline.requests import JobRequest, prepare_rows

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stores import BACKENDS, POSTGRES_URL, REDIS_URL, open_stores  # noqa: E402

LEASE_SECONDS = 2.0
MAX_ATTEMPTS = 10  # a job can be hit by several kills in a row; dead would be correct, just not what we test


@attrs.frozen
class Chaos:
    n: int


def registry() -> pipeline.Registry:
    async def run(job: Chaos, ctx: pipeline.JobContext) -> None:
        log = os.environ["CHAOS_LOG"]
        with open(log, "a") as f:  # noqa: ASYNC230 - one short O_APPEND line, on purpose synchronous
            f.write(f"start {ctx.id} {ctx.attempt} {os.getpid()} {time.time():.6f}\n")
        await trio.sleep(random.uniform(0.01, 0.1))  # long enough that kills catch jobs mid-run
        with open(log, "a") as f:  # noqa: ASYNC230 - as above
            f.write(f"end {ctx.id} {ctx.attempt} {os.getpid()} {time.time():.6f}\n")

    reg = pipeline.Registry()
    reg.register("chaos", Chaos, run, concurrency=16, max_attempts=MAX_ATTEMPTS)
    return reg


def worker_main(url: str) -> None:
    config = pipeline.Config.from_env({
        **json.loads(os.environ.get("CHAOS_SETTINGS", "{}")),  # the store's own (REDIS_ALLOW_NON_DURABLE)
        "DATABASE_URL": url, "WORKER_LEASE_SECONDS": str(LEASE_SECONDS), "WORKER_POLL_INTERVAL_MS": "50",
        "WORKER_BACKOFF_BASE_MS": "50", "WORKER_SHUTDOWN_TIMEOUT": "5", "SQLITE_SYNCHRONOUS": "full", "LOG_LEVEL": "error",
        "ADMIN_ENABLED": "false", "SQLITE_BUSY_TIMEOUT_MS": "500",  # below two thirds of the lease
    }, env_file=None)
    log = os.environ["CHAOS_LOG"]

    def settled(fields: dict[str, object]) -> None:
        # called once the outcome's transaction committed (or was found stale): the run is over
        with open(log, "a") as f:
            f.write(f"settled {fields['job_id']} {fields['attempt']} {os.getpid()} {time.time():.6f}\n")

    def ready(p: pipeline.Pipeline) -> None:
        p.add_observer(settled)
        print("ready", flush=True)

    trio.run(functools.partial(pipeline.serve, config, registry(), ready=ready))


def start_worker(url: str, log: Path, settings: dict[str, str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--role", "worker", "--url", url],
        env={**os.environ, "CHAOS_LOG": str(log), "CHAOS_SETTINGS": json.dumps(settings)}, stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


async def produce(backend: Backend, ids: list[str], n: int, reg: pipeline.Registry) -> None:
    """``n`` jobs in one insert, committed when it returns (the store's own insert, as a
    service's enqueue_many or the CLI writes them)."""
    rows = prepare_rows(reg, [JobRequest("chaos", {"n": len(ids) + k}, MAX_ATTEMPTS) for k in range(n)])
    await backend.insert(rows)
    ids.extend(row.id for row in rows)


async def statuses(backend: Backend) -> dict[str, str]:
    """Every job's status, through the operators' listing (newest first, page by page)."""
    found: dict[str, str] = {}
    offset = 0
    while True:
        page, total = await backend.list(limit=1000, offset=offset)
        found.update((job.id, job.status) for job in page)
        offset += len(page)
        if not page or offset >= total:
            return found


def run_chaos(jobs: int, workers: int, duration: float, kill_every: float, folder: Path, out: Any = sys.stdout,
              *, backend: str = "sqlite", postgres_url: str = POSTGRES_URL, redis_url: str = REDIS_URL) -> dict[str, int]:
    stores = open_stores(backend, folder, postgres_url=postgres_url, redis_url=redis_url)
    try:
        url = stores.fresh("chaos")
        stores.migrate(url)
        return trio.run(functools.partial(_drive, url, stores.settings, jobs, workers, duration, kill_every, folder, out, backend))
    finally:
        stores.close()


async def _drive(url: str, settings: dict[str, str], jobs: int, workers: int, duration: float, kill_every: float,
                 folder: Path, out: Any, backend: str) -> dict[str, int]:
    log = folder / "runs.log"
    start = functools.partial(start_worker, url, log, settings)
    procs = [await trio.to_thread.run_sync(start) for _ in range(workers)]
    killed: list[tuple[int, float, float]] = []  # (pid, signal sent at, process reaped at)
    ids: list[str] = []
    reg = registry()
    rng = random.Random()
    started = time.monotonic()
    next_kill = started + kill_every
    config = pipeline.Config.from_env({**settings, "DATABASE_URL": url, "LOG_LEVEL": "error", "SQLITE_SYNCHRONOUS": "full"},
                                      env_file=None)
    try:
        async with open_backend(config) as store:
            while time.monotonic() - started < duration:
                # spread the enqueues over the first 90% of the run
                due = min(jobs, int(jobs * (time.monotonic() - started) / (duration * 0.9)) + 1)
                if len(ids) < due:
                    await produce(store, ids, due - len(ids), reg)
                if time.monotonic() >= next_kill:
                    i = rng.randrange(len(procs))
                    sent = time.time()
                    procs[i].send_signal(signal.SIGKILL)
                    await trio.to_thread.run_sync(procs[i].wait)
                    killed.append((procs[i].pid, sent, time.time()))
                    procs[i] = await trio.to_thread.run_sync(start)
                    next_kill += kill_every * rng.uniform(0.5, 1.5)
                await trio.sleep(0.05)
            if len(ids) < jobs:
                await produce(store, ids, jobs - len(ids), reg)
            # no more kills: wait for leases to expire and the backlog to drain
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                counts = (await store.stats())["by_status"]
                if sum(n for status, n in counts.items() if status != "completed") == 0:
                    break
                await trio.sleep(0.2)
            found = await statuses(store)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                await trio.to_thread.run_sync(p.wait, 15)
            except subprocess.TimeoutExpired:
                p.kill()
    return check(found, log, ids, killed, time.monotonic() - started, out, backend=backend)


@attrs.define
class Run:
    """One execution of a job, from the side file."""

    pid: int
    attempt: int
    started: float
    ended: float | None = None  # the handler's last line
    settled: float | None = None  # its outcome committed (or found stale): the run is over


def read_runs(log: Path) -> dict[str, list[Run]]:
    runs: dict[str, list[Run]] = {}  # id -> runs, in start order
    for line in log.read_text().splitlines():
        kind, job_id, attempt_text, pid_text, when_text = line.split()
        attempt, pid, when = int(attempt_text), int(pid_text), float(when_text)
        if kind == "start":
            runs.setdefault(job_id, []).append(Run(pid, attempt, when))
            continue
        run = next((r for r in reversed(runs.get(job_id, [])) if (r.pid, r.attempt) == (pid, attempt)), None)
        if run is None:
            continue  # settled without starting here: released at shutdown, or lost before it started
        if kind == "end":
            run.ended = when
        else:
            run.settled = when
    for entries in runs.values():
        entries.sort(key=lambda r: r.started)
    return runs


def explained(run: Run, next_start: float, kills: list[tuple[float, float]]) -> tuple[bool, bool]:
    """Was ``run`` repeated because its process was killed while it was in flight: after it
    started, before its outcome was committed, and before the next run began? And if so,
    did that kill land after the handler's own end (between its end and the commit)?"""
    for sent, reaped in kills:
        # [sent, reaped] brackets the moment the kill landed: give the check the benefit of it
        if reaped >= run.started and sent <= next_start and (run.settled is None or sent < run.settled):
            return True, run.ended is not None and reaped > run.ended
    return False, False


def check(rows: dict[str, str], log: Path, ids: list[str], killed: list[tuple[int, float, float]], elapsed: float,
          out: Any, *, backend: str = "sqlite") -> dict[str, int]:
    """The books: ``rows`` is every job's status in the store, ``ids`` every job enqueued."""
    lost = [i for i in ids if i not in rows]
    not_done = {i: s for i, s in rows.items() if s != "completed"}
    runs = read_runs(log)
    kills: dict[int, list[tuple[float, float]]] = {}
    for pid, sent, reaped in killed:
        kills.setdefault(pid, []).append((sent, reaped))
    duplicates = unexplained = after_end = 0
    for entries in runs.values():
        for run, following in zip(entries, entries[1:]):  # every run but the last was repeated
            duplicates += 1
            ok, late = explained(run, following.started, kills.get(run.pid, []))
            unexplained += not ok
            after_end += late
    never_ran = [i for i in ids if i not in runs]
    result = {
        "jobs": len(ids), "kills": len(killed), "lost": len(lost), "not_completed": len(not_done),
        "never_ran": len(never_ran), "duplicates": duplicates, "unexplained_duplicates": unexplained,
        "killed_between_end_and_commit": after_end,
    }
    print(
        f"chaos ({backend}): {result['jobs']} jobs, {len(killed)} SIGKILLs in {elapsed:.0f} s: "
        f"{result['lost']} lost, {result['not_completed']} not completed, {result['never_ran']} never ran, "
        f"{duplicates} duplicate executions ({after_end} killed between the handler's end and the commit), "
        f"all from workers killed mid-run: {'yes' if unexplained == 0 else f'NO ({unexplained} not)'}",
        file=out,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["chaos", "worker"], default="chaos")
    parser.add_argument("--url", help=argparse.SUPPRESS)  # a worker's DATABASE_URL
    parser.add_argument("--backend", choices=BACKENDS, default="sqlite", help="the job store (default sqlite)")
    parser.add_argument("--postgres-url", default=POSTGRES_URL, help="the server for --backend postgres")
    parser.add_argument("--redis-url", default=REDIS_URL, help="the server for --backend redis")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--kill-every", type=float, default=2.0)
    args = parser.parse_args(argv)
    if args.role == "worker":
        worker_main(args.url)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        r = run_chaos(args.jobs, args.workers, args.duration, args.kill_every, Path(tmp), backend=args.backend,
                      postgres_url=args.postgres_url, redis_url=args.redis_url)
    ok = r["lost"] == r["not_completed"] == r["never_ran"] == r["unexplained_duplicates"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
