"""Workflows (issue 24) on Postgres only: the upgrade of a schema made at version 7; a parent's outcome
racing an insert that names it from another connection (each order forced, then many free races); the
parents of one child ended by K connections at once (counted once each, woken once, no deadlock); a
wake and only a wake sends NOTIFY; an expired parent that a claim saw; the caller's transaction (the
outbox); the statements a plain job pays for and those of a parent; and the indexes the workflow
statements read through. What every store promises is tests/backends/test_workflows.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import psycopg
import pytest
import trio

import pipeline.backends.postgres as postgres
from pipeline import Config
from pipeline.backends import Backend, Lease, open_backend
from pipeline.backends.base import Settlement, expired_error, parent_failed
from pipeline.backends.postgres import graph, outbox, queries, schema, store, worker
from pipeline.backends.postgres.db import connect
from pipeline.states import Transition

from .kit import LONG, bury, drain_chain, flow_job, job, record, settle_one, succeed, ts
from .stores import BACKENDS, postgres_store
from .test_postgres_control import _plan, _walk, connection
from .test_postgres_limits import recording, rollback, waiting_for_a_lock

pytestmark = pytest.mark.skipif("postgres" not in BACKENDS, reason="no postgres entry")


# -- the upgrade ---------------------------------------------------------------------------------------

_V7_ROWS = """
INSERT INTO jobs (id, job_type, payload, status, attempts, run_after, lease_token, lease_owner, lease_expires_at,
                  started_at, unique_key, result)
VALUES ('00000000-0000-7000-8000-000000000001', 't', '{}', 'pending', 0, now(), 0, NULL, NULL, NULL, 'k', NULL),
       ('00000000-0000-7000-8000-000000000002', 'r', '{}', 'running', 1, now(), 1, 'old:1', now() + interval '1 hour',
        now(), NULL, NULL),
       ('00000000-0000-7000-8000-000000000003', 'c', '{}', 'completed', 1, now(), 1, NULL, NULL, NULL, NULL, '"c"')
