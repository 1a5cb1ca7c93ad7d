"""Several service processes on one Postgres or Redis: `python benchmarks/cluster.py --backend postgres|redis`.

What the shared server costs per job when many machines drain one store (issue 36). For each count
of ``--services`` (default 1, 2 and 4), a fresh store (a database on the Postgres server, a key
prefix on the Redis server) is loaded with ``--jobs`` no-op jobs, and that many services are started
from the command line as a user starts them, each as a machine of its own would run it: ``python -m
pipeline --app clusterapp:registry --processes 1`` (a no-op app written to the run's folder), default
logging (a line per job, to its own file), WORKER_CONCURRENCY=32 as benchmarks/service.py runs.

The job type is paused while they start (the store's own pause, as `types pause` sets it), and
resumed once every service has said it is running: the clock and the CPU readings run from the
resume to the last job completed, so that no service's start-up (imports: about a second of CPU
each) is counted, and every service drains from the first job. Per count it prints:

* the rate, jobs/s from the resume to the last job completed;
* the server's CPU per job. Postgres: the CPU time (user + system, /proc/<pid>/stat) of the
  backends of the run's database (the services' sessions, and autovacuum's if it ran), read at the
  resume, every 0.2 s and at the end; and apart, the server's shared processes (postmaster, WAL
  writer, checkpointer, background writer...), which also serve the server's other databases. A
  server whose processes this machine cannot read is timed by pg_stat_statements instead (the
  statements' execution time: wall time, not CPU), if it has the extension; the output says which.
  Redis: ``INFO cpu`` (used_cpu_user + used_cpu_sys, with its children's) of a redis-server of the
  script's own, started on a free port with ``--appendonly yes`` (appendfsync everysec): the
  durability the store requires (``--redis-url`` uses another server instead);
* each service's CPU per job it ran (its whole process tree from /proc; its jobs counted from its
  log lines), and all the services' together per job;
* how many cores the server kept busy meanwhile.

Rounds alternate the order of the counts (1 2 4, then 4 2 1, ...); the table shows medians and, with
more than one round, the range. Then the projection: one server of N cores sustains 0.8 × N × 10^6 /
(server µs per job) jobs/s at 80 % CPU (N = 8, 16, 32 and this machine's); Redis runs every script
on one thread, so its ceiling is one core's whatever N. On a machine with few cores the services
compete with the server for CPU, and the rate grows only until the cores are busy, not with the
services as it would with a machine each: the server's CPU per job is the figure that carries over
to a cluster.

``--profile`` drains once more (the first count of --services, not timed) with the server's own
accounting on. Postgres: the database's counters over the drain (pg_stat_database: transactions;
pg_stat_user_tables: rows updated, how many HOT; pg_statio_*: blocks of the table and of each
index), the server's WAL (pg_stat_wal), pg_stat_statements per statement when the server has it
loaded (shared_preload_libraries; the extension is created in the run's database), then EXPLAIN
(ANALYZE, BUFFERS, WAL) of the store's claim, outcome and insert statements, 32 rows each, on a
fresh table: time, blocks, WAL and the index blocks each touches, per row. Redis: INFO commandstats
(each command's calls and µs, the scripts' inner commands included) and SLOWLOG at a threshold of 0
(every call, by script: its µs per call and calls per job).

``--env NAME=VALUE`` passes a setting to every service (WORKER_PREFETCH=0, ...); ``--set NAME=VALUE``
sets one on the server for the run's stores: Postgres ``ALTER DATABASE ... SET`` (synchronous_commit=off,
...), Redis ``CONFIG SET`` on the script's own server (appendfsync=always, ...). ``--drop-index NAME``
(Postgres) drops an index of the jobs table in each run's database once it is loaded: what the server
would spend without it, a measure of a lever, not a setting to run with. docs/scaling.md has the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stores import POSTGRES_URL, PostgresStores, RedisStores, Stores  # noqa: E402

APP = """
import dataclasses

import pipeline

registry = pipeline.Registry()


@dataclasses.dataclass
class Noop:
    n: int = 0


@registry.job
async def noop(job: Noop, ctx: pipeline.JobContext) -> None:
    return None
"""
JOB_TYPE = "noop"  # (stores.backlog's: payload {"n": i})
READY = "pipeline running on"  # the service's line once it runs (pipeline/service.py)
DONE = " ok → completed"  # the line of each job it completed
CORES = (8, 16, 32)
BUSY = 0.8  # the projection's share of each core
TICK = os.sysconf("SC_CLK_TCK")


# -- CPU from /proc ---------------------------------------------------------------------------------------

def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command's name (field 3 on), None if unreadable."""
    try:
        return (Path(f"/proc/{pid}/stat").read_text()).rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_cpu(pid: int, *, children: bool = False) -> float | None:
    """CPU seconds (user + system) of a live process, its threads included; with ``children``, also
    those of its children that ended and were waited for."""
    fields = _stat(pid)
    if fields is None:
        return None
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if children else 0)
    return ticks / TICK


