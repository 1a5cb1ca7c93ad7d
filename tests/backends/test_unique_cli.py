"""Unique keys through the CLI, as a person runs it (``python -m pipeline`` in a process of its
own), on every backend: a duplicate prints the holder's id and says so, a bad key exits 2 and
stores nothing, ``--from-file`` skips and counts duplicates, ``jobs show`` shows the key, and
``jobs retry`` of a dead job whose key another job holds exits 2 naming that job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from pipeline import Config
from pipeline.backends import Backend, open_backend

from .kit import bury, claim_one, settle_one
from .stores import on_each_store

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


async def cli(config: Config, tmp_path: Path, *argv: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ADMIN_", "WORKER_", "LOG_", "DATABASE_"))}
    env.update(DATABASE_URL=config.database_url, REDIS_ALLOW_NON_DURABLE="true",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    return await trio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "pipeline", *argv], env=env, input=input, capture_output=True, text=True, timeout=60,
        cwd=tmp_path))


async def test_the_cli_enqueues_once_per_key_and_says_so(tmp_path: Path) -> None:
    """On each store, the three side by side: each run is a chain of CLI processes, one at a time."""
    async def on(name: str, config: Config, folder: Path) -> None:
        async with open_backend(config) as backend:
            await enqueue_once_per_key(backend, config, folder)

    await on_each_store(tmp_path, on)


async def enqueue_once_per_key(backend: Backend, store_config: Config, tmp_path: Path) -> None:
    first = await cli(store_config, tmp_path, "enqueue", "generate_sitemap", "--unique-key", "nightly", "--json")
    assert first.returncode == 0, first.stderr
    created = json.loads(first.stdout)
    assert (created["duplicate"], created["unique_key"], created["status"]) == (False, "nightly", "pending")

    again = await cli(store_config, tmp_path, "enqueue", "generate_sitemap", "--unique-key", "nightly", "--priority", "1")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == created["id"]
    assert "duplicate" in again.stderr and created["id"] in again.stderr and "nothing was inserted" in again.stderr
    as_json = await cli(store_config, tmp_path, "enqueue", "generate_sitemap", "--unique-key", "nightly", "--json")
    assert json.loads(as_json.stdout) == {**created, "duplicate": True}
    assert (await backend.list())[1] == 1

    for bad, words in (("", "must not be empty"), ("x" * 201, "at most 200")):
        refused = await cli(store_config, tmp_path, "enqueue", "generate_sitemap", "--unique-key", bad)
        assert refused.returncode == 2, refused.stderr
        assert "--unique-key" in refused.stderr and words in refused.stderr
    assert (await backend.list())[1] == 1

    shown = await cli(store_config, tmp_path, "jobs", "show", created["id"])
    assert shown.returncode == 0, shown.stderr
    assert "unique key" in shown.stdout and "nightly" in shown.stdout

    lines = [{"job_type": "generate_sitemap", "unique_key": "nightly"},  # held by the first job
             {"job_type": "generate_sitemap", "unique_key": "weekly"},
             {"job_type": "generate_sitemap", "unique_key": "weekly"},  # held by the line before
             {"job_type": "generate_sitemap"}]
    loaded = await cli(store_config, tmp_path, "enqueue", "--from-file", "-", "--json",
                       input="".join(json.dumps(line) + "\n" for line in lines))
    assert loaded.returncode == 0, loaded.stderr
    report = json.loads(loaded.stdout)
    assert (report["enqueued"], report["duplicates"]) == (2, 2)
    ids = report["job_ids"]
    assert ids[0] == created["id"] and ids[1] == ids[2] and len(set(ids)) == 3
    assert (await backend.list())[1] == 3
    text = await cli(store_config, tmp_path, "enqueue", "--from-file", "-", input=json.dumps(lines[1]) + "\n")
    assert text.returncode == 0, text.stderr
    assert "enqueued 0 jobs" in text.stdout and "1 duplicate of pending" in text.stdout

    # the nightly job dies; another takes its key; retrying the dead one is refused, naming it
    assert await settle_one(backend, bury(await claim_one(backend, "generate_sitemap")))  # the oldest: nightly
    assert (await backend.get(created["id"])).status == "dead"  # type: ignore[union-attr]
    successor = await cli(store_config, tmp_path, "enqueue", "generate_sitemap", "--unique-key", "nightly")
    assert successor.returncode == 0 and successor.stdout.strip() != created["id"]
    retry = await cli(store_config, tmp_path, "jobs", "retry", created["id"])
    assert retry.returncode == 2, retry.stderr
    assert successor.stdout.strip() in retry.stderr
    assert (await backend.get(created["id"])).status == "dead"  # type: ignore[union-attr]
