"""Issue 23's control on Postgres only: the upgrade of a schema made at version 5, a cancel racing
the job's own outcome or a claim from another connection (each waits for the other's row lock,
and exactly one final state comes out), the indexes the control reads go through, and the hot
path's statements, which bind nothing of the features a batch does not use. What every store
promises is tests/backends/test_control.py."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar
from unittest import mock

import psycopg
import pytest
import trio

from pipeline import Config
from pipeline.backends import open_backend
from pipeline.backends.base import CANCELLING, Settlement, cancelled_error
from pipeline.backends.postgres import queries, retention, schema, store, worker
from pipeline.backends.postgres.db import connect
from pipeline.states import Transition

from .kit import LONG, add, bury, claim_one, job, record, release, retry, settle_one, snooze, succeed, ts
from .stores import BACKENDS, postgres_store

pytestmark = pytest.mark.skipif("postgres" not in BACKENDS, reason="no postgres entry")

T = TypeVar("T")
REQUESTED = "cancelled while running (cancel requested); its attempt ended: "


@contextmanager
def connection(config: Config) -> Iterator[psycopg.Connection[Any]]:
    """A connection as the backend's (autocommit, UTC, times read as text)."""
    conn = connect(config.database_url, "test")
    try:
        yield conn
    finally:
        conn.close()


# -- the upgrade ---------------------------------------------------------------------------------------

_OLD_ROWS = """
INSERT INTO jobs (id, job_type, payload, status, attempts, run_after, lease_token, lease_owner, lease_expires_at,
                  started_at, error)
VALUES ('00000000-0000-7000-8000-000000000001', 't', '{}', 'pending', 0, now() - interval '1 minute', 0, NULL,
        NULL, NULL, NULL),
       ('00000000-0000-7000-8000-000000000002', 'r', '{}', 'running', 1, now(), 1, 'old:1', now() + interval '1 hour',
        now(), NULL),
       ('00000000-0000-7000-8000-000000000003', 't', '{}', 'completed', 1, now(), 1, NULL, NULL, NULL, NULL),
       ('00000000-0000-7000-8000-000000000004', 'u', '{}', 'dead', 3, now(), 3, NULL, NULL, NULL, 'boom')
"""
PENDING, RUNNING, COMPLETED, DEAD = (f"00000000-0000-7000-8000-00000000000{n}" for n in range(1, 5))


async def test_a_schema_of_version_5_is_upgraded_in_place_and_its_jobs_go_on(tmp_path: Path) -> None:
    async with postgres_store(tmp_path) as config:
        with connection(config) as conn:
            with mock.patch.object(schema, "MIGRATIONS", schema.MIGRATIONS[:5]), mock.patch.object(schema, "LATEST", 5):
                assert schema.migrate(conn, "test") == [1, 2, 3, 4, 5]
            conn.execute(_OLD_ROWS)
            with pytest.raises(psycopg.errors.CheckViolation):  # version 5 knows no cancelled status
                conn.execute("UPDATE jobs SET status = 'cancelled' WHERE id = %s", (PENDING,))
            assert schema.migrate(conn, "test") == list(range(6, schema.LATEST + 1))
            assert schema.migrate(conn, "test") == []
            # the new check is in force and validated: every row was read against it
            valid = conn.execute("SELECT convalidated FROM pg_constraint WHERE conname = 'jobs_status_check' "
                                 "AND conrelid = 'jobs'::regclass").fetchall()
            assert valid == [(True,)]
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute("UPDATE jobs SET status = 'paused' WHERE id = %s", (PENDING,))
            names = conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()").fetchall()
            made = {"jobs_expiring", "jobs_cancel_requests", "jobs_cancelled", "jobs_finished", "paused_types_pkey"}
            assert made <= {name for (name,) in names}

        async with open_backend(config) as backend:
            for job_id in (PENDING, RUNNING, COMPLETED, DEAD):
                got = await record(backend, job_id)
                new = (got.result, got.progress, got.progress_message, got.snoozes, got.expires_at, got.cancel_requested)
                assert new == (None, None, None, 0, None, False), got
            # the running job goes on under its old lease, and can be asked to stop
            assert await backend.set_progress(RUNNING, 1, 0.5, "half")
            assert await backend.cancel([PENDING, RUNNING, COMPLETED], reason="upgrade") == [
                "cancelled", CANCELLING, "completed"]
            assert await settle_one(backend, Settlement(RUNNING, 1, Transition.RETRY, error="boom", delay=0.0))
            got = await record(backend, RUNNING)
            assert (got.status, got.error, got.progress) == ("cancelled", REQUESTED + "boom", 0.5)
            revived = await backend.revive(DEAD)
            assert (revived.status, revived.attempts, revived.error) == ("pending", 0, "boom")
            assert (await backend.stats())["by_status"] == {"waiting": 0, "pending": 1, "running": 0, "completed": 1, "dead": 0,
                                                             "cancelled": 2, "suspended": 0}
            await backend.set_type_paused("u", True)
            assert await backend.claim({"u": 1}, owner="w", lease_seconds=LONG) == []


