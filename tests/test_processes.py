"""Several processes on one SQLite file: hard kills, graceful stops, and no job run twice at once."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
from conftest import fast_config
from jobkit import Echo, registry, wait_file_line, wait_status

import pipeline

WORKER = Path(__file__).parent / "worker_process.py"

pytestmark = pytest.mark.slow


def start_worker(db_path: Path, log: Path, *settings: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PIPELINE_TEST_LOG": str(log)}
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), str(db_path), *settings],
        env=env, stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "ready" once every actor runs
    # SIGKILL tests run with the default durability, as docs/reliability.md says
    assert line.strip() == "ready synchronous=full", f"worker did not start as expected: {line!r}"
    return proc


def insert_jobs(db_path: Path, jobs: list[Echo]) -> list[str]:
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("PRAGMA synchronous = FULL")  # as the pipeline's own connections, by default
    conn.execute("BEGIN IMMEDIATE")
    ids = [pipeline.enqueue_in_transaction(conn, job, registry=registry()) for job in jobs]
    conn.execute("COMMIT")
    conn.close()
    return ids


def statuses(db_path: Path) -> dict[str, tuple[str, int]]:
    conn = sqlite3.connect(db_path)
    try:
        return {i: (s, a) for i, s, a in conn.execute("SELECT id, status, attempts FROM jobs")}
    finally:
        conn.close()


async def test_a_job_whose_worker_was_killed_is_rescued_by_another_process(tmp_path: Path) -> None:
    db_path, log = tmp_path / "jobs.db", tmp_path / "runs.log"
    victim = start_worker(db_path, log, "worker_lease_seconds=1.0")
    try:
        (job_id,) = insert_jobs(db_path, [Echo("survivor", sleep=3600.0)])
        wait_file_line(log, f"start {job_id} 1")
        os.kill(victim.pid, signal.SIGKILL)  # mid-job, no chance to clean up
        victim.wait(5)
    finally:
        victim.kill()
    assert statuses(db_path)[job_id] == ("running", 1)

    # the rescuer's job runs quickly: rewrite the payload as a host application might not,
    # but keep the row; what matters is that the lease expires and the job runs again
    conn = sqlite3.connect(db_path)
    conn.execute("UPDATE jobs SET payload = json_set(payload, '$.sleep', 0.0) WHERE id = ?", (job_id,))
    conn.commit()
    conn.close()
    config = fast_config(db_path, worker_lease_seconds=1.0, sqlite_synchronous="full")
    async with pipeline.open_pipeline(config, registry()) as p:
        job = await wait_status(p, job_id, "completed", timeout=15)
    assert job.attempts == 2
    assert "lease expired" in (job.error or "")


async def test_two_processes_never_run_the_same_job_at_once(tmp_path: Path) -> None:
    db_path, log = tmp_path / "jobs.db", tmp_path / "runs.log"
    workers = [start_worker(db_path, log, "worker_concurrency=8") for _ in range(2)]
    try:
        ids = insert_jobs(db_path, [Echo(str(i), sleep=0.01) for i in range(400)])  # 0.5 s of work: both get some, even on a busy machine
        with trio.fail_after(60):
            while any(s != ("completed", 1) for s in statuses(db_path).values()):
                await trio.sleep(0.05)
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            assert w.wait(10) == 0
    starts: dict[str, list[str]] = {}
    for line in log.read_text().splitlines():
        kind, job_id, attempt, pid, _ = line.split()
        if kind == "start":
            starts.setdefault(job_id, []).append(pid)
    assert sorted(starts) == sorted(ids)
    assert all(len(pids) == 1 for pids in starts.values()), "a job ran twice"
    pids = {pids[0] for pids in starts.values()}
    assert len(pids) == 2, "both processes took part"


def test_sigterm_during_a_burst_exits_zero_and_leaves_nothing_running(tmp_path: Path) -> None:
    db_path, log = tmp_path / "jobs.db", tmp_path / "runs.log"
    shutdown = 1.0
    worker = start_worker(db_path, log, f"worker_shutdown_timeout={shutdown}", "worker_concurrency=16")
    ids = insert_jobs(db_path, [Echo(str(i), sleep=0.05) for i in range(500)] + [Echo("hung", mode="hang")])
    wait_file_line(log, f"start {ids[-1]} 1")
    started = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(shutdown + 5) == 0
    # the grace, then the exit's last commits (synchronous=full: each an fsync, which took 1.2 s on a loaded
    # machine with the file locked by another writer); a stop that waited for the hung job never ends
    assert time.monotonic() - started < shutdown + 3.0
    rows = statuses(db_path)
    assert set(rows) == set(ids), "nothing lost"
    assert not [i for i, (s, _) in rows.items() if s == "running"], "no job left running"
    assert rows[ids[-1]] == ("pending", 0), "the unfinished job went back, its attempt not counted"
    assert all(s in ("pending", "completed") for s, _ in rows.values())


def test_a_second_signal_exits_at_once(tmp_path: Path) -> None:
    db_path, log = tmp_path / "jobs.db", tmp_path / "runs.log"
    worker = start_worker(db_path, log, "worker_shutdown_timeout=30.0")
    (job_id,) = insert_jobs(db_path, [Echo("hung", mode="hang")])
    wait_file_line(log, f"start {job_id} 1")
    worker.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(5) == 128 + signal.SIGTERM
    assert statuses(db_path)[job_id] == ("running", 1)  # the lease will return it
    # the next start rescues it once the lease ran out, and runs it again (quickly, this time)
    conn = sqlite3.connect(db_path)
    conn.execute("UPDATE jobs SET payload = json_set(payload, '$.mode', 'ok') WHERE id = ?", (job_id,))
    conn.commit()
    conn.close()
    worker = start_worker(db_path, log)
    try:
        deadline = time.monotonic() + 15
        while statuses(db_path)[job_id][0] != "completed" and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(10)
    assert statuses(db_path)[job_id] == ("completed", 2)


async def test_a_process_does_not_bury_the_backlog_of_a_live_worker_that_knows_its_type(tmp_path: Path) -> None:
    """Process A (here) does not know `echo`; the worker process B does. B's jobs that wait
    past A's grace period are not A's to bury; a type that no live worker knows is."""
    db_path, log = tmp_path / "jobs.db", tmp_path / "runs.log"
    worker = start_worker(db_path, log, "worker_concurrency=1", "worker_lease_seconds=0.6")
    try:
        ids = insert_jobs(db_path, [Echo(str(i), sleep=0.5) for i in range(6)])  # ~3 s of backlog for B
        conn = sqlite3.connect(db_path)
        conn.execute("INSERT INTO jobs (id, job_type, payload) VALUES ('ghost', 'nobody_knows', '{}')")
        conn.commit()
        conn.close()
        other = pipeline.site.types_registry()  # no `echo` here
        config = fast_config(db_path, worker_unknown_type_grace_seconds=0.5, worker_lease_seconds=0.6, admin_enabled=False,
                             sqlite_synchronous="full")
        async with pipeline.open_pipeline(config, other) as p:
            await wait_status(p, "ghost", "dead", timeout=15)
            for job_id in ids:
                job = await wait_status(p, job_id, "completed", "dead", timeout=30)
                assert job.status == "completed", job.error
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(10) == 0
    conn = sqlite3.connect(db_path)
    assert conn.execute("SELECT owner FROM workers").fetchall() == [], "stopped workers leave the table"
