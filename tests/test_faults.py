"""Faults from outside: a full disk, another process holding the write lock."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
from conftest import fast_config
from jobkit import Echo, registry, wait_status

import pipeline


async def test_a_full_disk_refuses_enqueue_clearly_and_recovers(db_path: Path) -> None:
    config = fast_config(db_path, worker_enabled=False)
    async with pipeline.open_pipeline(config, registry()) as p:
        kept = await p.enqueue_many([Echo(f"before-{i}") for i in range(50)])

        def cap(conn, pages: int | None) -> int:
            (count,) = conn.execute("PRAGMA page_count").fetchone()
            conn.execute(f"PRAGMA max_page_count = {count + 2 if pages is None else pages}")
            return count

        # the Ledger's own connection: no room for more than a couple of pages
        await p.backend.database.write(cap, None)
        with pytest.raises(pipeline.StoreError, match=r"database .*pipeline\.db is full"):
            for _ in range(100):  # each batch needs new pages sooner or later
                await p.enqueue_many([Echo("x" * 2000) for _ in range(20)])
        stats = await p.backend.stats()
        assert stats["by_status"]["pending"] >= 50  # what was committed is still there

        await p.backend.database.write(cap, 1_073_741_823)  # room returns
        after = await p.enqueue(Echo("after"))
        for job_id in [*kept, after]:
            assert (await p.backend.get(job_id)).status == "pending"

    # and the jobs run once workers start again: nothing committed was lost
    async with pipeline.open_pipeline(fast_config(db_path), registry()) as p:
        for job_id in [*kept, after]:
            await wait_status(p, job_id, "completed")


HOLD_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


@pytest.mark.slow
async def test_another_process_holding_the_write_lock_for_5_s(db_path: Path) -> None:
    config = fast_config(db_path, sqlite_busy_timeout_ms=1000)
    async with pipeline.open_pipeline(config, registry(concurrency=8)) as p:
        first = await p.enqueue_many([Echo(str(i), sleep=0.01) for i in range(200)])
        holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(db_path), "5"], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "locked"
            started = time.monotonic()
            during = await p.enqueue_many([Echo(f"during-{i}") for i in range(50)])  # waits, then commits
            assert time.monotonic() - started > 3.5
        finally:
            holder.wait(20)
        for job_id in [*first, *during]:
            job = await wait_status(p, job_id, "completed", timeout=30)
            assert job.attempts == 1, f"{job_id} ran {job.attempts} times"


async def test_cancelling_the_scope_around_the_pipeline_never_hangs(db_path: Path) -> None:
    """The caller's own scope is cancelled (a sibling task crashed, Ctrl-C in the host app)
    while the Poller waits, shielded, for a claim the Ledger cannot write yet."""
    import threading

    def hold_lock(seconds: float, held: threading.Event) -> None:
        conn = sqlite3.connect(db_path, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        held.set()
        time.sleep(seconds)
        conn.execute("COMMIT")
        conn.close()

    config = fast_config(db_path, sqlite_busy_timeout_ms=100)
    started = trio.current_time()
    with trio.fail_after(10):  # the test's own bound: a hang fails here
        with trio.move_on_after(1.0):
            async with pipeline.open_pipeline(config, registry()) as p:
                await p.enqueue(Echo("x"))
                held = threading.Event()
                threading.Thread(target=hold_lock, args=(1.5, held), daemon=True).start()
                await trio.to_thread.run_sync(held.wait)
                await trio.sleep_forever()
    assert trio.current_time() - started < 5