# -- races between two connections ----------------------------------------------------------------------


async def _waiting_for_a_lock(conn: psycopg.Connection[Any], pid: int) -> None:
    """Until the session ``pid`` waits for a lock (polled every 5 ms)."""
    with trio.fail_after(10):
        while True:
            row = conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
            if row is not None and row[0] == "Lock":
                return
            await trio.sleep(0.005)


async def _behind(holder: psycopg.Connection[Any], first: Callable[[], Any], waiter: psycopg.Connection[Any],
                  second: Callable[[], T]) -> T:
    """``first`` in a transaction left open on ``holder``; then ``second`` (on ``waiter``) in a
    thread, which must wait for a row lock ``first`` holds; then ``holder`` commits, and the
    answer of ``second`` once it went on."""
    holder.execute("BEGIN")
    try:
        first()  # (a function that opens its own transaction runs in a savepoint of this one)
        answer: list[T] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: trio.to_thread.run_sync(lambda: answer.append(second())))
            await _waiting_for_a_lock(holder, waiter.info.backend_pid)
            holder.execute("COMMIT")
    finally:
        if holder.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            holder.execute("ROLLBACK")
    return answer[0]


OUTCOMES: dict[str, Callable[[Any], Settlement]] = {
    "retry": lambda lease: retry(lease, 0.0, error="ValueError: nope"),
    "release": release,
    "snooze": lambda lease: snooze(lease, 0.0, limit=5, error="not ready"),
    "succeed": lambda lease: succeed(lease, '{"n":1}'),
    "bury": lambda lease: bury(lease, "fatal"),
}


@pytest.mark.parametrize("outcome, status, error", [
    ("retry", "cancelled", REQUESTED + "ValueError: nope"),
    ("release", "cancelled", REQUESTED + "released"),
    ("snooze", "cancelled", REQUESTED + "not ready"),
    ("succeed", "completed", None),
    ("bury", "dead", "fatal"),
])
async def test_an_outcome_that_waits_for_a_cancel_reads_the_request_it_committed(
    tmp_path: Path, outcome: str, status: str, error: str | None
) -> None:
    """The cancel locks the running row first; the worker's outcome, written meanwhile from another
    connection, waits for it and then reads the request: no retry after a cancel."""
    async with postgres_store(tmp_path) as config, open_backend(config) as backend:
        (job_id,) = await add(backend, max_attempts=5)
        lease = await claim_one(backend)
        with connection(config) as operator, connection(config) as worker:
            held = await _behind(
                operator, lambda: queries.cancel(operator, [job_id], reason="race"),
                worker, lambda: store.write_batch(worker, [OUTCOMES[outcome](lease)], [], notify=False))
        assert held == [True]
        got = await record(backend, job_id)
        assert (got.status, got.error, got.cancel_requested, got.lease_owner) == (status, error, False, None)
        assert await backend.claim({"t": 1}, owner="w", lease_seconds=LONG) == []
        assert await backend.cancel_requests("owner-a") == []