"""
PENDING, RUNNING, COMPLETED = (f"00000000-0000-7000-8000-00000000000{n}" for n in range(1, 4))


async def test_a_schema_of_version_7_is_upgraded_and_its_jobs_take_part_in_workflows(tmp_path: Path) -> None:
    async with postgres_store(tmp_path) as config:
        with connection(config) as conn:
            with mock.patch.object(schema, "MIGRATIONS", schema.MIGRATIONS[:7]), mock.patch.object(schema, "LATEST", 7):
                assert schema.migrate(conn, "test") == [1, 2, 3, 4, 5, 6, 7]
            conn.execute(_V7_ROWS)
            with pytest.raises(psycopg.errors.CheckViolation):  # version 7 knows no waiting status
                conn.execute("UPDATE jobs SET status = 'waiting' WHERE id = %s", (PENDING,))
            assert schema.migrate(conn, "test") == list(range(8, schema.LATEST + 1))
            assert schema.migrate(conn, "test") == []
            indexes = dict(conn.execute("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()")
                           .fetchall())
            assert "'waiting'" in indexes["jobs_unique"] and "unique_token = lease_token" in indexes["jobs_unique"]
            assert {"jobs_batch", "job_edges_pkey", "job_edges_child", "job_edges_uncounted", "batches_pkey"} <= set(indexes)
            assert "jobs_unique_8" not in indexes
            # the old rows gained nothing but NULLs
            assert conn.execute("SELECT count(*) FROM jobs WHERE waiting_for IS NULL AND has_children IS NULL "
                                "AND runs_on_parent_failure IS NULL AND batch_id IS NULL").fetchone() == (3,)

        async with open_backend(config) as backend:
            assert await backend.insert([job(unique_key="k")]) == [PENDING]  # the old pending job holds its key
            child = flow_job("w", after=[RUNNING, COMPLETED], unique_key="w")
            assert await backend.insert([child]) == [child.id]
            got = await record(backend, child.id)
            assert (got.status, got.waiting_for, got.parents) == ("waiting", 1, (RUNNING, COMPLETED))
            assert await backend.insert([job("w", unique_key="w")]) == [child.id]  # a waiting job holds its key
            assert (await record(backend, COMPLETED)).children == (child.id,)
            # the job running since before the upgrade ends under its old lease, and wakes the child
            assert await backend.settle([Settlement(RUNNING, 1, Transition.SUCCEED, result='"r"')]) == [True]
            got = await record(backend, child.id)
            assert (got.status, got.waiting_for) == ("pending", 0)
            assert {p: r.result for p, r in (await backend.parent_results(child.id)).items()} == {RUNNING: '"r"', COMPLETED: '"c"'}


# -- races between connections ---------------------------------------------------------------------------


@contextmanager
def connections(config: Config, n: int) -> Iterator[list[psycopg.Connection[Any]]]:
    opened = [connect(config.database_url, "test") for _ in range(n)]
    try:
        yield opened
    finally:
        for conn in opened:
            conn.close()


def at_once(calls: list[Callable[[], Any]]) -> list[Any]:
    """Each call in a thread of its own, released together; their answers, in order."""
    barrier = threading.Barrier(len(calls))
    answers: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            barrier.wait()
            answers[n] = calls[n]()
        except BaseException as exc:  # (re-raised below)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return answers


def edges_of(conn: psycopg.Connection[Any], child: str) -> list[tuple[str, bool]]:
    return [(parent, counted) for parent, counted in conn.execute(
        "SELECT parent_id, counted FROM job_edges WHERE child_id = %s ORDER BY position", (child,))]


async def _running(backend: Backend, n: int, job_type: str = "p") -> list[Lease]:
    await backend.insert([job(job_type) for _ in range(n)])
    return await backend.claim({job_type: n}, owner="w", lease_seconds=LONG)


async def test_an_outcome_racing_an_insert_that_names_its_job_counts_the_edge_once(tmp_path: Path) -> None:
    """The insert locks the parent (FOR UPDATE) and the outcome's update waits for it, or the other way
    round: whichever commits first, the second sees it. Forced both ways (one holds its transaction open
    until the other waits for its lock), then 30 free races of a success or a burial against an insert."""
    async with postgres_store(tmp_path) as config, open_backend(config) as backend:
        with connection(config) as inserter, connection(config) as worker:
            def insert(child: Any) -> Callable[[], list[str]]:  # (in a transaction of its own, as the backend's)
                return lambda: graph.insert_jobs(inserter, [child])

            def settle(outcome: Settlement) -> Callable[[], list[bool]]:
                return lambda: store.write_batch(worker, [outcome], [], notify=False)

            # the insert first: the outcome waits for its commit, then finds the child and wakes it
            (lease,) = await _running(backend, 1)
            child = flow_job("c", after=[lease.id])
            inserter.execute("BEGIN")
            try:
                assert insert(child)() == [child.id]  # (a savepoint: its locks are held until the COMMIT below)
                answer: list[Any] = []
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(lambda: trio.to_thread.run_sync(lambda: answer.append(settle(succeed(lease))())))
                    await waiting_for_a_lock(inserter, worker.info.backend_pid)
                    inserter.execute("COMMIT")
            finally:
                rollback(inserter)
            assert answer == [[True]]
            assert ((await record(backend, child.id)).status, edges_of(worker, child.id)) == ("pending", [(lease.id, True)])

            # the outcome first: the insert waits for its commit, then finds the parent dead
            (lease,) = await _running(backend, 1)
            child = flow_job("c", after=[lease.id])
            worker.execute("BEGIN")
            try:
                assert settle(bury(lease))() == [True]
                inserted: list[Any] = []
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(lambda: trio.to_thread.run_sync(lambda: inserted.append(insert(child)())))
                    await waiting_for_a_lock(worker, inserter.info.backend_pid)
                    worker.execute("COMMIT")
            finally:
                rollback(worker)
            got = await record(backend, child.id)
            assert (got.status, got.error, got.waiting_for) == ("cancelled", parent_failed(lease.id, "dead"), 0)
            assert edges_of(worker, child.id) == [(lease.id, True)]

            # free races
            leases = await _running(backend, 30)
            children = [flow_job("c", after=[lease.id]) for lease in leases]
            for n, (lease, child) in enumerate(zip(leases, children)):
                outcome = succeed(lease) if n % 2 else bury(lease)
                assert await trio.to_thread.run_sync(at_once, [settle(outcome), insert(child)]) == [[True], [child.id]]
            for n, (lease, child) in enumerate(zip(leases, children)):
                got = await record(backend, child.id)
                assert (got.status, got.waiting_for) == ("pending" if n % 2 else "cancelled", 0), n
                assert edges_of(worker, child.id) == [(lease.id, True)]


@contextmanager
def listening(config: Config) -> Iterator[Callable[[], list[str]]]:
    """A connection that LISTENs on the store's channel; yields what takes the notifications that
    reached it since the last take (each its schema's name)."""
    heard: list[str] = []
    with connection(config) as listener:
        listener.add_notify_handler(lambda note: heard.append(note.payload))
        listener.execute(f"LISTEN {store.CHANNEL}")

        def take() -> list[str]:
            listener.execute("SELECT 1")  # (they are read with a statement's answer)
            taken = heard[:]
            heard.clear()
            return taken

        yield take


async def test_the_parents_of_a_child_ended_by_k_connections_at_once_count_once_and_wake_it_once(
    tmp_path: Path,
) -> None:
    """8 parents of two children (the second waits under "run"), each parent's success written from a
    connection of its own at once, 4 times: every edge counts once, both children wake (one
    transaction wakes both: each takes the children's locks in id order), one NOTIFY a round, and
    Postgres broke no deadlock."""
    k = 8
    async with postgres_store(tmp_path) as config, open_backend(config) as backend:
        with connections(config, k) as workers, connection(config) as conn, listening(config) as notified:
            (schema_name,), = conn.execute("SELECT current_schema()").fetchall()
            (deadlocks,), = conn.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
            for _ in range(4):
                leases = await _running(backend, k)
                children = [flow_job("c", after=[lease.id for lease in leases]),
                            flow_job("c", after=[lease.id for lease in leases], on_parent_failure="run")]
                await backend.insert(children)
                notified()

                def settle(conn: psycopg.Connection[Any], lease: Lease) -> Callable[[], list[bool]]:
                    return lambda: store.write_batch(conn, [succeed(lease)], [], notify=False)

                answers = await trio.to_thread.run_sync(at_once, [settle(c, lease) for c, lease in zip(workers, leases)])
                assert answers == [[True]] * k
                for child in children:
                    got = await record(backend, child.id)
                    assert (got.status, got.waiting_for) == ("pending", 0)
                    assert edges_of(conn, child.id) == [(lease.id, True) for lease in leases]
                assert notified() == [schema_name]
            for conn in workers:  # each session's counters reach the statistics now, not within a second
                conn.execute("SELECT pg_stat_force_next_flush()")
                conn.execute("SELECT 1")
            conn.execute("SELECT pg_stat_clear_snapshot()")
            assert conn.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
                                    ).fetchone() == (deadlocks,)


