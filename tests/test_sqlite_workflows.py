"""Issue 24's workflows on SQLite alone (the cross-store behaviour is tests/backends/test_workflows.py's):
the migration from schema version 14, the indexes the workflow's statements seek, plain jobs' outcomes
running the statements they ran before (a parent's success its twin and the look for children), a
cancel cascade down a 100-job chain in one transaction, and the Poller of the process whose write woke
a job nudged at once."""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from pathlib import Path

import trio
from conftest import fast_config
from test_sqlite_control import plan, traced

import pipeline
from pipeline.backends import NewJob, Settlement
from pipeline.backends.base import NewBatch, parent_failed
from pipeline.backends.sqlite import migrations, open_sqlite_backend, queries, store, workflows
from pipeline.clock import format_ts
from pipeline.ids import UUID7Factory
from pipeline.sqlite_files import apply_migrations
from pipeline.states import Transition

new_id = UUID7Factory()
LONG = 3600.0


def ts(offset: float = 0.0) -> str:
    return format_ts(time.time() + offset)


def row(job_type: str = "t", *, after: tuple[str, ...] = (), unique_key: str | None = None,
        on_parent_failure: str | None = None, batch_id: str | None = None) -> NewJob:
    return NewJob(new_id(), job_type, '{"n":1}', 3, ts(-60), 5, ts(), unique_key=unique_key, after=after,
                  on_parent_failure=on_parent_failure, batch_id=batch_id)


def fresh(path: Path) -> sqlite3.Connection:
    conn = store.connect(path)
    migrations.migrate(conn, path)
    return conn


def statuses(conn: sqlite3.Connection, ids: list[str]) -> list[tuple[str, str | None, int]]:
    found = {r[0]: r[1:] for r in conn.execute("SELECT id, status, error, waiting_for FROM jobs")}
    return [found[job_id] for job_id in ids]


# -- the migration ------------------------------------------------------------------------------