@pytest.mark.parametrize("outcome, answer, status", [
    ("retry", "cancelled", "cancelled"),
    ("release", "cancelled", "cancelled"),
    ("succeed", "completed", "completed"),
    ("bury", "dead", "dead"),
])
async def test_a_cancel_that_waits_for_an_outcome_answers_what_the_outcome_left(
    tmp_path: Path, outcome: str, answer: str, status: str
) -> None:
    """The worker's outcome locks the row first; the cancel waits for it, then finds the job back in
    pending (cancelled at once) or final (left as it is)."""
    async with postgres_store(tmp_path) as config, open_backend(config) as backend:
        (job_id,) = await add(backend, max_attempts=5)
        lease = await claim_one(backend)
        with connection(config) as operator, connection(config) as worker:
            answers = await _behind(
                worker, lambda: store.write_batch(worker, [OUTCOMES[outcome](lease)], [], notify=False),
                operator, lambda: queries.cancel(operator, [job_id], reason="race"))
        assert answers == [answer]
        got = await record(backend, job_id)
        assert (got.status, got.cancel_requested) == (status, False)
        if status == "cancelled":
            assert got.error == cancelled_error("race")
        assert await backend.claim({"t": 1}, owner="w", lease_seconds=LONG) == []


async def test_a_cancel_that_waits_for_a_claim_asks_the_new_run_to_stop(tmp_path: Path) -> None:
    async with postgres_store(tmp_path) as config, open_backend(config) as backend:
        (job_id,) = await add(backend)
        leases = []
        with connection(config) as poller, connection(config) as operator:
            answers = await _behind(
                poller, lambda: leases.extend(worker.claim(poller, {"t": 1}, owner="owner-a", lease_seconds=LONG)),
                operator, lambda: queries.cancel(operator, [job_id], reason="race"))
        assert answers == [CANCELLING]
        (lease,) = leases
        got = await record(backend, job_id)
        assert (got.status, got.cancel_requested) == ("running", True)
        assert await backend.cancel_requests("owner-a") == [(job_id, lease.token)]


@pytest.mark.parametrize("expired", [False, True], ids=["due", "expired"])
async def test_a_claim_skips_a_pending_job_being_cancelled_without_waiting(tmp_path: Path, expired: bool) -> None:
    """SKIP LOCKED in both parts of the claim: the rows it picks, and the expired rows it ends."""
    async with postgres_store(tmp_path) as config, open_backend(config) as backend:
        row = job(expires_at=ts(-1.0) if expired else None)
        await backend.insert([row])
        with connection(config) as operator, connection(config) as poller:
            poller.execute("SET lock_timeout = '2s'")  # a claim that waited would fail (LockNotAvailable)
            operator.execute("BEGIN")
            assert queries.cancel(operator, [row.id], reason="race") == ["cancelled"]
            assert worker.claim(poller, {"t": 1}, owner="w", lease_seconds=LONG) == []
            operator.execute("COMMIT")
        got = await record(backend, row.id)
        assert (got.status, got.error) == ("cancelled", cancelled_error("race"))
        assert await backend.claim({"t": 1}, owner="w", lease_seconds=LONG) == []


async def test_texts_with_a_nul_character_are_stored_escaped(tmp_path: Path) -> None:
    """Postgres text holds no NUL: a reason, a progress message or an outcome's error keeps it escaped."""
    async with postgres_store(tmp_path) as config, open_backend(config) as backend:
        (pending,) = await add(backend)
        assert await backend.cancel([pending], reason="a\x00b") == ["cancelled"]
        assert (await record(backend, pending)).error == cancelled_error("a\\x00b")
        await add(backend, 1, "r")
        lease = await claim_one(backend, "r")
        assert await backend.set_progress(lease.id, lease.token, 0.5, "c\x00d")
        assert (await record(backend, lease.id)).progress_message == "c\\x00d"
        assert await backend.cancel([lease.id], reason="x") == [CANCELLING]
        assert await settle_one(backend, retry(lease, 0.0, error="e\x00f"))
        assert (await record(backend, lease.id)).error == REQUESTED + "e\\x00f"


