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
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

import pipeline
import pipeline.backends.sqlite  # noqa: F401 -- the package imports its parts on first use: not inside a timed section
import pipeline.engine.wiring  # noqa: F401
from pipeline.backends import open_backend

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from stores import BACKENDS, POSTGRES_URL, REDIS_URL, Stores, backlog, open_stores  # noqa: E402

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


def store_settings() -> dict[str, str]:
    """Settings every process on a store of this backend needs besides DATABASE_URL (Redis's
    REDIS_ALLOW_NON_DURABLE on the shared server). Read at each call, not at import: main()
    sets them once it knows the backend, and this process's own inserts (insert_backlog) need
    them as much as the measurements' processes do."""
    settings: dict[str, str] = json.loads(os.environ.get("PIPELINE_BENCH_SETTINGS", "{}"))
    return settings


def config_for(url: str, **overrides: Any) -> pipeline.Config:
    """Settings named as their variables in lower case (worker_concurrency=256), read as text."""
    values: dict[str, Any] = {"database_url": url, "log_level": "warning", "admin_enabled": False, **overrides}
    return pipeline.Config.from_env(
        {**store_settings(), **{k.upper(): str(v).lower() if isinstance(v, bool) else str(v) for k, v in values.items()}},
        env_file=None)


# -- measurements: each runs in a process of its own (``bench.py _measure NAME JSON``) ---------


async def m_drain(url: str, jobs: int, concurrency: int) -> dict[str, Any]:
    """Drain the ``jobs`` pending rows already in the store."""
    config = config_for(url)
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


async def m_enqueue(url: str, jobs: int, callers: int) -> dict[str, Any]:
    config = config_for(url, worker_enabled=False)
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


async def m_bulk(url: str, jobs: int) -> dict[str, Any]:
    config = config_for(url, worker_enabled=False)
    async with pipeline.open_pipeline(config, registry_for(1)) as p:
        batch = [Noop(i) for i in range(jobs)]
        t0 = time.perf_counter()
        await p.enqueue_many(batch)
        return {"bulk": jobs / (time.perf_counter() - t0)}


async def m_latency(url: str, samples: int, concurrency: int, gap: float) -> dict[str, Any]:
    """One job at a time: enqueue, wait for its handler to start, pause ``gap``, again."""
    started: dict[int, float] = {}
    seen = trio.Event()

    async def probe(job: Noop, ctx: pipeline.JobContext) -> None:
        nonlocal seen
        started[job.n] = time.perf_counter()
        seen.set()

    config = config_for(url)
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


async def m_cross_latency(url: str, samples: int, concurrency: int, spread: float) -> dict[str, Any]:
    """Another process inserts ``samples`` jobs, one transaction each, at random moments
    over ``spread`` seconds and says when each committed; here: when each started. On SQLite
    the pipeline finds them at its next poll; on Postgres a NOTIFY wakes it."""
    started: dict[str, float] = {}
    all_seen = trio.Event()

    async def probe(job: Noop, ctx: pipeline.JobContext) -> None:
        started[ctx.id] = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process
        if len(started) == samples:
            all_seen.set()

    config = config_for(url)
    async with pipeline.open_pipeline(config, registry_for(concurrency, probe)):
        inserter = await trio.run_process(
            [sys.executable, __file__, "_measure", "insert", json.dumps({"url": url, "samples": samples, "spread": spread})],
            capture_stdout=True,
        )
        with trio.fail_after(30 + 2 * config.worker.poll_interval):
            await all_seen.wait()
    committed = json.loads(inserter.stdout.decode().splitlines()[-1])
    waits = [started[job_id] - at for job_id, at in committed.items()]
    return percentiles(waits, "cross") | {"poll_interval_ms": config.worker.poll_interval_ms}


