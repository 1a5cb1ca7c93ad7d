"""Ten enqueuers of one unique key, spread over three processes that start at once, leave
exactly one job, and every one of them is told its id (the store enforces the key, so there is
no window between a check and an insert for a second process to slip through)."""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import trio

from pipeline import Config
from pipeline.backends import Backend

from .kit import released_together

ENQUEUER = Path(__file__).parent / "unique_enqueuer.py"

pytestmark = pytest.mark.slow


def run_enqueuers(url: str, tasks: list[int], keys: list[str]) -> list[list[str]]:
    """One process per entry of ``tasks`` (that many enqueuers per key each); all go at once."""
    env = {**os.environ, "REDIS_ALLOW_NON_DURABLE": "true", "LOG_LEVEL": "warning"}
    return released_together([[sys.executable, str(ENQUEUER), url, str(n), *keys] for n in tasks], env)


async def test_ten_enqueuers_of_one_key_in_three_processes_leave_one_job(backend: Backend, store_config: Config) -> None:
    keys = [f"key-{i}" for i in range(5)]  # five races at once, ten enqueuers each
    outputs = await trio.to_thread.run_sync(run_enqueuers, store_config.database_url, [4, 3, 3], keys)

    answers: dict[str, list[tuple[str, bool]]] = defaultdict(list)
    for out in outputs:
        for line in out:
            key, job_id, duplicate = line.split()
            answers[key].append((job_id, duplicate == "1"))
    jobs, total = await backend.list(job_type="generate_sitemap", limit=100)
    assert total == len(keys), f"{total} jobs for {len(keys)} keys"
    by_key = {job.unique_key: job for job in jobs}
    assert sorted(by_key) == keys
    for key in keys:
        assert len(answers[key]) == 10
        assert {job_id for job_id, _ in answers[key]} == {by_key[key].id}, f"{key}: told of a job that is not the one stored"
        assert sum(not duplicate for _, duplicate in answers[key]) == 1, f"{key}: not exactly one enqueuer inserted"
