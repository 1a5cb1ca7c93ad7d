"""Postgres: the start-up merge of the code's schedules (schedules.sync_code) locks the rows it read
(FOR UPDATE), so a tick fired by another process between the merge's read and its write is not
written back as due (it then fired twice).

The interleaving is made, not waited for: a trigger on scheduled_jobs holds the merge's write on an
advisory lock the test holds, after its read; the test fires the tick on another connection while
the merge is held there, and lets the merge go once the fire is done or waits on the merge's row lock
(both seen in pg_stat_activity)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from pipeline.backends import ScheduleRecord, open_backend
from pipeline.backends.postgres import schedules as pg_schedules

from .kit import job, ts
from .stores import BACKENDS, postgres_store

pytestmark = pytest.mark.skipif("postgres" not in BACKENDS, reason="no postgres entry")

HOLD = 421_021  # the advisory lock the trigger waits on

PAUSE_WRITES = f"""
CREATE FUNCTION pause_merge() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('pipeline_test.pause', true) = 'on' THEN
        PERFORM pg_advisory_xact_lock({HOLD});
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER pause_merge BEFORE INSERT OR UPDATE ON scheduled_jobs FOR EACH ROW EXECUTE FUNCTION pause_merge();
"""


def code_schedule(*, next_run: str, payload: str) -> ScheduleRecord:
    now = ts()
    return ScheduleRecord(name="digest", job_type="t", payload=payload, cron="* * * * *", timezone="UTC", enabled=True,
                          origin="code", next_run=next_run, created_at=now, updated_at=now)


def waiting(watch: psycopg.Connection[Any], pid: int) -> str | None:
    """What the session ``pid`` waits for (``Lock:advisory``, ``Lock:transactionid``...), or None."""
    row = watch.execute("SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return None if row is None or row[0] is None else f"{row[0]}:{row[1]}"


async def until(check: Any) -> None:
    with trio.fail_after(10):
        while not await trio.to_thread.run_sync(check):
            await trio.sleep(0.005)


async def test_a_tick_fired_while_the_merge_is_between_its_read_and_its_write_fires_once(tmp_path: Path) -> None:
    async with postgres_store(tmp_path) as config:
        tick = ts(-1)
        async with open_backend(config) as backend:  # the schema, and the code's schedule, due
            await backend.sync_code_schedules([code_schedule(next_run=tick, payload='{"n":1}')])
        url = config.database_url
        with psycopg.connect(url, autocommit=True) as holder, psycopg.connect(url, autocommit=True) as merger, \
                psycopg.connect(url, autocommit=True) as firer, psycopg.connect(url, autocommit=True) as watch:
            holder.execute(PAUSE_WRITES)
            holder.execute("SELECT pg_advisory_lock(%s)", (HOLD,))
            merger.execute("SET pipeline_test.pause = 'on'")
            following = ts(59)
            fired: list[bool] = []
            async with trio.open_nursery() as tn:
                # another process starts: same declaration, a new payload (so the merge writes the row,
                # keeping the next run it read)
                tn.start_soon(trio.to_thread.run_sync, lambda: pg_schedules.sync_code(
                    merger, [code_schedule(next_run=ts(60), payload='{"n":2}')]))
                await until(lambda: waiting(watch, merger.info.backend_pid) == "Lock:advisory")  # read, not written
                # meanwhile a Scheduler fires the tick it read
                tn.start_soon(trio.to_thread.run_sync, lambda: fired.append(pg_schedules.fire(
                    firer, "digest", tick=tick, next_run=following, job=job(run_after=tick))))
                await until(lambda: bool(fired) or (waiting(watch, firer.info.backend_pid) or "").startswith("Lock:"))
                holder.execute("SELECT pg_advisory_unlock(%s)", (HOLD,))
            # every Scheduler that read the tick before has tried it: is it due again?
            again = pg_schedules.fire(firer, "digest", tick=tick, next_run=ts(61), job=job(run_after=tick))
        async with open_backend(config) as backend:
            (stored,) = await backend.schedules()
            jobs, _ = await backend.list(job_type="t")
        assert fired == [True] and not again, "the tick fired twice: the merge wrote back the next run it had read"
        assert (stored.next_run, stored.last_run, stored.payload) == (following, tick, '{"n":2}')
        assert len(jobs) == 1