async def m_insert(url: str, samples: int, spread: float) -> dict[str, float]:
    """The other process of m_cross_latency: the store's own insert (what ``python -m
    pipeline enqueue`` or another service's ``enqueue`` does), one job per transaction; a
    job is committed when the call returns."""
    committed = {}
    async with open_backend(config_for(url)) as backend:
        for i in range(samples):
            await trio.sleep(random.uniform(0, 2 * spread / samples))
            (row,) = backlog(1)
            await backend.insert([row._replace(payload=f'{{"n":{i}}}')])
            committed[row.id] = time.monotonic()
    return committed


def m_serve(url: str, concurrency: int, poll_ms: int) -> None:
    """The service as ``python -m pipeline`` runs it (``pipeline.serve``), with the no-op
    job type; says "ready" once its workers run; stops on SIGTERM."""

    def ready(p: Any) -> None:
        print("ready", flush=True)

    config = config_for(url, worker_poll_interval_ms=poll_ms)
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
    """A ``python -m pipeline``-like process (m_serve) on the store at ``url``."""

    def __init__(self, url: str, concurrency: int, poll_ms: int) -> None:
        params = json.dumps({"url": url, "concurrency": concurrency, "poll_ms": poll_ms})
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


def wait_until(check: Callable[[], bool], what: str, *, every: float = 0.005, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(every)


def insert_backlog(url: str, jobs: int) -> None:
    """``jobs`` due no-op jobs in one insert (one transaction), through the store's own insert:
    what a running service's ``enqueue_many`` writes, with the wake-up it sends."""
    async def main() -> None:
        async with open_backend(config_for(url)) as backend:
            await backend.insert(list(backlog(jobs)))

    trio.run(main)


def processes_drain(stores: Stores, processes: int, jobs: int, concurrency: int) -> float:
    """Total drain rate of ``processes`` services on one store: start them on an empty
    table, insert the backlog in one transaction, time from its commit to the last job done."""
    url = stores.fresh(f"procs{processes}")
    stores.migrate(url)
    services = [Service(url, concurrency, poll_ms=50) for _ in range(processes)]
    try:
        for s in services:
            s.wait_ready()
        insert_backlog(url, jobs)
        t0 = time.perf_counter()
        wait_until(lambda: not stores.busy(url), "the backlog to drain", every=0.005 if stores.backend == "sqlite" else 0.02)
        return jobs / (time.perf_counter() - t0)
    finally:
        for s in services:
            s.stop()
        stores.drop(url)


def peak_memory(stores: Stores, template: str, name: str, jobs: int, concurrency: int) -> float:
    """Peak RSS of a service draining ``jobs`` jobs from the backlog in ``template``."""
    url = stores.copy(template, name)
    service = Service(url, concurrency, poll_ms=500)
    try:
        service.wait_ready()
        wait_until(lambda: stores.completed(url) >= jobs, f"{jobs} jobs completed", every=0.05)
        return service.peak_rss_mb()
    finally:
        service.stop()
        stores.drop(url)


def cli_bulk(stores: Stores, tmp: Path, jobs: int) -> float:
    """``python -m pipeline enqueue --from-file``, timed as a whole process."""
    lines = tmp / "jobs.jsonl"
    with lines.open("w") as f:
        for i in range(jobs):
            f.write(json.dumps({"job_type": "invalidate_cache", "payload": {"keys": [f"post:{i}"]}}) + "\n")
    url = stores.fresh("cli")
    env = {**os.environ, **stores.settings, "DATABASE_URL": url}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pipeline", "enqueue", "--from-file", str(lines)], cwd=tmp, env=env, check=True,
                   capture_output=True)
    rate = jobs / (time.perf_counter() - t0)
    stores.drop(url)
    return rate


# -- the peers: other job queues on the same server, where installed ---------------------------------


@attrs.frozen
class Peer:
    """Another queue measured on the same workloads by a script of its own (one JSON line out)."""

    name: str  # its column in the table
    script: str  # in benchmarks/
    modules: tuple[str, ...]  # importable when installed
    target: str  # what the script's --target names: "file" (a SQLite path) or "url" (a fresh store's URL)
    extra: tuple[str, ...] = ()
    note: str = ""  # how it is configured, for the table's footnote

    def installed(self) -> bool:
        import importlib.util

        return all(importlib.util.find_spec(m) is not None for m in self.modules)


