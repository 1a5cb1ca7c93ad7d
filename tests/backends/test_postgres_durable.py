"""Durable functions (issue 35) on Postgres, beyond the conformance suite (test_durable_store.py): a
schema of version 10 upgraded in place; the migration on a big table, which never holds up enqueues
for long (it waits a bounded time for the table's lock, and builds its indexes CONCURRENTLY); a signal
racing a SUSPEND on two connections, which never leaves the job suspended with its signal unconsumed;
the NOTIFY that wakes the Pollers when a job is woken."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from pipeline import Config
from pipeline.backends import Settlement, open_backend
from pipeline.backends.base import CANCELLING, FOREVER, StepRecord
from pipeline.backends.postgres import db, durable, limits, queries, schema, store
from pipeline.errors import SignalKeyUsed, UsageError
from pipeline.states import Transition

from .kit import LONG, flow_job, job, record, ts
from .stores import migrated_postgres_store, postgres_store

OWNER = "owner-a"


def connect(config: Config) -> psycopg.Connection[Any]:
    """A connection of the store's own kind (autocommit, times as text)."""
    return db.connect(config.database_url, "test")


def migrate_to(conn: psycopg.Connection[Any], version: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The empty schema brought to ``version``, as a pipeline of that version left it."""
    with monkeypatch.context() as m:
        m.setattr(schema, "MIGRATIONS", [mig for mig in schema.MIGRATIONS if mig[0] <= version])
        m.setattr(schema, "LATEST", version)
        assert schema.migrate(conn, "test") == list(range(1, version + 1))


def running(conn: psycopg.Connection[Any], job_type: str = "t", **fields: Any) -> tuple[str, int]:
    """A new job of its own type, claimed: (id, token)."""
    row = job(job_type, **fields)
    store.insert_jobs(conn, [row], notify=False)
    (lease,) = limits.claim(conn, {job_type: 1}, owner=OWNER, lease_seconds=LONG)
    assert lease.id == row.id
    return lease.id, lease.token


def suspend(job_id: str, token: int, *, awaiting: str | None = "go", delay: float = math.inf) -> Settlement:
    return Settlement(job_id, token, Transition.SUSPEND, delay=delay, awaiting=awaiting,
                      step=StepRecord("wait:go", "waiting", None, ts()))


def state(conn: psycopg.Connection[Any], job_id: str) -> tuple[str, str | None, int]:
    """The job's status, the signal it awaits, and how many of its 'go' signals are unconsumed."""
    found = queries.get_job(conn, job_id)
    assert found is not None
    (unconsumed,) = conn.execute("SELECT count(*) FROM job_signals WHERE job_id = %s AND name = 'go' AND NOT consumed",
                                 (job_id,)).fetchone()  # type: ignore[misc]
    return found.status, found.awaiting_signal, int(unconsumed)


def waits_for_a_lock(watcher: psycopg.Connection[Any], pid: int, *, within: float = 5.0) -> str:
    """Once the server session ``pid`` waits for a lock: the statement it waits in."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        row = watcher.execute("SELECT wait_event_type, query FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
        if row is not None and row[0] == "Lock":
            return str(row[1])
        time.sleep(0.005)
    raise AssertionError(f"session {pid} did not wait for a lock within {within} s")


class Background(threading.Thread):
    """``fn()`` in a thread; its answer (or what it raised) by :meth:`result`."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self._fn = fn
        self._out: list[Any] = []
        self._err: list[BaseException] = []
        self.start()

    def run(self) -> None:
        try:
            self._out.append(self._fn())
        except BaseException as exc:  # noqa: BLE001 - handed to result()
            self._err.append(exc)

    def result(self, timeout: float = 10.0) -> Any:
        self.join(timeout)
        assert not self.is_alive(), "the thread did not end"
        if self._err:
            raise self._err[0]
        return self._out[0]


# -- the migration ------------------------------------------------------------------------------------


def check_upgraded(conn: psycopg.Connection[Any]) -> None:
    """The schema at the latest version, as a fresh one is: versions 11 and 12 recorded, jobs_unique with
    'suspended' in its predicate (and no leftover), jobs_suspended valid, the status check validated."""
    versions = [v for (v,) in conn.execute(f"SELECT version FROM {schema.TABLE} ORDER BY version")]
    assert versions == list(range(1, schema.LATEST + 1)) and schema.LATEST >= 12
    indexes = dict(conn.execute(
        "SELECT c.relname, pg_get_indexdef(i.indexrelid) || CASE WHEN i.indisvalid THEN '' ELSE ' INVALID' END "
        "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = 'jobs'::regclass").fetchall())
    assert "'suspended'" in indexes["jobs_unique"] and "lease_token" in indexes["jobs_unique"], indexes["jobs_unique"]
    assert "jobs_unique_12" not in indexes
    assert indexes["jobs_suspended"].endswith("WHERE (status = 'suspended'::text)"), indexes["jobs_suspended"]
    assert not any(text.endswith("INVALID") for text in indexes.values()), indexes
    row = conn.execute("SELECT convalidated, pg_get_constraintdef(oid) FROM pg_constraint "
                       "WHERE conrelid = 'jobs'::regclass AND conname = 'jobs_status_check'").fetchone()
    assert row is not None and row[0] and "'suspended'" in row[1], row


_OLD_RUNNING = ("INSERT INTO jobs (id, job_type, payload, status, attempts, run_after, unique_key, lease_token, lease_owner, "
                "lease_expires_at, started_at) VALUES (%s, 't', '{}', 'running', 1, now(), 'K', 4, 'w', "
                "now() + interval '1 hour', now())")


async def test_a_schema_of_version_10_upgrades_and_its_running_job_suspends_holding_its_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with postgres_store(tmp_path) as config:
        with connect(config) as conn:
            migrate_to(conn, 10, monkeypatch)
            old = job().id
            conn.execute(_OLD_RUNNING, (old,))
        async with open_backend(config) as backend:  # migrates (a small table: in the one transaction)
            step = StepRecord("charge", "completed", '"ch_1"', ts(), ts())
            assert await backend.settle([Settlement(old, 4, Transition.STEP, step=step),
                                         Settlement(old, 4, Transition.SUSPEND, delay=math.inf, awaiting="go")]) == [True, True]
            got = await record(backend, old)
            assert (got.status, got.attempts, got.run_after, got.awaiting_signal, got.steps) == (
                "suspended", 0, FOREVER, "go", (step,))
            assert await backend.insert([job(unique_key="K")]) == [old]  # held while suspended
            assert await backend.signal(old, "go", "1") == "woken"
        with connect(config) as conn:
            check_upgraded(conn)


def insert_now(config: Config, latencies: list[float], stop: threading.Event) -> int:
    """Enqueue as the Ledger does (its batch statement), one job at a time until ``stop``; each one's
    time in ``latencies``. How many."""
    n = 0
    with connect(config) as conn:
        while not stop.is_set():
            t0 = time.monotonic()
            store.write_batch(conn, [], [job("e")], notify=False)
            latencies.append(time.monotonic() - t0)
            n += 1
            time.sleep(0.005)
    return n


@contextmanager
def enqueuing(config: Config) -> Iterator[list[float]]:
    """Enqueues going on in a thread for the length of the block: their times."""
    latencies: list[float] = []
    stop = threading.Event()
    inserter = Background(lambda: insert_now(config, latencies, stop))
    try:
        yield latencies
    finally:
        stop.set()
    assert inserter.result() > 10


@contextmanager
def holding_the_table(config: Config) -> Iterator[psycopg.Connection[Any]]:
    """A transaction that wrote to the jobs table (a bulk load, a session idle in a transaction), open
    for the length of the block: it holds the table's ROW EXCLUSIVE lock."""
    with connect(config) as holder:
        with holder.transaction():
            store.insert_jobs(holder, [job("held")], notify=False)
            yield holder


async def test_the_migration_waits_for_the_tables_lock_a_bounded_time_and_enqueues_go_on_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # an ALTER TABLE waiting for its lock holds up every enqueue queued behind it: the migration waits at
    # most MIGRATION_LOCK_TIMEOUT at a time (lowered here), and the enqueues go on in between
    monkeypatch.setattr(schema, "MIGRATION_LOCK_TIMEOUT", 0.1)
    monkeypatch.setattr(schema, "MIGRATION_LOCK_PAUSE", 0.05)
    monkeypatch.setattr(schema, "ONLINE_ABOVE_BYTES", 0)  # a "big" table: version 12 is built online
    async with postgres_store(tmp_path) as config:
        def scenario() -> None:
            with connect(config) as conn, connect(config) as migrating:
                migrate_to(conn, 10, monkeypatch)
                conn.execute(_OLD_RUNNING, (job().id,))
                with enqueuing(config) as latencies:
                    with holding_the_table(config):
                        migration = Background(lambda: schema.migrate(migrating, "test"))
                        assert "ALTER TABLE" in waits_for_a_lock(conn, migrating.info.backend_pid)
                        time.sleep(0.8)
                    assert migration.result() == [11, 12]
                assert max(latencies) < 0.5, sorted(latencies)[-5:]
                check_upgraded(conn)

        await trio.to_thread.run_sync(scenario)


async def test_on_a_big_table_the_indexes_are_built_concurrently_while_enqueues_go_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the build waits for a transaction that wrote to the table, without holding up the enqueues (a plain
    # CREATE INDEX would hold them up until that transaction ends); keyed jobs keep their keys throughout
    monkeypatch.setattr(schema, "ONLINE_ABOVE_BYTES", 0)
    async with postgres_store(tmp_path) as config:
        def scenario() -> None:
            with connect(config) as conn, connect(config) as migrating:
                migrate_to(conn, 11, monkeypatch)  # (11: catalog changes only; 12 reads the table)
                keyed = job().id  # (inserted as a process of version 11 does: this one's keyed insert needs version 12)
                conn.execute("INSERT INTO jobs (id, job_type, payload, unique_key) VALUES (%s, 't', '{}', 'K')", (keyed,))
                store.insert_jobs(conn, [job() for _ in range(200)], notify=False)
                with enqueuing(config) as latencies:
                    with holding_the_table(config):
                        migration = Background(lambda: schema.migrate(migrating, "test"))
                        assert "CONCURRENTLY" in waits_for_a_lock(conn, migrating.info.backend_pid)
                        time.sleep(0.5)
                        assert migration.is_alive()
                    assert migration.result() == [12]
                assert max(latencies) < 0.3, sorted(latencies)[-5:]
                check_upgraded(conn)
                assert store.insert_jobs(conn, [job(unique_key="K")], notify=False) == [keyed]

        await trio.to_thread.run_sync(scenario)


@pytest.mark.parametrize("online", [True, False], ids=["big table", "small table"])
async def test_an_online_build_that_died_half_way_is_done_again_at_the_next_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, online: bool) -> None:
    # (the table may have shrunk since: then the next start builds it in its transaction)
    if online:
        monkeypatch.setattr(schema, "ONLINE_ABOVE_BYTES", 0)
    async with postgres_store(tmp_path) as config:
        def scenario() -> None:
            with connect(config) as conn:
                migrate_to(conn, 11, monkeypatch)
                store.insert_jobs(conn, [job(), job()], notify=False)
                # a CREATE INDEX CONCURRENTLY that failed leaves its index behind, invalid (here: refused)
                with pytest.raises(psycopg.errors.UniqueViolation):
                    conn.execute("CREATE UNIQUE INDEX CONCURRENTLY jobs_unique_12 ON jobs (job_type)")
                assert schema.migrate(conn, "test") == [12]
                check_upgraded(conn)
                assert schema.migrate(conn, "test") == []

        await trio.to_thread.run_sync(scenario)


# -- a signal racing a SUSPEND ------------------------------------------------------------------------------


async def test_a_signal_committed_while_a_suspend_waits_for_the_row_wakes_the_job(tmp_path: Path) -> None:
    # the signal's sender locks the job's row first; the SUSPEND's statement starts (its snapshot) before
    # the signal commits, waits for the row, then writes: it must still see the signal
    async with migrated_postgres_store(tmp_path) as config:
        def scenario() -> None:
            with connect(config) as conn, connect(config) as sender, connect(config) as settler:
                job_id, token = running(conn)
                with sender.transaction():
                    assert durable.send_signal(sender, job_id, "go", '"yes"') == "kept"  # running: kept
                    settling = Background(lambda: store.write_batch(settler, [suspend(job_id, token)], [], notify=False))
                    waits_for_a_lock(conn, settler.info.backend_pid)
                assert settling.result() == [True]
                assert state(conn, job_id) == ("pending", None, 1)

        await trio.to_thread.run_sync(scenario)


async def test_a_signal_sent_while_a_suspend_commits_wakes_the_job_itself(tmp_path: Path) -> None:
    async with migrated_postgres_store(tmp_path) as config:
        def scenario() -> None:
            with connect(config) as conn, connect(config) as sender, connect(config) as settler:
                job_id, token = running(conn)
                with settler.transaction():
                    assert store.write_batch(settler, [suspend(job_id, token)], [], notify=False) == [True]
                    sending = Background(lambda: durable.send_signal(sender, job_id, "go", '"yes"'))
                    waits_for_a_lock(conn, sender.info.backend_pid)
                assert sending.result() == "woken"
                assert state(conn, job_id) == ("pending", None, 1)

        await trio.to_thread.run_sync(scenario)


async def test_signals_racing_suspends_never_leave_a_job_suspended_with_its_signal_unconsumed(tmp_path: Path) -> None:
    async with migrated_postgres_store(tmp_path) as config:
        def scenario() -> list[str]:
            answers = []
            with connect(config) as conn, connect(config) as sender, connect(config) as settler:
                for _ in range(40):
                    job_id, token = running(conn)
                    together = threading.Barrier(2)

                    def settle(job_id: str = job_id, token: int = token, together: threading.Barrier = together) -> list[bool]:
                        together.wait()
                        return store.write_batch(settler, [suspend(job_id, token)], [], notify=False)

                    def send(job_id: str = job_id, together: threading.Barrier = together) -> str:
                        together.wait()
                        return durable.send_signal(sender, job_id, "go", None)

                    settling, sending = Background(settle), Background(send)
                    assert settling.result() == [True]
                    answers.append(sending.result())
                    assert state(conn, job_id) == ("pending", None, 1), answers[-1]
            return answers

        answers = await trio.to_thread.run_sync(scenario)
        assert set(answers) <= {"woken", "kept"}


# -- wake-ups -----------------------------------------------------------------------------------------------


def heard(listener: psycopg.Connection[Any], within: float) -> list[str]:
    """The payload of the first NOTIFY on the pipeline's channel, if one comes within ``within`` seconds."""
    return [n.payload for n in listener.notifies(timeout=within, stop_after=1) if n.channel == store.CHANNEL]


async def test_a_job_woken_by_its_signal_or_its_time_notifies_the_pollers(tmp_path: Path) -> None:
    async with migrated_postgres_store(tmp_path) as config:
        def scenario() -> None:
            with connect(config) as conn, connect(config) as listener:
                (schema_name,) = conn.execute("SELECT current_schema()").fetchone()  # type: ignore[misc]
                listener.execute(f"LISTEN {store.CHANNEL}")
                job_id, token = running(conn)
                assert store.write_batch(conn, [suspend(job_id, token)], [], notify=False) == [True]
                assert durable.send_signal(conn, job_id, "other", None) == "kept"
                assert heard(listener, 0.1) == []  # nothing became due
                assert durable.send_signal(conn, job_id, "go", None) == "woken"
                assert heard(listener, 2.0) == [schema_name]

                # a suspend that finds its signal sent already goes pending, and says so
                (lease,) = limits.claim(conn, {"t": 1}, owner=OWNER, lease_seconds=LONG)
                assert durable.send_signal(conn, job_id, "go", None) == "kept"
                assert store.write_batch(conn, [suspend(job_id, lease.token)], [], notify=False) == [True]
                assert state(conn, job_id)[0] == "pending"
                assert heard(listener, 2.0) == [schema_name]

                # a sleep whose time came, woken by wake_suspended
                (lease,) = limits.claim(conn, {"t": 1}, owner=OWNER, lease_seconds=LONG)
                assert store.write_batch(conn, [suspend(job_id, lease.token, awaiting=None, delay=0.0)], [],
                                         notify=False) == [True]
                assert heard(listener, 0.05) == []
                time.sleep(0.01)
                assert durable.wake_suspended(conn) == (1, None)
                assert heard(listener, 2.0) == [schema_name]

        await trio.to_thread.run_sync(scenario)


async def test_a_used_key_is_refused_as_used_even_once_the_job_has_finished(tmp_path: Path) -> None:
    # a signed link pressed again after its job ended says "used", not "finished" (the admin's 410, not 409)
    async with migrated_postgres_store(tmp_path) as config:
        def scenario() -> None:
            with connect(config) as conn:
                job_id, token = running(conn)
                assert durable.send_signal(conn, job_id, "go", None, key="link") == "kept"
                assert store.write_batch(conn, [Settlement(job_id, token, Transition.SUCCEED)], [], notify=False) == [True]
                with pytest.raises(SignalKeyUsed):
                    durable.send_signal(conn, job_id, "go", None, key="link")
                with pytest.raises(UsageError, match="is completed") as refused:
                    durable.send_signal(conn, job_id, "go", None, key="another")
                assert not isinstance(refused.value, SignalKeyUsed)

        await trio.to_thread.run_sync(scenario)


async def test_a_suspend_of_a_job_whose_cancel_was_requested_cancels_it_and_its_children(tmp_path: Path) -> None:
    # as a release or a snooze of it would: a cancel racing the job's own outcome leaves one final state
    async with migrated_postgres_store(tmp_path) as config, open_backend(config) as backend:
        row = job("p")
        child = flow_job("c", after=[row.id])
        await backend.insert([row])
        await backend.insert([child])
        (lease,) = await backend.claim({"p": 1}, owner=OWNER, lease_seconds=LONG)
        assert await backend.cancel([row.id], reason="test") == [CANCELLING]
        assert await backend.settle([suspend(lease.id, lease.token)]) == [True]
        got = await record(backend, row.id)
        assert (got.status, got.awaiting_signal, got.cancel_requested, got.attempts) == ("cancelled", None, False, 0)
        assert got.error == f"{store.STOPPED}suspended"  # (the text of every store)
        assert (await record(backend, child.id)).status == "cancelled"