async def test_a_version_14_file_migrates_and_its_jobs_take_part_in_workflows(tmp_path: Path) -> None:
    path = tmp_path / "v14.db"
    conn = store.connect(path)
    apply_migrations(conn, [m for m in migrations.MIGRATIONS if m[0] <= 14], table=migrations.TABLE,
                     known=migrations.RETIRED)
    assert migrations.current_version(conn) == 14
    conn.execute("INSERT INTO jobs (id, job_type, payload, status, attempts, max_attempts, run_after, created_at, "
                 "updated_at, unique_key, lease_token, lease_owner, lease_expires_at, started_at) VALUES "
                 "('old-pending', 't', '{}', 'pending', 0, 3, '2020-01-01T00:00:00.000Z', '2020', '2020', 'K', 0, NULL, NULL, NULL), "
                 "('old-running', 't', '{}', 'running', 1, 3, '2020-01-01T00:00:00.000Z', '2020', '2020', NULL, 4, 'w', "
                 "'2999-01-01T00:00:00.000Z', '2020'), "
                 "('old-dead', 't', '{}', 'dead', 3, 3, '2020-01-01T00:00:00.000Z', '2020', '2020', NULL, 3, NULL, NULL, NULL)")
    conn.close()

    async with open_sqlite_backend(path) as backend:  # migrates
        child = row("c", after=("old-pending", "old-running"), unique_key="W")
        doomed = row("c", after=("old-dead",))
        assert await backend.insert([child, doomed]) == [child.id, doomed.id]
        assert await backend.insert([row("c", unique_key="W"), row(unique_key="K")]) == [child.id, "old-pending"]
        got = await backend.get(child.id)
        assert got is not None and (got.status, got.waiting_for, got.parents) == ("waiting", 2, ("old-pending", "old-running"))
        got = await backend.get(doomed.id)
        assert got is not None and (got.status, got.error) == ("cancelled", parent_failed("old-dead", "dead"))
        # the job running before the upgrade ends through the twin for jobs with children; the other is claimed
        assert await backend.settle([Settlement("old-running", 4, Transition.SUCCEED)]) == [True]
        (lease,) = await backend.claim({"t": 1}, owner="w", lease_seconds=LONG)
        assert lease.id == "old-pending"
        assert await backend.settle([Settlement(lease.id, lease.token, Transition.SUCCEED)]) == [True]
        got = await backend.get(child.id)
        assert got is not None and (got.status, got.waiting_for) == ("pending", 0)
        assert (await backend.stats())["by_status"]["cancelled"] == 1

    conn = store.connect(path)
    try:
        assert migrations.current_version(conn) == migrations.LATEST >= 15
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        (table,) = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'jobs'").fetchone()
        assert "OR status = 'waiting')" in table, table
        (unique,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'idx_jobs_unique'").fetchone()
        assert "status = 'waiting'" in unique and "unique_token = lease_token" in unique, unique
        objects = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
        assert {"edges", "batches", "idx_edges_child", "idx_edges_uncounted", "idx_jobs_batch"} <= objects
        assert conn.execute("SELECT id, has_children FROM jobs WHERE id LIKE 'old-%' ORDER BY id").fetchall() == [
            ("old-dead", 1), ("old-pending", 1), ("old-running", 1)]
        assert conn.execute("SELECT count(*) FROM edges WHERE counted = 0").fetchone() == (0,)
    finally:
        conn.close()


# -- indexes and the hot path ---------------------------------------------------------------------


def test_the_workflow_statements_seek_their_indexes(tmp_path: Path) -> None:
    conn = fresh(tmp_path / "plan.db")
    with store.write_transaction(conn):
        plain = [row() for _ in range(300)]
        store.insert_jobs(conn, plain)
        conn.execute("UPDATE jobs SET status = 'completed' WHERE rowid % 2 = 0")  # finished jobs to walk by mistake
        parent = row()
        children = [row(after=(parent.id,), batch_id="B") for _ in range(3)]
        workflows.insert_batch(conn, NewBatch("B", None, ts()))
        store.insert_jobs(conn, [parent, *children])
    conn.execute("ANALYZE")
    ids = f'["{parent.id}", "{plain[0].id}"]'
    expected = {
        "_ENDED": ((ids,), "SEARCH e USING INDEX idx_edges_uncounted (parent_id=?)"),
        "_UNCOUNTED": ((ids,), "SEARCH e USING INDEX idx_edges_uncounted (parent_id=?)"),
        "_COUNT": ((ids,), "SEARCH edges USING PRIMARY KEY (parent_id=?)"),
        "_STRANDED": ((10,), "SCAN e USING INDEX idx_edges_uncounted"),
        "_UNBLOCKED": ((10,), "SEARCH c USING INDEX idx_jobs_status (status=?)"),
        "_PARENTS": ((parent.id, 100), "SEARCH edges USING COVERING INDEX idx_edges_child (child_id=?)"),
        "_CHILDREN": ((parent.id, 100), "SEARCH edges USING PRIMARY KEY (parent_id=?)"),
        "_PARENT_RESULTS": ((parent.id,), "SEARCH e USING COVERING INDEX idx_edges_child (child_id=?)"),
        "_BATCH_COUNTS": (("B", None), "SEARCH jobs USING INDEX idx_jobs_batch (batch_id=?)"),
        "_BATCH_JOBS": (("B", None, 10, 0), "SEARCH jobs USING INDEX idx_jobs_batch (batch_id=?)"),
        "_FORGET_AS_CHILD": ((ids,), "SEARCH edges USING COVERING INDEX idx_edges_child (child_id=?)"),
        "_FORGET_BATCH": (("B",), "SEARCH jobs USING COVERING INDEX idx_jobs_batch (batch_id=?)"),
    }
    for name, (params, seek) in expected.items():
        found = plan(conn, getattr(workflows, name), params)
        assert seek in found and "SCAN jobs" not in found and "SCAN p" not in found, (name, found)
    # the children's jobs and the parents' statuses by id (one seek each), never a walk of the finished jobs
    ended = plan(conn, workflows._ENDED, (ids,))
    assert "SEARCH p USING INDEX sqlite_autoindex_jobs_1 (id=?)" in ended and "idx_jobs_finished" not in ended, ended
    # a plain job is in neither partial index
    assert conn.execute("SELECT count(*) FROM edges INDEXED BY idx_edges_uncounted WHERE counted = 0").fetchone() == (3,)
    assert conn.execute("SELECT count(*) FROM jobs INDEXED BY idx_jobs_batch WHERE batch_id IS NOT NULL").fetchone() == (3,)


def test_plain_outcomes_run_no_statement_more_and_a_parents_success_applies_its_edges(tmp_path: Path) -> None:
    conn = fresh(tmp_path / "hot.db")
    parent = row()
    rows = [row() for _ in range(4)] + [parent]
    child = row(after=(parent.id,))
    store.insert_jobs(conn, rows + [child])
    with store.write_transaction(conn):
        leases = store.claim_leases(conn, ts(), wants={"t": 5}, owner="me", lease_seconds=LONG)
    assert {lease.id for lease in leases} == {r.id for r in rows}
    by_id = {lease.id: lease for lease in leases}
    plain = [Settlement(by_id[r.id].id, by_id[r.id].token, t, error="e") for r, t in
             zip(rows, (Transition.SUCCEED, Transition.SUCCEED, Transition.BURY, Transition.RETRY))]
    statements = traced(conn)
    with store.write_transaction(conn):
        assert store.settle(conn, plain, now=ts()) == 4
    # BEGIN, two successes, a burial, a retry, COMMIT: one statement per outcome, as before workflows
    assert len(statements) == 6 and not any("edges" in s or "has_children = 1" in s for s in statements), statements

    statements.clear()
    with store.write_transaction(conn):
        assert store.settle(conn, [Settlement(parent.id, by_id[parent.id].token, Transition.SUCCEED)], now=ts()) == 1
    # the childless statement finds nothing, its twin writes the parent, then the look and the edges
    assert "has_children = 0" in statements[1] and "has_children = 1" in statements[2], statements
    assert "idx_edges_uncounted" in statements[3], statements
    assert statuses(conn, [child.id]) == [("pending", None, 0)]


# -- cascades -----------------------------------------------------------------------------------


def test_a_dead_head_cancels_a_100_job_chain_in_one_transaction(tmp_path: Path) -> None:
    conn = fresh(tmp_path / "chain.db")
    head = row()
    chain = [head]
    for _ in range(100):
        chain.append(row("c", after=(chain[-1].id,)))
    spared = row("c", after=(chain[50].id,), on_parent_failure="run")
    with store.write_transaction(conn):
        assert store.insert_jobs(conn, chain + [spared]) == [r.id for r in chain + [spared]]
    assert statuses(conn, [head.id, chain[1].id, chain[100].id]) == [("pending", None, 0), ("waiting", None, 1),
                                                                     ("waiting", None, 1)]
    with store.write_transaction(conn):
        (lease,) = store.claim_leases(conn, ts(), wants={"t": 1}, owner="me", lease_seconds=LONG)
    statements = traced(conn)
    with store.write_transaction(conn):
        assert store.settle(conn, [Settlement(lease.id, lease.token, Transition.BURY, error="fatal")], now=ts()) == 1
    assert [s for s in statements if s in ("BEGIN IMMEDIATE", "COMMIT") or s.startswith("SAVEPOINT")] == [
        "BEGIN IMMEDIATE", "COMMIT"]
    assert statuses(conn, [chain[1].id]) == [("cancelled", parent_failed(head.id, "dead"), 0)]
    assert statuses(conn, [r.id for r in chain[2:]]) == [
        ("cancelled", parent_failed(before.id, "cancelled"), 0) for before in chain[1:-1]]
    assert statuses(conn, [spared.id]) == [("pending", None, 0)]  # it runs on a parent's failure
    assert conn.execute("SELECT count(*) FROM edges WHERE counted = 0").fetchone() == (0,)
    # an operator's cancel of a waiting job applies its edges the same way; asking twice changes nothing
    tail = [row("c", after=(spared.id,))]
    tail.append(row("c", after=(tail[0].id,)))
    store.insert_jobs(conn, tail)
    with store.write_transaction(conn):
        assert queries.cancel(conn, [tail[0].id, tail[1].id, tail[0].id], reason="test", now=ts()) == ["cancelled"] * 3
    assert statuses(conn, [tail[1].id]) == [("cancelled", parent_failed(tail[0].id, "cancelled"), 0)]


# -- the engine ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Step:
    n: int = 0


async def test_a_job_woken_by_a_write_of_its_process_starts_at_once(tmp_path: Path) -> None:
    """The Poller polls once a minute here: only the Ledger's nudge after the batch that woke a job
    starts it at once. The parent is cancelled by an operator (no outcome of a worker, whose pool
    has room again and nudges the Poller anyway)."""
    # leases of a minute: no heartbeat batch (every lease/3) comes by to look for the job in its place
    config = fast_config(tmp_path / "wake.db", worker_poll_interval_ms=60_000, worker_lease_seconds=60.0)
    reg = pipeline.Registry()
    started: dict[int, float] = {}

    @reg.job
    async def step(job: Step, ctx: pipeline.JobContext) -> int:
        started[job.n] = time.monotonic()
        return job.n

    async with pipeline.open_pipeline(config, reg) as p:
        first = await p.enqueue(Step(1))
        second = await p.enqueue(Step(2), after=first)
        assert await p.result(second, timeout=10) == 2  # a chain through the workers
        later = await p.enqueue(Step(3), run_after=time.time() + 3600)
        woken = await p.enqueue(Step(4), after=later, on_parent_failure="run")
        before = time.monotonic()
        assert await p.cancel(later) == "cancelled"
        with trio.fail_after(5):
            while 4 not in started:
                await trio.sleep(0.001)
        took = started[4] - before
        got = await p.backend.get(woken)
    assert got is not None and got.parents == (later,)
    # milliseconds here; without the nudge, the poll a minute later: a second is a loaded machine's margin
    assert took < 1.0, f"the woken job started {took * 1000:.0f} ms after its parent's cancel"
    assert 3 not in started
