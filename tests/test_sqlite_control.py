"""Issue 23's control on SQLite alone: the migration from schema version 12 (the status check that
takes "cancelled", written in place), the indexes the new reads and writes seek, and the hot path's
statements as they were before it (the cross-store behaviour is tests/backends/test_control.py's)."""

from __future__ import annotations

import json
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.backends import NewJob, Settlement
from pipeline.backends.base import expired_error
from pipeline.backends.sqlite import drain, migrations, open_sqlite_backend, queries, retention, store
from pipeline.backends.sqlite.bulk import BulkInsert
from pipeline.clock import format_ts
from pipeline.errors import StoreError
from pipeline.ids import UUID7Factory
from pipeline.sqlite_files import apply_migrations
from pipeline.states import Transition

new_id = UUID7Factory()


def ts(offset: float = 0.0) -> str:
    return format_ts(time.time() + offset)


def row(job_type: str = "t", *, expires_at: str | None = None, unique_key: str | None = None) -> NewJob:
    return NewJob(new_id(), job_type, '{"n":1}', 3, ts(-60), 5, ts(), unique_key=unique_key, expires_at=expires_at)


def fresh(path: Path) -> sqlite3.Connection:
    conn = store.connect(path)
    migrations.migrate(conn, path)
    return conn


def plan(conn: sqlite3.Connection, sql: str, params: Any) -> str:
    return " | ".join(r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))


# -- the migration ------------------------------------------------------------------------------


