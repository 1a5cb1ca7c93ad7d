"""A store made before unique keys (SQLite at version 8, Postgres at version 1) is upgraded in
place when a new pipeline opens it: its jobs keep running, without a key, and keys work."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from unittest import mock

import psycopg

from pipeline import Config
from pipeline.backends import open_backend
from pipeline.backends.postgres import schema
from pipeline.backends.sqlite import migrations

from .kit import claim_one, job, settle_one, succeed
from .stores import postgres_store, sqlite_store


async def _keys_work_on(config: Config) -> None:
    async with open_backend(config) as backend:
        (old,) = (await backend.list())[0]
        assert (old.status, old.unique_key) == ("pending", None)
        keyed, twin = job(unique_key="k"), job(unique_key="k")
        assert await backend.insert([keyed, twin]) == [keyed.id, keyed.id]
        assert (await claim_one(backend)).id == old.id  # the old job runs as before
        assert await settle_one(backend, succeed(await claim_one(backend)))
        assert await backend.insert([twin]) == [twin.id]


async def test_a_sqlite_file_of_version_8_is_upgraded(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path) as config:
        path = config.database_url.removeprefix("sqlite:///")
        conn = sqlite3.connect(path, isolation_level=None)
        with mock.patch.object(migrations, "MIGRATIONS", [m for m in migrations.MIGRATIONS if m[0] <= 8]):
            migrations.migrate(conn)
        assert "unique_key" not in {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
        conn.execute("INSERT INTO jobs (id, job_type, payload, run_after) VALUES ('00000000-0000-7000-8000-000000000000', 't', '{}', "
                     "'2000-01-01T00:00:00.000Z')")
        conn.close()
        await _keys_work_on(config)


async def test_a_postgres_schema_of_version_1_is_upgraded(tmp_path: Path) -> None:
    async with postgres_store(tmp_path) as config:
        with psycopg.connect(config.database_url, autocommit=True) as conn:
            with mock.patch.object(schema, "MIGRATIONS", schema.MIGRATIONS[:1]), mock.patch.object(schema, "LATEST", 1):
                assert schema.migrate(conn, "test") == [1]
            conn.execute("INSERT INTO jobs (id, job_type, payload, run_after) VALUES "
                         "('00000000-0000-7000-8000-000000000000', 't', '{}', '2000-01-01T00:00:00Z')")
        await _keys_work_on(config)
