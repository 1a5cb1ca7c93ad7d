"""The supervisor (`tests/supervised_service.py --processes N`) as a subprocess, for the tests of
pipeline/supervisor.py: its log read by a thread, its store, its worker processes."""

from __future__ import annotations

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from jobkit import Echo, registry

import pipeline

SERVICE = Path(__file__).parent / "supervised_service.py"
ROOT = Path(__file__).parent.parent


def service_env(database_url: str, **settings: str) -> dict[str, str]:
    """This environment without the service's own variables, then test timings, then ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ADMIN_", "WORKER_", "LOG_", "DATABASE_", "SQLITE_", "REDIS_"))}
    env.update(DATABASE_URL=database_url, ADMIN_PORT="0", WORKER_LEASE_SECONDS="1.5", WORKER_POLL_INTERVAL_MS="50",
               SQLITE_BUSY_TIMEOUT_MS="400", WORKER_CONCURRENCY="4", WORKER_SHUTDOWN_TIMEOUT="5",
               WORKER_BACKOFF_BASE_MS="100",  # a rescued job runs again within the test (10 s by default)
               REDIS_ALLOW_NON_DURABLE="true", PYTHONPATH=str(ROOT))
    env.update(settings)
    return env


class Service:
    """The supervisor on a SQLite file in ``tmp_path`` (or ``database_url``), its log (stderr)
    read by a thread. ``settings``: environment variables over the test defaults."""

    def __init__(self, tmp_path: Path, *args: str, database_url: str | None = None, **settings: str) -> None:
        self.db = tmp_path / "jobs.db"
        self.runs = tmp_path / "runs.log"
        env = service_env(database_url or f"sqlite:///{self.db}", PIPELINE_TEST_LOG=str(self.runs), **settings)
        self.proc = subprocess.Popen([sys.executable, str(SERVICE), *args], env=env, cwd=tmp_path, start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def log_closed(self, timeout: float) -> bool:
        """Whether every writer of the log (the supervisor and its worker processes) is gone."""
        self._reader.join(timeout)
        return not self._reader.is_alive()

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

    def worker_pids(self) -> set[int]:
        """Every worker process the supervisor said it started."""
        return {int(m) for line in list(self.lines) for m in re.findall(r"worker process \d+ started \(pid (\d+)\)", line)}

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

    def kill(self) -> None:
        """After a test: the supervisor and every worker process it started, whatever state they are in."""
        for pid in (self.proc.pid, *self.worker_pids()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()


def metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + ("{" + want if want else "")) or (not want and line.startswith(name + " ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_healthz(url: str, status: int, timeout: float = 20.0) -> httpx.Response:
    """Poll ``/healthz`` until it answers ``status``; that answer."""
    deadline = time.monotonic() + timeout
    answer = None
    while time.monotonic() < deadline:
        try:
            answer = httpx.get(f"{url}/healthz", timeout=5)
        except httpx.TransportError:
            answer = None
        if answer is not None and answer.status_code == status:
            return answer
        time.sleep(0.05)
    raise AssertionError(f"/healthz never answered {status}; last: {answer.text if answer is not None else None}")


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not reaped yet, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def processes_of(supervisor_pid: int) -> list[int]:
    """Every running process started by that supervisor (their environment names it), found
    in /proc: also one the supervisor started and never reported."""
    marker = f"PIPELINE_SUPERVISOR_PID={supervisor_pid}\0".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes() and alive(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def listening_ports(pid: int) -> set[int]:
    """The TCP ports a process listens on (its sockets in /proc/PID/fd, matched in /proc/net/tcp*)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