async def test_a_version_12_file_migrates_keeping_its_rows_its_triggers_and_its_other_checks(tmp_path: Path) -> None:
    path = tmp_path / "v12.db"
    conn = store.connect(path)
    apply_migrations(conn, [m for m in migrations.MIGRATIONS if m[0] <= 12], table=migrations.TABLE,
                     known=migrations.RETIRED)
    assert migrations.current_version(conn) == 12
    conn.execute("INSERT INTO jobs (id, job_type, payload, status, attempts, max_attempts, run_after, created_at, updated_at) "
                 "VALUES ('old-pending', 't', '{}', 'pending', 0, 3, '2020-01-01T00:00:00.000Z', '2020', '2020'), "
                 "('old-dead', 't', '{}', 'dead', 3, 3, '2020-01-01T00:00:00.000Z', '2020', '2020')")
    # an application's trigger on the jobs table (the bundled site has one): a rebuilt table would lose it
    conn.execute("CREATE TABLE seen (id TEXT)")
    conn.execute("CREATE TRIGGER jobs_seen AFTER DELETE ON jobs BEGIN INSERT INTO seen VALUES (old.id); END")
    conn.close()

    async with open_sqlite_backend(path) as backend:  # migrates
        old = await backend.get("old-pending")
        assert old is not None and (old.result, old.progress, old.progress_message, old.snoozes, old.expires_at,
                                    old.cancel_requested) == (None, None, None, 0, None, False)
        assert await backend.cancel(["old-pending"], reason="test") == ["cancelled"]  # the check takes it
        assert (await backend.revive("old-dead")).status == "pending"
        await backend.delete("old-pending")

    conn = store.connect(path)
    try:
        assert migrations.current_version(conn) == migrations.LATEST  # through 13 (this test's) to the newest
        assert conn.execute("SELECT id FROM seen").fetchall() == [("old-pending",)]  # the trigger fired
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint failed"):
            conn.execute("UPDATE jobs SET status = 'finished' WHERE id = 'old-dead'")
        indexes = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert {"idx_jobs_expiring", "idx_jobs_cancel_requests", "idx_jobs_finished"} <= indexes
        (finished,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'idx_jobs_finished'").fetchone()
        assert "'cancelled'" in finished
    finally:
        conn.close()


def test_a_status_check_changed_by_hand_is_refused_and_nothing_is_migrated(tmp_path: Path) -> None:
    conn = store.connect(tmp_path / "odd.db")
    apply_migrations(conn, [m for m in migrations.MIGRATIONS if m[0] <= 12], table=migrations.TABLE, known=migrations.RETIRED)
    version = conn.execute("PRAGMA schema_version").fetchone()[0]
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute("UPDATE sqlite_master SET sql = replace(sql, '''dead'')', '''dead'', ''gone'')') WHERE name = 'jobs'")
    conn.execute(f"PRAGMA schema_version = {version + 1}")
    conn.execute("PRAGMA writable_schema = OFF")
    with pytest.raises(StoreError, match="status check is not"):
        migrations.migrate(conn)
    assert migrations.current_version(conn) == 12
    assert "result" not in {r[1] for r in conn.execute("PRAGMA table_info(jobs)")}


# -- indexes ------------------------------------------------------------------------------------


def test_the_claims_look_is_two_seeks_and_reads_no_job_when_none_expired(tmp_path: Path) -> None:
    conn = fresh(tmp_path / "plan.db")
    store.insert_jobs(conn, [row("a") for _ in range(50)] + [row("a", expires_at=ts(3600)) for _ in range(50)])
    conn.execute("ANALYZE")
    look = plan(conn, store._look_sql(2), (ts(), "a", "b"))
    assert "SEARCH paused_types USING" in look, look
    assert "SEARCH jobs USING COVERING INDEX idx_jobs_expiring (expires_at>? AND expires_at<?)" in look, look
    assert "SCAN jobs" not in look and "SCAN paused_types" not in look, look
    assert list(conn.execute(store._look_sql(2), (ts(), "a", "b"))) == []
    for types in (None, 1):
        expire = plan(conn, store._expire_sql(types), (ts(), "x", "y", "a")[: 3 + (types or 0)])
        assert "SEARCH jobs USING COVERING INDEX idx_jobs_expiring (expires_at>? AND expires_at<?)" in expire, expire


def test_cancel_requests_prune_and_finished_per_minute_read_by_index(tmp_path: Path) -> None:
    conn = fresh(tmp_path / "plan.db")
    conn.execute("ANALYZE")
    requests = plan(conn, queries._CANCEL_REQUESTS, ("owner",))
    assert "USING INDEX idx_jobs_cancel_requests (lease_owner=?)" in requests, requests
    prune = plan(conn, retention.PRUNE, ("cancelled", ts(), 10))
    assert "USING INDEX idx_jobs_finished (status=? AND updated_at<?)" in prune and "TEMP B-TREE" not in prune, prune
    minutes = plan(conn, queries._FINISHED_PER_MINUTE, (ts(-3600),))
    assert "idx_jobs_finished" in minutes, minutes


def test_no_condition_checked_at_each_write_builds_an_in_table(tmp_path: Path) -> None:
    """SQLite evaluates the status check and a partial index's condition at every write of a row;
    an IN of three values or more builds a table of them each time (the check's four statuses cost
    1.5 to 2.5 us of CPU per insert, claimed job and success; idx_jobs_finished with the three
    final statuses, 1 to 2.5 us): they compare in place (ORs, or IN of two)."""
    conn = fresh(tmp_path / "idx.db")
    (table,) = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'jobs'").fetchone()
    conditions = [("jobs", check) for check in re.findall(r"CHECK \((.*)\)", table)]
    assert any("'cancelled'" in check for _, check in conditions), table
    conditions += [(name, sql.split(" WHERE ", 1)[1]) for name, sql in conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'jobs' AND sql LIKE '% WHERE %'")]
    for name, condition in conditions:
        for values in re.findall(r"\bIN\s*\(([^)]*)\)", condition, flags=re.IGNORECASE):
            assert values.count(",") <= 1, (name, condition)


# -- the hot path's statements ----------------------------------------------------------------------

# As they were before issue 23 (e1aeb7c): a change to them must be one that is measured
OLD_INSERT = (
    "INSERT INTO jobs (id, job_type, payload, status, attempts, max_attempts, run_after, "
    "created_at, updated_at, priority) VALUES (?1, ?2, ?3, 'pending', 0, ?4, ?5, ?7, ?7, ?6)"
)
# (fenced by has_children = 0 since workflows: a job with children ends through a twin statement)
OLD_SUCCEED = ("UPDATE jobs SET status = 'completed', updated_at = ?, lease_owner = NULL, lease_expires_at = NULL "
               "WHERE id = ? AND status = 'running' AND lease_token = ? AND has_children = 0")


def traced(conn: sqlite3.Connection) -> list[str]:
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    return statements


def test_plain_inserts_claims_and_successes_run_the_statements_of_before(tmp_path: Path) -> None:
    conn = fresh(tmp_path / "hot.db")
    assert store._INSERT == OLD_INSERT and store._SUCCEED == OLD_SUCCEED
    rows = [row() for _ in range(3)]
    statements = traced(conn)
    with store.write_transaction(conn):
        store.insert_jobs(conn, rows)
    # one statement per row, binding the seven values it always bound
    assert statements[1:-1] == [
        OLD_INSERT.replace("?1", f"'{r.id}'").replace("?2", "'t'").replace("?3", "'{\"n\":1}'").replace("?4", "3")
        .replace("?5", f"'{r.run_after}'").replace("?6", "5").replace("?7", f"'{r.created_at}'") for r in rows
    ]

    statements.clear()
    with store.write_transaction(conn):
        leases = store.claim_leases(conn, ts(), wants={"t": 3}, owner="me", lease_seconds=60)
    # two statements more than before per claim: the look (paused types, anything expired), and per
    # type the seek for a due job (store._DUE, which spares a type with nothing due its UPDATE)
    assert len(leases) == 3 and len(statements) == 5, statements
    assert statements[1].startswith("SELECT job_type FROM paused_types") and statements[2].startswith("SELECT 1 FROM jobs")
    assert statements[3].lstrip().startswith("UPDATE jobs")

    statements.clear()
    with store.write_transaction(conn):
        settled = [Settlement(lease.id, lease.token, Transition.SUCCEED) for lease in leases]
        assert store.settle(conn, settled, now=ts()) == 3
    assert len(statements) == 5 and all(s.startswith("UPDATE jobs SET status = 'completed', updated_at = '")
                                         for s in statements[1:-1]), statements


def test_outcomes_back_to_pending_cost_one_statement_each_without_a_cancel_request(tmp_path: Path) -> None:
    conn = fresh(tmp_path / "back.db")
    store.insert_jobs(conn, [row() for _ in range(4)])
    with store.write_transaction(conn):
        leases = store.claim_leases(conn, ts(), wants={"t": 4}, owner="me", lease_seconds=60)
    queries.cancel(conn, [leases[3].id], reason="test", now=ts())
    statements = traced(conn)
    with store.write_transaction(conn):
        outcomes = [Settlement(lease.id, lease.token, Transition.RETRY, error="boom", delay=5) for lease in leases[:3]]
        assert store.settle(conn, outcomes, now=ts()) == 3
    assert len(statements) == 5, statements  # BEGIN, 3 × _RETRY, COMMIT: no look for cancel requests
    statements.clear()
    with store.write_transaction(conn):  # the one with a request: _RETRY finds nothing, _STOPPED ends it
        assert store.settle(conn, [Settlement(leases[3].id, leases[3].token, Transition.RETRY, error="boom")], now=ts()) == 1
    assert len(statements) == 4, statements
    assert conn.execute("SELECT status, error FROM jobs WHERE id = ?", (leases[3].id,)).fetchone() == (
        "cancelled", "cancelled while running (cancel requested); its attempt ended: boom")


# -- SQLite's own paths --------------------------------------------------------------------------


def test_a_bulk_load_stores_each_rows_expiry_through_its_json_statement(tmp_path: Path) -> None:
    conn = fresh(tmp_path / "bulk.db")
    soon, later = ts(60), ts(120)
    rows = [row(expires_at=soon), row(), row(expires_at=later)]
    statements = traced(conn)
    with BulkInsert(conn) as bulk:
        for r in rows:
            bulk.add(r)
    conn.set_trace_callback(None)
    assert sum("json_each" in s for s in statements) == 1, statements  # one statement for the chunk
    stored = conn.execute("SELECT id, expires_at FROM jobs ORDER BY rowid").fetchall()
    assert stored == [(rows[0].id, soon), (rows[1].id, None), (rows[2].id, later)]


def test_the_rescue_ends_expired_pending_jobs_of_every_type_and_frees_their_keys(tmp_path: Path) -> None:
    conn = fresh(tmp_path / "rescue.db")
    gone, kept = row("a", expires_at=ts(-1), unique_key="k"), row("b", expires_at=ts(3600))
    store.insert_jobs(conn, [gone, kept])
    with store.write_transaction(conn):
        assert store.rescue_expired(conn, now=ts(), base_seconds=1) == [(gone.id, Transition.EXPIRE)]
    assert conn.execute("SELECT status, error FROM jobs WHERE id = ?", (gone.id,)).fetchone() == (
        "cancelled", expired_error(gone.expires_at))  # type: ignore[arg-type]
    again = row("a", unique_key="k")
    assert store.insert_jobs(conn, [again]) == [again.id]


def test_a_drain_does_not_wait_for_the_jobs_of_a_paused_type(tmp_path: Path) -> None:
    conn = fresh(tmp_path / "drain.db")
    store.insert_jobs(conn, [row("a"), row("b"), row("b")])
    assert drain.make_due(conn) == {"a": 1, "b": 2}
    queries.set_type_paused(conn, "b", True, now=ts())
    assert drain.make_due(conn) == {"a": 1}


def test_a_cancel_request_outlives_no_run_in_what_reads_show(tmp_path: Path) -> None:
    """SUCCEED's statement (the hot path's, unchanged) leaves the column set: reads show a request
    only while the job runs, and the index of requests holds running jobs only."""
    conn = fresh(tmp_path / "flag.db")
    store.insert_jobs(conn, [row()])
    with store.write_transaction(conn):
        (lease,) = store.claim_leases(conn, ts(), wants={"t": 1}, owner="me", lease_seconds=60)
    assert queries.cancel(conn, [lease.id], reason="test", now=ts()) == ["cancelling"]
    assert queries.get_job(conn, lease.id).cancel_requested is True  # type: ignore[union-attr]
    assert queries.cancel_requests(conn, "me") == [(lease.id, lease.token)]
    with store.write_transaction(conn):
        assert store.settle(conn, [Settlement(lease.id, lease.token, Transition.SUCCEED, result=json.dumps([1]))],
                            now=ts()) == 1
    job = queries.get_job(conn, lease.id)
    assert job is not None and (job.status, job.result, job.cancel_requested) == ("completed", "[1]", False)
    assert queries.cancel_requests(conn, "me") == []
    (entries,) = conn.execute("SELECT count(*) FROM jobs INDEXED BY idx_jobs_cancel_requests "
                              "WHERE status = 'running' AND cancel_requested = 1").fetchone()
    assert entries == 0
