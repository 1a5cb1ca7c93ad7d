"""What a user gets from the command line: `python benchmarks/service.py [--backend sqlite|postgres|redis]`.

20,000 jobs of the bundled site's cheapest type (`invalidate_cache` on the in-process cache) are
written to a file and loaded with `python -m pipeline enqueue --from-file`; then `python -m
pipeline` is started as a user starts it (WORKER_CONCURRENCY=32, default logging: INFO, a line per
job, to a file), and the script waits until every job is completed, reading the store from outside.
It does so with `--processes 1` and with the default (one worker process per core). In the same
rounds, Huey's consumer as its documentation starts it (`huey_consumer app.huey -w 2 -k process`,
one worker process per core, `-q`) drains as many no-op tasks from its SQLite backend (`--backend
sqlite`, `fsync=True`) or its Redis one (`--backend redis`), and on Redis Dramatiq's worker as its
documentation starts it (`dramatiq app`: a process per core, 8 threads each). Three rounds, alternating,
medians.
A drain rate counts from the first job done to the last (the start-up is printed apart).
`--logging-cost` adds, in the same rounds, the default way with `LOG_LEVEL=warning` (no line per job),
and prints what the line per job costs.

`--cpu` (issue 25) measures what a job costs in CPU, whatever the machine's fsync: the whole process
tree's CPU (getrusage of the waited-for service, which waits for its worker processes; Huey's consumer
likewise) from start to stop, less the same start and stop on an empty store kept up as long, per job.
`--stages` then drains once more with `--processes 1`: each of its threads' CPU from /proc over the
drain (the event loop's, trio's worker threads' where the database work runs, the others'), each split
by stage as py-spy's samples of that thread are sorted (STAGES: the log line, metrics, the handler,
payload decode, the database thread's SQL, thread hops, the outcome, claims and leases, dispatch, the
heartbeat, the supervisor, trio's scheduler). py-spy also counts some waits as running (WAITS: a lock
wait with a timeout, epoll, fsync, the GIL after a system call): those samples are left out.

`--runtime trio asyncio uvloop` (issue 33) compares handlers' runtimes instead, in the same rounds,
alternating: an app of no-op `async def` handlers (RUNTIME_APP) on trio, on asyncio
(`Registry(runtime="asyncio")`: the worker process's trio run a guest of an asyncio loop) and on asyncio
with WORKER_ASYNCIO_LOOP=uvloop, each under `python -m pipeline --app ... --processes 1`. For each: the
drain rate and CPU per job as above (always with --cpu's subtraction of an empty start and stop), the pickup
latency (a running, idle service: one job enqueued at a time by pipeline.Client, from the enqueue call to
its handler's first line, --probes of them), and how long 1,000 jobs each holding a 1 s sleep of their
runtime (trio.sleep, asyncio.sleep) take from enqueue_many to the last completed, with the type's
concurrency at 1,000.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from stores import BACKENDS, Stores, open_stores  # noqa: E402

JOB = json.dumps({"job_type": "invalidate_cache", "payload": {"keys": ["k"]}})
HUEY_APP = """
from huey import RedisHuey, SqliteHuey

if {redis!r}:
    huey = RedisHuey({name!r}, url={redis!r}, results=False)
else:
    huey = SqliteHuey("bench", filename={db!r}, fsync=True, results=False)


@huey.task()
def noop():
    pass
"""


def settings(stores: Stores, url: str, concurrency: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ADMIN_", "WORKER_", "LOG_", "DATABASE_", "SQLITE_", "REDIS_"))}
    env.update(stores.settings, DATABASE_URL=url, ADMIN_PORT="0", WORKER_CONCURRENCY=str(concurrency))
    return env


def load(directory: Path, jobs: int, env: dict[str, str]) -> float:
    lines = directory / "jobs.jsonl"
    lines.write_text((JOB + "\n") * jobs)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pipeline", "enqueue", "--from-file", str(lines)], env=env, cwd=directory,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return jobs / (time.perf_counter() - started)


def children_cpu() -> float:
    """CPU seconds (user + system) of this script's waited-for children and theirs: a process tree's
    whole CPU once its root has been waited for (the service waits for its worker processes, Huey's
    consumer for its workers)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# what the last watch() measured of its process tree: CPU seconds, start to stop, and wall seconds;
