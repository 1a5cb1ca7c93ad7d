"""The pipeline's performance, measured side by side with Huey's SQLite backend in one run.

    python benchmarks/bench.py                 # every figure, 3 runs each (a few minutes)
    python benchmarks/bench.py --quick         # small sizes, one run: under a minute
    python -m pipeline bench [...]             # the same script, from a checkout

Prints a table: each figure's median over the runs and its spread (min–max), the same
workload on Huey's ``SqliteHuey`` with thread workers where Huey is installed
(``pip install -e '.[bench]'``), the ratio, and the issue's target. Draws the chart
to docs/bench.png (``--chart``).

Every measurement runs in a fresh process on a fresh SQLite file (synchronous=FULL,
the default), and the pipeline's and Huey's alternate within each run, so both see
the same machine at the same moment:

* drain: a backlog of no-op jobs, written with executemany before the workers start,
  through every actor (claim → handler → outcome → Ledger), timed from opening the
  pipeline to the last outcome committed; Huey: the same backlog, its consumer's threads;
* durable enqueue: 100 concurrent callers each awaiting ``enqueue`` (committed on return);
  Huey: 100 threads calling the task;
* bulk: one ``enqueue_many`` call; and ``python -m pipeline enqueue --from-file`` on a
  JSON-lines file, timed as a whole subprocess (start-up included);
* pickup latency, one job at a time: enqueue returns → handler starts (and call →
  start), same process; from another process inserting through
  ``pipeline.enqueue_in_transaction``: commit → start, bounded by WORKER_POLL_INTERVAL_MS;
* scale: the drain with 1,000,000 completed rows already in the table; the peak RSS
  (VmHWM) of a ``python -m pipeline``-like process with 1,000,000 pending jobs;
* processes: total drain rate of one and of two such processes on one file.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import trio

import pipeline
import pipeline.backends.sqlite  # noqa: F401 -- the package imports its parts on first use: not inside a timed section
import pipeline.engine.wiring  # noqa: F401
from pipeline.backends import NewJob
from pipeline.backends.sqlite import migrations, store
from pipeline.clock import format_ts
from pipeline.ids import UUID7Factory

HERE = Path(__file__).resolve().parent
DEFAULT_CHART = HERE.parent / "docs" / "bench.png"


@attrs.frozen
class Noop:
    n: int


async def noop(job: Noop, ctx: pipeline.JobContext) -> None:
    return None


def registry_for(concurrency: int, handler: Callable[..., Any] = noop) -> pipeline.Registry:
    registry = pipeline.Registry()
    registry.register("noop", Noop, handler, concurrency=concurrency)
    return registry


def config_for(db: Path, **overrides: Any) -> pipeline.Config:
    """Settings named as their variables in lower case (worker_concurrency=256), read as text."""
    values: dict[str, Any] = {"database_url": f"sqlite:///{db}", "log_level": "warning", "admin_enabled": False, **overrides}
    return pipeline.Config.from_env({k.upper(): str(v).lower() if isinstance(v, bool) else str(v) for k, v in values.items()},
                                    env_file=None)


# -- files built fast: executemany in one transaction -------------------------------------------


def build_file(db: Path, *, pending: int, completed: int = 0) -> None:
    """A jobs table with ``completed`` finished rows (older) and ``pending`` due no-op jobs."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = OFF")  # a throw-away file: no need to survive a power cut
    migrations.migrate(conn, db)
    new_id = UUID7Factory()
    past = format_ts(time.time() - 3600)
    now = format_ts(time.time())

    def rows(n: int, status: str, at: str) -> Iterator[tuple[Any, ...]]:
        for i in range(n):
            yield (new_id(), "noop", f'{{"n":{i}}}', status, 1 if status == "completed" else 0, 3, at, at, at, 5)

    conn.execute("BEGIN IMMEDIATE")
    sql = (
        "INSERT INTO jobs (id, job_type, payload, status, attempts, max_attempts, run_after, created_at, updated_at, priority) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    conn.executemany(sql, rows(completed, "completed", past))
    conn.executemany(sql, rows(pending, "pending", now))
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def copy_file(template: Path, db: Path) -> Path:
    shutil.copyfile(template, db)
    return db


# -- measurements: each runs in a process of its own (``bench.py _measure NAME JSON``) ---------


async def m_drain(db: str, jobs: int, concurrency: int) -> dict[str, Any]:
    """Drain the ``jobs`` pending rows already in ``db``."""
    config = config_for(Path(db))
    done = trio.Event()
    count = 0

    def seen(fields: dict[str, Any]) -> None:
        nonlocal count
        count += 1
        if count == jobs:
            done.set()

    t0 = time.perf_counter()
    async with pipeline.open_pipeline(config, registry_for(concurrency)) as p:
        p.add_observer(seen)
        await done.wait()
        elapsed = time.perf_counter() - t0
        batches = p.backend.ledger_stats.batches
    return {"drain": jobs / elapsed, "jobs_per_commit": jobs / max(batches, 1)}


async def m_enqueue(db: str, jobs: int, callers: int) -> dict[str, Any]:
    config = config_for(Path(db), worker_enabled=False)
    per_caller = jobs // callers
    async with pipeline.open_pipeline(config, registry_for(1)) as p:

        async def caller(k: int) -> None:
            for i in range(per_caller):
                await p.enqueue(Noop(k * per_caller + i))

        t0 = time.perf_counter()
        async with trio.open_nursery() as tn:
            for k in range(callers):
                tn.start_soon(caller, k)
        elapsed = time.perf_counter() - t0
        batches = p.backend.ledger_stats.batches
    return {"enqueue": per_caller * callers / elapsed, "jobs_per_commit": per_caller * callers / max(batches, 1)}


async def m_bulk(db: str, jobs: int) -> dict[str, Any]:
    config = config_for(Path(db), worker_enabled=False)
    async with pipeline.open_pipeline(config, registry_for(1)) as p:
        batch = [Noop(i) for i in range(jobs)]
        t0 = time.perf_counter()
        await p.enqueue_many(batch)
        return {"bulk": jobs / (time.perf_counter() - t0)}


async def m_latency(db: str, samples: int, concurrency: int, gap: float) -> dict[str, Any]:
    """One job at a time: enqueue, wait for its handler to start, pause ``gap``, again."""
    started: dict[int, float] = {}
    seen = trio.Event()

    async def probe(job: Noop, ctx: pipeline.JobContext) -> None:
        nonlocal seen
        started[job.n] = time.perf_counter()
        seen.set()

    config = config_for(Path(db))
    from_return, from_call = [], []
    async with pipeline.open_pipeline(config, registry_for(concurrency, probe)) as p:
        await trio.sleep(0.1)
        for i in range(samples):
            seen = trio.Event()
            t_call = time.perf_counter()
            await p.enqueue(Noop(i))
            t_return = time.perf_counter()
            with trio.fail_after(30):
                await seen.wait()
            from_return.append(started[i] - t_return)
            from_call.append(started[i] - t_call)
            await trio.sleep(gap)
    return percentiles(from_return, "latency") | percentiles(from_call, "latency_call")


async def m_cross_latency(db: str, samples: int, concurrency: int, spread: float) -> dict[str, Any]:
    """Another process inserts ``samples`` jobs, one transaction each, at random moments
    over ``spread`` seconds and says when each committed; here: when each started."""
    started: dict[str, float] = {}
    all_seen = trio.Event()

    async def probe(job: Noop, ctx: pipeline.JobContext) -> None:
        started[ctx.id] = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process
        if len(started) == samples:
            all_seen.set()

    config = config_for(Path(db))
    async with pipeline.open_pipeline(config, registry_for(concurrency, probe)):
        inserter = await trio.run_process(
            [sys.executable, __file__, "_measure", "insert", json.dumps({"db": db, "samples": samples, "spread": spread})],
            capture_stdout=True,
        )
        with trio.fail_after(30 + 2 * config.worker.poll_interval):
            await all_seen.wait()
    committed = json.loads(inserter.stdout.decode().splitlines()[-1])
    waits = [started[job_id] - at for job_id, at in committed.items()]
    return percentiles(waits, "cross") | {"poll_interval_ms": config.worker.poll_interval_ms}


def m_insert(db: str, samples: int, spread: float) -> dict[str, float]:
    """The other process of m_cross_latency: the outbox way, one job per transaction."""
    registry = registry_for(1)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 5000")
    committed = {}
    for i in range(samples):
        time.sleep(random.uniform(0, 2 * spread / samples))
        conn.execute("BEGIN IMMEDIATE")
        job_id = pipeline.enqueue_in_transaction(conn, Noop(i), registry=registry)
        conn.execute("COMMIT")
        committed[job_id] = time.monotonic()
    conn.close()
    return committed


def m_serve(db: str, concurrency: int, poll_ms: int) -> None:
    """The service as ``python -m pipeline`` runs it (``pipeline.serve``), with the no-op
    job type; says "ready" once its workers run; stops on SIGTERM."""

    def ready(p: Any) -> None:
        print("ready", flush=True)

    config = config_for(Path(db), worker_poll_interval_ms=poll_ms)
    trio.run(functools.partial(pipeline.serve, config, registry_for(concurrency), ready=ready))


MEASURES: dict[str, Callable[..., Any]] = {
    "drain": m_drain,
    "enqueue": m_enqueue,
    "bulk": m_bulk,
    "latency": m_latency,
    "cross_latency": m_cross_latency,
    "insert": m_insert,
    "serve": m_serve,
}


def percentiles(values: list[float], name: str) -> dict[str, float]:
    ms = sorted(v * 1000 for v in values)
    return {f"{name}_p50": statistics.median(ms), f"{name}_p99": ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]}


