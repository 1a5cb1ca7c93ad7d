"""The Postgres store beside an application (issue 34, item 4), on a real server: ``connection=`` from the
application's own connection, whose search_path is its own schema; ``application_name`` on every session
the pipeline opens; payloads and results an operator reads with ``->>``."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import attrs
import pytest
import trio
from backends.stores import POSTGRES_URL, postgres_store
from conftest import fast_config, require_service
from jobkit import Echo, Tick, registry, wait_status
from supervisor_harness import ROOT, Service, service_env

import pipeline
from pipeline import Config

psycopg = pytest.importorskip("psycopg")

LONG_POLL_MS = 60_000  # a job found within seconds was found by its NOTIFY, not by a poll


def _quiet(config: Config) -> Config:
    return config.replace(worker=attrs.evolve(config.worker, poll_interval_ms=LONG_POLL_MS))


def _with_options(url: str, options: str) -> str:
    """The store's URL (its database) with other libpq options than the test's search_path."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(query=options))


# -- connection= from the application's own schema ----------------------------------------------------------

# The application's schema holds tables named as the pipeline's, of another shape: a statement that named
# a table without its schema would find these (the caller's search_path) and fail, or write the app's rows.
_APP_TABLES = """
CREATE SCHEMA {app};
CREATE TABLE {app}.orders (id serial PRIMARY KEY, note text);
CREATE TABLE {app}.jobs (order_ref integer);
CREATE TABLE {app}.job_edges (order_ref integer);
CREATE TABLE {app}.batches (order_ref integer);
"""