async def test_a_wake_and_only_a_wake_notifies(tmp_path: Path) -> None:
    """A parent's end that leaves its child waiting, or cancels it, sends nothing; the one that wakes
    it sends NOTIFY in its transaction (delivered at the commit), as the sweep's wake does."""
    async with postgres_store(tmp_path) as config, open_backend(config) as backend:
        with listening(config) as notified, connection(config) as conn:
            first, second, doomed = await _running(backend, 3)
            child, victim = flow_job("c", after=[first.id, second.id]), flow_job("c", after=[doomed.id])
            await backend.insert([child, victim])
            notified()
            assert store.write_batch(conn, [succeed(first), bury(doomed)], [], notify=False) == [True, True]
            assert notified() == []
            assert (await record(backend, victim.id)).status == "cancelled"
            conn.execute("BEGIN")
            assert store.write_batch(conn, [succeed(second)], [], notify=False) == [True]
            assert notified() == []  # not before the commit
            conn.execute("COMMIT")
            assert len(notified()) == 1
            # the sweep's wake: a waiting job with nothing left to count (set so by hand)
            stuck = flow_job("c", after=[(await _running(backend, 1))[0].id])
            await backend.insert([stuck])
            conn.execute("UPDATE jobs SET waiting_for = 0 WHERE id = %s", (stuck.id,))
            notified()
            assert await backend.rescue_waiting() == 1
            assert len(notified()) == 1 and (await record(backend, stuck.id)).status == "pending"


