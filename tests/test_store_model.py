"""A hypothesis state machine drives the real store operations the Ledger runs (synchronous,
on a real SQLite file) and compares them with a plain model of the design's state machine."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import attrs
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pipeline import states
from pipeline.backends import NewJob, Settlement
from pipeline.backends.sqlite import migrations, queries, store
from pipeline.clock import format_ts
from pipeline.ids import UUID7Factory
from pipeline.states import Transition

BASE = 10.0  # backoff base, seconds
LEASE = 30.0
START = 1_800_000_000.0


class NoJitter:
    """The model needs the store's exact run_after: jitter fixed at 1.0."""

    def uniform(self, a: float, b: float) -> float:
        return 1.0


@attrs.define
class ModelJob:
    status: str
    attempts: int
    max_attempts: int
    run_after: float
    token: int = 0
    lease_expires: float = 0.0
    permanent: bool = False


@attrs.frozen
class Held:
    id: str
    token: int
    attempts: int
    max_attempts: int


class StoreVsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.conn = store.connect(Path(self.tmp.name) / "model.db", synchronous="normal")
        migrations.migrate(self.conn)
        self.now = START
        self.model: dict[str, ModelJob] = {}
        self.held: list[Held] = []  # every lease ever handed out, stale ones included
        self.new_id = UUID7Factory()

    def teardown(self) -> None:
        try:
            self._drain_to_the_end()
        finally:
            self.conn.close()
            self.tmp.cleanup()

    @property
    def ts(self) -> str:
        return format_ts(self.now)

    # -- rules ------------------------------------------------------------------------------

    @rule(max_attempts=st.integers(1, 4), delay=st.sampled_from([0.0, 0.0, 5.0, 60.0]))
    def enqueue(self, max_attempts: int, delay: float) -> None:
        row = NewJob(self.new_id(), "t", "{}", max_attempts, format_ts(self.now + delay), 5, self.ts)
        with store.write_transaction(self.conn):
            store.insert_jobs(self.conn, [row])
        self.model[row.id] = ModelJob("pending", 0, max_attempts, self.now + delay)

    @rule(limit=st.integers(1, 3))
    def claim(self, limit: int) -> None:
        with store.write_transaction(self.conn):
            rows = store.claim(self.conn, "t", limit, now=self.ts, owner="w", expires=format_ts(self.now + LEASE))
        due = sorted(
            (job.run_after, format_ts(job.run_after), job_id)
            for job_id, job in self.model.items()
            if job.status == "pending" and format_ts(job.run_after) <= self.ts
        )
        expected = [job_id for _, _, job_id in due[:limit]]
        assert sorted(r.id for r in rows) == sorted(expected)
        for r in rows:
            job = self.model[r.id]
            job.status, job.attempts, job.token = "running", job.attempts + 1, job.token + 1
            job.lease_expires = self.now + LEASE
            assert (r.attempts, r.lease_token) == (job.attempts, job.token)
            self.held.append(Held(r.id, r.lease_token, r.attempts, r.max_attempts))

    def _current(self, lease: Held) -> bool:
        job = self.model[lease.id]
        return job.status == "running" and job.token == lease.token

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self.held))
        current = self._current(lease)
        with store.write_transaction(self.conn):
            changed = store.settle(self.conn, [Settlement(lease.id, lease.token, Transition.SUCCEED)], now=self.ts)
        assert changed == (1 if current else 0), "a stale lease must change nothing"
        if current:
            self.model[lease.id].status = "completed"

    @precondition(lambda self: self.held)
    @rule(data=st.data(), permanent=st.booleans())
    def fail(self, data: st.DataObject, permanent: bool) -> None:
        lease = data.draw(st.sampled_from(self.held))
        current = self._current(lease)
        decision = states.settle_failure(
            attempts=lease.attempts, max_attempts=lease.max_attempts, permanent=permanent, base_seconds=BASE, rng=NoJitter()
        )
        with store.write_transaction(self.conn):
            changed = store.settle(
                self.conn, [Settlement(lease.id, lease.token, decision.transition, "boom", decision.delay)], now=self.ts
            )
        assert changed == (1 if current else 0), "a stale lease must change nothing"
        if current:
            job = self.model[lease.id]
            if permanent or job.attempts >= job.max_attempts:
                job.status, job.permanent = "dead", permanent
            else:
                job.status, job.run_after = "pending", self.now + BASE * 2 ** (job.attempts - 1)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self.held))
        current = self._current(lease)
        with store.write_transaction(self.conn):
            changed = store.settle(self.conn, [Settlement(lease.id, lease.token, Transition.RELEASE)], now=self.ts)
        assert changed == (1 if current else 0)
        if current:
            job = self.model[lease.id]
            job.status, job.attempts, job.run_after = "pending", job.attempts - 1, self.now

    @rule(seconds=st.sampled_from([1.0, 10.0, 31.0, 100.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @rule()
    def rescue_expired_leases(self) -> None:
        with store.write_transaction(self.conn):
            rescued = dict(store.rescue_expired(self.conn, now=self.ts, base_seconds=BASE, rng=NoJitter()))
        expected = {}
        for job_id, job in self.model.items():
            if job.status == "running" and format_ts(job.lease_expires) < self.ts:
                if job.attempts >= job.max_attempts:
                    job.status = "dead"
                    expected[job_id] = Transition.RESCUE_BURY
                else:
                    job.status, job.run_after = "pending", self.now + BASE * 2 ** (job.attempts - 1)
                    expected[job_id] = Transition.RESCUE
        assert rescued == expected

    @precondition(lambda self: any(j.status == "dead" for j in self.model.values()))
    @rule(data=st.data())
    def admin_retry(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(i for i, j in self.model.items() if j.status == "dead")))
        with store.write_transaction(self.conn):
            record = queries.revive(self.conn, job_id, now=self.ts)
        assert (record.status, record.attempts) == ("pending", 0)
        job = self.model[job_id]
        job.status, job.attempts, job.run_after, job.permanent = "pending", 0, self.now, False

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def same_states(self) -> None:
        rows = {r[0]: r[1:] for r in self.conn.execute("SELECT id, status, attempts, max_attempts FROM jobs")}
        assert set(rows) == set(self.model), "no job appears or disappears"
        for job_id, job in self.model.items():
            status, attempts, max_attempts = rows[job_id]
            assert status == job.status  # exactly one state, the model's
            assert attempts == job.attempts
            assert attempts <= max_attempts
            if status == "dead":
                assert job.permanent or attempts == max_attempts or job.attempts == max_attempts

    def _drain_to_the_end(self) -> None:
        """With handlers that succeed and time running far enough, every job ends completed or dead."""
        for _ in range(20):
            self.now += 10_000
            with store.write_transaction(self.conn):
                store.rescue_expired(self.conn, now=self.ts, base_seconds=BASE, rng=NoJitter())
                rows = store.claim(self.conn, "t", 1000, now=self.ts, owner="w", expires=format_ts(self.now + LEASE))
                store.settle(self.conn, [Settlement(r.id, r.lease_token, Transition.SUCCEED) for r in rows], now=self.ts)
        statuses = {s for (s,) in self.conn.execute("SELECT DISTINCT status FROM jobs")}
        assert statuses <= {"completed", "dead"}, statuses


TestStoreVsModel = StoreVsModel.TestCase
TestStoreVsModel.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_claim_uses_the_claim_index_without_sorting(tmp_path: Path) -> None:
    conn = store.connect(tmp_path / "plan.db")
    migrations.migrate(conn)
    plan = conn.execute("EXPLAIN QUERY PLAN " + store._CLAIM, {"owner": "o", "expires": "x", "now": "y", "job_type": "t", "limit": 5}).fetchall()
    details = " | ".join(row[-1] for row in plan)
    assert "idx_jobs_claim" in details, details
    assert "TEMP B-TREE" not in details, f"the claim query sorts: {details}"


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "new.db")
    migrations.migrate(conn)
    conn.execute("INSERT INTO schema_migrations VALUES (?, 'future', 'x')", (migrations.LATEST + 1,))
    conn.commit()
    try:
        migrations.migrate(conn)
    except Exception as exc:  # noqa: BLE001 - checked below
        assert type(exc).__name__ == "SchemaTooNew"
        assert f"schema version {migrations.LATEST + 1}" in str(exc) and "upgrade" in str(exc)
    else:
        raise AssertionError("a newer schema was accepted")
