"""Liveness promises end to end, each shaped so that it fails when the promise breaks:
pickup without a poll, outcomes the database refused for a while, a wedged event loop,
and a worker that lost its lease (issue 11, "tests that would have caught breakage")."""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path

import httpx
import pytest
import trio
from conftest import fast_config
from jobkit import Echo, registry, wait_file_line, wait_status
from prometheus_client.parser import text_string_to_metric_families

import pipeline
from pipeline.admin import run_admin_server
from pipeline.backends.sqlite import store
from pipeline.clock import now_ts, to_epoch

LONG_POLL_MS = 60_000  # a poll this long never happens during a test: only a wake-up can start the job
QUICK = 5.0  # seconds: "at once", generously, against the minute of the poll


# -- same-process pickup ---------------------------------------------------------------------


async def test_a_job_enqueued_here_starts_without_waiting_for_a_poll(db_path: Path) -> None:
    """The Ledger hands the new job to the waiting Poller (its standing offer, or a nudge)
    in the insert's own commit; nothing waits for WORKER_POLL_INTERVAL_MS."""
    starts: list[str] = []
    started = trio.Event()
    revived_ran = trio.Event()
    runs: dict[str, int] = {}

    async def run(job: Echo, ctx: pipeline.JobContext) -> None:
        runs[job.text] = runs.get(job.text, 0) + 1
        starts.append(job.text)
        started.set()
        if job.mode == "permanent" and runs[job.text] == 1:
            raise pipeline.PermanentError("dead on its first run, to be revived")
        if job.mode == "permanent":
            revived_ran.set()
        await trio.sleep(job.sleep)

    reg = pipeline.site.types_registry()
    reg.register("echo", Echo, run, concurrency=2)
    config = fast_config(db_path, worker_poll_interval_ms=LONG_POLL_MS)
    async with pipeline.open_pipeline(config, reg) as p:
        # one at a time, each once the previous one is done: the Poller is idle, waiting
        for i in range(3):
            started = trio.Event()
            with trio.fail_after(QUICK):
                job_id = await p.enqueue(Echo(f"single-{i}"))
                await started.wait()
                await wait_status(p, job_id, "completed")

        # a burst three times the pools' room (2 workers + 2 claimed ahead): a pool full of
        # claimed jobs asks for more as soon as a worker is free
        with trio.fail_after(QUICK):
            ids = await p.enqueue_many([Echo(f"burst-{i}", sleep=0.05) for i in range(12)])
            for job_id in ids:
                await wait_status(p, job_id, "completed")

        # a dead job revived by an operator runs again at once
        dead = await p.enqueue(Echo("revived", mode="permanent"))
        await wait_status(p, dead, "dead", timeout=QUICK)
        with trio.fail_after(QUICK):
            await p.backend.revive(dead)
            await revived_ran.wait()
            await wait_status(p, dead, "completed")
    assert sorted(starts) == sorted([f"single-{i}" for i in range(3)] + [f"burst-{i}" for i in range(12)] + ["revived"] * 2)


async def test_a_job_enqueued_here_is_claimed_in_its_inserts_own_transaction(db_path: Path) -> None:
    """The Poller's standing offer: the Ledger claims for it in the transaction that inserts,
    so a job costs two commits (insert with claim, outcome), not three (a nudged claim)."""
    config = fast_config(db_path, worker_poll_interval_ms=LONG_POLL_MS, worker_lease_seconds=60.0)  # no upkeep meanwhile
    async with pipeline.open_pipeline(config, registry()) as p:
        warm_up = await p.enqueue(Echo("warm-up"))
        await wait_status(p, warm_up, "completed", timeout=QUICK)
        before = p.backend.ledger_stats.batches
        for i in range(20):  # one at a time: nothing else shares their transactions
            job_id = await p.enqueue(Echo(str(i)))
            await wait_status(p, job_id, "completed", timeout=QUICK)
        batches = p.backend.ledger_stats.batches - before
    # two per job, and a few more where a loaded machine's Poller had not sent its offer back in time (a
    # fresh-clone run under load met 43); without the claim in the insert's transaction it is three per job: 60
    assert batches <= 2 * 20 + 5, f"{batches} transactions for 20 jobs: claims were not made with the inserts"