async def test_a_long_bulk_load_holds_no_lock_on_the_parents_it_names(tmp_path: Path) -> None:
    """A bulk load is one transaction however long its iterable takes: the parents its rows name are
    read without a lock, and locked only just before its commit. A parent that ended meanwhile (its
    outcome written at once, under a lock_timeout) has its edge applied then; one deleted meanwhile
    (at once too) cancels its child, as a delete does."""
    async with postgres_store(tmp_path) as config, open_backend(config) as backend:
        early, late = await _running(backend, 2)
        doomed = job("d")
        await backend.insert([doomed])
        waits, done = flow_job("c", after=[early.id]), flow_job("c", after=[late.id])
        orphan = flow_job("c", after=[doomed.id])
        more, stalled = threading.Event(), threading.Event()

        def rows() -> Iterator[Any]:
            yield job()
            yield from (waits, done, orphan)
            stalled.set()
            more.wait(10)  # the load stalls here, its children inserted (a chunk of one: below)
            yield job()

        async with trio.open_nursery() as nursery:
            loaded: list[int] = []
            with mock.patch.object(postgres, "KEYED_CHUNK", 1):
                nursery.start_soon(lambda: _load(backend, rows(), loaded))
                with connection(config) as conn:
                    with trio.fail_after(10):
                        while not stalled.is_set():  # (edges are written a chunk at a time: until the orphan's)
                            await trio.sleep(0.01)
                        while conn.execute("SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                                           "WHERE a.wait_event = 'ClientRead' AND l.relation = 'job_edges'::regclass"
                                           ).fetchone() == (0,):
                            await trio.sleep(0.01)  # (the load has written edges, and waits for its next row)
                    conn.execute("SET lock_timeout = '1s'")
                    assert store.write_batch(conn, [succeed(late)], [], notify=False) == [True]
                    queries.delete_job(conn, doomed.id)
                more.set()
        assert loaded == [5]
        assert [(await record(backend, r.id)).status for r in (waits, done)] == ["waiting", "pending"]
        got = await record(backend, orphan.id)
        assert (got.status, got.error, got.parents) == ("cancelled", parent_failed(doomed.id, "deleted"), ())
        assert await settle_one(backend, succeed(early))
        assert (await record(backend, waits.id)).status == "pending"


async def _load(backend: Backend, rows: Iterator[Any], loaded: list[int]) -> None:
    loaded.append(await backend.bulk_insert(rows))


async def test_an_insert_that_held_a_pending_parent_a_claim_skipped_notifies(tmp_path: Path) -> None:
    """The insert locks the parents it names; a claim meanwhile skips a pending one (SKIP LOCKED) and
    would look again only at its next poll: the insert's commit NOTIFYs, though its child waits."""
    async with postgres_store(tmp_path) as config, open_backend(config) as backend:
        parent = job()
        await backend.insert([parent])
        with connection(config) as inserter, connection(config) as poller, listening(config) as notified:
            inserter.execute("BEGIN")
            try:
                assert graph.insert_jobs(inserter, [flow_job("c", after=[parent.id])]) != []
                assert worker.claim(poller, {"t": 1}, owner="w", lease_seconds=LONG) == []  # skipped, locked
                inserter.execute("COMMIT")
            finally:
                rollback(inserter)
            assert len(notified()) == 1
            assert [lease.id for lease in worker.claim(poller, {"t": 1}, owner="w", lease_seconds=LONG)] == [parent.id]


# -- what a claim's statement leaves -----------------------------------------------------------------------


async def test_an_expired_parent_a_claim_sees_is_ended_with_its_edges_at_once(tmp_path: Path) -> None:
    """The claim's statement commits alone, so it ends only expired jobs without children; it sees
    an expired parent (a row of NULLs, store._PARKED) and ends it at once in a transaction that
    cancels its waiting child. Plain expired jobs beside it end in the claim's statement."""
    async with postgres_store(tmp_path) as config, open_backend(config) as backend:
        parent, plain = job(expires_at=ts(-1.0)), job(expires_at=ts(-1.0))
        child = flow_job("c", after=[parent.id])
        await backend.insert([parent, plain, child])
        with connection(config) as conn:
            parked = conn.execute(store._CLAIM, {"types": ["t"], "limits": [5], "starts": [5], "owner": "w",
                                                 "lease": LONG}).fetchall()
            assert parked == [(None,) * 12]
            assert (await record(backend, plain.id)).status == "cancelled"
            assert (await record(backend, parent.id)).status == "pending"  # left to the claim's next step
        assert await backend.claim({"t": 5}, owner="w", lease_seconds=LONG) == []
        got = await record(backend, parent.id)
        assert (got.status, got.error) == ("cancelled", expired_error(parent.expires_at))  # type: ignore[arg-type]
        got = await record(backend, child.id)
        assert (got.status, got.error) == ("cancelled", parent_failed(parent.id, "cancelled"))


