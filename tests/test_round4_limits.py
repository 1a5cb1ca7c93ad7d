"""Issue 32's limits, on every store: a key's freed slot is taken at once (not at the next poll);
a rate-limited type's handler starts, as the handlers themselves time them, never exceed the limit
in any window of the rate's length; and what guards the windows and the leases underneath (Redis's
rescue re-checks a lease it read as expired, Postgres counts a claim's window from when it holds the
type's lock, a job claimed twice in a window counts twice)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from backends.kit import max_in_window
from backends.stores import BACKENDS

import pipeline
from pipeline import Config


@pytest.fixture(params=sorted(BACKENDS))
async def store_config(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Config]:
    async with BACKENDS[request.param](tmp_path) as config:
        yield config


def polling_every(config: Config, seconds: float, **worker: Any) -> Config:
    return attrs.evolve(config, worker=attrs.evolve(config.worker, poll_interval_ms=int(seconds * 1000), **worker))


@dataclasses.dataclass
class TenantJob:
    tenant: str
    n: int = 0


# -- item 4: a key's freed slot is taken at once ---------------------------------------------------------

POLL = 30.0  # seconds: a poll interval no test here waits for


async def test_one_keys_backlog_drains_without_waiting_for_the_poll(store_config: Config) -> None:
    """Ten jobs of one key, one at a time (key_limit=1), with a 30 s poll interval: each job's end
    frees the key's slot and the next job of the key is claimed then, so the ten finish well within
    one poll interval (before: one job per poll, 4.5 minutes)."""
    reg = pipeline.Registry()
    done: list[int] = []
    running: list[int] = []
    most = 0

    @reg.job(limit_key=lambda job: job.tenant, key_limit=1, concurrency=4)
    async def tenant_work(job: TenantJob, ctx: pipeline.JobContext) -> None:
        nonlocal most
        running.append(job.n)
        most = max(most, len(running))
        await trio.sleep(0)
        running.remove(job.n)
        done.append(job.n)

    async with pipeline.open_pipeline(polling_every(store_config, POLL), reg) as p:
        began = trio.current_time()
        await p.enqueue_many([TenantJob("a", i) for i in range(10)])
        with trio.move_on_after(POLL):  # the jobs' waits are compared with the poll, not a bound of their own
            while len(done) < 10:
                await trio.sleep(0.01)
        took = trio.current_time() - began
    assert len(done) == 10, f"{len(done)} of 10 jobs of one key ran within a poll interval of {POLL:g} s"
    assert most == 1
    assert took < POLL / 2, f"10 jobs of one key took {took:.1f} s: a poll interval is {POLL:g} s"