# -- outcomes the database refused for a while ----------------------------------------------


# Both refuse one thing: the outcome (status → completed). ROLLBACK undoes the Ledger's whole
# transaction (as SQLITE_FULL or an I/O error at commit can); ABORT undoes only the statement,
# so the Ledger writes the batch's outcomes one by one and this one still fails alone.
REFUSE = """
CREATE TRIGGER refuse_outcomes BEFORE UPDATE OF status ON jobs WHEN NEW.status = 'completed'
BEGIN SELECT RAISE({how}, 'the disk refused the outcome'); END
"""


@pytest.mark.parametrize("how", ["ROLLBACK", "ABORT"])
async def test_an_outcome_the_database_refused_for_a_while_is_retried_by_its_worker(db_path: Path, how: str) -> None:
    runs = 0
    finished = trio.Event()

    async def run(job: Echo, ctx: pipeline.JobContext) -> None:
        nonlocal runs
        runs += 1
        finished.set()

    reg = pipeline.site.types_registry()
    reg.register("echo", Echo, run)
    config = fast_config(db_path, worker_lease_seconds=1.0)
    other = sqlite3.connect(db_path, isolation_level=None)  # another process's connection, say an operator's shell
    # and another live process on the file, which would rescue the job if its lease lapsed
    rescuer = pipeline.open_pipeline(fast_config(db_path, worker_lease_seconds=1.0), pipeline.site.types_registry())
    async with pipeline.open_pipeline(config, reg) as p, rescuer:
        other.execute(REFUSE.format(how=how))
        job_id = await p.enqueue(Echo("refused"))
        with trio.fail_after(QUICK):
            await finished.wait()
        # the outcome is refused for a while (longer than the lease, and than the worker's
        # first retries: 0.05 + 0.1 + ... + 0.8 s): the job stays running under this
        # worker's renewed lease meanwhile. Nothing to wait on: the pipeline must keep
        # trying by itself.
        await trio.sleep(1.5)
        job = await p.backend.get(job_id)
        assert (job.status, job.lease_owner) == ("running", p.owner)
        other.execute("DROP TRIGGER refuse_outcomes")
        job = await wait_status(p, job_id, "completed", "pending", "dead", timeout=QUICK)
    other.close()
    assert (job.status, job.attempts, runs) == ("completed", 1, 1), job.error


# -- a wedged event loop -------------------------------------------------------------------------


