"""`/healthz` under the supervisor answers for its worker processes, from one admin API: real
processes, a real SQLite file whose write lock another connection holds."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from supervisor_harness import Service, free_port, listening_ports, wait_healthz

pytestmark = pytest.mark.slow


def test_healthz_names_a_worker_process_that_cannot_commit_and_counts_those_that_run(tmp_path: Path) -> None:
    """Before: /healthz asked only the supervisor's own pipeline, which runs no job: 200 while
    every worker process waited for a lock, and ``"workers": false`` while two ran. Run on a
    fixed port: a worker process that served an API of its own could not bind it (and none
    listens on any port)."""
    port = free_port()
    service = Service(tmp_path, "--processes", "2", ADMIN_PORT=str(port), SQLITE_BUSY_TIMEOUT_MS="300")
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while (answer := wait_healthz(url, 200)).json()["workers"] != 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # until both worker processes have reported
        assert answer.json() == {"status": "ok", "workers": 2}
        children = service.worker_pids()
        assert len(children) == 2
        assert listening_ports(service.proc.pid) == {port}
        assert all(listening_ports(pid) == set() for pid in children), "a worker process serves an API of its own"

        other = sqlite3.connect(service.db, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process's write transaction, left open
        try:
            message = wait_healthz(url, 503, timeout=15).json()["error"]["message"]
        finally:
            other.execute("COMMIT")
            other.close()
        named = [pid for pid in children if f"(pid {pid}): database" in message]
        assert named and "locked by another writer" in message, message
        assert wait_healthz(url, 200, timeout=15).json() == {"status": "ok", "workers": 2}
        assert service.stop() == 0
    finally:
        service.kill()