@contextmanager
def _app_schema(config: Config) -> Iterator[tuple[str, str]]:
    """The application's schema beside the pipeline's, on the same database: its name, and the URL of
    the application's connections (their search_path that schema alone)."""
    app = "app_" + config.database_url.rsplit("search_path%3D", 1)[1]
    with psycopg.connect(config.database_url, autocommit=True) as admin:
        admin.execute(_APP_TABLES.format(app=app))
    try:
        yield app, _with_options(config.database_url, f"options=-csearch_path%3D{app}")
    finally:
        with psycopg.connect(config.database_url, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {app} CASCADE")


async def test_connection_from_the_apps_own_search_path_enqueues_into_the_pipelines_schema(tmp_path: Path) -> None:
    """Every kind of enqueue in the caller's transaction (plain, with an expiry, unique keys and their
    holder, after= a job in the store and in the call, a batch with its callback) from a connection
    whose search_path is the app's schema: its rows commit with the app's row, the service starts them
    by the NOTIFY (its payload the pipeline's schema), the app's same-named tables are untouched, and its
    search_path is as it was."""
    reg = registry()
    async with postgres_store(tmp_path) as config, pipeline.open_pipeline(_quiet(config), reg) as service:
        with _app_schema(config) as (app, app_url):
            client = await trio.to_thread.run_sync(lambda: pipeline.Client(registry=reg, config=config))
            try:
                existing = await trio.to_thread.run_sync(lambda: client.enqueue(Tick(0), delay=3600))

                def in_the_apps_transaction() -> tuple[list[str], str, list[tuple[Any, ...]]]:
                    with psycopg.connect(app_url) as conn:
                        (before,) = conn.execute("SHOW search_path").fetchone()
                        conn.execute("INSERT INTO orders (note) VALUES ('rolled back')")
                        gone = client.enqueue(Echo("rolled back"), connection=conn)
                        conn.rollback()
                        conn.execute("INSERT INTO orders (note) VALUES ('committed')")
                        ids = [client.enqueue(Echo("plain"), connection=conn),
                               client.enqueue(Echo("expiring"), expires_at=time.time() + 3600, connection=conn),
                               *client.enqueue_many([Tick(1), Tick(2)], unique_keys=["k", None], connection=conn),
                               client.enqueue(Tick(3), unique_key="k", connection=conn)]  # the holder's id
                        assert ids[4] == ids[2]
                        ids.append(client.enqueue(Tick(4), after=[existing], connection=conn))  # waits for it
                        first = client.enqueue(Echo("first"), connection=conn)
                        ids += [first, client.enqueue(Echo("then"), after=[first], connection=conn)]
                        batch = client.enqueue_batch([Tick(5), Tick(6)], then=Echo("callback"), connection=conn)
                        ids += [*batch.job_ids, batch.callback_id]
                        (during,) = conn.execute("SHOW search_path").fetchone()
                        conn.commit()
                        (after,) = conn.execute("SHOW search_path").fetchone()
                        assert before == during == after, (before, during, after)
                        app_rows = [conn.execute(f"SELECT count(*) FROM {name}").fetchone()
                                    for name in ("orders", "jobs", "job_edges", "batches")]
                    return [gone, *ids], before, app_rows

                (gone, *ids), search_path, app_rows = await trio.to_thread.run_sync(in_the_apps_transaction)
                assert search_path == app
                assert app_rows == [(1,), (0,), (0,), (0,)]  # the app's order; its own same-named tables untouched
                for job_id in (ids[0], ids[1], ids[3], ids[6], ids[7], ids[8], ids[9], ids[10]):
                    await wait_status(service, job_id, "completed", timeout=20)
                assert await service.backend.get(gone) is None
                assert (await service.backend.get(ids[2])).status == "completed"  # type: ignore[union-attr]
                assert (await service.backend.get(ids[5])).status == "waiting"  # type: ignore[union-attr]

                # the NOTIFY written in the app's transaction wakes the service: its payload is the pipeline's
                # schema (the listener ignores any other). Alone here: the confirmation of after= above sent one
                # of its own, on the client's connection.
                await trio.sleep(0.5)  # the service idle, waiting on its listener (a minute's poll)

                def alone() -> str:
                    with psycopg.connect(app_url) as conn:
                        return client.enqueue(Echo("woken"), connection=conn)

                started = time.monotonic()
                woken = await trio.to_thread.run_sync(alone)
                await wait_status(service, woken, "completed", timeout=20)
                assert time.monotonic() - started < LONG_POLL_MS / 1000 / 3, "found by a poll, not by the NOTIFY"
            finally:
                await trio.to_thread.run_sync(client.close)


async def test_an_async_connection_from_the_apps_own_search_path_enqueues_too(tmp_path: Path) -> None:
    reg = registry()
    async with postgres_store(tmp_path) as config, pipeline.open_pipeline(_quiet(config), reg) as service:
        with _app_schema(config) as (_, app_url):
            async def asyncio_app() -> list[str]:
                async with pipeline.AsyncClient(registry=reg, config=config) as aclient:
                    async with await psycopg.AsyncConnection.connect(app_url) as aconn:
                        async with aconn.transaction():
                            await aconn.execute("INSERT INTO orders (note) VALUES ('async')")
                            ids = await aclient.enqueue_many([Echo("async"), Tick(1)], unique_keys=[None, "k"],
                                                             connection=aconn)
                            first = await aclient.enqueue(Echo("first"), connection=aconn)
                            ids += [first, await aclient.enqueue(Echo("then"), after=[first], connection=aconn)]
                        jobs = await (await aconn.execute("SELECT count(*) FROM jobs")).fetchone()
                        assert jobs == (0,)
                return ids

            ids = await trio.to_thread.run_sync(lambda: asyncio.run(asyncio_app()))
            for job_id in ids:
                await wait_status(service, job_id, "completed", timeout=10)


async def test_a_connection_to_another_database_is_refused_naming_it_and_the_fix(tmp_path: Path) -> None:
    """The refusal that remains: another database (any schema, any search_path). The message names both
    databases and what to do; nothing is written, and the caller's transaction is not failed by the check."""
    reg = registry()
    async with postgres_store(tmp_path) as config:
        def refused() -> str:
            with pipeline.Client(registry=reg, config=config) as client, psycopg.connect(POSTGRES_URL) as other:
                other.execute("SELECT 1")
                with pytest.raises(pipeline.UsageError) as caught:
                    client.enqueue(Echo("x"), connection=other)
                assert other.execute("SELECT 2").fetchone() == (2,)  # its transaction still usable
                return str(caught.value)

        message = await trio.to_thread.run_sync(refused)
        ours = urlsplit(config.database_url).path.lstrip("/")
        theirs = urlsplit(POSTGRES_URL).path.lstrip("/")
        assert repr(theirs) in message and repr(ours) in message, message
        assert "pass a connection to that database" in message and "any search_path" in message, message


async def test_a_role_that_may_not_write_the_pipelines_tables_is_told_the_grants(tmp_path: Path) -> None:
    """The app's own role (not the pipeline's): refused before anything is written, the message giving the
    GRANTs; once granted, the enqueue commits with the app's transaction."""
    reg = registry()
    async with postgres_store(tmp_path) as config, pipeline.open_pipeline(_quiet(config), reg) as service:
        schema = config.database_url.rsplit("search_path%3D", 1)[1]
        role = f"app_role_{schema}"
        with psycopg.connect(config.database_url, autocommit=True) as admin:
            admin.execute(f"CREATE ROLE {role} LOGIN")
        try:
            with _app_schema(config) as (app, app_url):
                with psycopg.connect(config.database_url, autocommit=True) as admin:
                    admin.execute(f"GRANT ALL ON SCHEMA {app} TO {role}; GRANT ALL ON ALL TABLES IN SCHEMA {app} TO {role}; "
                                  f"GRANT ALL ON ALL SEQUENCES IN SCHEMA {app} TO {role}")
                parts = urlsplit(app_url)
                as_role = urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port or 5432}"))

                def enqueue_as_the_app() -> str:
                    with pipeline.Client(registry=reg, config=config) as client, psycopg.connect(as_role) as conn:
                        conn.execute("INSERT INTO orders (note) VALUES ('x')")
                        job_id = client.enqueue(Echo("as the app's role"), connection=conn)
                        conn.commit()
                        return job_id

                with pytest.raises(pipeline.UsageError) as caught:
                    await trio.to_thread.run_sync(enqueue_as_the_app)
                message = str(caught.value)
                assert role in message and f"GRANT USAGE ON SCHEMA {schema} TO {role}" in message, message
                with psycopg.connect(config.database_url, autocommit=True) as admin:
                    admin.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}; "
                                  f"GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA {schema} TO {role}")
                job_id = await trio.to_thread.run_sync(enqueue_as_the_app)
                await wait_status(service, job_id, "completed", timeout=20)
        finally:
            with psycopg.connect(config.database_url, autocommit=True) as admin:
                admin.execute(f"DROP OWNED BY {role}; DROP ROLE {role}")


