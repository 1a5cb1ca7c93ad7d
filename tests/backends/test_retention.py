"""Retention (issue 21, item 9): finished jobs and dead workers' entries are removed once old
enough, in bounded batches, by one process per interval, on every store; the service does it
by itself (JOB_RETENTION_*), 0 keeps a status for ever, and /metrics counts what went."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import trio
from jobkit import Echo, registry, wait_status

import pipeline
from pipeline import Config, UsageError
from pipeline.admin.metrics import Metrics
from pipeline.backends import Backend, open_backend
from pipeline.engine.actors.retention import prune_once

from .kit import LONG, add, bury, claim_one, outlive, renew, settle_one, succeed
from .stores import on_each_store


async def _finish(backend: Backend, n: int, how: object = succeed) -> list[str]:
    ids = await add(backend, n)
    for _ in ids:
        lease = await claim_one(backend)
        assert await settle_one(backend, how(lease))  # type: ignore[operator]
    return ids


async def test_old_finished_jobs_and_workers_go_oldest_first_at_most_limit_a_call(tmp_path: Path) -> None:
    """On each store, the three side by side (most of each run is a second of waiting for ages)."""
    async def on(name: str, config: Config, folder: Path) -> None:
        async with open_backend(config) as backend:
            await oldest_first(backend)

    await on_each_store(tmp_path, on)


async def oldest_first(backend: Backend) -> None:
    old_done = await _finish(backend, 5)
    old_dead = await _finish(backend, 3, bury)
    await renew(backend, "host:1:gone", ["t"], [], lease_seconds=0.05)  # a process that died long ago
    await trio.sleep(2.0)  # the young ones stay under the age for 1.5 s of prunes: a loaded machine took 0.6
    young_done = await _finish(backend, 2)
    pending = await add(backend, 2)
    running = await add(backend, 1, job_type="r")
    await claim_one(backend, "r")
    await renew(backend, "host:2:just-gone", ["t"], [], lease_seconds=0.05)  # its lease ran out, but not long ago
    await renew(backend, "host:3:live", ["t"], [], lease_seconds=LONG)
    await outlive(0.05)

    # completed more than 1.5 s ago: the five old ones, two at a time (the young ones are younger by far)
    assert [await backend.prune("completed", older_than_seconds=1.5, limit=2) for _ in range(4)] == [2, 2, 1, 0]
    for job_id in old_done:
        assert await backend.get(job_id) is None
    for job_id in young_done + old_dead + pending + running:
        assert await backend.get(job_id) is not None, "retention removed a job that was not past its age"
    assert await backend.prune("dead", older_than_seconds=1.5, limit=100) == 3
    assert await backend.prune("dead", older_than_seconds=1.5, limit=100) == 0
    assert {(await backend.get(i)).status for i in pending + running} == {"pending", "running"}  # type: ignore[union-attr]
    with pytest.raises(UsageError, match="only finished jobs"):
        await backend.prune("pending", older_than_seconds=0, limit=10)
    stats = await backend.stats()
    assert stats["by_status"].get("completed", 0) == 2 and stats["by_status"].get("dead", 0) == 0
    assert await backend.prune_workers(older_than_seconds=1.5) == 1
    assert {w.owner for w in await backend.workers()} == {"host:3:live", "host:2:just-gone"}  # (beats may share a ms)


async def test_one_process_takes_each_round(tmp_path: Path) -> None:
    """On each store, the three side by side (most of each run is the round's interval)."""
    async def on(name: str, config: Config, folder: Path) -> None:
        async with open_backend(config) as backend:
            await one_process_a_round(backend, config)

    await on_each_store(tmp_path, on)


async def one_process_a_round(backend: Backend, store_config: Config) -> None:
    async with open_backend(store_config) as other:
        answers: list[bool] = []

        async def ask(b: Backend) -> None:
            answers.append(await b.retention_turn(interval_seconds=1.0))

        async with trio.open_nursery() as nursery:  # ten at once from two processes' backends
            for n in range(10):
                nursery.start_soon(ask, backend if n % 2 else other)
        assert sorted(answers) == [False] * 9 + [True]
        assert not await backend.retention_turn(interval_seconds=1.0)
        await trio.sleep(1.1)  # the round's interval is over: the next one goes to whoever asks first
        assert await other.retention_turn(interval_seconds=1.0)
        assert not await backend.retention_turn(interval_seconds=1.0)


async def test_a_round_removes_every_old_job_in_batches_and_counts_them(backend: Backend,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pipeline.engine.actors.retention.BATCH", 3)
    await _finish(backend, 7)
    await _finish(backend, 2, bury)
    await trio.sleep(0.3)
    pruned: dict[str, int] = {"completed": 4}  # counts from before: added to
    done = await prune_once(backend, kept_for={"completed": 0.2}, pruned=pruned)  # dead: kept for ever
    assert done == {"completed": 7}
    assert pruned == {"completed": 11, "workers": 0}
    stats = await backend.stats()
    assert stats["by_status"].get("completed", 0) == 0 and stats["by_status"]["dead"] == 2


async def test_the_service_removes_old_completed_jobs_by_itself(store_config: Config) -> None:
    config = store_config.replace(retention=pipeline.RetentionSettings(completed_seconds=0.3, dead_seconds=0,
                                                                       interval_seconds=0.1))
    config = config.replace(worker=attrs.evolve(config.worker, default_max_attempts=1))
    async with pipeline.open_pipeline(config, registry()) as p:
        done = await p.enqueue(Echo("kept a moment"))
        dead = await p.enqueue(Echo("fails", mode="permanent"))
        await wait_status(p, done, "completed")
        await wait_status(p, dead, "dead")
        with trio.fail_after(10):
            while await p.backend.get(done) is not None:
                await trio.sleep(0.05)
        await trio.sleep(0.5)  # more rounds: the dead job stays (JOB_RETENTION_DEAD_SECONDS=0: kept for ever)
        assert (await p.backend.get(dead)).status == "dead"  # type: ignore[union-attr]
        assert p.pruned["completed"] == 1 and p.pruned.get("dead", 0) == 0
        text = Metrics(pruned=p.pruned).render(await p.backend.stats())
        assert 'pipeline_jobs_pruned_total{status="completed"} 1' in text


def test_a_sqlite_round_reads_the_finished_rows_index_only(tmp_path: Path) -> None:
    """With a million finished rows, a round that finds nothing must not read them all (in the
    Ledger's write transaction): the delete searches idx_jobs_finished by status and age."""
    import sqlite3

    from pipeline.backends.sqlite import migrations
    from pipeline.backends.sqlite.retention import PRUNE

    conn = sqlite3.connect(tmp_path / "plan.db")
    migrations.migrate(conn)
    conn.execute("ANALYZE")
    plan = " ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {PRUNE}", ("completed", "2026-01-01", 10)))
    assert "USING INDEX idx_jobs_finished" in plan and "TEMP B-TREE" not in plan, plan
