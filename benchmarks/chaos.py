"""Chaos on one SQLite file: kill -9 workers at random while a producer enqueues, then check the books.

    python benchmarks/chaos.py [--jobs 20000] [--workers 3] [--duration 60] [--kill-every 2]

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
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import attrs
import trio

import pipeline

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


def worker_main(db: str) -> None:
    config = pipeline.Config.from_env({
        "DATABASE_URL": f"sqlite:///{db}", "WORKER_LEASE_SECONDS": str(LEASE_SECONDS), "WORKER_POLL_INTERVAL_MS": "50",
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


def start_worker(db: Path, log: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--role", "worker", "--db", str(db)],
        env={**os.environ, "CHAOS_LOG": str(log)}, stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def produce(db: Path, ids: list[str], n: int, reg: pipeline.Registry) -> None:
    conn = sqlite3.connect(db, isolation_level=None, timeout=30)
    conn.execute("PRAGMA synchronous = FULL")  # as the workers (SQLITE_SYNCHRONOUS=full)
    conn.execute("BEGIN IMMEDIATE")
    for _ in range(n):
        ids.append(pipeline.enqueue_in_transaction(conn, Chaos(len(ids)), registry=reg, max_attempts=MAX_ATTEMPTS))
    conn.execute("COMMIT")
    conn.close()


def run_chaos(jobs: int, workers: int, duration: float, kill_every: float, folder: Path, out=sys.stdout) -> dict[str, int]:
    db, log = folder / "chaos.db", folder / "runs.log"
    sqlite3.connect(db).close()
    procs = [start_worker(db, log) for _ in range(workers)]
    killed: list[tuple[int, float, float]] = []  # (pid, signal sent at, process reaped at)
    ids: list[str] = []
    reg = registry()
    rng = random.Random()
    started = time.monotonic()
    next_kill = started + kill_every
    try:
        while time.monotonic() - started < duration:
            # spread the enqueues over the first 90% of the run
            due = min(jobs, int(jobs * (time.monotonic() - started) / (duration * 0.9)) + 1)
            if len(ids) < due:
                produce(db, ids, due - len(ids), reg)
            if time.monotonic() >= next_kill:
                i = rng.randrange(len(procs))
                sent = time.time()
                procs[i].send_signal(signal.SIGKILL)
                procs[i].wait()
                killed.append((procs[i].pid, sent, time.time()))
                procs[i] = start_worker(db, log)
                next_kill += kill_every * rng.uniform(0.5, 1.5)
            time.sleep(0.05)
        if len(ids) < jobs:
            produce(db, ids, jobs - len(ids), reg)
        # no more kills: wait for leases to expire and the backlog to drain
        conn = sqlite3.connect(db, timeout=30)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            (left,) = conn.execute("SELECT count(*) FROM jobs WHERE status != 'completed'").fetchone()
            if left == 0:
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
    return check(db, log, ids, killed, time.monotonic() - started, out)


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


def check(db: Path, log: Path, ids: list[str], killed: list[tuple[int, float, float]], elapsed: float, out) -> dict[str, int]:
    conn = sqlite3.connect(db)
    rows = dict(conn.execute("SELECT id, status FROM jobs"))
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
        f"chaos: {result['jobs']} jobs, {len(killed)} SIGKILLs in {elapsed:.0f} s: "
        f"{result['lost']} lost, {result['not_completed']} not completed, {result['never_ran']} never ran, "
        f"{duplicates} duplicate executions ({after_end} killed between the handler's end and the commit), "
        f"all from workers killed mid-run: {'yes' if unexplained == 0 else f'NO ({unexplained} not)'}",
        file=out,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["chaos", "worker"], default="chaos")
    parser.add_argument("--db")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--kill-every", type=float, default=2.0)
    args = parser.parse_args(argv)
    if args.role == "worker":
        worker_main(args.db)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        r = run_chaos(args.jobs, args.workers, args.duration, args.kill_every, Path(tmp))
    ok = r["lost"] == r["not_completed"] == r["never_ran"] == r["unexplained_duplicates"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