# -- application_name on every session --------------------------------------------------------------------------


@contextmanager
def _database_of_its_own() -> Iterator[str]:
    """A database for one test: every client session on it is the pipeline's, or the test's own observer."""
    require_service("PostgreSQL", urlsplit(POSTGRES_URL).hostname or "127.0.0.1", urlsplit(POSTGRES_URL).port or 5432)
    name = f"seams_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield urlunsplit(urlsplit(POSTGRES_URL)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _sessions(observer: Any) -> list[tuple[str, str]]:
    """(application_name, what it runs) of every client session on the observer's database but its own."""
    return observer.execute(
        "SELECT application_name, query FROM pg_stat_activity WHERE datname = current_database() "
        "AND backend_type = 'client backend' AND pid <> pg_backend_pid()").fetchall()


def _wait_sessions(observer: Any, want: set[str], timeout: float = 30.0,
                   counts: dict[str, int] | None = None) -> list[tuple[str, str]]:
    """The sessions once every name of ``want`` is there, with at least ``counts`` of some (a second
    worker process opens its listener and heartbeat a moment after the first), or at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        sessions = _sessions(observer)
        names = [name for name, _ in sessions]
        if (want <= set(names) and all(names.count(name) >= n for name, n in (counts or {}).items())) \
                or time.monotonic() > deadline:
            return sessions
        time.sleep(0.05)


def test_every_session_of_a_supervisor_its_workers_and_clients_names_its_role(tmp_path: Path) -> None:
    """A real supervisor with two worker processes, a Client, and a Client whose URL names its own
    application_name: in pg_stat_activity no session is anonymous, each role of the pipeline is there
    (pipeline-worker, -listener, -heartbeat, -supervisor, -client), and the user's name wins."""
    reg = registry()
    with _database_of_its_own() as url, psycopg.connect(url, autocommit=True, application_name="test-observer") as observer:
        service = Service(tmp_path, "--processes", "2", database_url=url, ADMIN_ENABLED="false")
        try:
            service.wait_line(r"pipeline running on .*2 worker processes")
            config = fast_config(tmp_path / "unused.db", database_url=url)
            own = config.replace(database_url=f"{url}?application_name=shop-web")
            with pipeline.Client(registry=reg, config=config) as client, pipeline.Client(registry=reg, config=own) as shop:
                ids = [client.enqueue(Echo("named")), shop.enqueue(Echo("named too"))]
                for job_id in ids:
                    assert client.result(job_id, timeout=30) is None
                want = {"pipeline-worker", "pipeline-listener", "pipeline-heartbeat", "pipeline-supervisor",
                        "pipeline-client", "shop-web"}
                sessions = _wait_sessions(observer, want, counts={"pipeline-listener": 2, "pipeline-heartbeat": 2})
            names = [name for name, _ in sessions]
            assert "" not in names, sessions  # no anonymous session
            assert set(names) == want, sessions
            # two worker processes: a listener and a heartbeat each; every other role's sessions are its pool's
            assert names.count("pipeline-listener") == 2 and names.count("pipeline-heartbeat") == 2, sessions
            listening = {name for name, query in sessions if query.startswith("LISTEN")}
            assert listening == {"pipeline-listener"}, sessions
        finally:
            service.stop()


# -- payloads and results an operator reads with ->> ------------------------------------------------------------


@attrs.frozen
class Order:
    """Fields out of alphabetical order, numbers JSON writes in more than one way, a NUL, non-ASCII text."""

    zeta: str
    alpha: float
    big: float
    nested: dict[str, Any]


async def _ship(job: Order, ctx: pipeline.JobContext) -> dict[str, Any]:
    return {"shipped": job.zeta, "weight": job.alpha, "big": job.big, "tags": job.nested["tags"]}


