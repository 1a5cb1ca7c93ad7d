"""Issue 23's limits on SQLite alone (the cross-store behaviour is tests/backends/test_control_limits.py's):
the migration from schema version 13, the claim the Ledger takes with an insert honouring the offer's
rates and key limits, the keyed claim's reads (a seek per key, bounded work whatever one key's backlog),
the walks' cursors, the rate's records, unique keys held only while pending as the rows keep them, and
the hot path's statements as they were when no type has these limits."""

from __future__ import annotations

import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from test_sqlite_control import plan

from pipeline.backends import Lease, NewJob, Settlement
from pipeline.backends.base import Claimed, ClaimOffer, Nudge
from pipeline.backends.sqlite import limits, migrations, open_sqlite_backend, queries, store
from pipeline.backends.sqlite.bulk import BulkInsert
from pipeline.clock import format_ts
from pipeline.errors import UsageError
from pipeline.ids import UUID7Factory
from pipeline.sqlite_files import apply_migrations
from pipeline.states import Transition

new_id = UUID7Factory()
LONG = 3600.0


def ts(offset: float = 0.0) -> str:
    return format_ts(time.time() + offset)


def row(job_type: str = "t", *, limit_key: str | None = None, unique_key: str | None = None,
        unique_while: str | None = None, due: float = -60.0) -> NewJob:
    return NewJob(new_id(), job_type, '{"n":1}', 3, ts(due), 5, ts(), unique_key=unique_key, limit_key=limit_key,
                  unique_while=unique_while)


def fresh(path: Path) -> sqlite3.Connection:
    conn = store.connect(path)
    migrations.migrate(conn, path)
    return conn


def claim(conn: sqlite3.Connection, wants: dict[str, int], **options: Any) -> list[Lease]:
    with store.write_transaction(conn):
        return store.claim_leases(conn, ts(), wants=wants, owner="me", lease_seconds=LONG, **options)


def settle(conn: sqlite3.Connection, outcomes: list[Settlement]) -> int:
    with store.write_transaction(conn):
        return store.settle(conn, outcomes, now=ts())


def succeed_all(conn: sqlite3.Connection, leases: list[Lease]) -> None:
    assert settle(conn, [Settlement(lease.id, lease.token, Transition.SUCCEED) for lease in leases]) == len(leases)


# -- the migration ------------------------------------------------------------------------------