def run_measure(name: str, **params: Any) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter; its last line of output is the result."""
    proc = subprocess.run(
        [sys.executable, __file__, "_measure", name, json.dumps(params)], capture_output=True, text=True, timeout=600, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"measurement {name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def measure_main(name: str, params_json: str) -> int:
    fn = MEASURES[name]
    params = json.loads(params_json)
    result = trio.run(functools.partial(fn, **params)) if inspect.iscoroutinefunction(fn) else fn(**params)
    if result is not None:
        print(json.dumps(result), flush=True)
    return 0


# -- measurements driven from outside: the service processes ------------------------------------


class Service:
    """A ``python -m pipeline``-like process (m_serve) on ``db``."""

    def __init__(self, db: Path, concurrency: int, poll_ms: int) -> None:
        params = json.dumps({"db": str(db), "concurrency": concurrency, "poll_ms": poll_ms})
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "_measure", "serve", params], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def wait_ready(self) -> None:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if line.strip() != "ready":
            self.proc.kill()
            raise RuntimeError(f"the service did not start: {line}{self.proc.stderr.read() if self.proc.stderr else ''}")

    def peak_rss_mb(self) -> float:
        """VmHWM: the most resident memory the process ever had."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmHWM in /proc/PID/status (not Linux?)")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_until(db: Path, sql: str, check: Callable[[int], bool], *, every: float = 0.005, timeout: float = 300) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        deadline = time.monotonic() + timeout
        while not check(conn.execute(sql).fetchone()[0]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting on {sql!r}")
            time.sleep(every)
    finally:
        conn.close()


def processes_drain(tmp: Path, processes: int, jobs: int, concurrency: int) -> float:
    """Total drain rate of ``processes`` services on one file: start them on an empty
    table, insert the backlog in one transaction, time from its commit to the last job done."""
    db = tmp / f"procs{processes}.db"
    build_file(db, pending=0)
    services = [Service(db, concurrency, poll_ms=50) for _ in range(processes)]
    try:
        for s in services:
            s.wait_ready()
        conn = store.connect(db)
        rows = [NewJob(i, "noop", f'{{"n":{n}}}', 3, format_ts(time.time()), 5, format_ts(time.time()))
                for n, i in enumerate(UUID7Factory().many(jobs))]
        with store.write_transaction(conn):
            store.insert_jobs(conn, rows)
        t0 = time.perf_counter()
        conn.close()
        wait_until(db, "SELECT EXISTS (SELECT 1 FROM jobs WHERE status IN ('pending', 'running'))", lambda busy: not busy)
        return jobs / (time.perf_counter() - t0)
    finally:
        for s in services:
            s.stop()


def peak_memory(template: Path, db: Path, jobs: int, concurrency: int) -> float:
    """Peak RSS of a service draining ``jobs`` jobs from the backlog in ``template``."""
    copy_file(template, db)
    service = Service(db, concurrency, poll_ms=500)
    try:
        service.wait_ready()
        wait_until(db, "SELECT count(*) FROM jobs WHERE status = 'completed'", lambda n: n >= jobs, every=0.05)
        return service.peak_rss_mb()
    finally:
        service.stop()


def cli_bulk(tmp: Path, jobs: int) -> float:
    """``python -m pipeline enqueue --from-file``, timed as a whole process."""
    lines = tmp / "jobs.jsonl"
    with lines.open("w") as f:
        for i in range(jobs):
            f.write(json.dumps({"job_type": "invalidate_cache", "payload": {"keys": [f"post:{i}"]}}) + "\n")
    db = tmp / "cli.db"
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{db}"}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pipeline", "enqueue", "--from-file", str(lines)], cwd=tmp, env=env, check=True,
                   capture_output=True)
    return jobs / (time.perf_counter() - t0)