# and "server", the store's server's CPU seconds meanwhile, when SERVER_CPU can tell (Stores.server_cpu)
LAST_TREE: dict[str, float] = {}


def _no_server() -> float | None:
    return None


SERVER_CPU: Callable[[], float | None] = _no_server  # main() sets the stores' (Stores.server_cpu)


def watch(args: list[str], env: dict[str, str], log: Path, done: Callable[[], int], jobs: int,
          profile: Callable[[int], Callable[[], None]] | None = None) -> tuple[float, float]:
    """Start ``args``; (jobs/s from the first job done to the last, seconds from start to the first).
    LAST_TREE gets the CPU of the whole process tree, start to stop (``jobs`` 0: run as long as
    LAST_TREE's "seconds" says, then stop: the same start and stop with nothing to do). ``profile``
    is started with the root's pid once the first job is done, and what it returns called at the end."""
    cpu, server = children_cpu(), SERVER_CPU()
    stop_profile = None
    with log.open("w") as out:
        started = time.perf_counter()
        process = subprocess.Popen(args, env=env, cwd=log.parent, stdout=out, stderr=out)
        try:
            first = None
            idle_until = started + LAST_TREE.get("seconds", 0.0) if jobs == 0 else None
            while True:
                now = time.perf_counter()
                if idle_until is not None:
                    if now >= idle_until:
                        first = (now, 0)
                        break
                else:
                    n = done()
                    if n and first is None:
                        first = (now, n)
                        if profile is not None:
                            stop_profile = profile(process.pid)
                    if n >= jobs:
                        break
                if process.poll() is not None:
                    raise RuntimeError(f"{args[0]} exited with {process.returncode}: see {log}")
                time.sleep(0.02)
        finally:
            if stop_profile is not None:
                stop_profile()
            process.terminate()
            process.wait(60)
            LAST_TREE.update(cpu=children_cpu() - cpu, seconds=time.perf_counter() - started)
            server_after = SERVER_CPU()
            LAST_TREE.pop("server", None)
            if server is not None and server_after is not None:
                LAST_TREE["server"] = server_after - server
    assert first is not None
    if jobs == 0:
        return 0.0, 0.0
    if first[1] >= jobs:  # all done by the first look (a tiny backlog): the rate counts the start-up too
        return jobs / max(now - started, 1e-9), first[0] - started
    return (jobs - first[1]) / max(now - first[0], 1e-9), first[0] - started


def pipeline_drain(stores: Stores, directory: Path, jobs: int, concurrency: int, processes: str | None,
                   log_level: str | None = None, profile: Callable[[int], Callable[[], None]] | None = None,
                   ) -> tuple[float, float, float]:
    """(jobs/s, start-up s, jobs/s of the CLI load); ``jobs`` 0: an empty store, started and stopped
    (see watch)."""
    url = stores.fresh("service")
    try:
        env = settings(stores, url, concurrency)
        if log_level:
            env["LOG_LEVEL"] = log_level
        loaded = load(directory, jobs, env) if jobs else 0.0
        args = [sys.executable, "-m", "pipeline"] + (["--processes", processes] if processes else [])
        rate, start_up = watch(args, env, directory / "service.log", lambda: stores.completed(url), jobs, profile)
        return rate, start_up, loaded
    finally:
        stores.drop(url)


# -- where a worker process's CPU goes (--stages) ------------------------------------------------------------

# py-spy's samples of the service's processes (only threads that were running: a sample is CPU),
# each sorted into the first stage whose pattern one of its frames matches, innermost frame first
# within each rule, rules in this order.
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("the log line (format, write)", ("logging/__init__.py", "pipeline/logs.py")),
    ("metrics", ("metrics.py", "prometheus", " observe (")),
    ("the handler and its context", ("pipeline/site/jobs.py", "pipeline/site/cache.py", "pipeline/context.py")),
    ("payload decode (json, cattrs)", ("cattrs", "json/decoder.py", "json/__init__.py", "registry.py")),
    (DATABASE := "database thread: SQL per batch and per row", ("sqlite3", "backends/sqlite/", "psycopg", "redis/")),
    ("thread hops (to_thread, run_sync_soon, wakeups)", ("trio/_threads.py", "_thread_cache.py", "_entry_queue.py",
                                                        "_wakeup_socketpair.py")),
    ("outcome: tray, Ledger batch, reply", ("_settle (", "trays.py", "ledger.py", "batches.py")),
    ("claim handling and lease objects", ("poller.py", "Lease", "claim")),
    ("dispatch to the worker, its scopes", ("pools.py",)),
    ("heartbeat and lease renewal", ("leases.py",)),
    ("supervisor and its metrics pipe", ("supervisor.py",)),
    ("trio's scheduler and I/O waits", ("trio/_core",)),
]


