"""K processes claim from one store at once: each job is claimed once (one lease each)."""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import pytest
import trio

from pipeline import Config
from pipeline.backends import Backend

from .kit import add, record, released_together

CLAIMER = Path(__file__).parent / "claimer.py"

pytestmark = pytest.mark.slow


def run_claimers(url: str, k: int, batch: int) -> list[list[str]]:
    """Start k claimers, let them all go at once, and return each one's output lines."""
    env = {**os.environ, "REDIS_ALLOW_NON_DURABLE": "true"}  # the test server keeps nothing on disk
    return released_together([[sys.executable, str(CLAIMER), url, "t", str(batch)]] * k, env)


async def test_processes_claiming_at_once_claim_each_job_once(backend: Backend, store_config: Config) -> None:
    n, k = 300, 3
    ids = await add(backend, n)
    outputs = await trio.to_thread.run_sync(run_claimers, store_config.database_url, k, 5)

    claims = [line.split() for out in outputs for line in out]
    counts = Counter(job_id for job_id, _, _ in claims)
    assert [job_id for job_id, c in counts.items() if c > 1] == [], "a job was claimed twice"
    assert set(counts) == set(ids)
    assert sum(1 for out in outputs if out) >= 2, "only one process got any work: the test proves nothing"

    for job_id, _token, owner in claims[:: n // 30]:  # what each process was told is what the store holds
        got = await record(backend, job_id)
        assert (got.status, got.attempts, got.lease_owner) == ("running", 1, owner)
    assert await backend.claim({"t": 1}, owner="late", lease_seconds=60) == []
