"""A small version of benchmarks/chaos.py: SIGKILLs during a burst lose nothing; and its --workflows
mode on each store side by side: chains run in order, a batch's callback runs once after its last job,
nothing is lost or left waiting; and that mode with asyncio handlers (--runtime asyncio) on one store."""

from __future__ import annotations

import importlib.util
import io
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import attrs
import pytest
from conftest import require_service

import pipeline
from pipeline.backends.base import BatchRecord

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def load_chaos():
    spec = importlib.util.spec_from_file_location("chaos", ROOT / "benchmarks" / "chaos.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_kill_9_during_a_burst_loses_nothing(tmp_path: Path) -> None:
    chaos = load_chaos()
    out = io.StringIO()
    result = chaos.run_chaos(jobs=1200, workers=3, duration=3.0, kill_every=0.6, folder=tmp_path, out=out)
    print(out.getvalue())
    # about five in 3 s; a loaded machine, slow to start the killed processes again, fitted two once
    assert result["kills"] >= 2, out.getvalue()
    assert result["lost"] == 0, out.getvalue()
    assert result["not_completed"] == 0, out.getvalue()
    assert result["never_ran"] == 0, out.getvalue()
    assert result["unexplained_duplicates"] == 0, out.getvalue()


def test_a_duplicate_counts_as_explained_only_if_its_run_was_killed_in_flight(tmp_path: Path) -> None:
    """The books of the chaos run on a hand-written side file: a repeated run is explained
    only by a kill of its process after it started, before its outcome was committed and
    before the job's next run began."""
    chaos = load_chaos()
    log = tmp_path / "runs.log"
    rows: dict[str, str] = {}
    cases = {  # job: its lines (kind, attempt, pid, time); every job below ran twice
        "killed-mid-run": [("start", 1, 100, 10.0), ("start", 2, 200, 20.0), ("end", 2, 200, 20.1),
                           ("settled", 2, 200, 20.2)],
        "killed-between-end-and-commit": [("start", 1, 101, 10.0), ("end", 1, 101, 10.1), ("start", 2, 200, 20.0),
                                          ("settled", 2, 200, 20.2)],
        "killed-after-its-commit": [("start", 1, 102, 10.0), ("end", 1, 102, 10.1), ("settled", 1, 102, 10.2),
                                    ("start", 2, 200, 20.0), ("settled", 2, 200, 20.2)],
        "killed-after-the-rerun-began": [("start", 1, 103, 10.0), ("start", 2, 200, 12.0), ("settled", 2, 200, 12.2)],
        "never-killed": [("start", 1, 104, 10.0), ("start", 2, 200, 20.0), ("settled", 2, 200, 20.2)],
    }
    lines = []
    for job_id, entries in cases.items():
        rows[job_id] = "completed"
        lines += [f"{kind} {job_id} {attempt} {pid} {when:.6f}" for kind, attempt, pid, when in entries]
    log.write_text("\n".join(lines) + "\n")
    # (pid, signal sent, process reaped): each killed well after its run began
    killed = [(100, 15.0, 15.01), (101, 15.0, 15.01), (102, 15.0, 15.01), (103, 15.0, 15.01)]
    result = chaos.check(rows, log, list(cases), killed, 30.0, io.StringIO())
    assert result["duplicates"] == 5
    assert result["killed_between_end_and_commit"] == 1
    # the lax rule ("killed at any time after the run began") took all but the last as explained
    assert result["unexplained_duplicates"] == 3


def test_kill_9_during_workflows_on_each_store_keeps_chains_in_order_and_the_callback_once(tmp_path: Path) -> None:
    """benchmarks/chaos.py --workflows, small, on the three stores at once: a batch of 200 jobs with a
    callback and 20 three-step chains, two worker processes per store, one SIGKILLed about every
    1.5 s for 3 s, the callback's first run killed on purpose. The books (see chaos.py's docstring)
    balance on each store: none lost, every repeat explained by a kill, chains in order, the callback
    once after the last job having read a finished batch, and no job seen waiting once its parents
    had ended. (Checked to fail: with enqueue_many(chain(...)) linking nothing, and with a SQLite store
    that left 5 % of its ended jobs' edges to the repair sweep.)"""
    chaos = load_chaos()
    for backend in ("postgres", "redis"):
        url = urlsplit(chaos.POSTGRES_URL if backend == "postgres" else chaos.REDIS_URL)
        require_service(backend, url.hostname or "127.0.0.1", url.port or (5432 if backend == "postgres" else 6379))

    def one(backend: str) -> tuple[dict[str, int], str, float]:
        out = io.StringIO()
        started = time.monotonic()
        result = chaos.run_workflows(200, 20, 2, 3.0, 1.5, tmp_path / backend, out, backend=backend)
        return result, out.getvalue(), time.monotonic() - started

    for backend in chaos.BACKENDS:
        (tmp_path / backend).mkdir()
    with ThreadPoolExecutor(len(chaos.BACKENDS)) as pool:
        runs = dict(zip(chaos.BACKENDS, pool.map(one, chaos.BACKENDS)))
    report = "\n".join(f"{line} [{seconds:.1f} s]" for _, line, seconds in runs.values())
    print(report)
    for result, _, _ in runs.values():
        # the callback's first run killed: on purpose, or by a random kill that came first (then that one
        # kill may be all that a loaded machine fits in 3 s; it failed so with "kills >= 2")
        assert result["kills"] >= 1, report
        assert result["callback_runs"] >= 2, report  # its first run was killed: it ran again
        assert result["chain_links"] == 40, report
        assert result["failures"] == 0, report


def test_kill_9_during_workflows_with_asyncio_handlers_keeps_the_books(tmp_path: Path) -> None:
    """benchmarks/chaos.py --workflows --runtime asyncio, small, on SQLite (one store: the run takes the
    seconds the trio one does, and the engine is the same on every store; `chaos.py --runtime asyncio
    --backend B` runs the others): the handlers are asyncio handlers, each worker process's trio run the
    guest of an asyncio loop, sleeping with asyncio.sleep, writing the side file through
    asyncio.to_thread, reading ctx.parent_results() and ctx.batch() across the bridge. SIGKILLs lose
    nothing, every repeat is explained by a kill, chains run in order, the callback once more after
    its first run is killed, having read a finished batch."""
    chaos = load_chaos()
    out = io.StringIO()
    result = chaos.run_workflows(200, 20, 2, 3.0, 1.5, tmp_path, out, backend="sqlite", runtime="asyncio")
    print(out.getvalue())
    assert "asyncio handlers" in out.getvalue()
    assert result["kills"] >= 1, out.getvalue()
    assert result["callback_runs"] >= 2, out.getvalue()
    assert result["chain_links"] == 40, out.getvalue()
    assert result["failures"] == 0, out.getvalue()


def test_the_workflow_books_catch_what_breaks_the_promises(tmp_path: Path) -> None:
    """check_workflows on a hand-written side file: a child that started before its parent's completing
    run ended, a callback that started before the last job's end, read an unfinished batch, or ran again
    with no kill to explain it, are each counted as such."""
    chaos = load_chaos()
    members, callback, chain = ["m1", "m2"], "cb", ["s1", "s2", "s3"]
    flows = chaos.Flows(pipeline.Batch("b", tuple(members), callback), [chain])
    ids = flows.ids

    def record(job_id: str, parents: tuple[str, ...] = ()) -> pipeline.JobRecord:
        return pipeline.JobRecord(job_id, "t", "{}", "completed", 1, 10, "", None, "", "", 5, parents=parents,
                                  parent_count=len(parents), batch_id="b" if job_id in (*members, callback) else None)

    records = {i: record(i) for i in ids}
    details = {callback: record(callback, tuple(members)), "s1": record("s1"), "s2": record("s2", ("s1",)),
               "s3": record("s3", ("s2",))}
    batch = BatchRecord("b", callback, "", 2, {"completed": 2}, "completed")
    good = {  # job: its lines (kind, attempt, pid, time, figures...)
        "m1": [("start", 1, 100, 1.0), ("end", 1, 100, 1.5)],
        "m2": [("start", 1, 100, 1.0), ("end", 1, 100, 2.0)],
        "cb": [("start", 1, 100, 2.1), ("batch", 1, 100, 2.1, 2, 2, 2), ("end", 1, 100, 2.6)],
        "s1": [("start", 1, 101, 1.0), ("end", 1, 101, 1.1)],
        "s2": [("start", 1, 101, 1.2), ("parents", 1, 101, 1.2, 1, 1), ("end", 1, 101, 1.3)],
        "s3": [("start", 1, 101, 1.4), ("parents", 1, 101, 1.4, 1, 1), ("end", 1, 101, 1.5)],
    }

    def books(lines: dict[str, list[tuple[object, ...]]], killed: tuple[tuple[int, float, float], ...] = ()) -> dict[str, int]:
        log = tmp_path / "runs.log"
        log.write_text("".join(f"{kind} {job} {attempt} {pid} {when:.6f}{''.join(f' {x}' for x in rest)}\n"
                               for job, entries in lines.items() for kind, attempt, pid, when, *rest in entries))
        return chaos.check_workflows(records, details, batch, chaos.read_runs(log), flows, list(killed), None,
                                     {"elapsed": 3.0, "drain": 1.0}, io.StringIO())

    assert books(good)["failures"] == 0
    early_child = {**good, "s2": [("start", 1, 101, 1.05), ("parents", 1, 101, 1.05, 1, 1), ("end", 1, 101, 1.3)]}
    assert books(early_child)["chains_out_of_order"] == 1
    misread = {**good, "s3": [("start", 1, 101, 1.4), ("parents", 1, 101, 1.4, 0, 1), ("end", 1, 101, 1.5)]}
    assert books(misread)["parents_results_misread"] == 1
    early_callback = {**good, "cb": [("start", 1, 100, 1.9), ("batch", 1, 100, 1.9, 2, 2, 2), ("end", 1, 100, 2.6)]}
    assert books(early_callback)["callback_started_early"] == 1
    unfinished = {**good, "cb": [("start", 1, 100, 2.1), ("batch", 1, 100, 2.1, 2, 1, 1), ("end", 1, 100, 2.6)]}
    assert books(unfinished)["callback_read_unfinished_batch"] == 1
    twice = {**good, "cb": [("start", 1, 100, 2.1), ("batch", 1, 100, 2.1, 2, 2, 2), ("end", 1, 100, 2.6),
                             ("start", 2, 102, 3.0), ("batch", 2, 102, 3.0, 2, 2, 2), ("end", 2, 102, 3.5)]}
    assert books(twice)["callback_repeats_unexplained"] == 1
    killed_mid_run = {**twice, "cb": [("start", 1, 100, 2.1), ("batch", 1, 100, 2.1, 2, 2, 2),
                                      ("start", 2, 102, 3.0), ("batch", 2, 102, 3.0, 2, 2, 2), ("end", 2, 102, 3.5)]}
    records[callback] = attrs.evolve(records[callback], attempts=2)  # the run that completed it
    assert books(killed_mid_run, ((100, 2.3, 2.31),))["failures"] == 0
    assert books(twice)["completing_run_not_the_recorded_attempt"] == 0
    assert books(good)["completing_run_not_the_recorded_attempt"] == 1