def tree_cpu(root: int) -> float:
    """CPU seconds of a process and its descendants (each with its waited-for children)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None:
                parents.setdefault(int(fields[1]), []).append(int(entry.name))
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += process_cpu(pid, children=True) or 0.0
        todo += parents.get(pid, [])
    return total


# -- the services ---------------------------------------------------------------------------------------

class Service:
    """One `python -m pipeline --app clusterapp:registry --processes 1`, its log in a file of its own."""

    def __init__(self, n: int, folder: Path, env: dict[str, str]) -> None:
        self.log = folder / f"service-{n}.log"
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "pipeline", "--app", "clusterapp:registry", "--processes", "1"],
                env=env, cwd=folder, stdout=out, stderr=out)

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"a service exited with {self.process.returncode} before it ran: see {self.log}\n"
                               + self.log.read_text()[-2000:])
        return READY in self.log.read_text()

    def cpu(self) -> float:
        return tree_cpu(self.process.pid)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def jobs(self) -> int:
        """The jobs it completed, by its log lines (read once it has stopped)."""
        return self.log.read_text().count(DONE)


def service_env(url: str, folder: Path, concurrency: int, extra: dict[str, str], durable_redis: bool) -> dict[str, str]:
    """The settings a user's service would have: DATABASE_URL and WORKER_CONCURRENCY, the admin API on
    a free port (as benchmarks/service.py runs it), default logging; none of this shell's own."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ADMIN_", "WORKER_", "LOG_", "DATABASE_", "SQLITE_", "REDIS_", "PIPELINE_"))}
    env.update(DATABASE_URL=url, ADMIN_PORT="0", WORKER_CONCURRENCY=str(concurrency),
               PYTHONPATH=os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])))
    if not durable_redis and url.startswith("redis"):
        env["REDIS_ALLOW_NON_DURABLE"] = "true"  # another server (--redis-url), which may keep nothing on disk
    env.update(extra)
    return env


