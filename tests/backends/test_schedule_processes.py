"""Three worker processes (`tests/supervised_service.py --processes 3`) on one store, one schedule
(added with the CLI) that ticks every second: every tick is enqueued exactly once, none twice, none
skipped once the three are up, and each tick's job starts at once, wherever it was fired (the insert wakes every Poller:
the poll interval here is 5 s)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import trio

from pipeline import Config
from pipeline.backends import Backend, open_backend
from pipeline.backends.base import ScheduleRecord
from pipeline.clock import now_ts, to_epoch
from pipeline.schedules import make_schedule

from .stores import on_each_store

ROOT = Path(__file__).resolve().parent.parent.parent
SERVICE = ROOT / "tests" / "supervised_service.py"

pytestmark = pytest.mark.slow


async def test_three_processes_enqueue_each_tick_once(tmp_path: Path) -> None:
    """On each store, the three stores side by side (most of the run is watching ticks)."""
    await on_each_store(tmp_path, three_processes_enqueue_each_tick_once)


async def three_processes_enqueue_each_tick_once(name: str, store_config: Config, tmp_path: Path) -> None:
    async with open_backend(store_config) as backend:
        await watch_the_ticks(backend, store_config, tmp_path)


async def watch_the_ticks(backend: Backend, store_config: Config, tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from jobkit import registry

    every_second = make_schedule(registry(), "every-second", "* * * * * *", "echo", {"text": "tick"})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ADMIN_", "WORKER_", "LOG_", "DATABASE_", "SQLITE_"))}
    env.update(DATABASE_URL=store_config.database_url, ADMIN_ENABLED="false", WORKER_LEASE_SECONDS="2",
               WORKER_POLL_INTERVAL_MS="5000", SQLITE_BUSY_TIMEOUT_MS="600", REDIS_ALLOW_NON_DURABLE="true",
               PYTHONPATH=str(ROOT))
    added = await trio.run_process([sys.executable, str(SERVICE), "schedule", "add", "every-second", "* * * * * *", "echo",
                                    "--payload", '{"text": "tick"}'], env=env, cwd=tmp_path, capture_stdout=True,
                                   capture_stderr=True, check=False)
    assert added.returncode == 0, added.stderr
    proc = subprocess.Popen([sys.executable, str(SERVICE), "run", "--processes", "3"], env=env, cwd=tmp_path,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        with trio.fail_after(30):  # the three processes are up and beating
            while len([w for w in await backend.workers() if w.alive]) < 3:
                assert proc.poll() is None, proc.communicate()[1][-3000:]
                await trio.sleep(0.1)
        started = now_ts()
        await trio.sleep(3.5)
        alive = [w for w in await backend.workers() if w.alive]
        # each job's run_after is its tick until the stop: a job it hands back (released) is due again
        # from that moment, and a CI run found one 31 ms after its tick
        fired, _ = await backend.list(job_type="echo", limit=1000)
        proc.send_signal(signal.SIGTERM)
        _, log = await trio.to_thread.run_sync(lambda: proc.communicate(timeout=30))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert len(alive) == 3, log[-3000:]
    ticks = sorted(j.run_after for j in fired)
    assert len(ticks) == len(set(ticks)), f"a tick enqueued twice: {ticks}"
    # none skipped once the three are up (before, a process starting on a busy machine may find a
    # tick a second late, which then fires once, late, and the next run is the tick after that)
    seconds = [round(to_epoch(t)) for t in ticks if t >= started]
    assert len(seconds) >= 3, ticks
    assert seconds == list(range(seconds[0], seconds[0] + len(seconds))), f"a tick skipped: {ticks} (from {started})"
    (stored,) = await backend.schedules()
    assert attrs.evolve(stored, next_run="", last_run="", last_job_id="", updated_at="") == attrs.evolve(
        ScheduleRecord.of(every_second, origin="operator", now=stored.created_at), next_run="", last_run="", last_job_id="",
        updated_at="")
    # the schedule names its last fire (the stop may have come after one more)
    jobs, _ = await backend.list(job_type="echo", limit=1000)
    assert stored.last_job_id == max(jobs, key=lambda j: j.created_at).id
    assert stored.last_run >= ticks[-1] and stored.last_run.endswith(".000Z"), (stored.last_run, ticks)
    assert round(to_epoch(stored.last_run)) in (seconds[-1], seconds[-1] + 1), (stored.last_run, ticks)
    # each job ran as soon as it was fired, not at the next poll
    done = [j for j in jobs if j.status == "completed"]
    assert len(done) >= 3 and all(to_epoch(j.updated_at) - to_epoch(j.created_at) < 1.0 for j in done), [
        (j.created_at, j.updated_at) for j in done]