# A sample whose innermost frame is one of these is a wait, not CPU: py-spy counts a thread as running
# while it waits for a lock with a timeout (trio's idle worker threads, the log thread's timer), for
# epoll (trio's loop with nothing to do), for the disk (the commit's fsync) or for the GIL after a
# system call (trio's wake-up byte, sent from the database thread). Left out of the stages: they
# were a quarter of the samples of a drain, and the per-thread CPU from /proc does not have them.
WAITS = ("Condition.wait (threading.py", "Event.wait (threading.py", "WorkerThread._work (trio/_core/_thread_cache.py",
         "EpollIOManager.get_events (trio/_core/_io_epoll.py", "WakeupSocketpair.wakeup_thread_and_signal_safe (",
         "_commit (pipeline/backends/sqlite/ledger.py")

# The service's threads, by what their samples' frames show (the first that matches) and by /proc:
# the event loop is the process's main thread; trio's worker threads carry trio's names (the
# Ledger's batches, the reads, the WAL watch; a sync handler's thread is named for its job). The
# loop's samples are the rest: py-spy often reads a task's coroutine frames without the loop below them.
THREADS = (("trio's worker threads (the database: Ledger batches, reads)", "_thread_cache.py"),
           ("other threads (log lines, the lease heartbeat)", "Thread._bootstrap (threading.py"),
           ("the trio thread (the event loop)", ""))


