"""benchmarks/bench.py runs end to end on tiny sizes and prints its table and chart.

Not a timed test: nothing here checks a speed (the figures are the benchmark's to
report, on a quiet machine); only that every measurement runs, the table has every
row, and the chart is a PNG.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import early
import pytest
from PIL import Image

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench.py"

ROWS = [
    "drain, 300 no-op jobs",
    "durable enqueue, 10 concurrent callers",
    "bulk enqueue_many",
    "CLI enqueue --from-file",
    "pickup p50, enqueue returns",
    "pickup p99 from another process",
    "completed rows in the table",
    "peak RSS of the service, 2,000 pending jobs",
    "two service processes",
]


TINY = "test_bench.py::test_bench_runs_on_tiny_sizes"
SERVICE = "test_bench.py::test_the_service_benchmark_runs_the_service_as_started"
# both started as the run begins (early.py)
early.command(TINY, lambda folder: [sys.executable, str(BENCH), "--tiny", "--no-huey", "--chart", str(folder / "bench.png"),
                                    "--json", str(folder / "bench.json")])
early.command(SERVICE, lambda folder: [sys.executable, str(BENCH.with_name("service.py")), "--jobs", "300", "--rounds", "1",
                                       "--no-huey", "--cpu"])


@pytest.mark.slow
def test_bench_runs_on_tiny_sizes() -> None:
    proc, folder = early.result(TINY, timeout=240)
    chart = folder / "bench.png"
    assert proc.returncode == 0, proc.stderr[-3000:]
    for row in ROWS:
        assert row in proc.stdout, f"{row!r} missing from\n{proc.stdout}"
    assert "Huey SQLite skipped (--no-huey)" in proc.stdout
    with Image.open(chart) as image:
        assert image.format == "PNG" and image.size == (1500, 900)


def test_bench_refuses_bad_sizes() -> None:
    proc = subprocess.run([sys.executable, str(BENCH), "--runs", "0"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "--runs must be at least 1" in proc.stderr


def test_python_m_pipeline_bench_runs_the_script() -> None:
    proc = subprocess.run([sys.executable, "-m", "pipeline", "bench", "--runs", "0"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2 and "--runs must be at least 1" in proc.stderr  # bench.py's own check, reached through the CLI


@pytest.mark.slow
def test_the_service_benchmark_runs_the_service_as_started() -> None:
    """benchmarks/service.py on a tiny backlog: the CLI load, `python -m pipeline` with one and
    with the default processes, every job completed each time, and (--cpu) the CPU per job of each
    way's process tree, each way run again on an empty store (on 300 jobs, within the noise of a
    start and stop: it was negative once on a loaded machine, so only its presence is checked here).
    (--logging-cost, a third way with LOG_LEVEL=warning, is left to the script's users: two service
    runs more, in a suite at its time limit.)"""
    proc, _ = early.result(SERVICE, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cpu = re.findall(r"^  python -m pipeline (.+): (-?\d+) µs \(", proc.stdout, re.M)
    assert len(cpu) == 2, proc.stdout
    assert proc.returncode == 0, proc.stderr[-3000:]
    for line in ("enqueue --from-file, 300 lines:", "python -m pipeline --processes 1, WORKER_CONCURRENCY=32, default logging:",
                 "worker processes), WORKER_CONCURRENCY=32, default logging:"):
        assert line in proc.stdout, f"{line!r} missing from\n{proc.stdout}"


def test_the_stages_of_the_cpu_budget_sort_py_spys_samples_by_thread_then_by_the_first_rule_that_matches(
        tmp_path: Path) -> None:
    """service.py --stages: a sample (a stack, innermost frame last, and its count) goes to its thread's
    group (trio's worker threads, the other threads, else the event loop: py-spy often reads a task's
    frames without the loop's), then to the first stage of STAGES with a frame that matches, whatever
    its depth ("other" for none; the database stage only in the database's threads); a sample whose
    innermost frame is a wait (WAITS) is left out."""
    sys.path.insert(0, str(BENCH.parent))
    try:
        import service
    finally:
        sys.path.remove(str(BENCH.parent))
    raw = tmp_path / "samples.txt"
    proc = 'process 1:"python -m pipeline"'
    db_thread = f"{proc};Thread.run (threading.py:1);WorkerThread._handle_job (trio/_core/_thread_cache.py:2)"
    log_thread = f"{proc};Thread._bootstrap (threading.py:1);OutcomeLines._run (pipeline/logs.py:2)"
    raw.write_text("\n".join([
        # a log line written from inside the outcome's code: the log line's (its rule comes first)
        f"{proc};run_worker (pipeline/engine/actors/pools.py:1);_settle (pipeline/engine/actors/pools.py:2);"
        "OutcomeLines.write (pipeline/logs.py:3) 3",
        f"{db_thread};_apply (pipeline/backends/sqlite/ledger.py:2);claim_rows (pipeline/backends/sqlite/store.py:3) 5",
        f"{db_thread};_apply (pipeline/backends/sqlite/ledger.py:2);_commit (pipeline/backends/sqlite/ledger.py:3) 7",
        f"{proc};run (trio/_core/_run.py:1);run_worker (pipeline/engine/actors/pools.py:4) 1",
        f"{proc};somewhere (elsewhere.py:1) 1",
        # the loop waiting for its outcome's commit under the backend's frames: the outcome's, not the database's
        f"{proc};_settle (pipeline/engine/actors/pools.py:2);SqliteBackend.settle (pipeline/backends/sqlite/__init__.py:3);"
        "Trays.settle (pipeline/backends/trays.py:4) 2",
        f"{log_thread};OutcomeLines.flush (pipeline/logs.py:3) 1",
        f"{log_thread};Event.wait (threading.py:3);Condition.wait (threading.py:4) 50",
        f"{proc};run (trio/_core/_run.py:1);EpollIOManager.get_events (trio/_core/_io_epoll.py:243) 20",
        f"{db_thread};deliver_worker_fn_result (trio/_threads.py:1);WakeupSocketpair.wakeup_thread_and_signal_safe (trio/_core/_wakeup_socketpair.py:39) 9",
    ]) + "\n")
    shares = service.stages(raw)
    workers, others, loop = (name for name, _ in service.THREADS)
    assert shares == {
        loop: pytest.approx({"the log line (format, write)": 3 / 7, "dispatch to the worker, its scopes": 1 / 7,
                             "other": 1 / 7, "outcome: tray, Ledger batch, reply": 2 / 7}),
        workers: {"database thread: SQL per batch and per row": 1.0},
        others: {"the log line (format, write)": 1.0},
    }


def test_the_sql_floor_script_drains_its_jobs_and_prints_the_cost_per_job() -> None:
    proc = subprocess.run([sys.executable, str(BENCH.with_name("sql_floor.py")), "--rounds", "1", "--batch", "1000"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^SQLite, 20,000 jobs, 1000 a transaction, medians of 1: claim \d+\.\d µs, outcomes "
                     r"\(SUCCEED \+ the next job's START\) \d+\.\d µs, whole round \d+\.\d µs CPU per job$", proc.stdout, re.M)
