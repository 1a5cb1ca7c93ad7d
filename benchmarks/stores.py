"""Fresh job stores for bench.py and chaos.py, one kind per backend: each made empty, named by
the DATABASE_URL the measured processes get, and removed afterwards.

    stores = open_stores("postgres", tmp)       # or "sqlite", "redis"
    url = stores.fresh("drain")                 # a new empty store
    stores.build(url, pending=20_000)           # a backlog of due no-op jobs, written fast
    ...                                         # processes run with DATABASE_URL=url
    stores.close()                              # every store it made is gone

* sqlite: a new file in the run's directory;
* postgres: a new database on the server (``--postgres-url``, default the local one), made
  with CREATE DATABASE and dropped WITH (FORCE) at the end;
* redis: a new key prefix (``?prefix=`` in the URL) on the server (``--redis-url``), its keys
  deleted at the end; the shared server keeps nothing on disk, so the processes run with
  REDIS_ALLOW_NON_DURABLE=true (``settings``).

Backlogs are written the quickest way each store has (executemany, COPY; on Redis the
backend's own bulk insert), and ``busy``/``completed`` read the counts a waiting loop polls.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import trio

import pipeline
from pipeline.backends import NewJob, open_backend
from pipeline.clock import format_ts
from pipeline.ids import UUID7Factory

POSTGRES_URL = os.environ.get("PIPELINE_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("PIPELINE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
BACKENDS = ("sqlite", "postgres", "redis")


def backlog(n: int, *, job_type: str = "noop", status: str = "pending", at: str | None = None) -> Iterator[NewJob]:
    """``n`` due jobs of ``job_type`` with payload ``{"n": i}``."""
    at = at or format_ts(time.time())
    for i, job_id in enumerate(UUID7Factory().many(n)):
        yield NewJob(job_id, job_type, f'{{"n":{i}}}', 3, at, 5, at)


def _config(url: str, settings: dict[str, str]) -> pipeline.Config:
    return pipeline.Config.from_env({"DATABASE_URL": url, "LOG_LEVEL": "warning", "ADMIN_ENABLED": "false", **settings},
                                    env_file=None)


class Stores:
    """The stores of one backend made during a run; ``close`` removes them all."""

    backend = ""
    settings: dict[str, str] = {}  # more settings every process on these stores needs

    def __init__(self) -> None:
        self.made: list[str] = []
        self.built: dict[str, tuple[int, int]] = {}  # url -> (pending, completed) of build()

    def fresh(self, name: str) -> str:
        raise NotImplementedError

    def drop(self, url: str) -> None:
        raise NotImplementedError

    def server_cpu(self) -> float | None:
        """CPU seconds the store's server has spent so far (user + system), None where there is no
        server (SQLite) or it cannot be read from here."""
        return None

    def close(self) -> None:
        for url in reversed(self.made):
            try:
                self.drop(url)
            except Exception as exc:  # a store left behind is worth a line, not a failed run
                print(f"could not remove {url}: {exc}", flush=True)
        self.made.clear()

    def config(self, url: str, **overrides: Any) -> pipeline.Config:
        """Settings named as their variables in lower case (worker_concurrency=256), read as text."""
        values = {k.upper(): str(v).lower() if isinstance(v, bool) else str(v) for k, v in overrides.items()}
        return _config(url, {**self.settings, **values})

    def migrate(self, url: str) -> None:
        """Create the engine's tables or keys, as a process starting on the store would."""
        async def main() -> None:
            async with open_backend(self.config(url)):
                pass

        trio.run(main)

    def copy(self, template: str, name: str) -> str:
        """A fresh store holding what ``template`` was built with (here: built again)."""
        url = self.fresh(name)
        pending, completed = self.built[template]
        self.build(url, pending=pending, completed=completed)
        return url

    def build(self, url: str, *, pending: int, completed: int = 0) -> None:
        """``completed`` finished rows (older) and ``pending`` due no-op jobs, written fast."""
        self.built[url] = (pending, completed)
        if completed:
            raise NotImplementedError(f"a backlog with completed rows on {self.backend}")

        async def main() -> None:
            async with open_backend(self.config(url)) as backend:
                await backend.bulk_insert(backlog(pending))

        trio.run(main)

    def counts(self, url: str) -> dict[str, int]:
        """Jobs by status, through the backend's own operator query."""
        async def main() -> dict[str, int]:
            async with open_backend(self.config(url)) as backend:
                stats = await backend.stats()
            return dict(stats.get("by_status", {}))

        return trio.run(main)

    def busy(self, url: str) -> bool:
        counts = self.counts(url)
        return bool(counts.get("pending", 0) or counts.get("running", 0))

    def completed(self, url: str) -> int:
        return self.counts(url).get("completed", 0)