def thread_cpu(pid: int) -> dict[str, tuple[str, float]]:
    """Per live thread of the process (by thread id): its THREADS group and its CPU seconds (user +
    system) so far, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    threads: dict[str, tuple[str, float]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # (a thread that ended meanwhile)
        if task.name == str(pid):
            group = THREADS[2][0]
        elif comm.startswith(("Trio thread", "pipeline job")):
            group = THREADS[0][0]
        else:
            group = THREADS[1][0]
        threads[task.name] = (group, (int(fields[11]) + int(fields[12])) / tick)  # utime, stime
    return threads


def profiler(out: Path, threads: dict[str, float] | None = None) -> Callable[[int], Callable[[], None]]:
    """What watch() starts once the first job is done: py-spy recording the service's process tree,
    stopped (SIGINT: it writes its samples) when the last job is done. ``threads`` gets the CPU
    seconds each group of the root's threads spent meanwhile (thread_cpu; Linux): of the threads
    alive at the end, what they spent since the start (a thread that ended meanwhile is not
    counted: trio's idle worker threads end after 10 s without work)."""
    def start(pid: int) -> Callable[[], None]:
        before = thread_cpu(pid) if threads is not None else {}
        spy = subprocess.Popen(["py-spy", "record", "--subprocesses", "--format", "raw", "--rate", "500", "--nonblocking",
                                "-o", str(out), "--pid", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def stop() -> None:
            if threads is not None:
                threads.update({name: 0.0 for name, _ in THREADS})
                for tid, (group, seconds) in thread_cpu(pid).items():
                    threads[group] += seconds - before.get(tid, (group, 0.0))[1]
            spy.send_signal(signal.SIGINT)
            spy.wait(60)

        return stop

    return start


def stages(raw: Path) -> dict[str, dict[str, float]]:
    """Per group of threads (THREADS), the share of its samples in ``raw`` (py-spy's raw format) per
    stage, "other" for the rest; the samples that are waits (WAITS) left out."""
    counts: dict[str, dict[str, int]] = {}
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")[1:]  # (the first is the process)
        if not frames or frames[-1].startswith(WAITS):
            continue
        group = next(name for name, pattern in THREADS if any(pattern in frame for frame in frames))
        # (the database stage is the database thread's: on the loop, the backend's frames are its callers')
        rules = STAGES if group == THREADS[0][0] else [(stage, patterns) for stage, patterns in STAGES if stage != DATABASE]
        name = next((stage for stage, patterns in rules for frame in reversed(frames)
                     if any(pattern in frame for pattern in patterns)), "other")
        counts.setdefault(group, {})
        counts[group][name] = counts[group].get(name, 0) + int(n)
    shares = {}
    for group, by_stage in counts.items():
        total = sum(by_stage.values())
        shares[group] = {name: n / total for name, n in by_stage.items()}
    return shares


def huey_drain(backend: str, stores: Stores, directory: Path, jobs: int) -> tuple[float, float]:
    """Huey's consumer, one worker process per core; done = taken off its queue (Huey deletes a task
    as it dequeues it; at most one per worker is still running when the queue is empty). ``jobs`` 0:
    started and stopped with nothing to do (see watch)."""
    redis_url = getattr(stores, "server_url", "") if backend == "redis" else ""
    name = f"bench_huey_{os.getpid()}_{time.monotonic_ns()}"
    (directory / "huey_app.py").write_text(HUEY_APP.format(redis=redis_url, name=name, db=str(directory / "huey.db")))
    sys.path.insert(0, str(directory))
    try:
        sys.modules.pop("huey_app", None)
        import huey_app  # type: ignore[import-not-found]

        huey = huey_app.huey
        for _ in range(jobs):
            huey_app.noop()
        env = dict(os.environ, PYTHONPATH=str(directory))
        consumer = str(Path(sys.executable).with_name("huey_consumer"))
        args = [consumer, "huey_app.huey", "-w", str(os.cpu_count() or 1), "-k", "process", "-q", "-n",
                "-d", "0.1", "-b", "1.15", "-m", "0.5"]
        return watch(args, env, directory / "huey.log", lambda: jobs - huey.pending_count(), jobs)
    finally:
        sys.path.remove(str(directory))
        if backend == "redis":
            huey_app.huey.storage.flush_all()


DRAMATIQ_APP = """
import dramatiq
from dramatiq.brokers.redis import RedisBroker

dramatiq.set_broker(RedisBroker(url={redis!r}, namespace={name!r}))


@dramatiq.actor(max_retries=0)
def noop():
    pass
"""


def dramatiq_drain(stores: Stores, directory: Path, jobs: int) -> tuple[float, float]:
    """Dramatiq's worker as its documentation starts it (`dramatiq app`: one process per core, 8
    threads each), on the same Redis; done = acknowledged (gone from the queue's message hash)."""
    name = f"bench_dramatiq_{os.getpid()}_{time.monotonic_ns()}"
    (directory / "dramatiq_app.py").write_text(DRAMATIQ_APP.format(redis=stores.server_url, name=name))  # type: ignore[attr-defined]
    sys.path.insert(0, str(directory))
    try:
        sys.modules.pop("dramatiq_app", None)
        import dramatiq_app  # type: ignore[import-not-found]

        broker = dramatiq_app.dramatiq.get_broker()
        for _ in range(jobs):
            dramatiq_app.noop.send()
        client = broker.client
        messages = f"{name}:default.msgs"
        env = dict(os.environ, PYTHONPATH=str(directory))
        args = [str(Path(sys.executable).with_name("dramatiq")), "dramatiq_app"]
        return watch(args, env, directory / "dramatiq.log", lambda: jobs - client.hlen(messages), jobs)
    finally:
        sys.path.remove(str(directory))
        dramatiq_app.dramatiq.get_broker().flush_all()


# --runtime: the app each runtime's service runs (BENCH_RUNTIME: trio, asyncio or uvloop; the loop itself is
# WORKER_ASYNCIO_LOOP's). `registry` drains no-ops and answers probes; `holding` holds 1,000 jobs at once.
RUNTIME_APP = """
import asyncio
import dataclasses
import os
import time

import trio

import pipeline

ON_TRIO = os.environ["BENCH_RUNTIME"] in ("trio", "guest")
registry = pipeline.Registry(runtime="trio" if ON_TRIO else "asyncio")
holding = pipeline.Registry(runtime="trio" if ON_TRIO else "asyncio")


@dataclasses.dataclass
class Noop:
    n: int = 0


@dataclasses.dataclass
class Probe:
    n: int = 0


@dataclasses.dataclass
class Hold:
    seconds: float = 1.0


@registry.job
async def noop(job: Noop, ctx: pipeline.JobContext) -> None:
    return None


@registry.job
async def probe(job: Probe, ctx: pipeline.JobContext) -> float:
    return time.time()  # its start, as the handler sees it


@dataclasses.dataclass
class Unused:
    n: int = 0


if os.environ["BENCH_RUNTIME"] == "guest":  # trio handlers, in a process that hosts an asyncio loop all the same
    @registry.job(runtime="asyncio")
    async def unused(job: Unused, ctx: pipeline.JobContext) -> None:
        return None

    holding.register("unused", Unused, unused, runtime="asyncio")


@holding.job(concurrency=1000)
async def hold(job: Hold, ctx: pipeline.JobContext) -> None:
    await (trio.sleep(job.seconds) if ON_TRIO else asyncio.sleep(job.seconds))
"""
NOOP = json.dumps({"job_type": "noop", "payload": {}})


def runtime_env(stores: Stores, url: str, runtime: str, concurrency: int, directory: Path) -> dict[str, str]:
    env = settings(stores, url, concurrency)
    env.update(BENCH_RUNTIME=runtime, WORKER_ASYNCIO_LOOP="uvloop" if runtime == "uvloop" else "asyncio",
               PYTHONPATH=os.pathsep.join(filter(None, [str(directory), env.get("PYTHONPATH")])))
    return env


def runtime_drain(stores: Stores, directory: Path, runtime: str, jobs: int, concurrency: int) -> tuple[float, float]:
    """(jobs/s, CPU µs per job) of `--app benchapp:registry --processes 1` draining ``jobs`` no-ops on
    ``runtime``: the process tree's CPU, less the same start and stop on an empty store kept up as long."""
    (directory / "benchapp.py").write_text(RUNTIME_APP)
    app = [sys.executable, "-m", "pipeline", "--app", "benchapp:registry"]
    url = stores.fresh("runtime")
    try:
        env = runtime_env(stores, url, runtime, concurrency, directory)
        lines = directory / "jobs.jsonl"
        lines.write_text((NOOP + "\n") * jobs)
        subprocess.run([*app, "enqueue", "--from-file", str(lines)], env=env, cwd=directory, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rate, _ = watch([*app, "--processes", "1"], env, directory / "service.log", lambda: stores.completed(url), jobs)
        full = LAST_TREE["cpu"]
    finally:
        stores.drop(url)
    url = stores.fresh("runtime")
    try:
        env = runtime_env(stores, url, runtime, concurrency, directory)
        watch([*app, "--processes", "1"], env, directory / "service.log", lambda: 0, 0)
        return rate, (full - LAST_TREE["cpu"]) / jobs * 1e6
    finally:
        stores.drop(url)


def runtime_service(stores: Stores, directory: Path, runtime: str, probes: int) -> tuple[list[float], float]:
    """A running, idle service of the runtime's app: (pickup latencies in ms, one job at a time from
    pipeline.Client's enqueue call to its handler's start; seconds from enqueue_many of 1,000 jobs holding
    a 1 s sleep to the last completed)."""
    (directory / "benchapp.py").write_text(RUNTIME_APP)
    sys.path.insert(0, str(directory))
    url = stores.fresh("runtime")
    service = None
    try:
        sys.modules.pop("benchapp", None)
        os.environ["BENCH_RUNTIME"] = runtime
        import benchapp  # type: ignore[import-not-found]

        env = runtime_env(stores, url, runtime, 32, directory)
        env["LOG_LEVEL"] = "warning"  # the probes' and holds' lines would be the log thread's, not the pickup's
        log = (directory / "probe.log").open("w")
        service = subprocess.Popen([sys.executable, "-m", "pipeline", "--app", "benchapp:registry", "--processes", "1"],
                                   env=env, cwd=directory, stdout=log, stderr=log)
        latencies = []
        with pipeline_client(stores, url, benchapp.registry) as client:
            client.result(client.enqueue(benchapp.Probe(-1)), timeout=60)  # the service is up and warm
            for n in range(probes):
                time.sleep(0.02)  # idle between probes: each is picked up from a waiting service
                sent = time.time()
                started = client.result(client.enqueue(benchapp.Probe(n)), timeout=30)
                latencies.append((started - sent) * 1000)
        service.send_signal(signal.SIGTERM)
        service.wait(60)
        service = subprocess.Popen([sys.executable, "-m", "pipeline", "--app", "benchapp:holding", "--processes", "1"],
                                   env=env, cwd=directory, stdout=log, stderr=log)
        with pipeline_client(stores, url, benchapp.holding) as client:
            warm = client.enqueue(benchapp.Hold(0.0))
            client.result(warm, timeout=60)
            sent = time.perf_counter()
            client.enqueue_many([benchapp.Hold(1.0) for _ in range(1000)])
            while stores.completed(url) < 1001:
                time.sleep(0.005)
            held = time.perf_counter() - sent
        return latencies, held
    finally:
        if service is not None:
            service.send_signal(signal.SIGTERM)
            service.wait(60)
        sys.path.remove(str(directory))
        stores.drop(url)


def pipeline_client(stores: Stores, url: str, registry: Any) -> Any:
    import pipeline

    return pipeline.Client(config=stores.config(url), registry=registry)


def runtime_rounds(options: argparse.Namespace, stores: Stores, tmp: str) -> None:
    runtimes: list[str] = options.runtime
    rates: dict[str, list[float]] = {r: [] for r in runtimes}
    cpus: dict[str, list[float]] = {r: [] for r in runtimes}
    pickups: dict[str, list[float]] = {r: [] for r in runtimes}
    holds: dict[str, list[float]] = {r: [] for r in runtimes}
    for _ in range(options.rounds):
        for runtime in runtimes:
            with tempfile.TemporaryDirectory(dir=tmp) as work:
                rate, cpu = runtime_drain(stores, Path(work), runtime, options.jobs, options.concurrency)
            with tempfile.TemporaryDirectory(dir=tmp) as work:
                latencies, held = runtime_service(stores, Path(work), runtime, options.probes)
            rates[runtime].append(rate)
            cpus[runtime].append(cpu)
            pickups[runtime] += latencies
            holds[runtime].append(held)
            print(f"{runtime}: {rate:,.0f} jobs/s, {cpu:.0f} µs CPU per job, pickup median "
                  f"{statistics.median(latencies):.1f} ms, 1,000 jobs holding 1 s: {held:.2f} s", flush=True)
    print(f"backend {options.backend}, {options.jobs:,} no-op jobs, --processes 1, WORKER_CONCURRENCY={options.concurrency}, "
          f"medians of {options.rounds} rounds ({options.probes} probes a round for the pickup):")
    base = statistics.median(cpus[runtimes[0]])
    for runtime in runtimes:
        cpu = statistics.median(cpus[runtime])
        pickup = sorted(pickups[runtime])
        p90 = pickup[int(len(pickup) * 0.9)]
        ratio = f" ({cpu / base:.2f}× {runtimes[0]}'s)" if runtime != runtimes[0] and base > 0 else ""
        print(f"  {RUNTIME_LABELS[runtime]}: {statistics.median(rates[runtime]):,.0f} jobs/s; CPU per job {cpu:.0f} µs "
              f"({min(cpus[runtime]):.0f} to {max(cpus[runtime]):.0f}){ratio}; pickup {statistics.median(pickup):.1f} ms "
              f"(p90 {p90:.1f} ms); 1,000 jobs holding a 1 s sleep, concurrency=1000: {statistics.median(holds[runtime]):.2f} s "
              f"({min(holds[runtime]):.2f} to {max(holds[runtime]):.2f})")


RUNTIME_LABELS = {"trio": "trio handlers", "asyncio": "asyncio handlers (asyncio's loop)",
                  "uvloop": "asyncio handlers (WORKER_ASYNCIO_LOOP=uvloop)",
                  "guest": "trio handlers in a process hosting an asyncio loop (its registry has an asyncio type too)"}


def _server_note(values: list[float] | None) -> str:
    if not values:
        return ""
    return f"; the store's server besides: {statistics.median(values):.0f} µs ({min(values):.0f} to {max(values):.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=BACKENDS, default="sqlite")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32, help="WORKER_CONCURRENCY (default 32; the type's default is 2)")
    parser.add_argument("--no-huey", action="store_true", help="leave out Huey's consumer")
    parser.add_argument("--no-dramatiq", action="store_true", help="leave out Dramatiq's worker (--backend redis)")
    parser.add_argument("--logging-cost", action="store_true", help="also the default way with LOG_LEVEL=warning")
    parser.add_argument("--cpu", action="store_true",
                        help="also the CPU µs per job of each way's whole process tree (and Huey's consumer's): its "
                             "CPU start to stop, less the same start and stop on an empty store")
    parser.add_argument("--stages", action="store_true",
                        help="then where the CPU of one worker process goes: its threads' CPU from /proc, by stage as "
                             "py-spy's samples of one more --processes 1 drain split it (py-spy: pip install -e '.[bench]')")
    parser.add_argument("--samples", type=Path, help="with --stages: keep py-spy's samples (its raw format) in this file")
    parser.add_argument("--runtime", nargs="+", choices=list(RUNTIME_LABELS), metavar="RUNTIME",
                        help="compare handlers' runtimes instead (trio, asyncio, uvloop; the first is the baseline): "
                             "drain rate, CPU per job, pickup latency, 1,000 jobs holding 1 s")
    parser.add_argument("--probes", type=int, default=50, help="with --runtime: jobs enqueued one at a time per round")
    options = parser.parse_args()
    if options.runtime:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "stores").mkdir()
            stores = open_stores(options.backend, Path(tmp) / "stores")
            try:
                runtime_rounds(options, stores, tmp)
            finally:
                stores.close()
        return
    if options.stages and shutil.which("py-spy") is None:
        parser.error("--stages needs py-spy on PATH (pip install -e '.[bench]')")
    default = f"default ({os.cpu_count()} worker processes)"
    quiet = f"{default} with LOG_LEVEL=warning"
    ways: dict[str, tuple[str | None, str | None]] = {"--processes 1": ("1", None), default: (None, None)}
    if options.logging_cost:
        ways[quiet] = (None, "warning")
    rates: dict[str, list[float]] = {way: [] for way in ways}
    loads: list[float] = []
    peer = options.backend != "postgres" and not options.no_huey
    if peer:
        try:
            import huey  # noqa: F401
        except ImportError:
            print("huey is not installed (pip install -e '.[bench]'): no peer in this run", flush=True)
            peer = False
    hueys: list[float] = []
    cpus: dict[str, list[float]] = {way: [] for way in ways}  # --cpu: µs per job of the tree, per round
    huey_cpus: list[float] = []
    servers: dict[str, list[float]] = {}  # --cpu: the store's server's CPU µs per job, per round ("huey": Huey's)
    dramatiqs: list[float] = []
    with_dramatiq = options.backend == "redis" and not options.no_dramatiq
    if with_dramatiq:
        try:
            import dramatiq  # noqa: F401
        except ImportError:
            print("dramatiq is not installed (pip install -e '.[bench]'): no Dramatiq in this run", flush=True)
            with_dramatiq = False
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "stores").mkdir()
        stores = open_stores(options.backend, Path(tmp) / "stores")
        global SERVER_CPU
        SERVER_CPU = stores.server_cpu
        try:
            for _ in range(options.rounds):
                for way, (processes, log_level) in ways.items():
                    with tempfile.TemporaryDirectory(dir=tmp) as work:
                        rate, start_up, loaded = pipeline_drain(stores, Path(work), options.jobs, options.concurrency, processes,
                                                                log_level)
                        full, full_server = LAST_TREE["cpu"], LAST_TREE.get("server")
                        if options.cpu:  # the same start and stop on an empty store, kept up as long
                            pipeline_drain(stores, Path(work), 0, options.concurrency, processes, log_level)
                            cpus[way].append((full - LAST_TREE["cpu"]) / options.jobs * 1e6)
                            if full_server is not None and "server" in LAST_TREE:
                                servers.setdefault(way, []).append((full_server - LAST_TREE["server"]) / options.jobs * 1e6)
                    rates[way].append(rate)
                    loads.append(loaded)
                    cpu_note = f", {cpus[way][-1]:.0f} µs CPU per job" if options.cpu else ""
                    if options.cpu and way in servers:
                        cpu_note += f" (and the server's: {servers[way][-1]:.0f} µs)"
                    print(f"{way}: {rate:,.0f} jobs/s (first job done {start_up:.2f} s after start){cpu_note}", flush=True)
                if peer:
                    with tempfile.TemporaryDirectory(dir=tmp) as work:
                        rate, start_up = huey_drain(options.backend, stores, Path(work), options.jobs)
                        full, full_server = LAST_TREE["cpu"], LAST_TREE.get("server")
                        if options.cpu:
                            huey_drain(options.backend, stores, Path(work), 0)
                            huey_cpus.append((full - LAST_TREE["cpu"]) / options.jobs * 1e6)
                            if full_server is not None and "server" in LAST_TREE:
                                servers.setdefault("huey", []).append((full_server - LAST_TREE["server"]) / options.jobs * 1e6)
                    hueys.append(rate)
                    cpu_note = f", {huey_cpus[-1]:.0f} µs CPU per task" if options.cpu else ""
                    if options.cpu and "huey" in servers:
                        cpu_note += f" (and the server's: {servers['huey'][-1]:.0f} µs)"
                    print(f"huey_consumer -w {os.cpu_count()} -k process: {rate:,.0f} tasks/s "
                          f"(first task done {start_up:.2f} s after start){cpu_note}", flush=True)
                if with_dramatiq:
                    with tempfile.TemporaryDirectory(dir=tmp) as work:
                        rate, start_up = dramatiq_drain(stores, Path(work), options.jobs)
                    dramatiqs.append(rate)
                    print(f"dramatiq app: {rate:,.0f} messages/s (first done {start_up:.2f} s after start)", flush=True)
            shares: dict[str, dict[str, float]] = {}
            threads: dict[str, float] = {}
            if options.stages:
                with tempfile.TemporaryDirectory(dir=tmp) as work:
                    raw = Path(work) / "samples.txt"
                    pipeline_drain(stores, Path(work), options.jobs, options.concurrency, "1", None, profiler(raw, threads))
                    shares = stages(raw)
                    if options.samples:
                        shutil.copy(raw, options.samples)
        finally:
            stores.close()
    print(f"backend {options.backend}, {options.jobs:,} jobs, medians of {options.rounds} rounds:")
    print(f"enqueue --from-file, {options.jobs:,} lines: {statistics.median(loads):,.0f} jobs/s")
    huey = statistics.median(hueys) if hueys else None
    dramatiq_rate = statistics.median(dramatiqs) if dramatiqs else None
    for way, values in rates.items():
        ratios = [f"{statistics.median(values) / peer:.1f}× {label}" for label, peer in (("Huey", huey), ("Dramatiq", dramatiq_rate))
                  if peer]
        ratio = f" ({', '.join(ratios)})" if ratios else ""
        logging_ = "" if way == quiet else ", default logging"
        print(f"python -m pipeline {way}, WORKER_CONCURRENCY={options.concurrency}{logging_}: "
              f"{statistics.median(values):,.0f} jobs/s{ratio}")
    if options.logging_cost:
        costs = [1 - with_lines / without for with_lines, without in zip(rates[default], rates[quiet])]
        print(f"the line per job costs {statistics.median(costs):.0%} of the drain rate "
              f"(median of the rounds' costs: {', '.join(f'{c:.0%}' for c in costs)})")
    if huey:
        print(f"Huey consumer ({options.backend}), {os.cpu_count()} worker processes, -q: {huey:,.0f} tasks/s")
    if options.cpu:
        print("CPU per job of the whole process tree (start to stop, less an empty store's start and stop), medians:")
        for way, values in cpus.items():
            noise = " (within the noise of a start and stop: use more --jobs)" if statistics.median(values) <= 0 else ""
            print(f"  python -m pipeline {way}: {statistics.median(values):.0f} µs "
                  f"({min(values):.0f} to {max(values):.0f}){noise}{_server_note(servers.get(way))}")
        if huey_cpus:
            print(f"  huey_consumer -w {os.cpu_count()} -k process: {statistics.median(huey_cpus):.0f} µs "
                  f"({min(huey_cpus):.0f} to {max(huey_cpus):.0f}){_server_note(servers.get('huey'))}")
    if shares:
        print("where the CPU of --processes 1 goes, in one more drain: each thread's CPU per job from /proc (from the "
              "first job done to the last), split by stage as py-spy's samples of that thread are (waits left out):")
        for group, seconds in threads.items():
            per_job = seconds / options.jobs * 1e6
            print(f"  {group}: {per_job:.1f} µs")
            for name, share in sorted(shares.get(group, {}).items(), key=lambda item: -item[1]):
                print(f"    {name:52} {share:6.1%} {share * per_job:7.1f} µs")
    if dramatiq_rate:
        print(f"Dramatiq worker (redis), {os.cpu_count()} processes of 8 threads: {dramatiq_rate:,.0f} messages/s")


if __name__ == "__main__":
    main()
