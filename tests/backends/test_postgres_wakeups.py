"""Postgres wake-ups beyond inserts: a job made due again by an operator's retry of a dead job
(revive) or by a claim given back unused (release) starts at once in another process, by its
NOTIFY, not at that process's next poll (a minute here)."""

from __future__ import annotations

import time
from pathlib import Path

import attrs
import pytest
import trio

import pipeline
from pipeline.backends import open_backend

from .kit import LONG, bury, claim_one, job, release
from .stores import BACKENDS, postgres_store

pytestmark = pytest.mark.skipif("postgres" not in BACKENDS, reason="no postgres entry")


@attrs.frozen
class T:
    n: int


@pytest.mark.parametrize("how", ["revive", "release"])
async def test_a_job_made_due_again_by_another_process_starts_at_once(tmp_path: Path, how: str) -> None:
    ran = trio.Event()

    async def run(t: T, ctx: pipeline.JobContext) -> None:
        ran.set()

    registry = pipeline.Registry()
    registry.register("t", T, run, concurrency=2)
    async with postgres_store(tmp_path) as config, open_backend(config) as other:
        # the poll would find the job only after a minute: a start within seconds is the NOTIFY's
        config = config.replace(worker=attrs.evolve(config.worker, poll_interval_ms=60_000))
        row = job(max_attempts=1)
        await other.insert([row])
        lease = await claim_one(other, lease_seconds=LONG)  # running in the other process
        if how == "revive":  # dead, for an operator to retry
            assert await other.settle([bury(lease)]) == [True]
        async with pipeline.open_pipeline(config, registry) as p:
            # a first job inserted elsewhere runs here: this process listens, and its Poller has
            # looked (and found nothing else due) before the job is made due again
            await other.insert([job(payload={"n": 1})])
            with trio.fail_after(5):
                await ran.wait()
            assert (await p.backend.get(row.id)).status == ("dead" if how == "revive" else "running")  # type: ignore[union-attr]
            t0 = time.monotonic()
            if how == "revive":
                await other.revive(row.id)
            else:  # a claim given back unused (a process stopping with jobs claimed ahead does this)
                assert await other.settle([release(lease)]) == [True]
            with trio.move_on_after(5):
                while (await p.backend.get(row.id)).status != "completed":  # type: ignore[union-attr]
                    await trio.sleep(0.02)
            took = time.monotonic() - t0
            assert took < 2.0, f"not started within {took:.1f} s of being made due: left to the poll, no wake-up"
