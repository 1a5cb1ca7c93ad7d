"""The SQLite file is the one named at open, for every connection and for the WAL watch, however
it is named: through a symlink, or by a path relative to a working folder the application later
leaves (issue 21, item 13). Real files, links and os.chdir; the second process is another connection."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest
import trio
from conftest import fast_config
from jobkit import Echo, registry, wait_status

import pipeline


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the WAL watch uses Linux's inotify")
async def test_through_a_symlink_the_wal_watch_sees_other_processes_commits(tmp_path: Path) -> None:
    """SQLite writes the -wal beside the link's target. Before: the watch looked for it beside
    the link, could not be set, and a job committed elsewhere waited for the poll (here a minute)."""
    (tmp_path / "data").mkdir()
    target = tmp_path / "data" / "jobs.db"
    link = tmp_path / "jobs.db"
    link.symlink_to(target)
    config = fast_config(link, worker_poll_interval_ms=60_000, worker_lease_seconds=60.0)
    async with pipeline.open_pipeline(config, registry()) as p:
        assert target.exists() and link.is_symlink()
        await trio.sleep(0.3)  # the Poller's first claim is done; it now waits for the interval
        for _ in range(3):
            await trio.sleep(0.1)  # the Ledger is quiet
            conn = sqlite3.connect(link, isolation_level=None)  # another program, through the link too
            conn.execute("BEGIN IMMEDIATE")
            job_id = pipeline.enqueue_in_transaction(conn, Echo("through the link"), registry=registry())
            conn.execute("COMMIT")
            conn.close()
            committed = trio.current_time()
            await wait_status(p, job_id, "completed", timeout=5.0)
            waited = trio.current_time() - committed
            assert waited < 2.0, f"a job committed through the link waited {waited:.2f} s (the poll is a minute)"


async def test_a_relative_path_names_the_same_file_after_the_application_changes_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DATABASE_URL=sqlite:///jobs.db, then the embedding application calls os.chdir. Before:
    connections opened afterwards (the readers, the bulk load's) opened jobs.db in the new
    folder, created and migrated it: the bulk load's 100 jobs went there, acknowledged, and
    reads of the pipeline's own jobs found nothing."""
    first, second = tmp_path / "app", tmp_path / "elsewhere"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    config = fast_config(Path("jobs.db"))
    async with pipeline.open_pipeline(config, registry()) as p:
        before = await p.enqueue(Echo("before the chdir"))
        await wait_status(p, before, "completed")
        monkeypatch.chdir(second)
        rows = [p.new_job(Echo(f"bulk {i}")) for i in range(100)]
        assert await p.backend.bulk_insert(rows) == 100
        for row in rows[::9]:  # read on the pooled connections, new ones among them; run by the workers
            await wait_status(p, row.id, "completed")
        records, total = await p.backend.list(status="completed", limit=200)
        assert total == 101
    assert not (second / "jobs.db").exists(), "a second database was created in the new working folder"
    conn = sqlite3.connect(first / "jobs.db")
    assert conn.execute("SELECT count(*) FROM jobs WHERE status = 'completed'").fetchone() == (101,)
    conn.close()