class SqliteStores(Stores):
    backend = "sqlite"

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def path(self, url: str) -> Path:
        return Path(url.removeprefix("sqlite:///"))

    def fresh(self, name: str) -> str:
        path = self.folder / f"{name}-{uuid.uuid4().hex[:6]}.db"
        url = f"sqlite:///{path}"
        self.made.append(url)
        return url

    def drop(self, url: str) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.path(url)}{suffix}").unlink(missing_ok=True)

    def copy(self, template: str, name: str) -> str:
        url = self.fresh(name)
        shutil.copyfile(self.path(template), self.path(url))
        return url

    def build(self, url: str, *, pending: int, completed: int = 0) -> None:
        from pipeline.backends.sqlite import migrations

        db = self.path(url)
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = OFF")  # a throw-away file: no need to survive a power cut
        migrations.migrate(conn, db)
        past, now = format_ts(time.time() - 3600), format_ts(time.time())
        sql = ("INSERT INTO jobs (id, job_type, payload, status, attempts, max_attempts, run_after, created_at, updated_at, "
               "priority) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(sql, ((r.id, r.job_type, r.payload, "completed", 1, 3, past, past, past, 5)
                               for r in backlog(completed, at=past)))
        conn.executemany(sql, ((r.id, r.job_type, r.payload, "pending", 0, 3, now, now, now, 5) for r in backlog(pending)))
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()

    def _one(self, url: str, sql: str) -> int:
        conn = sqlite3.connect(self.path(url), isolation_level=None, timeout=30)
        try:
            return int(conn.execute(sql).fetchone()[0])
        finally:
            conn.close()

    def busy(self, url: str) -> bool:
        return bool(self._one(url, "SELECT EXISTS (SELECT 1 FROM jobs WHERE status IN ('pending', 'running'))"))

    def completed(self, url: str) -> int:
        return self._one(url, "SELECT count(*) FROM jobs WHERE status = 'completed'")


class PostgresStores(Stores):
    backend = "postgres"

    def __init__(self, server_url: str = POSTGRES_URL) -> None:
        super().__init__()
        self.server_url = server_url
        self._conns: dict[str, Any] = {}  # url -> the connection _one polls on

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.server_url, autocommit=True) as conn:
            conn.execute(sql)

    def server_cpu(self) -> float | None:
        """The server's processes on this machine, from /proc (Linux): each one's user + system time,
        and the postmaster's of its children that have ended (a connection's backend, once it
        closed); None if the server is elsewhere or /proc does not say."""
        if urlsplit(self.server_url).hostname not in ("127.0.0.1", "localhost", "::1", None):
            return None
        tick, total, seen = os.sysconf("SC_CLK_TCK"), 0, False
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                name, rest = (proc / "stat").read_text().rsplit(")", 1)
            except OSError:
                continue  # (ended meanwhile, or not ours to read)
            if not name.endswith("(postgres"):
                continue
            fields = rest.split()
            total += sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime, stime, cutime, cstime
            seen = True
        return total / tick if seen else None

    def fresh(self, name: str) -> str:
        database = f"pipeline_bench_{name}_{uuid.uuid4().hex[:8]}".lower()
        self._admin(f"CREATE DATABASE {database}")
        url = urlunsplit(urlsplit(self.server_url)._replace(path=f"/{database}"))
        self.made.append(url)
        return url

    def drop(self, url: str) -> None:
        conn = self._conns.pop(url, None)
        if conn is not None:
            conn.close()
        self._admin(f"DROP DATABASE IF EXISTS {urlsplit(url).path.lstrip('/')} WITH (FORCE)")

    def copy(self, template: str, name: str) -> str:
        """CREATE DATABASE ... TEMPLATE: a file-level copy, as quick as SQLite's."""
        database = f"pipeline_bench_{name}_{uuid.uuid4().hex[:8]}".lower()
        self._admin(f"CREATE DATABASE {database} TEMPLATE {urlsplit(template).path.lstrip('/')}")
        url = urlunsplit(urlsplit(self.server_url)._replace(path=f"/{database}"))
        self.made.append(url)
        return url

    def build(self, url: str, *, pending: int, completed: int = 0) -> None:
        import psycopg

        self.migrate(url)
        past, now = format_ts(time.time() - 3600), format_ts(time.time())
        columns = "COPY jobs (id, job_type, payload, status, attempts, max_attempts, run_after, created_at, updated_at, priority) FROM STDIN"
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = off")  # a throw-away database
            with conn.transaction(), conn.cursor().copy(columns) as copy:
                for r in backlog(completed, at=past):
                    copy.write_row((r.id, r.job_type, r.payload, "completed", 1, 3, past, past, past, 5))
                for r in backlog(pending, at=now):
                    copy.write_row((r.id, r.job_type, r.payload, "pending", 0, 3, now, now, now, 5))
            conn.execute("VACUUM ANALYZE jobs")  # fresh statistics, as a table in use has
            conn.execute("CHECKPOINT")  # the build's WAL written out before anything is timed

    def _one(self, url: str, sql: str) -> int:
        """On one connection per store, kept: a waiting loop that connected at every poll
        would fork a server process each time, on the cores the measured processes use."""
        import psycopg

        conn = self._conns.get(url)
        if conn is None or conn.closed:
            conn = self._conns[url] = psycopg.connect(url, autocommit=True)
        row = conn.execute(sql).fetchone()
        return int(row[0]) if row else 0

    def busy(self, url: str) -> bool:
        return bool(self._one(url, "SELECT EXISTS (SELECT 1 FROM jobs WHERE status IN ('pending', 'running'))"))

    def completed(self, url: str) -> int:
        return self._one(url, "SELECT count(*) FROM jobs WHERE status = 'completed'")