def wait_until(what: str, check: Callable[[], bool], timeout: float, every: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


# -- the server's side, per backend ---------------------------------------------------------------------

class Server:
    """A backend's server: its stores, how to pause and resume the job type, whether jobs are left,
    and the CPU it spends on a run (start → sample()... → stop)."""

    stores: Stores
    source = ""  # what the server's CPU is read from, for the output
    looks = 0  # this script's own statements on the run's store since start() (on Postgres, each a transaction)

    def open(self, url: str) -> None:
        """A run's store, made and loaded: the connection the rest uses."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def paused(self, paused: bool) -> None:
        raise NotImplementedError

    def busy(self) -> bool:
        """Whether the store has jobs pending or running."""
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def sample(self) -> None:
        """A look during the drain (Postgres: its processes, which may come and go)."""
        raise NotImplementedError

    def stop(self) -> dict[str, float]:
        """CPU seconds since start() by part; "server": all of them."""
        raise NotImplementedError


class PostgresServer(Server):
    stores: PostgresStores

    def __init__(self, server_url: str, settings: dict[str, str], drops: Sequence[str] = ()) -> None:
        import psycopg

        self.stores = PostgresStores(server_url)
        self.settings = settings
        self.drops = list(drops)  # --drop-index: what the server would spend without them
        self.database = ""
        self.conn: psycopg.Connection[Any] | None = None
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.kinds: dict[int, str] = {}  # pid -> "backends" (the run's database) or "shared"
        self.listed = 0.0
        local = urlsplit(server_url).hostname in ("127.0.0.1", "localhost", "::1", None)
        self.by_proc = local and self._probe(server_url)
        self.source = ("/proc/<pid>/stat of the run's database's backends, and of the server's shared processes"
                       if self.by_proc else "pg_stat_statements (execution time of the run's statements: wall, not CPU)")
        self.statements_time = 0.0

    @staticmethod
    def _probe(server_url: str) -> bool:
        """Whether this machine can read the server's processes (a session's own backend, while open)."""
        import psycopg

        with psycopg.connect(server_url, autocommit=True) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            return row is not None and process_cpu(int(row[0])) is not None

    def open(self, url: str) -> None:
        import psycopg

        self.database = urlsplit(url).path.lstrip("/")
        for name, value in self.settings.items():  # before any service connects: each session reads them at its start
            self.stores._admin(f"ALTER DATABASE {self.database} SET {name} = '{value}'")  # noqa: SLF001
        self.conn = psycopg.connect(url, autocommit=True)
        self.reshape(self.conn)

    def reshape(self, conn: Any) -> None:
        """The run's store without the indexes --drop-index names (a what-if: the store's own statements
        that read them would scan instead)."""
        for index in self.drops:
            conn.execute(f"DROP INDEX {index}")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def paused(self, paused: bool) -> None:
        from pipeline.backends.postgres import queries

        assert self.conn is not None
        queries.set_type_paused(self.conn, JOB_TYPE, paused)

    def busy(self) -> bool:
        assert self.conn is not None
        self.looks += 1
        row = self.conn.execute("SELECT EXISTS (SELECT 1 FROM jobs WHERE status IN ('pending', 'running'))").fetchone()
        return bool(row and row[0])

    def _list(self) -> None:
        """The run's database's backends (not this script's session) and the server's shared processes."""
        assert self.conn is not None
        self.looks += 1
        rows = self.conn.execute(
            "SELECT pid, datname IS NOT NULL FROM pg_stat_activity WHERE (datname = %s AND pid <> pg_backend_pid()) "
            "OR (datname IS NULL AND backend_type <> 'client backend')", (self.database,)).fetchall()
        for pid, ours in rows:
            self.kinds.setdefault(int(pid), "backends" if ours else "shared")
        if self.kinds and not any(kind == "postmaster" for kind in self.kinds.values()):
            fields = _stat(next(iter(self.kinds)))
            if fields is not None:
                self.kinds[int(fields[1])] = "postmaster"
        self.listed = time.monotonic()

    def _read(self) -> None:
        for pid in self.kinds:
            cpu = process_cpu(pid)
            if cpu is not None:
                self.last[pid] = cpu

    def _statements(self) -> float:
        assert self.conn is not None
        try:
            row = self.conn.execute("SELECT coalesce(sum(total_exec_time), 0) FROM pg_stat_statements s JOIN pg_database d "
                                    "ON d.oid = s.dbid WHERE d.datname = %s", (self.database,)).fetchone()
        except Exception:
            return float("nan")
        return float(row[0]) / 1000 if row else float("nan")

    def start(self) -> None:
        self.kinds, self.last, self.looks = {}, {}, 0
        if not self.by_proc:
            self.statements_time = self._statements()
            return
        self._list()
        self._read()
        self.first = dict(self.last)

    def sample(self) -> None:
        if self.by_proc and time.monotonic() - self.listed > 0.2:
            self._list()
            self._read()

    def stop(self) -> dict[str, float]:
        if not self.by_proc:
            return {"server": self._statements() - self.statements_time}
        self._list()
        self._read()
        parts = {"backends": 0.0, "shared": 0.0}
        for pid, cpu in self.last.items():
            kind = "shared" if self.kinds[pid] == "postmaster" else self.kinds[pid]
            parts[kind] += cpu - self.first.get(pid, 0.0 if kind == "backends" else cpu)  # (a shared process new meanwhile: from now)
        parts["server"] = parts["backends"] + parts["shared"]
        return parts


@contextlib.contextmanager
def own_redis(folder: Path, settings: dict[str, str]) -> Iterator[str]:
    """A redis-server of the run's own on a free port, with the durability the store requires:
    AOF on, appendfsync everysec (Redis's default; ``--set appendfsync=always`` for the other)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH (Debian: apt-get install redis-server), or pass --redis-url")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (folder / "redis").mkdir()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
            "--appendfsync", "everysec", "--dir", str(folder / "redis")]
    for name, value in settings.items():
        args += [f"--{name}", value]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {proc.returncode}: {' '.join(args)}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
            return False

        wait_until("redis-server to listen", up, 10)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class RedisServer(Server):
    stores: RedisStores
    source = "INFO cpu (used_cpu_user + used_cpu_sys, and its children's)"

    def __init__(self, server_url: str, settings: dict[str, str], own: bool) -> None:
        import redis

        self.stores = RedisStores(server_url)
        self.client = redis.Redis.from_url(server_url)
        self.own = own
        for name, value in settings.items():
            if not own:
                raise SystemExit("--set on Redis changes the script's own server only (not one given by --redis-url)")
            self.client.config_set(name, value)
        self.prefix = ""
        self.before = 0.0
        self.commands: dict[str, dict[str, float]] = {}

    def open(self, url: str) -> None:
        self.prefix = RedisStores._prefix(url)  # noqa: SLF001

    def close(self) -> None:
        pass

    def paused(self, paused: bool) -> None:
        from pipeline.backends.redis import store

        store.set_type_paused(self.client, self.prefix, JOB_TYPE, paused)

    def busy(self) -> bool:
        pipe = self.client.pipeline(transaction=False)  # (st:<status>:<type>: every layout keeps it)
        pipe.zcard(f"{self.prefix}st:pending:{JOB_TYPE}")
        pipe.zcard(f"{self.prefix}st:running:{JOB_TYPE}")
        return any(pipe.execute())

    def _cpu(self) -> float:
        info = self.client.info("cpu")
        return sum(float(info[k]) for k in ("used_cpu_user", "used_cpu_sys", "used_cpu_user_children", "used_cpu_sys_children"))

    def start(self) -> None:
        if self.own:
            self.client.config_resetstat()  # commandstats from here
        self.before = self._cpu()

    def sample(self) -> None:
        pass

    def stop(self) -> dict[str, float]:
        cpu = self._cpu() - self.before
        self.commands = {name.removeprefix("cmdstat_"): {"calls": float(v["calls"]), "usec": float(v["usec"])}
                         for name, v in self.client.info("commandstats").items()} if self.own else {}
        return {"server": cpu}


# -- one run --------------------------------------------------------------------------------------------

@attrs.frozen
class Run:
    services: int
    jobs: int
    seconds: float  # resume → the last job completed
    server: dict[str, float]  # CPU seconds by part ("server": all)
    service_cpu: list[float]  # CPU seconds of each service's tree over the same window
    service_jobs: list[int]  # jobs each completed
    looks: int  # this script's own statements on the store during the drain (Server.looks)
    commands: dict[str, dict[str, float]]  # Redis: INFO commandstats over the drain, per command: calls, usec

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds

    def server_us(self, part: str = "server") -> float:
        return self.server.get(part, float("nan")) / self.jobs * 1e6

    def each_us(self) -> list[float]:
        return [cpu / n * 1e6 if n else float("nan") for cpu, n in zip(self.service_cpu, self.service_jobs)]

    def all_us(self) -> float:
        return sum(self.service_cpu) / self.jobs * 1e6


def one_run(server: Server, folder: Path, services: int, jobs: int, concurrency: int, extra: dict[str, str],
            durable_redis: bool, between: Callable[[str], None] | None = None,
            after: Callable[[str], None] | None = None, every: float = 0.01) -> Run:
    """A fresh store of ``jobs`` pending no-op jobs, drained by ``services`` services started together
    while the type is paused; timed from the resume to the last job completed. ``between(url)``
    runs once the services are up (before the resume), ``after(url)`` once they have stopped; the
    store is looked at every ``every`` seconds for jobs left."""
    url = server.stores.fresh("cluster")
    started: list[Service] = []
    try:
        server.stores.build(url, pending=jobs)  # (with the engine's tables: a migration, as a service's start runs it)
        server.open(url)
        server.paused(True)
        env = service_env(url, folder, concurrency, extra, durable_redis)
        started = [Service(n, folder, env) for n in range(services)]
        wait_until(f"{services} services to run", lambda: all(s.ready() for s in started), 180, every=0.05)
        if between is not None:
            between(url)
        time.sleep(0.2)  # (their first claims, which find the type paused, are behind them)
        before = [s.cpu() for s in started]
        server.start()
        began = time.perf_counter()
        server.paused(False)
        while server.busy():
            server.sample()
            for s in started:
                if s.process.poll() is not None:
                    raise RuntimeError(f"a service exited with {s.process.returncode} mid-drain: see {s.log}")
            time.sleep(every)
        seconds = time.perf_counter() - began
        parts = server.stop()
        looks = server.looks
        cpu = [s.cpu() - b for s, b in zip(started, before)]
        for s in started:
            s.stop()
        if after is not None:
            after(url)
        completed = server.stores.completed(url)
        if completed != jobs:
            raise RuntimeError(f"{completed} of {jobs} jobs completed: see {folder}/service-*.log")
        return Run(services, jobs, seconds, parts, cpu, [s.jobs() for s in started], looks,
                   dict(getattr(server, "commands", {})))
    finally:
        for s in started:
            s.stop()
        server.close()
        server.stores.drop(url)


# -- the table --------------------------------------------------------------------------------------------

def figure(values: Sequence[float], fmt: str = "{:,.0f}") -> str:
    """The median, and the range when there are several."""
    values = [v for v in values if v == v]  # (no NaN)
    if not values:
        return "n/a"
    text = fmt.format(statistics.median(values))
    if len(values) > 1:
        text += f" ({fmt.format(min(values))}–{fmt.format(max(values))})"
    return text


def table(backend: str, runs: dict[int, list[Run]], server: Server) -> list[str]:
    postgres = backend == "postgres" and isinstance(server, PostgresServer) and server.by_proc
    head = ["services", "jobs/s", "server µs/job"]
    if postgres:
        head += ["of which backends", "shared processes"]
    head += ["each service µs/job", "all services µs/job", "server cores busy"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for count, done in runs.items():
        cells = [str(count), figure([r.rate for r in done]), figure([r.server_us() for r in done])]
        if postgres:
            cells += [figure([r.server_us("backends") for r in done]), figure([r.server_us("shared") for r in done])]
        each = [statistics.median(r.each_us()[i] for r in done) for i in range(count)]
        cells += [", ".join(f"{v:,.0f}" for v in each), figure([r.all_us() for r in done]),
                  figure([r.server["server"] / r.seconds for r in done], "{:.2f}")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def projection(backend: str, runs: dict[int, list[Run]]) -> list[str]:
    """Jobs/s one server sustains with BUSY of its cores serving jobs, from each count's server µs/job."""
    own = os.cpu_count() or 1
    redis = backend == "redis"
    cores = (1,) if redis else tuple(sorted({own, *CORES}))
    head = ["services in the run", "server µs/job"] + [("one core (its main thread)" if redis else
                                                          f"{n} cores" + (" (this machine)" if n == own else ""))
                                                         for n in cores]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    widest = max(runs)
    for count, done in runs.items():
        us = statistics.median(r.server_us() for r in done)
        lines.append("| " + " | ".join([str(count), f"{us:,.0f}"] + [f"{BUSY * n * 1e6 / us:,.0f}" for n in cores]) + " |")
    us = statistics.median(r.server_us() for r in runs[widest])
    if redis:
        lines.append(f"one Redis server sustains {BUSY * 1e6 / us:,.0f} jobs/s at {BUSY:.0%} of its main thread, whatever "
                     f"its cores (from {us:,.0f} µs per job, {widest} services): Redis runs every script on that one "
                     "thread; past it, more servers (one store, one key prefix, per server)")
    else:
        for n in cores:
            lines.append(f"one server of {n} cores sustains {BUSY * n * 1e6 / us:,.0f} jobs/s at {BUSY:.0%} CPU "
                         f"(from {us:,.0f} µs per job, {widest} services)")
    return lines


# -- --profile -------------------------------------------------------------------------------------------

_PG_COUNTERS = """
SELECT d.xact_commit, d.blks_hit, d.blks_read, d.tup_inserted, d.tup_updated, d.tup_deleted,
       t.n_tup_upd, t.n_tup_hot_upd, t.n_tup_ins, t.n_dead_tup, t.autovacuum_count,
       s.heap_blks_hit, s.heap_blks_read, s.idx_blks_hit, s.idx_blks_read, s.toast_blks_hit,
       w.wal_records, w.wal_fpi, w.wal_bytes, w.wal_write, w.wal_sync
  FROM pg_stat_database d, pg_stat_user_tables t, pg_statio_user_tables s, pg_stat_wal w
 WHERE d.datname = current_database() AND t.relname = 'jobs' AND s.relname = 'jobs'
"""
_PG_NAMES = ("xact_commit", "blks_hit", "blks_read", "tup_inserted", "tup_updated", "tup_deleted", "n_tup_upd",
             "n_tup_hot_upd", "n_tup_ins", "n_dead_tup", "autovacuum_count", "heap_blks_hit", "heap_blks_read",
             "idx_blks_hit", "idx_blks_read", "toast_blks_hit", "wal_records", "wal_fpi", "wal_bytes", "wal_write",
             "wal_sync")
_PG_INDEXES = ("SELECT indexrelname, idx_blks_hit + idx_blks_read FROM pg_statio_user_indexes WHERE relname = 'jobs' "
               "ORDER BY indexrelname")

# pg_stat_statements' statements, named by what they start with (normalised: parameters are $n)
_LABELS = (("WITH w AS MATERIALIZED", "claim (store._CLAIM)"), ("WITH settled AS", "outcomes (the Ledger's batch)"),
           ("WITH ins AS", "insert (the Ledger's batch)"), ("UPDATE jobs j SET lease_expires_at", "lease renewal"),
           ("WITH due AS", "rescue of expired leases"), ("UPDATE workers", "worker heartbeat"),
           ("SELECT EXISTS (SELECT 1 FROM jobs", "(this script's look for jobs left)"),
           ("LISTEN", "LISTEN"), ("SELECT pg_notify", "NOTIFY"))


def _label(query: str) -> str:
    text = " ".join(query.split())
    for start, name in _LABELS:
        if start in text[:80]:
            return name
    return text[:60]


def _pg_counters(conn: Any) -> dict[str, float]:
    conn.execute("SELECT pg_stat_force_next_flush()")  # (this session's own counts, at its next idle)
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(_PG_COUNTERS).fetchone()
    values = dict(zip(_PG_NAMES, (float(v or 0) for v in row))) if row else {}
    values.update({f"index {name}": float(n or 0) for name, n in conn.execute(_PG_INDEXES).fetchall()})
    return values


def _statements_ready(conn: Any) -> bool:
    """pg_stat_statements in the run's database, if the server has it loaded; reset."""
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = current_database()), 0)")
        return True
    except Exception as exc:  # not loaded (shared_preload_libraries), or not installed
        print(f"  pg_stat_statements: not available here ({str(exc).splitlines()[0]}); the database's counters and "
              "EXPLAIN instead", flush=True)
        return False


def profile_postgres(server: PostgresServer, folder: Path, services: int, jobs: int, concurrency: int,
                     extra: dict[str, str]) -> list[str]:
    import psycopg

    lines: list[str] = []
    state: dict[str, Any] = {}

    def between(url: str) -> None:  # the services are up, the type paused: the counters from here
        conn = psycopg.connect(url, autocommit=True)
        state["conn"] = conn
        state["statements"] = _statements_ready(conn)
        state["before"] = _pg_counters(conn)

    def after(url: str) -> None:  # the services have stopped: their sessions' counts are flushed
        conn = state["conn"]
        time.sleep(0.5)
        state["after"] = _pg_counters(conn)
        if state["statements"]:
            state["rows"] = conn.execute(
                "SELECT query, calls, rows, total_exec_time, plans, total_plan_time, shared_blks_hit, shared_blks_dirtied, "
                "wal_records, wal_fpi, wal_bytes FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
                "WHERE d.datname = current_database() ORDER BY total_exec_time + total_plan_time DESC LIMIT 8").fetchall()
        conn.close()

    run = one_run(server, folder, services, jobs, concurrency, extra, True, between, after, every=0.05)
    b, a = state["before"], state["after"]
    d = {k: a.get(k, 0.0) - b.get(k, 0.0) for k in a}
    d["xact_commit"] -= run.looks  # (this script's looks for jobs left, and for the server's processes)
    per = {k: v / jobs for k, v in d.items()}
    lines.append(f"profile: one more drain of {jobs:,} jobs by {services} service(s), {run.rate:,.0f} jobs/s, server "
                 f"{run.server_us():,.0f} µs per job; the run's database's counters from the services' start to their "
                 "stop, per job:")
    hot = d["n_tup_hot_upd"] / d["n_tup_upd"] if d["n_tup_upd"] else 0.0
    lines.append(f"  the services' transactions {per['xact_commit']:.3f} (each a commit: a WAL flush with synchronous_commit "
                 f"on); rows updated {per['n_tup_upd']:.2f} ({hot:.0%} HOT), inserted {per['n_tup_ins']:.2f}; dead rows left "
                 f"{a['n_dead_tup']:,.0f}, autovacuums {d['autovacuum_count']:.0f}")
    lines.append(f"  blocks: {per['blks_hit']:.1f} hit, {per['blks_read']:.2f} read (the jobs table {per['heap_blks_hit']:.1f}, "
                 f"its indexes {per['idx_blks_hit']:.1f})")
    indexes = sorted(((k.removeprefix("index "), v) for k, v in per.items() if k.startswith("index ") and v > 0.005),
                     key=lambda item: -item[1])
    lines.append("  index blocks touched: " + ", ".join(f"{name} {v:.2f}" for name, v in indexes))
    lines.append(f"  WAL (pg_stat_wal: the whole server's, other databases' too): {per['wal_bytes']:,.0f} bytes, "
                 f"{per['wal_records']:.1f} records, {per['wal_fpi']:.2f} full-page images, {per['wal_write']:.3f} writes, "
                 f"{per['wal_sync']:.3f} syncs")
    if state.get("rows"):
        lines.append("  statements (pg_stat_statements, the run's database; times: wall, the statement's execution and its "
                     "planning, which pg_stat_statements.track_planning=on counts):")
        lines.append("  | statement | calls/job | rows/call | execution µs/job | µs/call | plans/call | planning µs/job | "
                     "blocks hit/job | dirtied/job | WAL records/job | WAL bytes/job | FPI/job |")
        lines.append("  |---|---|---|---|---|---|---|---|---|---|---|---|")
        for query, calls, rows, total, plans, planning, hit, dirtied, wal_records, wal_fpi, wal_bytes in state["rows"]:
            lines.append(f"  | {_label(query)} | {calls / jobs:.3f} | {rows / max(calls, 1):.1f} | {total * 1000 / jobs:.1f} | "
                         f"{total * 1000 / max(calls, 1):,.0f} | {plans / max(calls, 1):.2f} | {planning * 1000 / jobs:.1f} | "
                         f"{hit / jobs:.1f} | {dirtied / jobs:.2f} | {float(wal_records) / jobs:.2f} | "
                         f"{float(wal_bytes) / jobs:,.0f} | {float(wal_fpi) / jobs:.3f} |")
    lines += explain_postgres(server, jobs)
    return lines


def plan_totals(plan: dict[str, Any]) -> dict[str, float]:
    """A plan's execution figures: its top node's (which count what runs beneath it), and those of the
    data-modifying CTEs no node reads (the insert of the Ledger's batch): Postgres runs them to completion
    after the top node, outside its counts."""
    top = plan["Plan"]
    scanned: set[str] = set()
    todo = [top]
    while todo:
        node = todo.pop()
        if node.get("Node Type") == "CTE Scan":
            scanned.add(node.get("CTE Name", ""))
        todo += node.get("Plans", [])
    parts = [top] + [child for child in top.get("Plans", []) if (child.get("Subplan Name") or "").startswith("CTE ")
                     and child["Subplan Name"].removeprefix("CTE ") not in scanned]
    keys = {"hit": "Shared Hit Blocks", "read": "Shared Read Blocks", "dirtied": "Shared Dirtied Blocks",
            "wal records": "WAL Records", "wal bytes": "WAL Bytes", "fpi": "WAL FPI"}
    totals = {name: float(sum(part.get(key, 0) for part in parts)) for name, key in keys.items()}
    totals["ms"] = float(plan["Execution Time"])
    totals["planning ms"] = float(plan.get("Planning Time", 0.0))
    totals["planning hit"] = float(plan.get("Planning", {}).get("Shared Hit Blocks", 0))
    return totals


def explain_postgres(server: PostgresServer, jobs: int, batch: int = 32, rounds: int = 30) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS, WAL) of the store's claim, outcome and insert statements, ``batch`` rows
    each, in the order a drain runs them, ``rounds`` times on a fresh table of ``jobs`` pending jobs."""
    import psycopg

    from pipeline.backends.base import Settlement
    from pipeline.backends.postgres import store
    from pipeline.states import Transition

    from stores import backlog

    url = server.stores.fresh("explain")
    try:
        server.stores.build(url, pending=jobs + batch * rounds)
        conn = psycopg.connect(url, autocommit=True)
        server.reshape(conn)
        found: dict[str, list[dict[str, float]]] = {}

        def explain(name: str, sql: str, params: dict[str, Any]) -> None:
            before: dict[str, int] = dict(conn.execute(_PG_INDEXES).fetchall())
            row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) " + sql, params).fetchone()
            assert row is not None
            plan = row[0][0]
            conn.execute("SELECT pg_stat_force_next_flush()")
            conn.execute("SELECT pg_stat_clear_snapshot()")
            after: dict[str, int] = dict(conn.execute(_PG_INDEXES).fetchall())
            figures = plan_totals(plan)
            figures.update({f"index {k}": float(after.get(k, 0) - before.get(k, 0)) for k in after})
            found.setdefault(name, []).append(figures)

        conn.execute("SELECT pg_stat_force_next_flush()")
        extra = iter(backlog(batch * rounds, job_type="inserted"))
        for _ in range(rounds):
            explain("claim, started (store._CLAIM)", store._CLAIM,  # noqa: SLF001
                    {"types": [JOB_TYPE], "limits": [batch], "starts": [batch], "owner": "explain", "lease": 30.0})
            held = conn.execute("SELECT id, lease_token FROM jobs WHERE status = 'running' AND lease_owner = 'explain' "
                                "AND started_at IS NOT NULL").fetchall()
            explain("claim ahead (the same, not started)", store._CLAIM,  # noqa: SLF001
                    {"types": [JOB_TYPE], "limits": [batch], "starts": [0], "owner": "ahead", "lease": 30.0})
            ahead = conn.execute("SELECT id, lease_token FROM jobs WHERE status = 'running' AND lease_owner = 'ahead' "
                                 "AND started_at IS NULL").fetchall()
            explain("START of jobs claimed ahead (outcomes)", store.BATCH_SETTLE,
                    {**store.outcome_params([Settlement(i, t, Transition.START) for i, t in ahead]), "notify": False})
            explain("SUCCEED (outcomes: the Ledger's batch)", store.BATCH_SETTLE,
                    {**store.outcome_params([Settlement(i, t, Transition.SUCCEED) for i, t in held + ahead]),
                     "notify": False})
            explain("insert (the Ledger's batch)", store.BATCH_INSERT,
                    {**store.insert_params([next(extra) for _ in range(batch)]), "notify": False})
        conn.close()
    finally:
        server.stores.drop(url)
    lines = [f"  EXPLAIN (ANALYZE, BUFFERS, WAL) of the store's statements on a table of {jobs:,} pending jobs, "
             f"{batch} rows a statement (SUCCEED: {2 * batch}, the jobs of both claims), medians of {rounds}, per row "
             "(planning: once per statement, as if planned at each call):",
             "  | statement | µs | blocks hit | dirtied | WAL records | WAL bytes | FPI | index blocks touched | planning µs, blocks |",
             "  |---|---|---|---|---|---|---|---|---|"]
    for name, runs in found.items():
        rows = 2 * batch if name.startswith("SUCCEED") else batch

        def med(key: str) -> float:
            return statistics.median(r[key] for r in runs) / rows

        indexes = sorted(((k.removeprefix("index "), med(k)) for k in runs[0] if k.startswith("index ")), key=lambda i: -i[1])
        touched = ", ".join(f"{k} {v:.2f}" for k, v in indexes if v >= 0.25)
        rest = sum(v for _, v in indexes if v < 0.25)
        touched += f", the other {sum(v < 0.25 for _, v in indexes)} {rest:.2f}"
        lines.append(f"  | {name} | {med('ms') * 1000:.1f} | {med('hit'):.1f} | {med('dirtied'):.2f} | {med('wal records'):.2f} | "
                     f"{med('wal bytes'):,.0f} | {med('fpi'):.3f} | {touched} | {med('planning ms') * 1000:.1f}, "
                     f"{med('planning hit'):.1f} |")
    return lines


def profile_redis(server: RedisServer, folder: Path, services: int, jobs: int, concurrency: int,
                  extra: dict[str, str], timed: Sequence[Run]) -> list[str]:
    """INFO commandstats of the timed runs of ``services`` (``timed``; medians), then one more drain with
    SLOWLOG recording every command: which script ran which commands, and its share of the time (SLOWLOG's
    own bookkeeping of a script's commands runs inside the script, so its µs are above the timed runs')."""
    from pipeline.backends.redis.scripts import ALL

    client = server.client
    kept = {k: str(client.config_get(k)[k]) for k in ("slowlog-log-slower-than", "slowlog-max-len")}
    room = min(jobs * 30 + 10_000, 5_000_000)  # (a script's own commands are logged too: about 16 a job)
    client.config_set("slowlog-max-len", str(room))

    def between(url: str) -> None:
        client.slowlog_reset()
        client.config_set("slowlog-log-slower-than", "0")  # every command, with its µs

    try:
        run = one_run(server, folder, services, jobs, concurrency, extra, server.own, between)
        client.config_set("slowlog-log-slower-than", kept["slowlog-log-slower-than"])
        entries = sorted(client.slowlog_get(-1), key=lambda entry: entry["id"])
    finally:
        for k, v in kept.items():
            client.config_set(k, v)
    # A script's own commands are logged before it (it is logged once it has returned), from no client's
    # address ("?:0"), and nothing else runs while a script does: those since the last script are the next one's.
    names = {script.sha: name for name, script in ALL.items()}
    durations: dict[str, list[int]] = {}
    inner: dict[str, dict[str, int]] = {}
    since: dict[str, int] = {}
    for entry in entries:
        words = entry["command"].split()
        if len(words) > 1 and words[0].upper() in (b"EVALSHA", b"EVALSHA_RO"):
            name = names.get(words[1].decode(), words[1].decode()[:10])
            durations.setdefault(name, []).append(int(entry["duration"]))
            mine = inner.setdefault(name, {})
            for command, n in since.items():
                mine[command] = mine.get(command, 0) + n
            since = {}
        elif words and entry.get("client_address") == b"?:0":
            command = words[0].decode().upper()
            since[command] = since.get(command, 0) + 1
    lines = [f"profile: one more drain of {jobs:,} jobs by {services} service(s), {run.rate:,.0f} jobs/s, server "
             f"{run.server_us():,.0f} µs per job (with SLOWLOG recording every command, which costs the server CPU of its own)"]
    lines.append(f"  commands per job in the timed runs of {services} service(s) (INFO commandstats, medians of "
                 f"{len(timed)}: a script's own redis.call()s counted too; µs: the server's clock around each, which a "
                 "busy machine stretches):")
    lines.append("  | command | calls/job | µs/call | µs/job |")
    lines.append("  |---|---|---|---|")
    names_seen = {name for run in timed for name in run.commands}
    rows = []
    for name in names_seen:
        if name.startswith(("slowlog", "config", "info")):
            continue
        calls = statistics.median(run.commands.get(name, {}).get("calls", 0.0) / run.jobs for run in timed)
        usec = statistics.median(run.commands.get(name, {}).get("usec", 0.0) / run.jobs for run in timed)
        if calls >= 0.001:
            rows.append((usec, f"  | {name} | {calls:.3f} | {usec / calls:.1f} | {usec:.1f} |"))
    lines += [row for _, row in sorted(rows, reverse=True)]
    lines.append("  scripts (SLOWLOG of every call: µs as Redis times them, the commands each ran):")
    lines.append("  | script | calls/job | jobs/call | µs/call (median) | µs/job | its commands per job |")
    lines.append("  |---|---|---|---|---|---|")
    for name, times in sorted(durations.items(), key=lambda item: -sum(item[1])):
        commands = ", ".join(f"{c} {n / jobs:.2f}" for c, n in sorted(inner.get(name, {}).items(), key=lambda i: -i[1])
                             if n / jobs >= 0.005)
        lines.append(f"  | {name} | {len(times) / jobs:.3f} | {jobs / len(times):,.1f} | {statistics.median(times):,.0f} | "
                     f"{sum(times) / jobs:.1f} | {commands} |")
    if len(entries) >= room:
        lines.append("  (SLOWLOG was full: the oldest calls are missing)")
    return lines


# -- main -------------------------------------------------------------------------------------------------

def pairs(values: Sequence[str], flag: str) -> dict[str, str]:
    found = {}
    for value in values:
        name, sep, setting = value.partition("=")
        if not sep or not name:
            raise SystemExit(f"{flag} takes NAME=VALUE, not {value!r}")
        found[name] = setting
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("postgres", "redis"), required=True)
    parser.add_argument("--services", default="1,2,4", help="counts of service processes, comma-separated (default 1,2,4)")
    parser.add_argument("--jobs", type=int, default=10_000, help="no-op jobs per run (default 10,000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the counts' order alternating (default 3)")
    parser.add_argument("--concurrency", type=int, default=32, help="WORKER_CONCURRENCY (default 32, as service.py)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="a setting for every service")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a server setting for the run: Postgres ALTER DATABASE SET, Redis CONFIG SET (its own server)")
    parser.add_argument("--drop-index", action="append", default=[], metavar="NAME",
                        help="Postgres: drop this index of the jobs table in each run's database once loaded: what the "
                             "server would spend without it (a what-if, not a configuration)")
    parser.add_argument("--profile", action="store_true", help="then one more drain with the server's accounting on")
    parser.add_argument("--postgres-url", default=POSTGRES_URL, help="the Postgres server (a database is made per run)")
    parser.add_argument("--redis-url", help="a Redis server to use instead of one of the script's own (AOF on)")
    options = parser.parse_args(argv)
    try:
        counts = [int(c) for c in options.services.split(",")]
    except ValueError:
        parser.error(f"--services takes counts like 1,2,4, not {options.services!r}")
    if not counts or min(counts) < 1 or options.jobs < 1 or options.rounds < 1:
        parser.error("--services, --jobs and --rounds must be at least 1")
    extra, settings = pairs(options.env, "--env"), pairs(options.set, "--set")
    if options.drop_index and options.backend != "postgres":
        parser.error("--drop-index is for --backend postgres")
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        folder = Path(tmp)
        (folder / "clusterapp.py").write_text(APP)
        server: Server
        if options.backend == "postgres":
            server = PostgresServer(options.postgres_url, settings, options.drop_index)
        else:
            own = options.redis_url is None
            url = stack.enter_context(own_redis(folder, settings)) if own else options.redis_url
            server = RedisServer(url, {} if own else settings, own)
        stack.callback(server.stores.close)
        durable = options.backend == "postgres" or options.redis_url is None
        runs: dict[int, list[Run]] = {count: [] for count in counts}
        print(f"backend {options.backend}, {options.jobs:,} no-op jobs per run, WORKER_CONCURRENCY={options.concurrency}, "
              f"each service `python -m pipeline --app clusterapp:registry --processes 1`, default logging"
              + "".join(f", {k}={v}" for k, v in extra.items()) + "".join(f"; server {k} = {v}" for k, v in settings.items())
              + "".join(f"; without the index {name}" for name in options.drop_index),
              flush=True)
        print(f"the server's CPU: {server.source}", flush=True)
        for r in range(options.rounds):
            for count in counts if r % 2 == 0 else list(reversed(counts)):
                run = one_run(server, folder, count, options.jobs, options.concurrency, extra, durable)
                runs[count].append(run)
                print(f"round {r + 1}, {count} service(s): {run.rate:,.0f} jobs/s, server {run.server_us():,.0f} µs/job, "
                      f"services {', '.join(f'{v:,.0f}' for v in run.each_us())} µs/job (jobs: "
                      f"{', '.join(f'{n:,}' for n in run.service_jobs)})", flush=True)
        print(f"\nmedians of {options.rounds} round(s) (range), CPU per job from the resume to the last job completed:")
        for line in table(options.backend, runs, server):
            print(line)
        bound = ("it assumes the work spreads over the cores, which row locks, the claim's index and the WAL's one "
                 "stream limit" if options.backend == "postgres" else "a server's scripts run one at a time, on one core")
        print(f"\nprojection: jobs/s with {BUSY:.0%} of the server's cores serving jobs, from its CPU per job (an upper "
              f"bound: {bound}):")
        for line in projection(options.backend, runs):
            print(line)
        cores = os.cpu_count() or 1
        if max(counts) + 1 > cores:
            print(f"\nnote: this machine has {cores} cores, shared by the services and the server: the rate grows only until "
                  "they are busy, not with the services as it would with a machine each, and the services take CPU from the "
                  "server. The server's CPU per job is the figure that carries over to a cluster of machines.")
        if options.profile:
            print(flush=True)
            if isinstance(server, PostgresServer):
                lines = profile_postgres(server, folder, counts[0], options.jobs, options.concurrency, extra)
            else:
                assert isinstance(server, RedisServer)
                lines = profile_redis(server, folder, counts[0], options.jobs, options.concurrency, extra, runs[counts[0]])
            for line in lines:
                print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