# -- the caller's transaction -------------------------------------------------------------------------------


async def test_the_outbox_takes_a_chain_and_a_parent_outside_the_call_without_locking_it(tmp_path: Path) -> None:
    async with postgres_store(tmp_path) as config, open_backend(config) as backend:
        existing = job()
        await backend.insert([existing])
        with connection(config) as conn:
            first = job("a")
            second = flow_job("b", after=[first.id])
            third = flow_job("b", after=[second.id])
            conn.execute("BEGIN")
            assert outbox.insert_in_transaction(conn, [first, second, third]) == [first.id, second.id, third.id]
            conn.execute("ROLLBACK")
            assert await backend.get(first.id) is None  # the caller's rollback took it all
            with conn.transaction():
                outbox.insert_in_transaction(conn, [first, second, third])
            assert [(await record(backend, r.id)).status for r in (first, second, third)] == ["pending", "waiting", "waiting"]
            # a parent outside the call (issue 32, item 8): read, not locked (its outcome would wait for the
            # caller's commit); the clients confirm it after the commit (tests/test_round4_workflows.py)
            conn.execute("BEGIN")
            outbox.insert_in_transaction(conn, [job("d"), flow_job("d", after=[existing.id])])
            assert conn.execute("SELECT count(*) FROM jobs WHERE job_type = 'd'").fetchone() == (2,)
            conn.execute("ROLLBACK")


# -- what a plain job pays -----------------------------------------------------------------------------------


async def test_a_plain_outcome_is_the_one_statement_and_a_parents_takes_the_edges_path(tmp_path: Path) -> None:
    """A batch of outcomes of jobs without children is store.BATCH_SETTLE alone (a job with children is
    left out of it by a condition on rows it reads anyway); a parent's outcome is then written by
    settle_parents, whose one statement writes it and applies its edges (schema version 9's function)."""
    async with postgres_store(tmp_path) as config, open_backend(config) as backend:
        plain, parent = await _running(backend, 2)
        child = flow_job("c", after=[parent.id])
        await backend.insert([child])
        with recording(config) as conn:
            assert store.write_batch(conn, [succeed(plain)], [], notify=False) == [True]
            assert conn.statements == [store.BATCH_SETTLE]
            conn.statements.clear()
            assert store.write_batch(conn, [succeed(parent)], [], notify=False) == [True]
            assert conn.statements == [store.BATCH_SETTLE, store.SETTLE_AND_APPLY]
        assert (await record(backend, child.id)).status == "pending"


# -- the indexes ------------------------------------------------------------------------------------------------

# 20,000 jobs of every status, a tenth of them in 1,000 batches; 20,000 edges, a tenth not counted
_FILL = """
INSERT INTO jobs (id, job_type, payload, status, updated_at, waiting_for, has_children, batch_id, batch_position,
                  expires_at)
SELECT 'j' || lpad(g::text, 6, '0'), 't' || g % 5, '{}',
       (ARRAY['completed', 'dead', 'cancelled', 'pending', 'running', 'waiting'])[1 + g % 6],
       now() - (g % 5000) * interval '1 minute', CASE WHEN g % 2 = 0 THEN g % 3 END, g % 2 = 1 OR NULL,
       CASE WHEN g % 10 = 0 THEN 'b' || g / 10 % 1000 END, g, CASE WHEN g % 6 = 3 THEN now() + interval '1 day' END
  FROM generate_series(1, 20000) g;
INSERT INTO job_edges (parent_id, child_id, position, counted)
SELECT 'j' || lpad((2 * (g % 10000) + 1)::text, 6, '0'), 'j' || lpad((2 * (g / 2 % 10000) + 2)::text, 6, '0'),
       g % 7, g % 10 <> 0
  FROM generate_series(1, 20000) g
ON CONFLICT DO NOTHING;
INSERT INTO batches (id, callback_id, created_at) SELECT 'b' || g, NULL, now() FROM generate_series(0, 999) g;
"""


class _RolledBack(Exception):
    pass


