"""The supervisor notices a worker process that hangs: real processes stopped with SIGSTOP (as a
process whose event loop is blocked looks from outside: it sends no report), a real SQLite file."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from jobkit import Echo
from supervisor_harness import Service, alive, metric, processes_of, wait_healthz

pytestmark = pytest.mark.slow

SILENCE_LIMIT = 2.0  # seconds without a report before the supervisor ends a worker process (10 by default)


def test_a_hung_worker_process_is_replaced_and_the_counters_never_go_back(tmp_path: Path) -> None:
    """Before: a stopped worker process was never noticed: the supervisor logged nothing and
    ran one process short for good. Now it is ended once its reports stop for SILENCE_LIMIT and
    started again; /metrics keeps the counts it had reported (dropping them fails this too)."""
    service = Service(tmp_path, "--processes", "2", TEST_SUPERVISOR_SILENCE_LIMIT=str(SILENCE_LIMIT))
    try:
        url = service.wait_line(r"admin API on (http://127\.0\.0\.1:\d+)").group(1)
        service.wait_line(r"pipeline running on .*: 2 worker processes")
        ids = service.enqueue([Echo(str(n), sleep=0.02) for n in range(200)])
        service.wait_completed(ids)
        deadline = time.monotonic() + 10
        while (before := metric(url, "pipeline_jobs_processed_total", job_type="echo", outcome="ok")) < 200:
            assert time.monotonic() < deadline, before  # until both have reported their last counts
            time.sleep(0.1)
        assert before == 200
        victim = min(service.run_pids())  # it ran jobs: its counts are in `before`
        assert victim in service.worker_pids()
        mark = len(service.lines)
        os.kill(victim, signal.SIGSTOP)
        stopped_at = time.monotonic()
        service.wait_line(rf"\(pid {victim}\) has sent no report for [\d.]+ s .*ending it \(SIGKILL\)", start=mark,
                          timeout=SILENCE_LIMIT + 10)
        waited = time.monotonic() - stopped_at
        assert SILENCE_LIMIT - 1.5 <= waited <= SILENCE_LIMIT + 8, waited  # (its last report came up to 1 s before)
        service.wait_line(rf"\(pid {victim}\) was ended by SIGKILL", start=mark)
        replacement = int(service.wait_line(r"worker process \d started \(pid (\d+)\)", start=mark).group(1))
        assert replacement != victim and not alive(victim)
        deadline = time.monotonic() + 20
        while wait_healthz(url, 200).json()["workers"] != 2:  # the new one runs and reports
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert metric(url, "pipeline_jobs_processed_total", job_type="echo", outcome="ok") == before
        more = service.enqueue([Echo(f"after {n}") for n in range(20)])
        service.wait_completed(more)
        assert service.stop() == 0
    finally:
        service.kill()


def test_a_stop_ends_a_worker_process_that_does_not_stop(tmp_path: Path) -> None:
    """Before: after SIGTERM the supervisor waited for a stopped worker process for ever. Now a
    worker process still running WORKER_SHUTDOWN_TIMEOUT + the margin after the signal is
    ended; the supervisor exits 0, leaving no process behind."""
    grace, margin = 1.0, 1.0
    service = Service(tmp_path, "--processes", "2", WORKER_SHUTDOWN_TIMEOUT=str(grace), TEST_SUPERVISOR_STOP_MARGIN=str(margin))
    try:
        url = service.wait_line(r"admin API on (http://127\.0\.0\.1:\d+)").group(1)
        deadline = time.monotonic() + 20
        while wait_healthz(url, 200).json()["workers"] != 2:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        stuck, other = sorted(service.worker_pids())
        for pid in (stuck, other):  # each handles signals: a SIGTERM would not end it at once
            service.wait_line(rf"pipeline running on .* \(owner [^:]+:{pid}:")
        os.kill(stuck, signal.SIGSTOP)
        started = time.monotonic()
        service.proc.send_signal(signal.SIGTERM)
        assert service.proc.wait(grace + margin + 10) == 0
        took = time.monotonic() - started
        assert grace + margin - 0.5 <= took <= grace + margin + 5, took
        service.wait_line(rf"\(pid {stuck}\) has not stopped within WORKER_SHUTDOWN_TIMEOUT .*ending it \(SIGKILL\)")
        service.wait_line(rf"\(pid {other}\) stopped \(status 0\)")
        assert not alive(stuck) and not alive(other)
        assert processes_of(service.proc.pid) == []
    finally:
        service.kill()
