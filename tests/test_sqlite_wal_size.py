"""The WAL shrinks back once nothing holds checkpoints back, its size is in /metrics, and
/healthz says while a reader holds them back (issue 21, item 14). A real reader: another
connection with a read transaction open, as a backup or a sqlite3 shell keeps one."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import httpx
import pytest
import trio
from conftest import fast_config
from jobkit import Echo, registry, wait_status
from prometheus_client.parser import text_string_to_metric_families

import pipeline
from pipeline import sqlite_files
from pipeline.admin import run_admin_server
from pipeline.backends.sqlite import checkpoints

LIMIT = 256 * 1024  # the WAL's size limit, scaled down from 64 MiB (journal_size_limit, and the health threshold)


def wal_bytes(db_path: Path) -> int:
    return os.path.getsize(f"{db_path}-wal")


async def run_jobs(p: pipeline.Pipeline, n: int) -> None:
    ids = await p.enqueue_many([Echo(f"row {i} " + "x" * 200) for i in range(n)])
    await wait_status(p, ids[-1], "completed")


async def test_a_reader_holding_checkpoints_back_is_reported_and_the_wal_shrinks_once_it_ends(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: no journal_size_limit (the WAL kept its largest size for ever), no WAL size in
    /metrics, and /healthz answered 200 while the WAL grew."""
    monkeypatch.setattr(sqlite_files, "WAL_SIZE_LIMIT", LIMIT)
    monkeypatch.setattr(checkpoints, "CHECK_EVERY", 0.1, raising=False)
    config = fast_config(db_path, worker_concurrency=50, admin_port=0)
    async with pipeline.open_pipeline(config, registry()) as p, trio.open_nursery() as tn:
        stop = trio.Event()
        url = await tn.start(run_admin_server, p, None, stop.wait)
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            await run_jobs(p, 50)
            assert (await client.get("/healthz")).status_code == 200
            reader = sqlite3.connect(db_path, isolation_level=None)  # a backup, a sqlite3 shell
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM jobs").fetchone()  # its snapshot: checkpoints stop there
            with trio.fail_after(20):
                while True:  # jobs keep running: the WAL grows past the limit, and on
                    await run_jobs(p, 200)
                    answer = await client.get("/healthz")
                    if answer.status_code == 503:
                        break
            grown = wal_bytes(db_path)
            assert grown > LIMIT
            message = answer.json()["error"]["message"]
            assert "WAL" in message and "read transaction" in message, message
            families = {f.name: f for f in text_string_to_metric_families((await client.get("/metrics")).text)}
            gauge = families["pipeline_sqlite_wal_bytes"]
            assert gauge.type == "gauge" and gauge.samples[0].value > LIMIT

            reader.execute("COMMIT")
            reader.close()
            with trio.fail_after(20):  # a checkpoint copies everything back; the next commit truncates the WAL
                while wal_bytes(db_path) > LIMIT or (await client.get("/healthz")).status_code != 200:
                    await run_jobs(p, 20)
            assert wal_bytes(db_path) <= LIMIT < grown
        stop.set()


async def test_every_connection_limits_the_wal_size(db_path: Path) -> None:
    """journal_size_limit on the connections of the backend (the Ledger's and the readers',
    the renewer's and the bulk loads' open the same way)."""
    async with pipeline.open_pipeline(fast_config(db_path, worker_enabled=False), registry()) as p:
        limits = await p.backend.database.read(lambda conn: conn.execute("PRAGMA journal_size_limit").fetchone()[0])
        assert limits == sqlite_files.WAL_SIZE_LIMIT == 64 * 2**20
        ledger = await p.backend.database.write(lambda conn: conn.execute("PRAGMA journal_size_limit").fetchone()[0])
        assert ledger == 64 * 2**20