async def test_the_workflow_statements_read_through_their_indexes(tmp_path: Path) -> None:
    """On 20,000 jobs and 20,000 edges (statistics gathered): each statement of the graph reads the index
    made for it, and none reads a table whole."""
    async with postgres_store(tmp_path) as config, open_backend(config):
        with connection(config) as conn:
            conn.execute(_FILL)
            conn.execute("ANALYZE")
            ids = {"ids": ["j000011", "j000013"]}
            # the statements inside the function of version 9, planned as it runs them (auto_explain's
            # plans of nested statements, sent to this session as notices), in a transaction rolled back
            plans: list[str] = []
            conn.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
            with pytest.raises(_RolledBack), conn.transaction():
                conn.execute("LOAD 'auto_explain'")
                conn.execute("SET LOCAL auto_explain.log_min_duration = 0")
                conn.execute("SET LOCAL auto_explain.log_nested_statements = on")
                conn.execute("SET LOCAL auto_explain.log_level = notice")
                conn.execute("SET LOCAL auto_explain.log_format = json")
                conn.execute("SET LOCAL client_min_messages = notice")
                # (parents with edges not counted yet: g % 10 = 0 in _FILL)
                conn.execute(store._APPLY_EDGES, {"parents": ["j000021", "j000041"], "hows": ["completed", "dead"], "e_parents": [],
                                                  "e_children": [], "e_hows": [], "notify": False})
                raise _RolledBack
            nested = [_walk(json.loads(plan.split("\n", 1)[1])["Plan"]) for plan in plans if "job_edges e" in plan
                      or "FOR UPDATE OF j" in plan or "UPDATE jobs j SET status = m.status" in plan]
            assert len(nested) == 3, plans  # count the edges, lock the children, move them
            for indexes, scans in nested:
                assert indexes & {"job_edges_uncounted", "jobs_pkey"} and not scans, (plans, indexes, scans)
            cases: list[tuple[str, Any, set[str]]] = [
                (store._EXPIRE_PARENTS, {"types": ["t1", "t3"]}, {"jobs_expiring"}),
                (graph._STRANDED, {"limit": 500}, {"job_edges_uncounted"}),
                (graph._UNSTUCK, {"limit": 500}, {"jobs_status"}),
                (graph._LOCK_PARENTS, ids, {"jobs_pkey"}),
                (graph._FORGET_EDGES, ids, {"job_edges_pkey", "job_edges_child"}),
                (graph._FORGET_BATCHES, {"ids": ["b10", "b20"]}, {"batches_pkey", "jobs_batch"}),
                (graph._PARENT_RESULTS, {"id": "j000012"}, {"job_edges_child", "jobs_pkey"}),
                (graph._BATCH, {"id": "b10"}, {"batches_pkey", "jobs_batch"}),
                (graph._BATCH_JOBS, {"id": "b10", "limit": 50, "offset": 0}, {"batches_pkey", "jobs_batch"}),
            ]
            for sql, params, expected in cases:
                indexes, scans = _plan(conn, sql, params)
                assert expected <= indexes and not scans, (sql, indexes, scans)
            indexes, scans = _plan(conn, queries._GET, ("j000011",))
            assert {"jobs_pkey", "job_edges_pkey"} <= indexes and not scans, (indexes, scans)


# -- a chain's link: the child claimed by the process that ended its parent ------------------------------------


async def test_a_chains_child_is_claimed_after_its_parents_outcome_without_a_notify_per_link(tmp_path: Path) -> None:
    """A chain of 40 drained by one pipeline (kit.drain_chain): each link's child is woken by its
    parent's outcome statement and claimed by the Ledger right after it, with the Poller's offer
    (ledger._claim_woken): a listener hears the NOTIFY of the insert and hardly any per link (a link
    whose offer was out with the Poller's own claim NOTIFYs; then the next may race that claim);
    without the claim riding the outcome, every link NOTIFYs: 39 arrive. Every job ran after its parent."""
    async with postgres_store(tmp_path) as config:
        with connection(config) as listener:
            listener.execute(f"LISTEN {store.CHANNEL}")
            ran = await drain_chain(config, 40)
            listener.execute("SELECT 1")  # (delivers what arrived meanwhile)
            heard = list(listener.notifies(timeout=0.2))
    assert ran == list(range(40))
    assert len(heard) <= 30, [n.payload for n in heard]  # 1 to 4 in 8 runs here
