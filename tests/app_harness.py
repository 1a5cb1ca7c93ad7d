"""For the tests of ``python -m pipeline --app``: an application's folder, the CLI and the
service as real processes started in it (its working directory, as a user runs them)."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def app_env(folder: Path, database_url: str, **settings: str) -> dict[str, str]:
    """The environment a user's shell would have in ``folder``: the project importable (as an
    installed package is), no PIPELINE_APP and no setting of the test run's own."""
    values = {k: v for k, v in os.environ.items()
              if not k.startswith(("ADMIN_", "WORKER_", "LOG_", "DATABASE_", "PIPELINE_", "REDIS_", "SQLITE_"))}
    values.update(DATABASE_URL=database_url, PYTHONPATH=str(ROOT), WORKER_PROCESSES="1", **settings)
    return values


def cli(folder: Path, env: Mapping[str, str], *argv: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline", *argv], cwd=folder, env=dict(env), input=input,
                          capture_output=True, text=True, timeout=60)


class Service:
    """``python -m pipeline ARGV`` in ``folder``; its log lines (stderr) read as they come."""

    def __init__(self, folder: Path, env: Mapping[str, str], *argv: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "pipeline", *argv], cwd=folder, env=dict(env),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._new.put(line.rstrip("\n"))
        self._new.put(None)

    def wait_for(self, found: Callable[[list[str]], bool], what: str, timeout: float = 30.0) -> None:
        """Read the log until ``found(lines so far)``; fail naming ``what`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not found(self.lines):
            try:
                line = self._new.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"no {what} within {timeout} s; the log:\n" + "\n".join(self.lines[-40:])) from None
            if line is None:
                raise AssertionError(f"the service ended (status {self.proc.wait()}) before {what}; the log:\n"
                                     + "\n".join(self.lines[-40:]))
            self.lines.append(line)

    def ready(self, processes: int, handling: str, timeout: float = 30.0) -> None:
        """Until ``processes`` pipelines say they run, each handling ``handling``."""
        def count(lines: list[str]) -> bool:
            return sum(1 for line in lines if "pipeline running on" in line and f"handling: {handling}" in line) >= processes
        self.wait_for(count, f"{processes} pipelines handling {handling}", timeout)

    def admin_url(self) -> str:
        for line in self.lines:
            if match := re.search(r"admin API on (http://127\.0\.0\.1:\d+) ", line):
                return match.group(1)
        raise AssertionError("no admin API in the log")

    def stop(self, timeout: float = 30.0) -> int:
        """SIGINT (a terminal's Ctrl-C): the graceful stop; its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            self.kill()
        self._drain()
        return code

    def _drain(self) -> None:
        """The rest of the log, once the process has ended."""
        while (line := self._new.get(timeout=10)) is not None:
            self.lines.append(line)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