async def test_a_version_13_file_migrates_keeping_the_keys_its_jobs_hold(tmp_path: Path) -> None:
    path = tmp_path / "v13.db"
    conn = store.connect(path)
    apply_migrations(conn, [m for m in migrations.MIGRATIONS if m[0] <= 13], table=migrations.TABLE,
                     known=migrations.RETIRED)
    assert migrations.current_version(conn) == 13
    conn.execute("INSERT INTO jobs (id, job_type, payload, status, attempts, max_attempts, run_after, created_at, "
                 "updated_at, unique_key, lease_token, lease_owner, lease_expires_at) VALUES "
                 "('old-pending', 't', '{}', 'pending', 0, 3, '2020-01-01T00:00:00.000Z', '2020', '2020', 'K', 0, NULL, NULL), "
                 "('old-running', 't', '{}', 'running', 1, 3, '2020-01-01T00:00:00.000Z', '2020', '2020', 'R', 4, 'w', "
                 "'2999-01-01T00:00:00.000Z')")
    conn.close()

    async with open_sqlite_backend(path) as backend:  # migrates
        # the keys held before are held after: by a pending job, and by a running one (a default job's)
        assert await backend.insert([row(unique_key="K"), row(unique_key="R", unique_while="pending")]) == [
            "old-pending", "old-running"]
        old = await backend.get("old-running")
        assert old is not None and old.limit_key is None
        keyed = [row(limit_key="A"), row(limit_key="A"), row(limit_key="B")]
        await backend.insert(keyed)
        leases = await backend.claim({"t": 3}, owner="w", lease_seconds=LONG, key_limits={"t": 1})
        assert sorted(lease.id for lease in leases) == sorted(["old-pending", keyed[0].id, keyed[2].id])

    conn = store.connect(path)
    try:
        assert migrations.current_version(conn) == migrations.LATEST
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("SELECT limit_key, unique_token FROM jobs WHERE id = 'old-pending'").fetchone() == (None, None)
        objects = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
        assert {"idx_jobs_keyed", "idx_jobs_keyed_running", "rate_claims", "idx_rate_claims", "key_cursors"} <= objects
        (unique,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'idx_jobs_unique'").fetchone()
        assert "unique_token = lease_token" in unique, unique
    finally:
        conn.close()


# -- the claim taken with an insert ---------------------------------------------------------------


async def test_the_claim_taken_with_an_insert_honours_the_offers_rates_and_key_limits(tmp_path: Path) -> None:
    """Four wanted; A allowed one running, and three claims a minute: A's first, B's and C's (not A's
    second, which the claim order would take next), one record of three in the rate's window."""
    nudge_send, nudge_recv = trio.open_memory_channel[Nudge](3)
    offers_send, offers_recv = trio.open_memory_channel[ClaimOffer](1)
    rows = [row(limit_key=key) for key in "AABCD"]
    async with open_sqlite_backend(tmp_path / "offer.db", nudge_send=nudge_send, offers_recv=offers_recv) as backend:
        offers_send.send_nowait(ClaimOffer({"t": 4}, "owner-a", LONG, rates={"t": (3, 60.0)}, key_limits={"t": 1}))
        await backend.insert(rows)
        assert offers_send.statistics().current_buffer_used == 0  # the insert's batch took it
        with trio.fail_after(5):
            while not isinstance(answer := await nudge_recv.receive(), Claimed):
                pass
        assert [lease.id for lease in answer.leases] == [rows[0].id, rows[2].id, rows[3].id]
        assert await backend.rate_free_at("t", 3, 60.0) > 59.0
        assert await backend.claim({"t": 4}, owner="w2", lease_seconds=LONG, rates={"t": (3, 60.0)}) == []

    conn = store.connect(tmp_path / "offer.db")
    try:
        assert [n for (n,) in conn.execute("SELECT n FROM rate_claims WHERE job_type = 't'")] == [3]
    finally:
        conn.close()


# -- the keyed claim's reads ------------------------------------------------------------------------


def test_the_keyed_claim_seeks_each_key_and_never_scans_the_type(tmp_path: Path) -> None:
    conn = fresh(tmp_path / "plan.db")
    store.insert_jobs(conn, [row(limit_key="A") for _ in range(2000)] + [row(limit_key="B") for _ in range(10)])
    conn.execute("ANALYZE")  # plans as they are with the statistics an operator may gather
    params: dict[str, object] = {"job_type": "t", "after": "A", "batch": 16, "now": ts(), "key": "A", "n": 4,
                                 "priority": 5, "run_after": ts(), "id": "x"}
    for sql in (limits._WALK_FROM, limits._WALK_AFTER):
        walk = plan(conn, sql, params)
        assert walk.count("USING INDEX idx_jobs_keyed (job_type=? AND limit_key>?)") == 2, walk  # a seek per key
        assert "USING INDEX idx_jobs_keyed_running (job_type=? AND limit_key=?)" in walk, walk
        assert "USING INDEX idx_jobs_keyed (job_type=? AND limit_key=?)" in walk, walk
    key_jobs = plan(conn, limits._KEY_JOBS, params)
    assert key_jobs == "SEARCH jobs USING INDEX idx_jobs_keyed (job_type=? AND limit_key=?)", key_jobs
    for sql in (limits._KEYLESS_FROM_START, limits._KEYLESS_AFTER):  # (the keyless look: the claim order's index)
        look = plan(conn, sql, params)
        assert "SEARCH jobs USING INDEX idx_jobs_claim_order (job_type=?" in look, look
        assert "SCAN jobs" not in look and "ANY(" not in look, look
    for sql in (limits._WALK_FROM, limits._KEY_JOBS, limits._KEYLESS_FROM_START):
        assert "SCAN jobs" not in plan(conn, sql, params)
    # and the plain claim still walks the claim order's index, in order
    plain = plan(conn, store._CLAIM, {"job_type": "t", "now": ts(), "limit": 4, "counted": 1, "owner": "o",
                                      "expires": ts()})
    assert "SEARCH jobs USING INDEX idx_jobs_claim_order (job_type=?)" in plain, plain
    assert "TEMP B-TREE" not in plain, plain


def work_of_a_keyed_claim(conn: sqlite3.Connection) -> int:
    """SQLite's virtual machine steps (in hundreds) of one claim of 4 with 2 allowed per key."""
    steps = [0]
    conn.set_progress_handler(lambda: steps.__setitem__(0, steps[0] + 1), 100)
    try:
        leases = claim(conn, {"t": 4}, key_limits={"t": 2})
    finally:
        conn.set_progress_handler(None, 0)
    assert len(leases) == 4
    succeed_all(conn, leases)
    return steps[0]


def test_a_keyed_claim_costs_the_same_over_any_backlog_of_one_key(tmp_path: Path) -> None:
    """The work of a keyed claim over 2,000 and 20,000 due jobs of key A (and 10 of B): the same
    (a scan of A's backlog would cost ten times more over the larger one)."""
    work = []
    for n in (2000, 20_000):
        conn = fresh(tmp_path / f"{n}.db")
        with store.write_transaction(conn):
            store.insert_jobs(conn, [row(limit_key="A") for _ in range(n)] + [row(limit_key="B") for _ in range(10)])
        work.append(statistics_median([work_of_a_keyed_claim(conn) for _ in range(3)]))
        conn.close()
    assert work[1] <= work[0] * 1.1 + 5, work


def statistics_median(values: list[int]) -> int:
    return sorted(values)[len(values) // 2]


def test_keys_beyond_one_walk_each_get_their_turn(tmp_path: Path) -> None:
    """Thirty keys of two due jobs each, inserted key after key; claims of one job, one allowed per
    key, each settled before the next: a claim visits 4 keys with room, and the next one starts after
    the key the last one took from, so thirty claims take one job of every key (from the first keys
    only, each key's second job would come before the next key's first)."""
    conn = fresh(tmp_path / "walk.db")
    keys = [f"k{i:02d}" for i in range(30)]
    store.insert_jobs(conn, [row(limit_key=key) for key in keys for _ in range(2)])
    taken = []
    for _ in range(30):
        (lease,) = claim(conn, {"t": 1}, key_limits={"t": 1})
        taken.append(queries.get_job(conn, lease.id).limit_key)  # type: ignore[union-attr]
        succeed_all(conn, [lease])
    assert taken == keys
    assert conn.execute("SELECT limit_key FROM key_cursors WHERE job_type = 't'").fetchone() == ("k29",)


def test_a_keyless_job_behind_a_long_keyed_backlog_is_found_within_backlog_over_look_claims(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 due jobs of key A, then 2 without a key (due later), each look reading 8 due jobs: the first
    look sees A's jobs only; the second, from where the last one ended, moves on claim after claim
    and finds the keyless ones within 40 / 8 claims; then each claim takes a job of both groups."""
    monkeypatch.setattr(limits, "KEYLESS_LOOK", 8)
    conn = fresh(tmp_path / "keyless.db")
    a_jobs = [row(limit_key="A", due=-120 + i) for i in range(40)]
    keyless = [row(due=-30), row(due=-29)]
    store.insert_jobs(conn, a_jobs + keyless)
    found_at = None
    for n in range(1, 8):
        leases = claim(conn, {"t": 2}, key_limits={"t": 40})
        if {lease.id for lease in leases} & {job.id for job in keyless}:
            found_at = n
            assert sorted(lease.id for lease in leases) == sorted([a_jobs[2 * (n - 1)].id, keyless[0].id])
            break
        assert [lease.id for lease in leases] == [job.id for job in a_jobs[2 * (n - 1) : 2 * n]]
        succeed_all(conn, leases)
    assert found_at is not None and 2 <= found_at <= 40 // 8 + 1, found_at


def test_a_keyless_job_among_the_first_due_jobs_takes_its_turn_at_once(tmp_path: Path) -> None:
    """With the look's real size: 200 due jobs of key A, then 2 without a key, both within the first
    KEYLESS_LOOK due jobs of the type: the first claim of 4 takes two of each group."""
    assert limits.KEYLESS_LOOK >= 202
    conn = fresh(tmp_path / "front.db")
    a_jobs = [row(limit_key="A", due=-300 + i) for i in range(200)]
    keyless = [row(due=-30), row(due=-29)]
    store.insert_jobs(conn, a_jobs + keyless)
    leases = claim(conn, {"t": 4}, key_limits={"t": 2})
    assert sorted(lease.id for lease in leases) == sorted([a_jobs[0].id, a_jobs[1].id, keyless[0].id, keyless[1].id])


# -- rate limits ------------------------------------------------------------------------------------


def test_the_rate_keeps_one_record_per_claim_and_drops_those_a_window_old(tmp_path: Path) -> None:
    conn = fresh(tmp_path / "rate.db")
    store.insert_jobs(conn, [row() for _ in range(10)])
    rates = {"t": (3, 10.0)}
    assert len(claim(conn, {"t": 2}, rates=rates, at=1000.0)) == 2
    assert len(claim(conn, {"t": 2}, rates=rates, at=1004.0)) == 1  # the window's room: 3 less 2
    assert claim(conn, {"t": 2}, rates=rates, at=1009.999) == []
    records = conn.execute("SELECT at, n FROM rate_claims WHERE job_type = 't' ORDER BY at").fetchall()
    assert records == [(1000.0, 2), (1004.0, 1)]
    # with 3 allowed, the window has room once the claim of two leaves it; with 1, once the last does
    assert limits.rate_free_at(conn, "t", 3, 10.0, now=1005.0) == pytest.approx(5.0)
    assert limits.rate_free_at(conn, "t", 2, 10.0, now=1005.0) == pytest.approx(5.0)
    assert limits.rate_free_at(conn, "t", 1, 10.0, now=1005.0) == pytest.approx(9.0)
    assert limits.rate_free_at(conn, "t", 4, 10.0, now=1005.0) == 0.0
    assert limits.rate_free_at(conn, "t", 0, 10.0, now=1005.0) == 10.0
    assert len(claim(conn, {"t": 5}, rates=rates, at=1010.0)) == 2  # the first record left the window
    assert conn.execute("SELECT at, n FROM rate_claims WHERE job_type = 't' ORDER BY at").fetchall() == [
        (1004.0, 1), (1010.0, 2)]


# -- unique keys held only while pending, as the rows keep them -------------------------------------------


def holds(conn: sqlite3.Connection, job_id: str) -> bool:
    (held,) = conn.execute(f"SELECT {store.HOLDS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return bool(held)


def test_two_jobs_sent_back_in_one_batch_take_the_key_once(tmp_path: Path) -> None:
    """Two jobs of one key held only while pending both run (the claim freed it each time), and both
    are retried in one batch of outcomes: the first takes the key again, the second goes on without
    it, and nothing fails."""
    conn = fresh(tmp_path / "back.db")
    first = row(unique_key="K", unique_while="pending")
    store.insert_jobs(conn, [first])
    assert holds(conn, first.id)
    (lease_1,) = claim(conn, {"t": 1})
    assert not holds(conn, first.id)
    second = row(unique_key="K", unique_while="pending")
    assert store.insert_jobs(conn, [second]) == [second.id]
    (lease_2,) = claim(conn, {"t": 1})
    assert settle(conn, [Settlement(lease.id, lease.token, Transition.RETRY, error="boom")
                         for lease in (lease_1, lease_2)]) == 2
    assert (holds(conn, first.id), holds(conn, second.id)) == (True, False)
    assert store.insert_jobs(conn, [row(unique_key="K")]) == [first.id]


def test_a_revived_job_holding_its_key_only_while_pending_is_never_refused_for_it(tmp_path: Path) -> None:
    conn = fresh(tmp_path / "revive.db")
    pending_only, default = row(unique_key="P", unique_while="pending"), row(unique_key="D")
    store.insert_jobs(conn, [pending_only, default])
    queries.cancel(conn, [pending_only.id, default.id], reason="test", now=ts())
    holder_p, holder_d = row(unique_key="P"), row(unique_key="D")
    store.insert_jobs(conn, [holder_p, holder_d])
    revived = queries.revive(conn, pending_only.id, now=ts())
    assert (revived.status, revived.unique_key) == ("pending", "P") and not holds(conn, pending_only.id)
    with pytest.raises(UsageError, match=f"held by job {holder_d.id}"):
        queries.revive(conn, default.id, now=ts())
    queries.cancel(conn, [holder_p.id], reason="test", now=ts())
    queries.cancel(conn, [pending_only.id], reason="test", now=ts())
    queries.revive(conn, pending_only.id, now=ts())  # the key is free now: it takes it
    assert holds(conn, pending_only.id)


# -- the hot path, when no type has these limits ---------------------------------------------------------

# The claim's statement as it was before issue 23's limits (a change to it must be one that is measured).
# Issue 32 added expires_at to what it returns (a worker refuses a job that expired while held):
# benchmarks/sql_floor.py's claim, 5.9-6.3 us per job before, 6.0-6.1 after, two alternating runs
OLD_CLAIM = """
UPDATE jobs
   SET status = 'running', attempts = attempts + :counted, started_at = CASE WHEN :counted THEN :now END,
       lease_token = lease_token + 1, lease_owner = :owner, lease_expires_at = :expires, updated_at = :now
 WHERE rowid IN (SELECT rowid FROM jobs
                  WHERE status = 'pending' AND job_type = :job_type AND run_after <= :now
                  ORDER BY priority, run_after, id
                  LIMIT :limit)
RETURNING id, job_type, payload, attempts + 1 - :counted, max_attempts, lease_token, created_at, run_after, priority, trace,
          expires_at
"""


def test_a_claim_without_rates_or_key_limits_runs_the_statements_of_before(tmp_path: Path) -> None:
    """The look and the claim's one UPDATE per type, whether the claim names no limits at all or
    only other types' (the engine passes them whenever some type has them); a plain job's run never
    enters the index of running keyed jobs, nor the rate's records."""
    assert store._CLAIM == OLD_CLAIM
    conn = fresh(tmp_path / "hot.db")
    store.insert_jobs(conn, [row() for _ in range(9)])
    traces = []
    for options in ({}, {"rates": {"u": (5, 1.0)}, "key_limits": {"u": 2}}):
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        assert len(claim(conn, {"t": 3}, **options)) == 3
        conn.set_trace_callback(None)
        assert len(statements) == 5 and statements[1].startswith("SELECT job_type FROM paused_types"), statements
        assert statements[2].startswith("SELECT 1 FROM jobs INDEXED BY idx_jobs_claim_order"), statements  # _DUE
        assert "WHERE rowid IN (SELECT rowid FROM jobs" in statements[3], statements  # _CLAIM, its values bound
        traces.append([re.sub(r"'[^']*'", "?", s) for s in statements])  # (the times and the tokens apart)
    assert traces[0] == traces[1]
    # a keyed claim does run other statements (so the trace above would see them)
    store.insert_jobs(conn, [row(limit_key="A")])
    statements = []
    conn.set_trace_callback(statements.append)
    claim(conn, {"t": 3}, key_limits={"t": 1})
    conn.set_trace_callback(None)
    assert any("WITH RECURSIVE walk" in s for s in statements), statements
    (n,) = conn.execute("SELECT count(*) FROM jobs INDEXED BY idx_jobs_keyed_running WHERE limit_key IS NOT NULL "
                        "AND status = 'running' AND job_type = 't'").fetchone()
    assert n == 1  # the keyed job alone, of the seven running
    assert conn.execute("SELECT count(*) FROM rate_claims").fetchone() == (0,)


def test_a_type_with_nothing_due_costs_its_claim_one_look_and_no_update(tmp_path: Path) -> None:
    """A process claims for every type it runs whenever its pools have room, most of them with nothing
    due: such a type gets one seek of the claim's index (store._DUE), not the claim's UPDATE; a job of
    it that is due later is not claimed, and once one is due it is."""
    conn = fresh(tmp_path / "due.db")
    store.insert_jobs(conn, [row("t") for _ in range(3)] + [row("later", due=60.0)])
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    leases = claim(conn, {"t": 5, "later": 5, "none": 5})
    conn.set_trace_callback(None)
    assert sorted(lease.job_type for lease in leases) == ["t"] * 3
    updates = [s for s in statements if s.lstrip().startswith("UPDATE jobs")]
    assert len(updates) == 1 and "job_type = 't'" in updates[0], statements  # the claim of "t" alone
    assert sum(s.startswith("SELECT 1 FROM jobs INDEXED BY idx_jobs_claim_order") for s in statements) == 3
    store.insert_jobs(conn, [row("none")])
    assert [lease.job_type for lease in claim(conn, {"t": 5, "later": 5, "none": 5})] == ["none"]


def index_entries(conn: sqlite3.Connection, index: str) -> int:
    """The entries an index holds, read from its pages (dbstat): what a query through it, whose WHERE
    picks its rows again, cannot show."""
    (n,) = conn.execute("SELECT coalesce(sum(ncell), 0) FROM dbstat WHERE name = ? AND pagetype = 'leaf'",
                        (index,)).fetchone()
    return int(n)


def test_plain_jobs_enter_no_keyed_index(tmp_path: Path) -> None:
    """Jobs without a limit key, pending or running, are in neither keyed index: an insert and a claim
    of a type without keys do no more work than before issue 23's limits (an index of every pending
    job cost each about 1 us, a fifth: measured). The keyed ones are, while pending and running."""
    conn = fresh(tmp_path / "plain.db")
    store.insert_jobs(conn, [row() for _ in range(50)] + [row(limit_key="A") for _ in range(3)])
    assert (index_entries(conn, "idx_jobs_keyed"), index_entries(conn, "idx_jobs_keyed_running")) == (3, 0)
    assert len(claim(conn, {"t": 20})) == 20  # plain jobs first: the keyed ones were inserted last
    assert len(claim(conn, {"t": 40}, key_limits={"t": 2})) == 32  # the 30 plain ones left, and A's 2
    assert (index_entries(conn, "idx_jobs_keyed"), index_entries(conn, "idx_jobs_keyed_running")) == (1, 2)


def test_a_bulk_load_stores_limit_keys_through_its_json_statement(tmp_path: Path) -> None:
    conn = fresh(tmp_path / "bulk.db")
    rows = [row(limit_key="A"), row(), row(limit_key="B")]
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    with BulkInsert(conn) as bulk:
        for r in rows:
            bulk.add(r)
    conn.set_trace_callback(None)
    assert sum("json_each" in s for s in statements) == 1, statements
    assert conn.execute("SELECT id, limit_key FROM jobs ORDER BY rowid").fetchall() == [
        (rows[0].id, "A"), (rows[1].id, None), (rows[2].id, "B")]
