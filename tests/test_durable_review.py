"""Durable functions: what a review found could take a worker process down or mislead a handler, each
held here (SQLite; the paths are the engine's): an asyncio handler whose lease is gone, a suspension
in a nursery beside an error or a timeout, durations past what a store can hold, a handler that
swallows its suspension, a durable call inside a step's function."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

import pipeline
from pipeline.engine import asyncio_host


@dataclasses.dataclass
class Job:
    n: int = 0


@dataclasses.dataclass
class Other:
    n: int = 0


def config_for(tmp_path: Path, **settings: str) -> pipeline.Config:
    return pipeline.Config.from_env({"DATABASE_URL": f"sqlite:///{tmp_path / 'jobs.db'}", "WORKER_POLL_INTERVAL_MS": "50",
                                     "WORKER_BACKOFF_BASE_MS": "20", **settings}, env_file=None)


async def ended(p: pipeline.Pipeline, job_id: str) -> pipeline.JobRecord:
    with trio.fail_after(10):
        while True:
            record = await p.backend.get(job_id)
            assert record is not None
            if record.status in ("completed", "dead", "cancelled"):
                return record
            await trio.sleep(0.02)


def test_an_asyncio_handler_whose_lease_is_gone_ends_its_run_not_the_process(tmp_path: Path) -> None:
    reg = pipeline.Registry()
    seen: list[str] = []

    @reg.job(runtime="asyncio", max_attempts=1)
    async def taken_over(job: Job, ctx: pipeline.JobContext) -> str:
        # another process took the job over (its lease lost): the token moves on under this run
        with sqlite3.connect(tmp_path / "jobs.db") as conn:
            conn.execute("UPDATE jobs SET lease_token = lease_token + 5 WHERE id = ?", (ctx.id,))
        try:
            await ctx.step("charge", lambda: 1)
        except BaseException as exc:
            seen.append(type(exc).__name__)
            raise
        return "not here"

    @reg.job(runtime="asyncio")
    async def after(job: Other, ctx: pipeline.JobContext) -> str:
        return "still running"

    async def main() -> None:
        async with pipeline.open_pipeline(config_for(tmp_path), reg) as p:
            lost = await p.enqueue(Job())
            with trio.fail_after(10):
                while not seen:
                    await trio.sleep(0.02)
            # the process goes on: another job runs, and the lost run wrote nothing
            assert await p.result(await p.enqueue(Other()), timeout=10) == "still running"
            record = await p.backend.get(lost)
            assert record is not None and record.status == "running" and record.steps == ()

    asyncio_host.run(main)
    assert seen == ["LeaseGone"]


async def test_a_suspension_beside_a_nursery_childs_error_fails_the_attempt(tmp_path: Path) -> None:
    reg = pipeline.Registry()
    runs: list[int] = []

    async def child() -> None:
        raise ValueError("child failed")

    @reg.job(max_attempts=2)
    async def mixed(job: Job, ctx: pipeline.JobContext) -> None:
        runs.append(ctx.attempt)
        await ctx.step("first", lambda: 1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(child)
            await ctx.sleep(60)

    async with pipeline.open_pipeline(config_for(tmp_path), reg) as p:
        record = await ended(p, await p.enqueue(Job()))
    assert record.status == "dead" and "ValueError: child failed" in (record.error or ""), record.error
    assert runs == [1, 2]


async def test_a_suspension_met_by_the_timeout_is_a_timeout(tmp_path: Path) -> None:
    reg = pipeline.Registry()

    @reg.job(timeout=0.3, max_attempts=1)
    async def slow(job: Job, ctx: pipeline.JobContext) -> None:
        await ctx.step("first", lambda: 1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            try:
                await trio.sleep_forever()
            finally:  # the timeout's Cancelled arrives as the run suspends
                await ctx.sleep(5)

    async with pipeline.open_pipeline(config_for(tmp_path), reg) as p:
        record = await ended(p, await p.enqueue(Job()))
    assert record.status == "dead" and "timed out" in (record.error or ""), record.error


@pytest.mark.parametrize("call", ["sleep", "wait"])
async def test_a_sleep_or_timeout_past_a_hundred_years_is_refused_by_name(tmp_path: Path, call: str) -> None:
    reg = pipeline.Registry()

    @reg.job(max_attempts=1)
    async def forever(job: Job, ctx: pipeline.JobContext) -> None:
        if call == "sleep":
            await ctx.sleep(1e12)
        else:
            await ctx.wait_for("approval", timeout=1e12)

    async with pipeline.open_pipeline(config_for(tmp_path), reg) as p:
        record = await ended(p, await p.enqueue(Job()))
        more = await p.enqueue(Job())  # the process and its store go on
        assert (await ended(p, more)).status == "dead"
    what = "ctx.sleep's duration" if call == "sleep" else "wait_for's timeout"
    assert f"{what} must be at most" in (record.error or ""), record.error


async def test_a_handler_that_swallows_its_suspension_is_told(tmp_path: Path) -> None:
    reg = pipeline.Registry()
    after: list[str] = []

    @reg.job
    async def swallow(job: Job, ctx: pipeline.JobContext) -> str:
        try:
            await ctx.sleep(3600)
        except BaseException:
            pass
        after.append("went on")
        return "done"

    async with pipeline.open_pipeline(config_for(tmp_path), reg) as p:
        record = await ended(p, await p.enqueue(Job()))
    assert record.status == "dead", record.status
    assert "caught the suspension of its ctx.sleep or ctx.wait_for" in (record.error or "")


async def test_a_durable_call_inside_a_steps_function_is_refused(tmp_path: Path) -> None:
    reg = pipeline.Registry()

    @reg.job(max_attempts=1)
    async def nested(job: Job, ctx: pipeline.JobContext) -> Any:
        async def inner() -> int:
            await ctx.sleep(1)
            return 1

        return await ctx.step("outer", inner)

    async with pipeline.open_pipeline(config_for(tmp_path), reg) as p:
        record = await ended(p, await p.enqueue(Job()))
    assert "ctx.sleep inside the function of step 'outer'" in (record.error or ""), record.error