async def test_a_wedged_process_stops_renewing_and_another_process_runs_its_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler blocks the worker's event loop far past the stall limit (the longest job
    timeout, at least ten leases, plus a lease): the heartbeat thread stops renewing, and
    another process rescues the job and runs it while the wedged one is still stuck."""
    from test_processes import insert_jobs, start_worker

    db_path, log = tmp_path / "jobs.db", tmp_path / "runs.log"
    monkeypatch.setenv("PIPELINE_TEST_LOG", str(log))  # this process's runs are logged too
    lease, timeout, block = 0.3, 0.5, 5.0  # stall limit: max(0.5, 10 × 0.3) + 0.3 = 3.3 s; rescued at 3.6 s
    settings = dict(worker_lease_seconds=lease, worker_job_timeout_seconds=timeout, sqlite_busy_timeout_ms=100)
    wedged = start_worker(db_path, log, *(f"{k}={v}" for k, v in settings.items()))
    try:
        (job_id,) = insert_jobs(db_path, [Echo("wedge", sleep=block, mode="block")])
        first = wait_file_line(log, f"start {job_id} 1 {wedged.pid} ")
        blocked_at = float(first.split()[-1])
        config = fast_config(db_path, sqlite_synchronous="full", **settings)
        async with pipeline.open_pipeline(config, registry()) as rescuer:
            job = await wait_status(rescuer, job_id, "completed", timeout=block + 5)
            assert wedged.poll() is None, "the wedged process died instead"
            assert (job.attempts, job.lease_owner) == (2, None)
            assert "lease expired" in (job.error or "")
            assert to_epoch(job.updated_at) < blocked_at + block, "rescued only once the loop woke up"
            # the wedged run wakes up and finishes: its late outcome changes nothing
            wait_file_line(log, f"end {job_id} 1 {wedged.pid} ", timeout=block + 5)
            await trio.sleep(lease)  # its outcome reaches the Ledger (stale)
            assert (await rescuer.backend.get(job_id)).attempts == 2
        pids = [line.split()[3] for line in log.read_text().splitlines() if line.startswith("start ")]
        assert pids == [str(wedged.pid), str(os.getpid())]
    finally:
        wedged.send_signal(signal.SIGTERM)
        assert wedged.wait(10) == 0


# -- a worker that lost its lease ---------------------------------------------------------------


async def test_a_worker_that_lost_its_lease_cancels_the_run_and_does_not_start_the_next(db_path: Path) -> None:
    """Another process takes over two jobs of this one (their leases ran out while it could
    not renew): the one running here is cancelled, the one claimed ahead never starts, and
    both show as ``lost`` in /metrics; neither touches the other process's rows."""
    events: list[str] = []
    running = trio.Event()

    async def run(job: Echo, ctx: pipeline.JobContext) -> None:
        events.append(f"start {job.text}")
        running.set()
        try:
            await trio.sleep_forever()
        finally:
            events.append(f"stopped {job.text}")

    reg = pipeline.site.types_registry()
    reg.register("echo", Echo, run, concurrency=1)  # and one claimed ahead
    lease = 1.0
    config = fast_config(db_path, worker_lease_seconds=lease, sqlite_busy_timeout_ms=100, admin_port=0,
                         worker_prefetch=1)
    async with pipeline.open_pipeline(config, reg) as p, trio.open_nursery() as tn:
        stop = trio.Event()
        url = await tn.start(run_admin_server, p, None, stop.wait)
        first = await p.enqueue(Echo("first"))
        with trio.fail_after(QUICK):
            await running.wait()
        second = await p.enqueue(Echo("second"))
        with trio.fail_after(QUICK):  # claimed ahead, behind the running one
            while (await p.backend.get(second)).status != "running":
                await trio.sleep(0.01)

        def take_over() -> list[tuple[str, int]]:
            """Another process: holds the write lock (this one's renewals fail) until both
            leases ran out, then rescues them and claims them for itself, in one transaction."""
            conn = store.connect(db_path, busy_timeout_ms=5000)
            try:
                with store.write_transaction(conn):
                    while True:
                        expiries = [e for (e,) in conn.execute(
                            "SELECT lease_expires_at FROM jobs WHERE id IN (?, ?)", (first, second))]
                        if all(e < now_ts() for e in expiries):
                            break
                        time.sleep(0.02)
                    rescued = store.rescue_expired(conn, now=now_ts(), base_seconds=0.0)
                    assert sorted(i for i, _ in rescued) == sorted([first, second])
                    taken = store.claim_leases(conn, now_ts(), wants={"echo": 2}, owner="other", lease_seconds=3600)
                    return [(t.id, t.token) for t in taken]
            finally:
                conn.close()

        taken = dict(await trio.to_thread.run_sync(take_over))
        assert sorted(taken) == sorted([first, second])
        with trio.fail_after(QUICK):  # this process's next renewal learns of it
            while "stopped first" not in events:
                await trio.sleep(0.01)
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            with trio.fail_after(QUICK):
                while True:
                    families = {f.name: f for f in text_string_to_metric_families((await client.get("/metrics")).text)}
                    lost = [s.value for s in families["pipeline_jobs_processed"].samples
                            if s.labels == {"job_type": "echo", "outcome": "lost"}]
                    if lost == [2]:
                        break
                    await trio.sleep(0.02)
        stop.set()
    assert events == ["start first", "stopped first"], "the run was not cancelled, or the second job started"
    conn = sqlite3.connect(db_path)
    rows = dict(conn.execute("SELECT id, status || ' ' || lease_owner || ' ' || lease_token FROM jobs"))
    conn.close()
    assert rows == {job_id: f"running other {token}" for job_id, token in taken.items()}
