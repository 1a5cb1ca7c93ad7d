"""The backends the conformance suite runs against, by name.

An entry is an async context manager that, given a directory of its own (pytest's tmp_path),
prepares a fresh, empty store and yields the Config that names it (its DATABASE_URL), and
removes the store afterwards. Adding a backend to the suite is adding an entry here.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import trio
from conftest import fast_config, require_service

from pipeline import Config


@asynccontextmanager
async def sqlite_store(tmp_path: Path) -> AsyncIterator[Config]:
    """A new file in tmp_path (whoever made the directory removes it)."""
    yield fast_config(tmp_path / "conformance.db")


# The server the postgres entry uses (trust auth on loopback here; CI the same). One database
# per test run, made at first use and dropped at exit; a schema of its own per test, named in
# the URL's search_path, so every process given the URL (test_processes) sees the same store.
POSTGRES_URL = os.environ.get("PIPELINE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
_run_database: list[str] = []  # the test run's database, once made
_made = threading.Lock()


def _admin(sql: str, *, database: str | None = None) -> None:
    import psycopg

    url = POSTGRES_URL if database is None else _on_database(database)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


def _on_database(name: str) -> str:
    parts = urlsplit(POSTGRES_URL)
    return urlunsplit(parts._replace(path=f"/{name}"))


def _run_db() -> str:
    with _made:
        if not _run_database:
            name = f"pipeline_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
            _admin(f"CREATE DATABASE {name}")
            # Commits that do not wait for the WAL's fsync (80-260 us each on this machine's disk): the
            # server never stops during a test, so what a test reads is the same, only sooner (as
            # fast_config's SQLite stores run with synchronous=normal)
            _admin(f"ALTER DATABASE {name} SET synchronous_commit = off")
            _run_database.append(name)
            atexit.register(_admin, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        return _run_database[0]


@asynccontextmanager
async def postgres_store(tmp_path: Path) -> AsyncIterator[Config]:
    """A fresh schema in the test run's database (skipped when no server answers, unless
    PIPELINE_REQUIRE_SERVICES=1); the schema is dropped afterwards."""
    parts = urlsplit(POSTGRES_URL)
    require_service("PostgreSQL", parts.hostname or "127.0.0.1", parts.port or 5432)
    database = await trio.to_thread.run_sync(_run_db)
    schema = f"t_{uuid.uuid4().hex[:12]}"
    await trio.to_thread.run_sync(lambda: _admin(f"CREATE SCHEMA {schema}", database=database))
    try:
        yield fast_config(tmp_path / "unused.db").replace(
            database_url=f"{_on_database(database)}?options=-csearch_path%3D{schema}"
        )
    finally:
        await trio.to_thread.run_sync(lambda: _admin(f"DROP SCHEMA {schema} CASCADE", database=database))


# Opening a backend on a new schema runs every migration (~50-90 ms on this server); a test run opens
# hundreds. So the conformance entry (BACKENDS["postgres"]) takes a schema migrated ahead by a thread of
# the test run, while the tests before it ran, and hands it back to that thread to drop. postgres_store
# itself gives an empty schema, unmigrated: the upgrade tests build old layouts in it.
_READY_AHEAD = 3
_ready: queue.Queue[str] = queue.Queue()
_to_drop: queue.Queue[str] = queue.Queue()
_schemas_thread: list[threading.Thread] = []


_schemas_failed: list[BaseException] = []


def _prepare_schemas() -> None:
    """The thread: drop the schemas handed back, keep _READY_AHEAD migrated ones ready. An error ends
    it, kept for the test that waits next (at exit, DROP DATABASE ends its connection: nobody waits)."""
    try:
        _prepare_schemas_until_error()
    except BaseException as error:  # noqa: BLE001 - handed to the waiting test
        _schemas_failed.append(error)


def _prepare_schemas_until_error() -> None:
    import psycopg

    from pipeline.backends.postgres import schema as pg_schema

    database = _run_db()
    while True:
        try:
            dropped = _to_drop.get(timeout=0.05 if _ready.qsize() < _READY_AHEAD else None)
        except queue.Empty:
            dropped = None
        if dropped is not None:
            with contextlib.suppress(Exception):  # a test left it locked: the run's DROP DATABASE takes it
                _admin(f"SET lock_timeout = '2s'; DROP SCHEMA {dropped} CASCADE", database=database)
            continue
        name = f"t_{uuid.uuid4().hex[:12]}"
        url = f"{_on_database(database)}?options=-csearch_path%3D{name}"
        _admin(f"CREATE SCHEMA {name}", database=database)
        with psycopg.connect(url, autocommit=True) as conn:
            pg_schema.migrate(conn, "test schema")
        _ready.put(name)


def _migrated_schema() -> str:
    with _made:
        if not _schemas_thread:
            thread = threading.Thread(target=_prepare_schemas, name="test-schemas", daemon=True)
            thread.start()
            _schemas_thread.append(thread)
    while True:
        try:
            return _ready.get(timeout=1)
        except queue.Empty:
            if not _schemas_thread[0].is_alive():
                raise RuntimeError("the thread that prepares test schemas stopped") from (_schemas_failed or [None])[0]


@asynccontextmanager
async def migrated_postgres_store(tmp_path: Path) -> AsyncIterator[Config]:
    """As postgres_store, the schema already migrated to the latest version (empty of jobs)."""
    parts = urlsplit(POSTGRES_URL)
    require_service("PostgreSQL", parts.hostname or "127.0.0.1", parts.port or 5432)
    database = await trio.to_thread.run_sync(_run_db)
    schema = await trio.to_thread.run_sync(_migrated_schema)
    try:
        yield fast_config(tmp_path / "unused.db").replace(
            database_url=f"{_on_database(database)}?options=-csearch_path%3D{schema}"
        )
    finally:
        _to_drop.put(schema)


# The server the redis entry uses: the machine's shared one (it keeps nothing on disk, so the
# entry allows a non-durable server); a key prefix of its own per test, named in the URL
# (?prefix=), so every process given the URL sees the same store; its keys deleted afterwards.
REDIS_URL = os.environ.get("PIPELINE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def drop_redis_keys(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{{{prefix}}}:*", count=1000))
        for i in range(0, len(keys), 1000):
            client.unlink(*keys[i : i + 1000])
    finally:
        client.close()


@asynccontextmanager
async def redis_store(tmp_path: Path) -> AsyncIterator[Config]:
    """A fresh key prefix on the test server (skipped when it does not answer, unless
    PIPELINE_REQUIRE_SERVICES=1); its keys are deleted afterwards."""
    from pipeline.config import RedisSettings

    parts = urlsplit(REDIS_URL)
    require_service("Redis", parts.hostname or "127.0.0.1", parts.port or 6379)
    prefix = f"pipeline-test-{uuid.uuid4().hex[:12]}"
    try:
        yield fast_config(tmp_path / "unused.db").replace(
            database_url=f"{REDIS_URL}?prefix={prefix}", redis=RedisSettings(allow_non_durable=True)
        )
    finally:
        await trio.to_thread.run_sync(drop_redis_keys, REDIS_URL, prefix)


StoreFactory = Callable[[Path], AbstractAsyncContextManager[Config]]

BACKENDS: dict[str, StoreFactory] = {
    "sqlite": sqlite_store,
    "postgres": migrated_postgres_store,
    "redis": redis_store,
}


StoreScenario = Callable[[str, Config, Path], Awaitable[None]]  # (backend name, its store's Config, a folder)


async def on_each_store(tmp_path: Path, scenario: StoreScenario) -> None:
    """Run ``scenario(name, config, folder)`` on a fresh store of each backend, the three side by
    side: a test of real processes mostly waits (for processes to start, for ticks, for a stop),
    and one store after another it waits three times. Each store gets a folder of its own in
    tmp_path. Every store's run goes to its end whatever the others do; their failures are raised
    together, each noted with its store. A store whose server does not answer (skipped, outside CI)
    is left out, and once the others passed the test is reported skipped, naming it."""
    failures: list[BaseException] = []
    passed: list[str] = []
    skipped: list[str] = []

    async def one(name: str) -> None:
        folder = tmp_path / name
        folder.mkdir()
        try:
            async with BACKENDS[name](folder) as config:
                await scenario(name, config, folder)
            passed.append(name)
        except pytest.skip.Exception as skip:
            skipped.append(f"{name}: {skip.msg}")
        except (Exception, pytest.fail.Exception) as error:
            error.add_note(f"(on the {name} store)")
            failures.append(error)

    async with trio.open_nursery() as nursery:
        for name in sorted(BACKENDS):
            nursery.start_soon(one, name)
    report_stores(failures, passed, skipped)


def report_stores(failures: list[BaseException], passed: list[str], skipped: list[str]) -> None:
    """The end of a test run on several stores: their failures raised together (one as it is), or the
    test reported skipped, naming the stores left out, once the others passed."""
    if len(failures) == 1:
        raise failures[0]
    if failures:
        raise BaseExceptionGroup(f"failed on {len(failures)} stores", failures)
    if skipped:
        pytest.skip(f"passed on {', '.join(sorted(passed)) or 'no store'}; left out: {'; '.join(sorted(skipped))}")