PEERS: dict[str, list[Peer]] = {
    "sqlite": [Peer("Huey SQLite", "bench_huey.py", ("huey",), "file", note="SqliteHuey(fsync=True), thread workers")],
    # procrastinate: the Postgres queue most like this one (LISTEN/NOTIFY, FOR UPDATE SKIP LOCKED), asyncio
    "postgres": [Peer("procrastinate", "bench_procrastinate.py", ("procrastinate",), "url",
                      note="procrastinate's asyncio worker, PsycopgConnector")],
    "redis": [
        Peer("Huey Redis", "bench_huey.py", ("huey", "redis"), "url", ("--redis",), note="RedisHuey, thread workers"),
        Peer("Dramatiq", "bench_dramatiq.py", ("dramatiq", "redis"), "url", note="RedisBroker, worker threads"),
    ],
}


def run_peer(peer: Peer, what: str, target: str, **params: Any) -> dict[str, Any]:
    args = [sys.executable, str(HERE / peer.script), what, *peer.extra, "--target", target]
    for key, value in params.items():
        args += [f"--{key}", str(value)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{peer.name} {what} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
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
    huey_jobs: int  # the peers' drain backlog (they are slower: a smaller one keeps the run short)
    huey_workers: int  # the peers' worker threads or concurrency
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
    peers: dict[str, list[float]] = attrs.field(factory=dict)  # peer name -> its runs
    higher_is_better: bool = True
    met: Callable[[float, float | None], bool] | None = None  # (our median, the best peer's median or None) → target met

    @property
    def huey(self) -> list[float]:
        """The first peer's runs (the chart draws one peer: Huey on SQLite)."""
        return next(iter(self.peers.values()), [])

    def best_peer(self) -> float | None:
        medians = [statistics.median(v) for v in self.peers.values() if v]
        if not medians:
            return None
        return max(medians) if self.higher_is_better else min(medians)


# the drain target per backend: (at least, times the best peer), and the peers it names
DRAIN_TARGETS = {"sqlite": (20_000, 5, "Huey"), "postgres": (8_000, 10, "procrastinate"),
                 "redis": (10_000, 3, "the best of Huey and Dramatiq")}


def figures(sizes: Sizes, poll_ms: int, backend: str) -> dict[str, Figure]:
    def at_least(x: float) -> Callable[[float, float | None], bool]:
        return lambda ours, peer: ours >= x

    def at_most(x: float) -> Callable[[float, float | None], bool]:
        return lambda ours, peer: ours <= x

    s = sizes
    least, times, whom = DRAIN_TARGETS[backend]
    # a wake-up: inotify on the WAL (SQLite on Linux), NOTIFY (Postgres), pub/sub (Redis)
    cross_target, cross_met = "≤ 5", at_most(5)
    cross_label = "pickup p50 from another process (woken, not polled)"
    items = [
        Figure("drain", f"drain, {s.jobs:,} no-op jobs ({s.concurrency} workers; peers {s.huey_workers})", "jobs/s",
               f"≥ {least:,} and ≥ {times}× {whom}", met=lambda ours, peer: ours >= least and (peer is None or ours >= times * peer)),
        Figure("enqueue", f"durable enqueue, {s.callers} concurrent callers", "jobs/s", "≥ 20,000", met=at_least(20_000)),
        Figure("bulk", f"bulk enqueue_many, {s.bulk_jobs:,} jobs in one call", "jobs/s", "≥ 50,000", met=at_least(50_000)),
        Figure("cli", f"CLI enqueue --from-file, {s.bulk_jobs:,} lines (whole process)", "jobs/s", "≥ 50,000",
               met=at_least(50_000)),
        Figure("latency_p50", "pickup p50, enqueue returns → handler starts", "ms", "≤ 1", higher_is_better=False, met=at_most(1)),
        Figure("latency_p99", "pickup p99, enqueue returns → handler starts", "ms", "≤ 5", higher_is_better=False, met=at_most(5)),
        Figure("latency_call_p50", "pickup p50, enqueue called → handler starts", "ms", "", higher_is_better=False),
        Figure("latency_call_p99", "pickup p99, enqueue called → handler starts", "ms", "", higher_is_better=False),
        Figure("cross_p50", cross_label, "ms", cross_target, higher_is_better=False, met=cross_met),
        Figure("cross_p99", cross_label.replace("p50", "p99"), "ms", "≤ 25", higher_is_better=False, met=at_most(25)),
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


def bench(sizes: Sizes, stores: Stores, tmp: Path, *, peers: list[Peer], only: set[str] | None = None) -> dict[str, Figure]:
    poll_ms = pipeline.Config().worker.poll_interval_ms
    figs = figures(sizes, poll_ms, stores.backend)
    s = sizes

    def want(group: str) -> bool:
        return only is None or group in only

    def peer_target(peer: Peer, name: str) -> str:
        if peer.target == "file":
            return str(tmp / f"{name}-{random.getrandbits(32):08x}.db")
        return stores.fresh(name)

    def record(key: str, peer: Peer, value: float) -> None:
        figs[key].peers.setdefault(peer.name, []).append(value)

    templates: dict[str, str] = {}
    if want("scale"):
        progress(f"building a table with {s.scale_rows:,} completed rows and {s.jobs:,} pending ...")
        templates["scale"] = stores.fresh("scale_template")
        stores.build(templates["scale"], pending=s.jobs, completed=s.scale_rows)
    if want("memory"):
        progress(f"building a table with {s.scale_rows:,} pending rows ...")
        templates["memory_large"] = stores.fresh("memory_large_template")
        stores.build(templates["memory_large"], pending=s.scale_rows)
        templates["memory_small"] = stores.fresh("memory_small_template")
        stores.build(templates["memory_small"], pending=s.memory_jobs)
    for run in range(s.runs):
        progress(f"run {run + 1} of {s.runs}")
        if want("drain"):
            url = stores.fresh("drain")
            stores.build(url, pending=s.jobs)
            r = run_measure("drain", url=url, jobs=s.jobs, concurrency=s.concurrency)
            stores.drop(url)
            figs["drain"].ours.append(r["drain"])
            figs["drain_empty"].ours.append(r["drain"])
            progress(f"  drain {r['drain']:,.0f} jobs/s ({r['jobs_per_commit']:.0f} jobs per commit)")
            for peer in peers:
                h = run_peer(peer, "drain", peer_target(peer, "peer_drain"), jobs=s.huey_jobs, workers=s.huey_workers)
                record("drain", peer, h["drain"])
                progress(f"  {peer.name} drain {h['drain']:,.0f} jobs/s")
        if want("enqueue"):
            url = stores.fresh("enqueue")
            r = run_measure("enqueue", url=url, jobs=s.enqueue_jobs, callers=s.callers)
            stores.drop(url)
            figs["enqueue"].ours.append(r["enqueue"])
            progress(f"  enqueue {r['enqueue']:,.0f} jobs/s ({r['jobs_per_commit']:.0f} jobs per commit)")
            for peer in peers:
                h = run_peer(peer, "enqueue", peer_target(peer, "peer_enqueue"), jobs=min(s.enqueue_jobs, 10 * s.huey_jobs),
                             callers=s.callers)
                record("enqueue", peer, h["enqueue"])
                progress(f"  {peer.name} enqueue {h['enqueue']:,.0f} jobs/s")
        if want("bulk"):
            url = stores.fresh("bulk")
            r = run_measure("bulk", url=url, jobs=s.bulk_jobs)
            stores.drop(url)
            figs["bulk"].ours.append(r["bulk"])
            rate = cli_bulk(stores, tmp, s.bulk_jobs)
            figs["cli"].ours.append(rate)
            progress(f"  bulk {r['bulk']:,.0f} jobs/s, CLI --from-file {rate:,.0f} jobs/s")
        if want("latency"):
            url = stores.fresh("latency")
            r = run_measure("latency", url=url, samples=s.latency_samples, concurrency=s.concurrency, gap=0.002)
            stores.drop(url)
            for key in ("latency_p50", "latency_p99", "latency_call_p50", "latency_call_p99"):
                figs[key].ours.append(r[key])
            progress(f"  pickup p50 {r['latency_p50']:.3f} ms, p99 {r['latency_p99']:.3f} ms")
            for peer in peers:
                h = run_peer(peer, "latency", peer_target(peer, "peer_latency"), samples=s.huey_samples, workers=s.huey_workers,
                             gap=0.002)
                for key in ("latency_p50", "latency_p99", "latency_call_p50", "latency_call_p99"):
                    record(key, peer, h[key])
                progress(f"  {peer.name} pickup p50 {h['latency_p50']:.3f} ms, p99 {h['latency_p99']:.3f} ms")
            url = stores.fresh("cross")
            r = run_measure("cross_latency", url=url, samples=s.cross_samples, concurrency=s.concurrency,
                            spread=max(3.0, 6 * poll_ms / 1000) if stores.backend == "sqlite" else 3.0)
            stores.drop(url)
            figs["cross_p50"].ours.append(r["cross_p50"])
            figs["cross_p99"].ours.append(r["cross_p99"])
            progress(f"  cross-process pickup p50 {r['cross_p50']:.1f} ms, p99 {r['cross_p99']:.1f} ms")
        if want("scale"):
            url = stores.copy(templates["scale"], "scale")
            r = run_measure("drain", url=url, jobs=s.jobs, concurrency=s.concurrency)
            stores.drop(url)
            figs["drain_scale"].ours.append(r["drain"])
            if want("drain"):  # the ratio to the empty-table drain of the same run
                figs["scale_ratio"].ours.append(r["drain"] / figs["drain_empty"].ours[-1])
            progress(f"  drain with {s.scale_rows:,} rows {r['drain']:,.0f} jobs/s")
        if want("memory"):
            small = peak_memory(stores, templates["memory_small"], "memory_small", s.memory_jobs, s.concurrency)
            large = peak_memory(stores, templates["memory_large"], "memory_large", s.memory_jobs, s.concurrency)
            figs["rss_small"].ours.append(small)
            figs["rss_large"].ours.append(large)
            progress(f"  peak RSS {small:.0f} MB ({s.memory_jobs:,} pending), {large:.0f} MB ({s.scale_rows:,} pending)")
        if want("processes"):
            one = processes_drain(stores, 1, s.process_jobs, s.concurrency)
            two = processes_drain(stores, 2, s.process_jobs, s.concurrency)
            figs["procs1"].ours.append(one)
            figs["procs2"].ours.append(two)
            figs["procs_ratio"].ours.append(two / one)
            progress(f"  one process {one:,.0f} jobs/s, two {two:,.0f} jobs/s")
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


def table(figs: dict[str, Figure], sizes: Sizes, backend: str, peers: list[Peer], notes: list[str]) -> str:
    header = ["figure", "unit", "pipeline", "(min to max)"]
    for peer in peers:
        header += [peer.name, "(min to max)", "ratio"]
    header += ["target", "met"]
    rows = []
    for f in figs.values():
        ours = statistics.median(f.ours)
        row = [f.label, f.unit, fmt(ours, f.unit), spread(f.ours, f.unit)]
        for peer in peers:
            values = f.peers.get(peer.name, [])
            theirs = statistics.median(values) if values else None
            ratio = ""
            if theirs:
                ratio = f"{ours / theirs:.1f}×" if f.higher_is_better else f"{theirs / ours:.1f}× faster" if ours > 0 else ""
            row += ["" if theirs is None else fmt(theirs, f.unit), spread(values, f.unit), ratio]
        met = "" if f.met is None else ("yes" if f.met(ours, f.best_peer()) else "NO")
        rows.append([*row, f.target, met])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    right = set(range(2, len(header) - 2))

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [line(header), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    runs = f"{sizes.runs} run{'s' if sizes.runs > 1 else ''}"
    where = {"sqlite": "a fresh SQLite file, synchronous=FULL", "postgres": "a fresh Postgres database",
             "redis": "a fresh Redis key prefix"}[backend]
    note = f"{backend}: median of {runs}, each measurement in a fresh process on {where}; {os.cpu_count()} cores"
    return "\n".join([note, *notes, *out])


# -- entry point ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_measure"]:
        return measure_main(argv[1], argv[2])
    parser = argparse.ArgumentParser(
        prog="bench.py", description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", choices=BACKENDS, default="sqlite",
                        help="the job store to measure (default sqlite); its peers run on the same server")
    parser.add_argument("--postgres-url", default=POSTGRES_URL,
                        help="the server for --backend postgres; a database is made and dropped per measurement "
                             f"(default {POSTGRES_URL}, or PIPELINE_BENCH_POSTGRES_URL)")
    parser.add_argument("--redis-url", default=REDIS_URL,
                        help=f"the server for --backend redis; a key prefix per measurement (default {REDIS_URL})")
    parser.add_argument("--quick", action="store_true", help="small sizes, one run (under a minute)")
    parser.add_argument("--runs", type=int, help="runs of every figure (default 3; 1 with --quick)")
    parser.add_argument("--jobs", type=int, help="drain backlog (default 20,000)")
    parser.add_argument("--scale-rows", type=int, help="rows already in the table for the scale figures (default 1,000,000)")
    parser.add_argument("--concurrency", type=int, help="workers of the no-op job type (default 256)")
    parser.add_argument("--huey-workers", type=int, help="the peers' worker threads (default 16, Huey's best here from 1 to 64)")
    parser.add_argument("--no-huey", "--no-peers", dest="no_peers", action="store_true",
                        help="skip the other queues (Huey, procrastinate, Dramatiq) even if installed")
    parser.add_argument("--only", action="append", choices=["drain", "enqueue", "bulk", "latency", "scale", "memory", "processes"],
                        help="measure only this group (repeatable)")
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # the test suite's: proves the script runs
    parser.add_argument("--chart", type=Path, help="where to draw the chart (default docs/bench.png for sqlite, none for the others)")
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
    only = set(args.only) if args.only else None
    notes = []
    peers = []
    for peer in PEERS[args.backend]:
        if args.no_peers:
            notes.append(f"{peer.name} skipped (--no-huey)")
        elif not peer.installed():
            notes.append(f"{peer.name} is not installed (pip install -e '.[bench]'), so its columns are empty")
        else:
            peers.append(peer)
            notes.append(f"{peer.name}: {peer.note}")
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp_name:
        stores = open_stores(args.backend, Path(tmp_name), postgres_url=args.postgres_url, redis_url=args.redis_url)
        os.environ["PIPELINE_BENCH_SETTINGS"] = json.dumps(stores.settings)  # every measurement's process reads them
        try:
            figs = bench(sizes, stores, Path(tmp_name), peers=peers, only=only)
        finally:
            stores.close()
    print(table(figs, sizes, args.backend, peers, notes))
    if args.json:
        args.json.write_text(json.dumps({k: {"ours": f.ours, "peers": f.peers, "unit": f.unit, "label": f.label}
                                         for k, f in figs.items()}, indent=2))
    chart = args.chart or (DEFAULT_CHART if args.backend == "sqlite" else None)
    if chart is not None and not args.no_chart:
        from bench_chart import draw

        runs = f"median of {sizes.runs} runs" if sizes.runs > 1 else "1 run"
        first = peers[0].name if peers else "Huey"
        draw(figs, chart, title=f"pipeline vs {first} ({args.backend}), no-op jobs, {runs}, {os.cpu_count()} cores",
             scale_rows=sizes.scale_rows, poll_ms=pipeline.Config().worker.poll_interval_ms, callers=sizes.callers)
        print(f"chart: {chart}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