ORDERS = [
    Order("ord-1", 2.5, 1e16, {"tags": ["ünïcode", "€"], "b": 1, "a": 2}),
    Order("ord-2 with a NUL \x00 inside", -0.0, 1e-7, {"tags": ["x\x00y"], "b": None, "a": [1.0, 10]}),
]


async def test_payloads_and_results_are_read_with_the_jsonb_cast_and_their_text_round_trips_exactly(tmp_path: Path) -> None:
    """docs/backends.md: payload and result are text, the JSON the engine wrote, read back byte for byte (field
    order, 1e+16 and -0.0 as written, NUL escaped), which jsonb would not keep (it sorts keys, writes 1e16 as an
    integer and -0.0 as 0.0, and refuses \\u0000); an operator reads them with ``payload::jsonb ->> 'field'``,
    leaving out the rows holding a NUL, which the cast refuses."""
    reg = pipeline.Registry()
    reg.register("ship", Order, _ship)
    async with postgres_store(tmp_path) as config, pipeline.open_pipeline(config, reg) as service:
        ids = [await service.enqueue(order) for order in ORDERS]
        for job_id in ids:
            await wait_status(service, job_id, "completed", timeout=20)
        for job_id, order in zip(ids, ORDERS):
            record = await service.backend.get(job_id)
            assert record is not None
            assert record.payload == reg.encode(order)[1]  # the text written, byte for byte
            assert reg.decode("ship", record.payload) == order  # the NUL, -0.0's sign, the field types
            assert record.result == service.encode_result(await _ship(order, None))  # type: ignore[arg-type]
        first = await service.backend.get(ids[0])
        assert first is not None and first.payload.index('"zeta"') < first.payload.index('"alpha"')
        assert '"big":1e+16' in first.payload and '"alpha":-0.0' in (await service.backend.get(ids[1])).payload  # type: ignore[union-attr]

        def as_an_operator() -> tuple[list[tuple[Any, ...]], str]:
            with psycopg.connect(config.database_url) as conn:
                read = conn.execute(
                    r"SELECT payload::jsonb ->> 'zeta', payload::jsonb -> 'nested' -> 'tags' ->> 0, "
                    r"       result::jsonb ->> 'shipped', (result::jsonb ->> 'weight')::float8 "
                    r"  FROM jobs WHERE job_type = 'ship' AND payload NOT LIKE '%\\u0000%' AND result NOT LIKE '%\\u0000%'"
                ).fetchall()
                with pytest.raises(psycopg.errors.UntranslatableCharacter) as refused:
                    conn.execute("SELECT payload::jsonb FROM jobs WHERE id = %s", (ids[1],)).fetchall()
            return read, str(refused.value)

        read, refused = await trio.to_thread.run_sync(as_an_operator)
        assert read == [("ord-1", "ünïcode", "ord-1", 2.5)]
        assert "\\u0000 cannot be converted to text" in refused


def test_the_admin_only_service_and_the_cli_name_their_sessions_too(tmp_path: Path) -> None:
    """`python -m pipeline` with WORKER_ENABLED=false (the admin API alone) and a CLI command, real processes,
    each caught at its start waiting for the migrations' lock the test holds: pipeline-admin, pipeline-cli."""
    with _database_of_its_own() as url, psycopg.connect(url, autocommit=True, application_name="test-observer") as observer:
        env = service_env(url, WORKER_ENABLED="false", PYTHONPATH=f"{ROOT}:{Path(__file__).parent}")
        holder = psycopg.connect(url, application_name="test-holder")
        holder.execute("SELECT pg_advisory_xact_lock(hashtext('pipeline migrations ' || current_schema()))")
        admin = subprocess.Popen([sys.executable, "-m", "pipeline", "--app", "jobkit:registry"], env=env, cwd=tmp_path,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        cli = subprocess.Popen([sys.executable, "-m", "pipeline", "--app", "jobkit:registry", "jobs", "list"], env=env,
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            want = {"pipeline-admin", "pipeline-cli", "test-holder"}
            deadline = time.monotonic() + 30
            while True:  # each session shows first with its own set-up query, then waits for the lock
                sessions = _wait_sessions(observer, want)
                waiting = {name for name, query in sessions if "pg_advisory_xact_lock" in query}
                if {"pipeline-admin", "pipeline-cli"} <= waiting or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert {"pipeline-admin", "pipeline-cli"} <= waiting, sessions
            assert {name for name, _ in sessions} == want, sessions
            holder.rollback()  # the lock goes: both start
            out, err = cli.communicate(timeout=60)
            assert cli.returncode == 0, err
        finally:
            holder.close()
            for proc in (admin, cli):
                proc.send_signal(signal.SIGTERM)
                proc.communicate(timeout=30)
