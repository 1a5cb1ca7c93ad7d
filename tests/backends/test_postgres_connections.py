"""The Postgres backend's connections as an embedding application meets them: a process with
many files open, operators' reads that take their time, a database whose session defaults
are not the ones the code reads times with."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import attrs
import psycopg
import pytest
import trio
from conftest import missing

import pipeline
from pipeline import Config
from pipeline.backends import open_backend

from .kit import claim_one, job
from .stores import BACKENDS, postgres_store

pytestmark = pytest.mark.skipif("postgres" not in BACKENDS, reason="no postgres entry")


@attrs.frozen
class Note:
    n: int


@asynccontextmanager
async def running(config: Config) -> AsyncIterator[tuple[pipeline.Pipeline, list[int]]]:
    """A pipeline whose one job type records the notes it ran."""
    ran: list[int] = []

    async def record(note: Note, ctx: pipeline.JobContext) -> None:
        ran.append(note.n)

    registry = pipeline.Registry()
    registry.register("note", Note, record, concurrency=2)
    async with pipeline.open_pipeline(config, registry) as p:
        yield p, ran


async def until(check, what: str, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    with trio.fail_after(timeout):
        while not await check():
            await trio.sleep(0.02)


@contextmanager
def files_open(n: int) -> Iterator[None]:
    """``n`` more descriptors open in this process (the soft limit raised for them if need be,
    and put back after), so that every socket opened meanwhile is numbered above them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = n + 512
    if soft != resource.RLIM_INFINITY and soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            missing(f"the hard limit on open files ({hard}) is below {wanted} (ulimit -Hn {wanted})")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    fds = []
    try:
        for _ in range(n):
            fds.append(os.open(os.devnull, os.O_RDONLY))
        yield
    finally:
        for fd in fds:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_process_with_more_than_1024_files_open_enqueues_claims_and_runs_jobs(tmp_path: Path) -> None:
    """select.select refuses a descriptor numbered 1024 or more: the pool's check of a
    connection took each one for dropped ("every pooled connection was dropped; retry later")."""
    async with postgres_store(tmp_path) as config:
        with files_open(1100):
            async with open_backend(config) as backend:
                with backend.database.pool.connection() as conn:  # type: ignore[attr-defined]
                    assert conn.pgconn.socket >= 1024
                row = job()
                assert await backend.insert([row]) == [row.id]
                assert (await claim_one(backend)).id == row.id
                assert (await backend.get(row.id)).status == "running"  # type: ignore[union-attr]
            async with running(config) as (p, ran):  # the pool, the listener, the heartbeat's connection
                job_id = await p.enqueue(Note(1))
                await until(lambda: _status_is(p, job_id, "completed"), "the job ran")
                assert ran == [1]


async def _has_workers(p: pipeline.Pipeline) -> bool:
    return bool(await p.backend.workers())


async def _status_is(p: pipeline.Pipeline, job_id: str, status: str) -> bool:
    found = await p.backend.get(job_id)
    return found is not None and found.status == status


async def test_an_enqueue_commits_at_once_while_operators_reads_hold_every_connection_they_may(tmp_path: Path) -> None:
    """Operators' reads (the admin API, the dashboard, the CLI) once shared the whole pool with
    the Ledger: six slow ones and an enqueue failed after 10 s ("couldn't get a connection").
    Here the reads are slow because another session holds the workers table locked. The worker
    side keeps a connection too: a claim, and /healthz's ping, go on meanwhile."""
    async with postgres_store(tmp_path) as config, open_backend(config) as backend:
        readers_done = 0

        async def read_workers() -> None:
            nonlocal readers_done
            await backend.workers()
            readers_done += 1

        with psycopg.connect(config.database_url) as locker:  # a transaction, held open
            locker.execute("LOCK TABLE workers IN ACCESS EXCLUSIVE MODE")
            async with trio.open_nursery() as tn:
                try:
                    for _ in range(8):  # more than the pool holds
                        tn.start_soon(read_workers)
                    await until(lambda: _waiting_on_locks(config, at_least=4), "the reads wait on the lock")
                    t0 = time.monotonic()
                    row = job()
                    with trio.move_on_after(8):
                        assert await backend.insert([row]) == [row.id]
                    took = time.monotonic() - t0
                    assert took < 2.0, f"an enqueue took {took:.1f} s while operators' reads waited"
                    t0 = time.monotonic()
                    with trio.move_on_after(8):
                        (lease,) = await backend.claim({row.job_type: 1}, owner="o", lease_seconds=30)
                        await backend.ping()
                    took = time.monotonic() - t0
                    assert took < 2.0, f"a claim and a ping took {took:.1f} s while operators' reads waited"
                    assert lease.id == row.id and readers_done == 0
                finally:
                    locker.rollback()  # the reads go on (else the nursery would wait for them for ever)
        assert readers_done == 8
        assert (await backend.get(row.id)).status == "running"  # type: ignore[union-attr]


async def _waiting_on_locks(config: Config, *, at_least: int) -> bool:
    def count() -> int:
        with psycopg.connect(config.database_url, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                               "AND wait_event_type = 'Lock'").fetchone()
        return int(row[0]) if row else 0

    return await trio.to_thread.run_sync(count) >= at_least


async def test_a_database_whose_datestyle_is_not_iso_reads_and_runs_jobs(tmp_path: Path) -> None:
    """Times are read back as Postgres's ISO text; a role, a database or a URL that sets another
    DateStyle (SQL, German, Postgres) made every read fail ("timestamp '01/12/2026 …' is not in
    UTC"). The URL's options set it here, beside the test's search_path; and another time zone."""
    async with postgres_store(tmp_path) as config:
        url = config.database_url + "%20-cdatestyle%3DSQL%2CDMY%20-ctimezone%3DAsia%2FKolkata%20-cintervalstyle%3Dsql_standard"
        with psycopg.connect(url, autocommit=True) as conn:  # the URL sets them, as a role's settings would
            assert conn.execute("SHOW datestyle").fetchone() == ("SQL, DMY",)
        config = config.replace(database_url=url)
        async with running(config) as (p, ran):
            job_id = await p.enqueue(Note(7))
            await until(lambda: _status_is(p, job_id, "completed"), "the job ran")
            found = await p.backend.get(job_id)
            assert found is not None and found.created_at.endswith("Z") and found.created_at[4] == "-"
            listed, total = await p.backend.list()
            assert total == 1 and listed[0].updated_at == found.updated_at
            stats = await p.backend.stats()
            assert stats["by_status"]["completed"] == 1 and stats["now"].endswith("Z")
            assert sum(minute["completed"] for minute in stats["finished_per_minute"]) == 1
            # (the process's row is written by its heartbeat, which a loaded machine can run after the job)
            await until(lambda: _has_workers(p), "the process's heartbeat wrote its row")
            (worker,) = await p.backend.workers()
            assert worker.alive and worker.heartbeat_at.endswith("Z")
            assert ran == [7]