# -- Huey, where installed ------------------------------------------------------------------------


def huey_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("huey") is not None


def run_huey(what: str, db: Path, **params: Any) -> dict[str, Any]:
    args = [sys.executable, str(HERE / "bench_huey.py"), what, "--db", str(db)]
    for key, value in params.items():
        args += [f"--{key}", str(value)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"huey {what} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


# -- the run --------------------------------------------------------------------------------------


@attrs.define
class Sizes:
    jobs: int  # drain backlog
    concurrency: int  # workers of the no-op type
    callers: int
    enqueue_jobs: int
    bulk_jobs: int
    latency_samples: int
    cross_samples: int
    scale_rows: int  # completed rows for the scale drain, pending rows for the memory figure
    memory_jobs: int  # jobs the service drains before its peak RSS is read
    process_jobs: int
    huey_jobs: int
    huey_workers: int
    huey_samples: int
    runs: int


FULL = Sizes(jobs=20_000, concurrency=256, callers=100, enqueue_jobs=20_000, bulk_jobs=100_000, latency_samples=500,
             cross_samples=300, scale_rows=1_000_000, memory_jobs=50_000, process_jobs=60_000, huey_jobs=5_000,
             huey_workers=16, huey_samples=200, runs=3)
QUICK = Sizes(jobs=5_000, concurrency=256, callers=100, enqueue_jobs=5_000, bulk_jobs=20_000, latency_samples=100,
              cross_samples=60, scale_rows=100_000, memory_jobs=5_000, process_jobs=10_000, huey_jobs=1_000,
              huey_workers=16, huey_samples=40, runs=1)


@attrs.define
class Figure:
    key: str
    label: str
    unit: str
    target: str
    ours: list[float] = attrs.field(factory=list)
    huey: list[float] = attrs.field(factory=list)
    higher_is_better: bool = True
    met: Callable[[float, float | None], bool] | None = None  # (our median, Huey's median or None) → target met


def figures(sizes: Sizes, poll_ms: int) -> dict[str, Figure]:
    def at_least(x: float) -> Callable[[float, float | None], bool]:
        return lambda ours, huey: ours >= x

    def at_most(x: float) -> Callable[[float, float | None], bool]:
        return lambda ours, huey: ours <= x

    s = sizes
    items = [
        Figure("drain", f"drain, {s.jobs:,} no-op jobs ({s.concurrency} workers; Huey {s.huey_workers} threads)", "jobs/s",
               "≥ 20,000 and ≥ 5× Huey", met=lambda ours, huey: ours >= 20_000 and (huey is None or ours >= 5 * huey)),
        Figure("enqueue", f"durable enqueue, {s.callers} concurrent callers", "jobs/s", "≥ 20,000", met=at_least(20_000)),
        Figure("bulk", f"bulk enqueue_many, {s.bulk_jobs:,} jobs in one call", "jobs/s", "≥ 50,000", met=at_least(50_000)),
        Figure("cli", f"CLI enqueue --from-file, {s.bulk_jobs:,} lines (whole process)", "jobs/s", "≥ 50,000",
               met=at_least(50_000)),
        Figure("latency_p50", "pickup p50, enqueue returns → handler starts", "ms", "≤ 1", higher_is_better=False, met=at_most(1)),
        Figure("latency_p99", "pickup p99, enqueue returns → handler starts", "ms", "≤ 5", higher_is_better=False, met=at_most(5)),
        Figure("latency_call_p50", "pickup p50, enqueue called → handler starts", "ms", "", higher_is_better=False),
        Figure("latency_call_p99", "pickup p99, enqueue called → handler starts", "ms", "", higher_is_better=False),
        # bounded by the poll interval, plus the claim's own commit and a trio round
        Figure("cross_p50", f"pickup p50 from another process (poll {poll_ms} ms)", "ms", f"≤ {poll_ms} (half on average)",
               higher_is_better=False, met=at_most(poll_ms * 1.1)),
        Figure("cross_p99", f"pickup p99 from another process (poll {poll_ms} ms)", "ms", f"≤ {poll_ms} + claim",
               higher_is_better=False, met=at_most(poll_ms * 1.1)),
        Figure("drain_empty", f"drain, {s.jobs:,} jobs, nothing else in the table", "jobs/s", ""),
        Figure("drain_scale", f"drain, {s.jobs:,} jobs, {s.scale_rows:,} completed rows in the table", "jobs/s", "≥ 0.8× empty"),
        Figure("scale_ratio", "  … against the empty table", "×", "≥ 0.80", met=at_least(0.8)),
        Figure("rss_small", f"peak RSS of the service, {s.memory_jobs:,} pending jobs", "MB", "", higher_is_better=False),
        Figure("rss_large", f"peak RSS of the service, {s.scale_rows:,} pending jobs", "MB", "< 200", higher_is_better=False, met=at_most(200)),
        Figure("procs1", f"drain, {s.process_jobs:,} jobs, one service process", "jobs/s", ""),
        Figure("procs2", f"drain, {s.process_jobs:,} jobs, two service processes (total)", "jobs/s", "≥ one"),
        Figure("procs_ratio", "  … two against one", "×", "≥ 1.00", met=at_least(1.0)),
    ]
    return {f.key: f for f in items}


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def bench(sizes: Sizes, *, with_huey: bool, only: set[str] | None = None) -> dict[str, Figure]:
    poll_ms = pipeline.Config().worker.poll_interval_ms
    figs = figures(sizes, poll_ms)
    s = sizes

    def want(group: str) -> bool:
        return only is None or group in only

    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp_name:
        tmp = Path(tmp_name)
        templates: dict[str, Path] = {}
        if want("scale"):
            progress(f"building a table with {s.scale_rows:,} completed rows and {s.jobs:,} pending ...")
            templates["scale"] = tmp / "scale-template.db"
            build_file(templates["scale"], pending=s.jobs, completed=s.scale_rows)
        if want("memory"):
            progress(f"building a table with {s.scale_rows:,} pending rows ...")
            templates["memory_large"] = tmp / "memory-large-template.db"
            build_file(templates["memory_large"], pending=s.scale_rows)
            templates["memory_small"] = tmp / "memory-small-template.db"
            build_file(templates["memory_small"], pending=s.memory_jobs)
        for run in range(s.runs):
            progress(f"run {run + 1} of {s.runs}")
            db = tmp / f"run{run}"
            db.mkdir()

            def fresh(name: str, db: Path = db) -> Path:
                return db / f"{name}.db"

            if want("drain"):
                path = fresh("drain")
                build_file(path, pending=s.jobs)
                r = run_measure("drain", db=str(path), jobs=s.jobs, concurrency=s.concurrency)
                figs["drain"].ours.append(r["drain"])
                figs["drain_empty"].ours.append(r["drain"])
                progress(f"  drain {r['drain']:,.0f} jobs/s ({r['jobs_per_commit']:.0f} jobs per commit)")
                if with_huey:
                    h = run_huey("drain", fresh("huey-drain"), jobs=s.huey_jobs, workers=s.huey_workers)
                    figs["drain"].huey.append(h["drain"])
                    progress(f"  huey drain {h['drain']:,.0f} jobs/s")
            if want("enqueue"):
                r = run_measure("enqueue", db=str(fresh("enqueue")), jobs=s.enqueue_jobs, callers=s.callers)
                figs["enqueue"].ours.append(r["enqueue"])
                progress(f"  enqueue {r['enqueue']:,.0f} jobs/s ({r['jobs_per_commit']:.0f} jobs per commit)")
                if with_huey:
                    h = run_huey("enqueue", fresh("huey-enqueue"), jobs=min(s.enqueue_jobs, 10 * s.huey_jobs), callers=s.callers)
                    figs["enqueue"].huey.append(h["enqueue"])
                    progress(f"  huey enqueue {h['enqueue']:,.0f} jobs/s")
            if want("bulk"):
                r = run_measure("bulk", db=str(fresh("bulk")), jobs=s.bulk_jobs)
                figs["bulk"].ours.append(r["bulk"])
                rate = cli_bulk(db, s.bulk_jobs)
                figs["cli"].ours.append(rate)
                progress(f"  bulk {r['bulk']:,.0f} jobs/s, CLI --from-file {rate:,.0f} jobs/s")
            if want("latency"):
                r = run_measure("latency", db=str(fresh("latency")), samples=s.latency_samples, concurrency=s.concurrency,
                                gap=0.002)
                for key in ("latency_p50", "latency_p99", "latency_call_p50", "latency_call_p99"):
                    figs[key].ours.append(r[key])
                progress(f"  pickup p50 {r['latency_p50']:.3f} ms, p99 {r['latency_p99']:.3f} ms")
                if with_huey:
                    h = run_huey("latency", fresh("huey-latency"), samples=s.huey_samples, workers=s.huey_workers, gap=0.002)
                    for key in ("latency_p50", "latency_p99", "latency_call_p50", "latency_call_p99"):
                        figs[key].huey.append(h[key])
                    progress(f"  huey pickup p50 {h['latency_p50']:.3f} ms, p99 {h['latency_p99']:.3f} ms")
                r = run_measure("cross_latency", db=str(fresh("cross")), samples=s.cross_samples, concurrency=s.concurrency,
                                spread=max(3.0, 6 * poll_ms / 1000))
                figs["cross_p50"].ours.append(r["cross_p50"])
                figs["cross_p99"].ours.append(r["cross_p99"])
                progress(f"  cross-process pickup p50 {r['cross_p50']:.1f} ms, p99 {r['cross_p99']:.1f} ms")
            if want("scale"):
                path = copy_file(templates["scale"], fresh("scale"))
                r = run_measure("drain", db=str(path), jobs=s.jobs, concurrency=s.concurrency)
                figs["drain_scale"].ours.append(r["drain"])
                if want("drain"):  # the ratio to the empty-table drain of the same run
                    figs["scale_ratio"].ours.append(r["drain"] / figs["drain_empty"].ours[-1])
                progress(f"  drain with {s.scale_rows:,} rows {r['drain']:,.0f} jobs/s")
            if want("memory"):
                small = peak_memory(templates["memory_small"], fresh("memory-small"), s.memory_jobs, s.concurrency)
                large = peak_memory(templates["memory_large"], fresh("memory-large"), s.memory_jobs, s.concurrency)
                figs["rss_small"].ours.append(small)
                figs["rss_large"].ours.append(large)
                progress(f"  peak RSS {small:.0f} MB ({s.memory_jobs:,} pending), {large:.0f} MB ({s.scale_rows:,} pending)")
            if want("processes"):
                one = processes_drain(db, 1, s.process_jobs, s.concurrency)
                two = processes_drain(db, 2, s.process_jobs, s.concurrency)
                figs["procs1"].ours.append(one)
                figs["procs2"].ours.append(two)
                figs["procs_ratio"].ours.append(two / one)
                progress(f"  one process {one:,.0f} jobs/s, two {two:,.0f} jobs/s")
            shutil.rmtree(db)
    return {k: f for k, f in figs.items() if f.ours}


# -- the table ------------------------------------------------------------------------------------


def fmt(value: float, unit: str, *, signed: bool = False) -> str:
    if unit == "ms" and value < 0 and not signed:
        return f"< 0 ({value:.3f})"  # the handler started before enqueue's caller resumed
    if unit == "ms":
        return f"{value:.3f}" if value < 10 else f"{value:,.1f}"
    if unit == "×":
        return f"{value:.2f}"
    return f"{value:,.0f}"


def spread(values: list[float], unit: str) -> str:
    if len(values) < 2:
        return ""
    return f"{fmt(min(values), unit, signed=True)} to {fmt(max(values), unit, signed=True)}"


def table(figs: dict[str, Figure], sizes: Sizes, huey_note: str | None) -> str:
    header = ["figure", "unit", "pipeline", "(min to max)", "Huey SQLite", "(min to max)", "ratio", "target", "met"]
    rows = []
    for f in figs.values():
        ours = statistics.median(f.ours)
        huey = statistics.median(f.huey) if f.huey else None
        ratio = ""
        if huey:
            ratio = f"{ours / huey:.1f}×" if f.higher_is_better else f"{huey / ours:.1f}× faster" if ours > 0 else ""
        met = "" if f.met is None else ("yes" if f.met(ours, huey) else "NO")
        rows.append([
            f.label, f.unit, fmt(ours, f.unit), spread(f.ours, f.unit),
            "" if huey is None else fmt(huey, f.unit), "" if huey is None else spread(f.huey, f.unit), ratio, f.target, met,
        ])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    right = {2, 3, 4, 5, 6}

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [line(header), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    runs = f"{sizes.runs} run{'s' if sizes.runs > 1 else ''}"
    note = f"median of {runs}, each measurement in a fresh process on a fresh SQLite file, synchronous=FULL; {os.cpu_count()} cores"
    if huey_note:
        note += f"; {huey_note}"
    return "\n".join([note, *out])


# -- entry point ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_measure"]:
        return measure_main(argv[1], argv[2])
    parser = argparse.ArgumentParser(
        prog="bench.py", description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, one run (under a minute)")
    parser.add_argument("--runs", type=int, help="runs of every figure (default 3; 1 with --quick)")
    parser.add_argument("--jobs", type=int, help="drain backlog (default 20,000)")
    parser.add_argument("--scale-rows", type=int, help="rows already in the table for the scale figures (default 1,000,000)")
    parser.add_argument("--concurrency", type=int, help="workers of the no-op job type (default 256)")
    parser.add_argument("--huey-workers", type=int, help="Huey consumer threads (default 16, its best here from 1 to 64)")
    parser.add_argument("--no-huey", action="store_true", help="skip Huey even if installed")
    parser.add_argument("--only", action="append", choices=["drain", "enqueue", "bulk", "latency", "scale", "memory", "processes"],
                        help="measure only this group (repeatable)")
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # the test suite's: proves the script runs
    parser.add_argument("--chart", type=Path, default=DEFAULT_CHART, help="where to draw the chart (default docs/bench.png)")
    parser.add_argument("--no-chart", action="store_true")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write every run's figures to FILE")
    args = parser.parse_args(argv)
    sizes = attrs.evolve(QUICK if args.quick or args.tiny else FULL)
    if args.tiny:
        sizes = Sizes(jobs=300, concurrency=32, callers=10, enqueue_jobs=300, bulk_jobs=500, latency_samples=10, cross_samples=5,
                      scale_rows=2_000, memory_jobs=300, process_jobs=300, huey_jobs=100, huey_workers=4, huey_samples=5, runs=1)
    for name in ("runs", "jobs", "scale_rows", "concurrency", "huey_workers"):
        if getattr(args, name) is not None:
            value = getattr(args, name)
            if value < 1:
                parser.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")
            setattr(sizes, name, value)
    huey_note = None
    if args.no_huey:
        huey_note = "Huey skipped (--no-huey)"
    elif not huey_installed():
        huey_note = "Huey is not installed (pip install -e '.[bench]'), so its columns are empty"
    figs = bench(sizes, with_huey=huey_note is None, only=set(args.only) if args.only else None)
    print(table(figs, sizes, huey_note))
    if args.json:
        args.json.write_text(json.dumps({k: {"ours": f.ours, "huey": f.huey, "unit": f.unit, "label": f.label}
                                         for k, f in figs.items()}, indent=2))
    if not args.no_chart:
        sys.path.insert(0, str(HERE))
        from bench_chart import draw

        runs = f"median of {sizes.runs} runs" if sizes.runs > 1 else "1 run"
        draw(figs, args.chart, title=f"pipeline vs Huey (SQLite), no-op jobs, {runs}, {os.cpu_count()} cores, synchronous=FULL",
             scale_rows=sizes.scale_rows, poll_ms=pipeline.Config().worker.poll_interval_ms, callers=sizes.callers)
        print(f"chart: {args.chart}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