# -- the indexes the control reads through ---------------------------------------------------------------


def _plan(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> tuple[set[str], list[str]]:
    """The indexes a statement's plan reads, and the tables it reads whole."""
    (doc,), = conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchall()
    return _walk((doc if isinstance(doc, list) else json.loads(doc))[0]["Plan"])


def _walk(plan: dict[str, Any]) -> tuple[set[str], list[str]]:
    """The indexes a plan (EXPLAIN's JSON) reads, and the tables it reads whole."""
    indexes: set[str] = set()
    scans: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        if "Index Name" in node:
            indexes.add(node["Index Name"])
        if node.get("Node Type") == "Seq Scan":
            scans.append(node["Relation Name"])
        for child in node.get("Plans", []):
            walk(child)

    walk(plan)
    return indexes, scans


_FILL = """
INSERT INTO jobs (id, job_type, payload, status, updated_at, lease_owner, expires_at, cancel_requested)
SELECT 'j' || lpad(g::text, 6, '0'), 't' || g % 5, '{}',
       (ARRAY['completed', 'dead', 'cancelled', 'pending', 'running'])[1 + g % 5],
       now() - (g % 5000) * interval '1 minute', CASE WHEN g % 5 = 4 THEN 'w' || g % 20 END,
       CASE WHEN g % 5 = 3 THEN now() + interval '1 day' END, g % 500 = 4
  FROM generate_series(1, 20000) g
"""


async def test_the_control_reads_the_rows_it_needs_through_their_indexes(tmp_path: Path) -> None:
    """On a table of 20,000 jobs of every status (its statistics gathered): the claim's expiry, the
    rescue's, the cancel requests, retention of cancelled jobs and the finished-per-minute view each
    read through the index made for them, and none reads the jobs table whole."""
    async with postgres_store(tmp_path) as config, open_backend(config):
        with connection(config) as conn:
            conn.execute(_FILL)
            conn.execute("ANALYZE jobs")
            claim = {"types": ["t1", "t3"], "limits": [10, 10], "starts": [10, 10], "owner": "w", "lease": 30.0}
            since = {"since": ts(-3600)}
            for sql, params, expected in (
                (store._CLAIM, claim, {"jobs_expiring", "jobs_claim", "paused_types_pkey"}),
                (store._EXPIRE_ALL, None, {"jobs_expiring"}),
                (store._CANCEL_REQUESTS, {"owner": "w4"}, {"jobs_cancel_requests"}),
                (queries._FINISHED_PER_MINUTE, since, {"jobs_finished", "jobs_cancelled"}),
            ):
                indexes, scans = _plan(conn, sql, params)
                assert expected <= indexes and "jobs" not in scans, (sql, indexes, scans)
            prune = {"status": "cancelled", "age": 3600.0, "limit": 100}
            indexes, scans = _plan(conn, retention.PRUNE, prune)
            assert "jobs_cancelled" in indexes and "jobs" not in scans, (indexes, scans)


# -- the hot path ----------------------------------------------------------------------------------------


def test_rows_and_outcomes_without_the_features_bind_what_they_did_before() -> None:
    """No expiry (nor key, nor trace): the plain insert; outcomes without a result or a snooze: the
    five arrays of before (a result, a snooze each add two more, in statements of their own)."""
    rows = [job(), job()]
    assert store.insert_statement(rows) is store._INSERT
    assert store.insert_statement([*rows, job(expires_at=ts(60))]) is store._INSERT_TRACED
    lease = mock.Mock(id="a", token=1)
    plain = [succeed(lease), retry(lease, 1.0), bury(lease), release(lease), Settlement("a", 1, Transition.START),
             Settlement("a", 1, Transition.CANCEL, error="stopped")]
    for outcome in plain:
        assert set(store.outcome_params([outcome])) == {"o_ids", "o_tokens", "o_kinds", "o_errors", "o_delays"}
    assert not store.full(plain)
    for outcome in (succeed(lease, "1"), snooze(lease, 1.0)):
        assert store.full([outcome])
        assert {"o_results", "o_limits"} <= set(store.outcome_params([outcome]))
