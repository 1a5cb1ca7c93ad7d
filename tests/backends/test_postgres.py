"""What only the Postgres backend promises: wake-ups across processes through LISTEN/NOTIFY,
and a drain that survives the server dropping every connection."""

from __future__ import annotations

from urllib.parse import urlsplit

import psycopg
import pytest
import trio

import pipeline
from pipeline import Config
from pipeline.backends import open_backend

from .kit import job
from .stores import BACKENDS, postgres_store

pytestmark = pytest.mark.skipif("postgres" not in BACKENDS, reason="no postgres entry")


def _terminate(config: Config) -> int:
    """pg_terminate_backend on every other session of the pipeline in the store's database; how many.
    (The pipeline's sessions only, named pipeline-<role>: the test run's own, which prepares the next
    tests' schemas in the same database, a migration at a time, would die mid-way.)"""
    database = urlsplit(config.database_url).path.lstrip("/")
    with psycopg.connect(config.database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() "
            "AND application_name LIKE 'pipeline-%%'",
            (database,),
        ).fetchall()
    return len(rows)


async def test_a_drain_survives_the_server_dropping_every_connection(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import attrs

    @attrs.frozen
    class Noop:
        n: int

    async def run(job: Noop, ctx: pipeline.JobContext) -> None:
        await trio.sleep(0.001)

    registry = pipeline.Registry()
    registry.register("noop", Noop, run, concurrency=16)
    n = 3000
    async with postgres_store(tmp_path) as config:
        config = config.replace(worker=attrs.evolve(config.worker, poll_interval_ms=50))
        async with pipeline.open_pipeline(config, registry) as p:
            await p.enqueue_many([Noop(i) for i in range(n)])
            dropped = 0
            with trio.fail_after(60):
                while True:
                    stats = await _stats_patiently(p)
                    if stats["by_status"]["completed"] == n:
                        break
                    if dropped < 5 and stats["by_status"]["completed"] > dropped * n // 6:
                        dropped += 1
                        assert await trio.to_thread.run_sync(_terminate, config) > 0
                    await trio.sleep(0.02)
            assert dropped == 5
            stats = await _stats_patiently(p)
            assert stats["by_status"]["completed"] == n and stats["total"] == n


async def _stats_patiently(p: pipeline.Pipeline) -> dict:  # type: ignore[type-arg]
    while True:
        try:
            return await p.backend.stats()
        except pipeline.StoreError:
            await trio.sleep(0.05)


async def test_a_unique_key_whose_holder_finishes_between_the_insert_and_the_look_up_is_inserted_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """READ COMMITTED: the insert finds the key held, and by the look-up of the holder it has
    finished. A statement trigger stands in for the other process: after the first keyed insert
    (which inserts nothing), it completes the holder, in the insert's own transaction, so the
    look-up finds no holder. The key is then free, and the job must be inserted, not lost."""
    async with postgres_store(tmp_path) as config, open_backend(config) as backend:
        holder = job(unique_key="k")
        assert await backend.insert([holder]) == [holder.id]
        with psycopg.connect(config.database_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE race_once (done boolean NOT NULL)")
            conn.execute("INSERT INTO race_once VALUES (false)")
            conn.execute("""
                CREATE FUNCTION finish_holder() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                  IF (SELECT NOT done FROM race_once) THEN
                    UPDATE race_once SET done = true;
                    UPDATE jobs SET status = 'completed' WHERE unique_key = 'k' AND status = 'pending';
                  END IF;
                  RETURN NULL;
                END $$""")
            conn.execute("CREATE TRIGGER finish_holder AFTER INSERT ON jobs FOR EACH STATEMENT EXECUTE FUNCTION finish_holder()")
        successor = job(unique_key="k")
        assert await backend.insert([successor]) == [successor.id]
        assert (await backend.get(holder.id)).status == "completed"  # type: ignore[union-attr]
        assert (await backend.get(successor.id)).status == "pending"  # type: ignore[union-attr]
