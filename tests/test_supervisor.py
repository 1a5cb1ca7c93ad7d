"""`python -m pipeline --processes N`: a supervisor, N worker processes, one admin API; real
processes, real signals, a real SQLite file."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from jobkit import Echo
from supervisor_harness import ROOT, SERVICE, Service, metric

pytestmark = pytest.mark.slow


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    started = Service(tmp_path, "--processes", "2")
    try:
        yield started
    finally:
        started.kill()


def test_two_worker_processes_share_the_work_behind_one_admin_api(service: Service) -> None:
    url = service.wait_line(r"admin API on (http://127\.0\.0\.1:\d+)").group(1)
    service.wait_line(r"pipeline running on .*: 2 worker processes × 4 workers per job type \(WORKER_CONCURRENCY is per process\)")
    children = {int(service.wait_line(rf"worker process {n} started \(pid (\d+)\)").group(1)) for n in (0, 1)}
    ids = service.enqueue([Echo(str(n), sleep=0.02) for n in range(300)])
    service.wait_completed(ids)
    assert service.run_pids() == children and len(children) == 2  # both worker processes ran jobs; the supervisor none
    assert httpx.get(f"{url}/healthz").status_code == 200
    deadline = time.monotonic() + 10  # the worker processes report their counters every second
    while metric(url, "pipeline_jobs_processed_total", job_type="echo", outcome="ok") != 300 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metric(url, "pipeline_jobs_processed_total", job_type="echo", outcome="ok") == 300
    assert metric(url, "pipeline_worker_processes") == 2
    assert service.stop() == 0
    service.wait_line(r"pipeline stopped")
    assert all(not _alive(pid) for pid in children)


def test_a_worker_process_that_dies_is_started_again_and_its_jobs_come_back(service: Service) -> None:
    url = service.wait_line(r"admin API on (http://127\.0\.0\.1:\d+)").group(1)
    service.wait_line(r"pipeline running on .*: 2 worker processes")
    (hung,) = service.enqueue([Echo("long", sleep=1.5)])  # still running when it is killed, 20 ms after its start
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (not service.runs.exists() or f"start {hung} 1 " not in service.runs.read_text()):
        time.sleep(0.02)
    victim = int(next(line.split()[3] for line in service.runs.read_text().splitlines() if line.startswith(f"start {hung} 1 ")))
    before = len(service.lines)
    os.kill(victim, signal.SIGKILL)
    service.wait_line(rf"pid {victim}\) was ended by SIGKILL \(status -9\); .* starting it again", start=before)
    replacement = int(service.wait_line(r"worker process \d started \(pid (\d+)\)", start=before).group(1))
    assert replacement != victim
    service.wait_completed([hung], timeout=30)  # its lease ran out; another process ran it again
    ids = service.enqueue([Echo(str(n)) for n in range(50)])
    service.wait_completed(ids)
    deadline = time.monotonic() + 10  # until the worker processes' reports (every second) count them
    while (processed := metric(url, "pipeline_jobs_processed_total", job_type="echo", outcome="ok")) < 51:
        assert time.monotonic() < deadline, processed
        time.sleep(0.1)
    # one stopped by a SIGTERM of its own exits 0: not an error, said plainly, and replaced
    before = len(service.lines)
    os.kill(replacement, signal.SIGTERM)
    said = service.wait_line(rf"pid {replacement}\) stopped by itself with status 0 .* starting it again", start=before)
    assert " WARNING " in said.string and not [line for line in service.lines[before:] if " ERROR " in line]
    service.wait_line(r"worker process \d started \(pid \d+\)", start=before)
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
