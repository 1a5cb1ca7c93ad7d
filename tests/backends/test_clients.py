"""Producers without trio (issue 22, item 4): ``pipeline.Client`` from threads and
``pipeline.AsyncClient`` from asyncio and trio, on every store. Each call has committed when it
returns, a service on the same store starts the job within milliseconds (a minute-long poll would
not), bad input raises before anything is written, and many callers at once lose nothing."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import attrs
import pytest
import trio
from jobkit import Echo, KeyedWork, Tick, registry, wait_status

import pipeline
from pipeline import Config

from .stores import POSTGRES_URL, postgres_store, redis_store

LONG_POLL_MS = 60_000  # the service would find a job by its poll only after a minute


def _quiet(config: Config) -> Config:
    return config.replace(worker=attrs.evolve(config.worker, poll_interval_ms=LONG_POLL_MS))


async def test_a_sync_client_enqueues_from_threads_and_the_service_starts_it_at_once(store_config: Config) -> None:
    reg = registry()
    async with pipeline.open_pipeline(_quiet(store_config), reg) as service:
        client = await trio.to_thread.run_sync(lambda: pipeline.Client(store_config.database_url, registry=reg,
                                                                        config=store_config))
        try:
            await trio.sleep(0.3)  # the service idle, its listener waiting
            started = time.monotonic()
            job_id = await trio.to_thread.run_sync(client.enqueue, Echo("from a thread"))
            await wait_status(service, job_id, "completed", timeout=5)
            assert time.monotonic() - started < 3, "the service found the job by its poll, not by a wake-up"
            record = await trio.to_thread.run_sync(client.get, job_id)
            assert record is not None and record.status == "completed" and record.attempts == 1
            assert await trio.to_thread.run_sync(client.get, "no-such-id") is None
        finally:
            await trio.to_thread.run_sync(client.close)


async def test_many_threads_at_once_lose_nothing_and_keys_and_routes_hold(store_config: Config) -> None:
    reg = registry()

    def work() -> tuple[list[str], list[str], list[str], str]:
        with pipeline.Client(registry=reg, config=store_config) as client:
            ids: list[str] = []
            lock = threading.Lock()

            def enqueue_20(n: int) -> None:
                mine = [client.enqueue(Tick(n * 100 + i), delay=3600) for i in range(20)]
                with lock:
                    ids.extend(mine)

            threads = [threading.Thread(target=enqueue_20, args=(n,)) for n in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            many = client.enqueue_many([Tick(1), Tick(2)], priority=0)
            keyed = [client.enqueue(Tick(9), unique_key="k", delay=3600) for _ in range(3)]
            routed = client.emit(KeyedWork("k"))  # routes to one Tick under the key "k": held already
            return ids, many, keyed, routed[0]

    ids, many, keyed, routed = await trio.to_thread.run_sync(work)
    assert len(set(ids)) == 160
    assert len(set(keyed)) == 1 and routed == keyed[0]
    async with pipeline.backends.open_backend(store_config) as backend:
        for job_id in [*ids, *many, keyed[0]]:
            found = await backend.get(job_id)
            assert found is not None and found.status == "pending"
        assert (await backend.get(many[0])).priority == 0  # type: ignore[union-attr]
        stats = await backend.stats()
        assert stats["by_status"]["pending"] == 160 + 2 + 1


async def test_bad_input_raises_before_anything_is_written(store_config: Config) -> None:
    reg = registry()

    def misuse() -> list[str]:
        with pipeline.Client(registry=reg, config=store_config) as client:
            errors = []
            for call in (lambda: client.enqueue(object()), lambda: client.enqueue(Echo("x"), priority="high"),
                         lambda: client.enqueue(Echo("x"), delay=-1), lambda: client.enqueue(Echo("x"), delay=5, run_after=0),
                         lambda: client.enqueue_many([Tick(1), "not a job"]), lambda: client.enqueue(Tick(1), unique_key="")):
                with pytest.raises(pipeline.PipelineError) as caught:
                    call()
                errors.append(str(caught.value))
            client.close()
            with pytest.raises(pipeline.PipelineClosed, match="closed"):
                client.enqueue(Tick(1))
            return errors

    errors = await trio.to_thread.run_sync(misuse)
    assert "object" in errors[0] and "priority" in errors[1] and "delay" in errors[2] and "not both" in errors[3]
    async with pipeline.backends.open_backend(store_config) as backend:
        assert sum((await backend.stats())["by_status"].values()) == 0


async def test_an_asyncio_app_enqueues_from_100_tasks_and_each_call_has_committed(store_config: Config) -> None:
    reg = registry()

    async def app() -> list[str]:
        async with pipeline.AsyncClient(registry=reg, config=store_config) as client:
            ids = await asyncio.gather(*(client.enqueue(Tick(n), delay=3600) for n in range(100)))
            record = await client.get(ids[0])
            assert record is not None and record.status == "pending"
            with pytest.raises(pipeline.UnknownJobType):
                await client.enqueue(object())
            return list(ids)

    ids = await trio.to_thread.run_sync(lambda: asyncio.run(app()))
    assert len(set(ids)) == 100
    async with pipeline.backends.open_backend(store_config) as backend:
        assert (await backend.stats())["by_status"]["pending"] == 100


async def test_the_async_client_runs_under_trio_too(store_config: Config) -> None:
    reg = registry()
    async with pipeline.open_pipeline(_quiet(store_config), reg) as service:
        async with pipeline.AsyncClient(registry=reg, config=store_config) as client:
            await trio.sleep(0.3)
            results: list[str] = []

            async def one(n: int) -> None:
                results.append(await client.enqueue(Echo(f"trio {n}")))

            async with trio.open_nursery() as nursery:
                for n in range(20):
                    nursery.start_soon(one, n)
            for job_id in results:
                await wait_status(service, job_id, "completed", timeout=5)


def test_a_client_on_a_store_that_cannot_open_says_why(tmp_path: object) -> None:
    with pytest.raises(pipeline.ConfigError, match="DATABASE_URL"):
        pipeline.Client("mysql://nowhere/db", registry=registry())
    with pytest.raises(pipeline.PipelineError, match="missing-folder"):
        pipeline.Client(f"sqlite:///{tmp_path}/missing-folder/x.db", registry=registry())


# -- in the caller's transaction (issue 22, item 5) ---------------------------------------------------


async def _enqueue_in_a_transaction_then(service: pipeline.Pipeline, client: pipeline.Client, connect: object,
                                         begin: object) -> None:
    """Rolled back: no job. Committed: the service runs it by its wake-up (a minute-long poll)."""

    def rolled_back() -> str:
        conn = connect()  # type: ignore[operator]
        try:
            begin(conn)  # type: ignore[operator]
            job_id = client.enqueue(Echo("rolled back"), connection=conn)
            conn.rollback()
            return job_id
        finally:
            conn.close()

    def committed() -> list[str]:
        conn = connect()  # type: ignore[operator]
        try:
            begin(conn)  # type: ignore[operator]
            ids = [client.enqueue(Echo("committed"), connection=conn),
                   *client.enqueue_many([Echo("a"), Tick(1)], unique_keys=[None, "k"], connection=conn),
                   client.enqueue(Tick(2), unique_key="k", connection=conn)]  # the key is held in this transaction
            assert ids[2] == ids[3]
            assert client.get(ids[0]) is None  # not committed yet: invisible to the store's own connections
            conn.commit()
            return ids
        finally:
            conn.close()

    gone = await trio.to_thread.run_sync(rolled_back)
    await trio.sleep(0.3)
    started = time.monotonic()
    ids = await trio.to_thread.run_sync(committed)
    await wait_status(service, ids[0], "completed", timeout=5)
    assert time.monotonic() - started < 3, "the service found the committed job by its poll, not by a wake-up"
    assert await service.backend.get(gone) is None


async def test_a_sqlite_transaction_rolled_back_leaves_no_job_and_a_committed_one_runs(config: Config) -> None:
    import sqlite3

    reg = registry()
    async with pipeline.open_pipeline(_quiet(config), reg) as service:
        client = await trio.to_thread.run_sync(lambda: pipeline.Client(registry=reg, config=config))
        try:
            await _enqueue_in_a_transaction_then(service, client, lambda: sqlite3.connect(config.database_path),
                                                 lambda conn: conn.execute("BEGIN IMMEDIATE"))

            def misuse() -> list[str]:
                errors = []
                other = sqlite3.connect(config.database_path.parent / "other.db")
                autocommit = sqlite3.connect(config.database_path, isolation_level=None)
                for conn in (other, autocommit, object()):
                    with pytest.raises(pipeline.UsageError) as caught:
                        client.enqueue(Echo("x"), connection=conn)
                    errors.append(str(caught.value))
                other.close()
                autocommit.close()
                return errors

            errors = await trio.to_thread.run_sync(misuse)
            assert "other.db" in errors[0] and "autocommit" in errors[1] and "object" in errors[2]
        finally:
            await trio.to_thread.run_sync(client.close)


async def test_a_postgres_transaction_rolled_back_leaves_no_job_and_a_committed_one_runs(tmp_path: Path) -> None:
    import psycopg

    reg = registry()
    async with postgres_store(tmp_path) as config, pipeline.open_pipeline(_quiet(config), reg) as service:
        client = await trio.to_thread.run_sync(lambda: pipeline.Client(registry=reg, config=config))
        try:
            await _enqueue_in_a_transaction_then(service, client, lambda: psycopg.connect(config.database_url),
                                                 lambda conn: conn.execute("SELECT 1"))

            def misuse() -> list[str]:
                errors = []
                with psycopg.connect(config.database_url, autocommit=True) as conn:
                    with pytest.raises(pipeline.UsageError) as caught:
                        client.enqueue(Echo("x"), connection=conn)  # autocommit, no transaction: would commit alone
                    errors.append(str(caught.value))
                    with conn.transaction():  # an autocommit connection's own transaction block is one
                        errors.append(client.enqueue(Echo("in a block"), connection=conn))
                with psycopg.connect(POSTGRES_URL) as conn:  # the same server, another schema
                    with pytest.raises(pipeline.UsageError) as caught:
                        client.enqueue(Echo("x"), connection=conn)
                    errors.append(str(caught.value))
                with psycopg.connect(config.database_url) as conn:  # a transaction that failed
                    with pytest.raises(psycopg.errors.DivisionByZero):
                        conn.execute("SELECT 1/0")
                    with pytest.raises(pipeline.UsageError) as caught:
                        client.enqueue(Echo("x"), connection=conn)
                    errors.append(str(caught.value))
                return errors

            errors = await trio.to_thread.run_sync(misuse)
            assert "autocommit" in errors[0] and "schema" in errors[2] and "failed" in errors[3]
            await wait_status(service, errors[1], "completed", timeout=5)
        finally:
            await trio.to_thread.run_sync(client.close)

        async def asyncio_app() -> tuple[str, list[str]]:  # AsyncClient with a psycopg AsyncConnection
            async with pipeline.AsyncClient(registry=reg, config=config) as aclient:
                async with await psycopg.AsyncConnection.connect(config.database_url) as aconn:
                    gone = await aclient.enqueue(Echo("async, rolled back"), connection=aconn)
                    await aconn.rollback()
                    async with aconn.transaction():
                        ids = await aclient.enqueue_many([Echo("async"), Tick(5)], unique_keys=[None, "k2"], connection=aconn)
                        assert await aclient.enqueue(Tick(6), unique_key="k2", connection=aconn) == ids[1]
                    await aconn.set_autocommit(True)
                    with pytest.raises(pipeline.UsageError, match="autocommit"):
                        await aclient.enqueue(Echo("x"), connection=aconn)
                return gone, ids

        started = time.monotonic()
        gone, ids = await trio.to_thread.run_sync(lambda: asyncio.run(asyncio_app()))
        await wait_status(service, ids[0], "completed", timeout=5)
        assert time.monotonic() - started < 4
        assert await service.backend.get(gone) is None


async def test_redis_refuses_to_enqueue_in_a_transaction_saying_why(tmp_path: Path) -> None:
    async with redis_store(tmp_path) as config:
        def misuse() -> str:
            with pipeline.Client(registry=registry(), config=config) as client, pytest.raises(pipeline.UsageError) as caught:
                client.enqueue(Echo("x"), connection=object())
            return str(caught.value)

        assert "Redis" in await trio.to_thread.run_sync(misuse)


# -- a client outliving its callers' loops and processes ------------------------------------------------


def test_a_caller_loop_that_closes_with_a_call_in_flight_leaves_the_client_working(config: Config) -> None:
    reg = registry()

    async def gives_up(client: pipeline.AsyncClient) -> None:
        call = asyncio.ensure_future(client.enqueue(Tick(1)))
        await asyncio.sleep(0)  # the call is on its way to the client's loop
        call.cancel()  # and its caller's loop closes before the answer comes

    async def later(client: pipeline.AsyncClient) -> str:
        return await client.enqueue(Tick(2))

    client = pipeline.AsyncClient(registry=reg, config=config)
    asyncio.run(client.open())
    for _ in range(5):
        asyncio.run(gives_up(client))
    time.sleep(0.2)  # the answers arrive at closed loops
    assert asyncio.run(later(client))
    asyncio.run(client.close())


def test_a_client_made_before_fork_works_in_the_child(config: Config) -> None:
    import os

    reg = registry()
    with pipeline.Client(registry=reg, config=config) as client:
        parent_id = client.enqueue(Tick(1))
        pid = os.fork()
        if pid == 0:  # the child: gunicorn --preload, a prefork worker
            code = 1
            try:
                signal_alarm = __import__("signal")
                signal_alarm.alarm(20)
                child_id = client.enqueue(Tick(2))
                code = 0 if client.get(child_id) is not None and client.get(parent_id) is not None else 2
                client.close()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        assert client.enqueue(Tick(3))  # the parent's loop is untouched
