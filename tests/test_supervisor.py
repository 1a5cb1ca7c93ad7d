"""`python -m pipeline --processes N`: a supervisor, N worker processes, one admin API; real
processes, real signals, a real SQLite file."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from jobkit import Echo, registry

import pipeline

SERVICE = Path(__file__).parent / "supervised_service.py"
ROOT = Path(__file__).parent.parent

pytestmark = pytest.mark.slow


class Service:
    """The supervisor as a subprocess, its log (stderr) read by a thread."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.db = tmp_path / "jobs.db"
        self.runs = tmp_path / "runs.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ADMIN_", "WORKER_", "LOG_", "DATABASE_", "SQLITE_"))}
        env.update(DATABASE_URL=f"sqlite:///{self.db}", ADMIN_PORT="0", WORKER_LEASE_SECONDS="1.5", WORKER_POLL_INTERVAL_MS="50",
                   SQLITE_BUSY_TIMEOUT_MS="400", WORKER_CONCURRENCY="4", WORKER_SHUTDOWN_TIMEOUT="5",
                   PIPELINE_TEST_LOG=str(self.runs), PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen([sys.executable, str(SERVICE), *args], env=env, cwd=tmp_path, start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_line(self, pattern: str, timeout: float = 20.0, start: int = 0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines[start:]:
                if match := re.search(pattern, line):
                    return match
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.02)
        raise AssertionError(f"no log line matching {pattern!r}:\n" + "\n".join(self.lines[-40:]))

    def enqueue(self, jobs: list[Echo]) -> list[str]:
        conn = sqlite3.connect(self.db, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        ids = [pipeline.enqueue_in_transaction(conn, job, registry=registry()) for job in jobs]
        conn.execute("COMMIT")
        conn.close()
        return ids

    def statuses(self) -> dict[str, str]:
        conn = sqlite3.connect(self.db)
        try:
            return dict(conn.execute("SELECT id, status FROM jobs"))
        finally:
            conn.close()

    def wait_completed(self, ids: list[str], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            statuses = self.statuses()
            if all(statuses.get(i) == "completed" for i in ids):
                return
            time.sleep(0.05)
        raise AssertionError(f"not completed: {[i for i in ids if self.statuses().get(i) != 'completed'][:5]}")

    def run_pids(self) -> set[int]:
        return {int(line.split()[3]) for line in self.runs.read_text().splitlines() if line.startswith("start ")}

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    started = Service(tmp_path, "--processes", "2")
    try:
        yield started
    finally:
        if started.proc.poll() is None:
            started.proc.kill()
            started.proc.wait()


def metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + ("{" + want if want else "")) or (not want and line.startswith(name + " ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_two_worker_processes_share_the_work_behind_one_admin_api(service: Service) -> None:
    url = service.wait_line(r"admin API on (http://127\.0\.0\.1:\d+)").group(1)
    service.wait_line(r"pipeline running on .*: 2 worker processes")
    children = {int(service.wait_line(rf"worker process {n} started \(pid (\d+)\)").group(1)) for n in (0, 1)}
    ids = service.enqueue([Echo(str(n), sleep=0.02) for n in range(300)])
    service.wait_completed(ids)
    assert service.run_pids() == children and len(children) == 2  # both worker processes ran jobs; the supervisor none
    assert httpx.get(f"{url}/healthz").status_code == 200
    time.sleep(1.5)  # the worker processes report their counters every second
    assert metric(url, "pipeline_jobs_processed_total", job_type="echo", outcome="ok") == 300
    assert metric(url, "pipeline_worker_processes") == 2
    assert service.stop() == 0
    service.wait_line(r"pipeline stopped")
    assert all(not _alive(pid) for pid in children)


def test_a_worker_process_that_dies_is_started_again_and_its_jobs_come_back(service: Service) -> None:
    url = service.wait_line(r"admin API on (http://127\.0\.0\.1:\d+)").group(1)
    service.wait_line(r"pipeline running on .*: 2 worker processes")
    (hung,) = service.enqueue([Echo("long", sleep=3.0)])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (not service.runs.exists() or f"start {hung} 1 " not in service.runs.read_text()):
        time.sleep(0.02)
    victim = int(next(line.split()[3] for line in service.runs.read_text().splitlines() if line.startswith(f"start {hung} 1 ")))
    before = len(service.lines)
    os.kill(victim, signal.SIGKILL)
    service.wait_line(rf"pid {victim}\) exited with status -9; .* starting it again", start=before)
    replacement = int(service.wait_line(r"worker process \d started \(pid (\d+)\)", start=before).group(1))
    assert replacement != victim
    service.wait_completed([hung], timeout=30)  # its lease ran out; another process ran it again
    ids = service.enqueue([Echo(str(n)) for n in range(50)])
    service.wait_completed(ids)
    time.sleep(1.5)
    assert metric(url, "pipeline_jobs_processed_total", job_type="echo", outcome="ok") >= 51
    assert service.stop() == 0


def test_a_store_that_cannot_be_opened_stops_the_service_before_any_worker_starts(tmp_path: Path) -> None:
    bad = tmp_path / "corrupt.db"
    bad.write_bytes(b"\x00garbage" * 512)
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{bad}", "ADMIN_PORT": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "pipeline", "--processes", "2"], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 1
    assert "corrupt.db" in done.stderr and "Traceback" not in done.stderr
    assert "worker process 0 started" not in done.stderr


def test_a_worker_process_that_cannot_start_stops_the_service_with_its_reason(tmp_path: Path) -> None:
    """A start that fails only in the worker processes is not retried for ever: the service
    exits 1 naming the process, and no worker process is left behind."""
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'jobs.db'}", "ADMIN_PORT": "0", "PYTHONPATH": str(ROOT),
           "TEST_WORKERS_FAIL_AT_START": "1"}
    done = subprocess.run([sys.executable, str(SERVICE), "--processes", "2"], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert re.search(r"worker process \d \(pid \d+\) exited with status 3 before it was ready", done.stderr), done.stderr
    assert "Traceback" not in done.stderr
    pids = [int(p) for p in re.findall(r"worker process \d started \(pid (\d+)\)", done.stderr)]
    assert pids and not any(_alive(pid) for pid in pids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ctrl_c_in_a_terminal_stops_every_worker_process_gracefully(tmp_path: Path) -> None:
    """SIGINT to the supervisor's whole process group, as a terminal sends it: the worker
    processes (in sessions of their own) hear one SIGTERM from the supervisor and drain."""
    service = Service(tmp_path, "--processes", "2")
    try:
        service.wait_line(r"pipeline running on .*: 2 worker processes")
        children = {int(service.wait_line(rf"worker process {n} started \(pid (\d+)\)").group(1)) for n in (0, 1)}
        (job_id,) = service.enqueue([Echo("a second of work", sleep=1.0)])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (not service.runs.exists() or f"start {job_id} 1 " not in service.runs.read_text()):
            time.sleep(0.02)
        os.killpg(service.proc.pid, signal.SIGINT)  # the supervisor leads its own group, as in a terminal
        assert service.proc.wait(30) == 0
        assert service.statuses()[job_id] == "completed"  # it finished within the grace, not cut off
        assert all(not _alive(pid) for pid in children)
    finally:
        if service.proc.poll() is None:
            service.proc.kill()