class RedisStores(Stores):
    """A key prefix of its own per store, on a server that may keep nothing on disk."""

    backend = "redis"
    settings = {"REDIS_ALLOW_NON_DURABLE": "true"}  # the shared server here keeps nothing on disk

    def __init__(self, server_url: str = REDIS_URL) -> None:
        super().__init__()
        self.server_url = server_url.split("?", 1)[0]
        self._kept: Any = None  # the counting loops' client

    def server_cpu(self) -> float | None:
        """The server's own count (INFO cpu: its main process, threads included)."""
        info = self._client().info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def fresh(self, name: str) -> str:
        url = f"{self.server_url}?prefix=bench_{name}_{uuid.uuid4().hex[:8]}"
        self.made.append(url)
        return url

    # Completed jobs written in the store's own key layout (scripts.py's docstring) by the server
    # itself, 5,000 a call: a million through the insert and settle scripts would take minutes.
    # ARGV: prefix, type, payload, finished (epoch ms), then the ids.
    _COMPLETED = r"""
local P, t, payload, at = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
for i = 5, #ARGV do
  local id = ARGV[i]
  redis.call('HSET', P .. 'job:' .. id, 'type', t, 'payload', payload, 'status', 'completed', 'attempts', 1,
             'max', 3, 'run', at, 'prio', 5, 'created', at, 'updated', at, 'token', 1)
  redis.call('ZADD', P .. 'all', 0, id)
  redis.call('ZADD', P .. 'type:' .. t, 0, id)
  redis.call('ZADD', P .. 'st:completed:' .. t, 0, id)
  redis.call('ZADD', P .. 'done:completed', at, id)
end
redis.call('SADD', P .. 'types', t)
return #ARGV - 4
"""

    def build(self, url: str, *, pending: int, completed: int = 0) -> None:
        """Completed rows written by a script of the server's own (older than the pending
        ones, as in the other stores), then the pending ones through the backend's bulk insert."""
        self.built[url] = (pending, completed)
        self.migrate(url)
        if completed:
            client = self._client()
            try:
                script = client.register_script(self._COMPLETED)
                at = str(int((time.time() - 3600) * 1000))
                ids = list(UUID7Factory().many(completed))
                for i in range(0, completed, 5_000):
                    script(args=[self._prefix(url), "noop", "{}", at, *ids[i : i + 5_000]])
            finally:
                client.close()

        async def main() -> None:
            async with open_backend(self.config(url)) as backend:
                await backend.bulk_insert(backlog(pending))

        trio.run(main)

    # The waiting loops' counts read the index sets directly, on one client kept: counting through
    # the backend would open it (and log the durability warning) at every poll.
    def _client(self) -> Any:
        import redis

        return redis.Redis.from_url(self.server_url)

    @staticmethod
    def _prefix(url: str) -> str:
        return "{" + url.split("?prefix=", 1)[1] + "}:"

    def _count(self, url: str, status: str) -> int:
        """The jobs of a status: the sum of its sets per type, st:<status>:<type>, which every layout
        keeps (layout 7 has no status:<status> for pending, running and completed), so that
        before_after.py reads the code of before a layout change the same way."""
        if self._kept is None:
            self._kept = self._client()
        prefix = self._prefix(url)
        types = self._kept.smembers(prefix + "types")
        pipe = self._kept.pipeline(transaction=False)
        for t in types:
            pipe.zcard(f"{prefix}st:{status}:".encode() + t)
        return sum(int(n) for n in pipe.execute())

    def busy(self, url: str) -> bool:
        return bool(self._count(url, "pending") or self._count(url, "running"))

    def completed(self, url: str) -> int:
        return self._count(url, "completed")

    def drop(self, url: str) -> None:
        import redis

        prefix = url.split("?prefix=", 1)[1]
        client = redis.Redis.from_url(self.server_url)
        try:
            for pattern in (f"{{{prefix}}}:*", f"{prefix}:*"):  # with or without the hash tag's braces
                keys = list(client.scan_iter(match=pattern, count=1000))
                for i in range(0, len(keys), 1000):
                    client.delete(*keys[i : i + 1000])
        finally:
            client.close()


def open_stores(backend: str, folder: Path, *, postgres_url: str = POSTGRES_URL, redis_url: str = REDIS_URL) -> Stores:
    if backend == "sqlite":
        return SqliteStores(folder)
    if backend == "postgres":
        return PostgresStores(postgres_url)
    if backend == "redis":
        return RedisStores(redis_url)
    raise ValueError(f"unknown backend {backend!r}: one of {', '.join(BACKENDS)}")


def backend_of(url: str) -> str:
    scheme = url.split(":", 1)[0]
    return {"sqlite": "sqlite", "postgresql": "postgres", "postgres": "postgres", "redis": "redis", "rediss": "redis"}[scheme]
