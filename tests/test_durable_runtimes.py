"""Durable functions beyond trio handlers (issue 35): an asyncio handler's steps (an asyncio coroutine
function as the step, awaited on the loop), sleeps and waits, on each store; and pipeline.testing, whose
drain skips a durable sleep (as it skips a retry's backoff) but leaves a wait for its signal."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import attrs
import trio
from backends.stores import on_each_store

import pipeline
from pipeline import Config
from pipeline.engine import asyncio_host
from pipeline.testing import open_test_pipeline


@dataclasses.dataclass
class Order:
    n: int = 0


def test_an_asyncio_handler_steps_sleeps_and_waits_on_each_store(tmp_path: Path) -> None:
    async def scenario(name: str, config: Config, folder: Path) -> None:
        reg = pipeline.Registry()
        calls: list[str] = []

        async def on_asyncio(tag: str) -> str:
            asyncio.get_running_loop()  # (raises outside asyncio)
            await asyncio.sleep(0)
            calls.append(tag)
            return tag

        @reg.job(runtime="asyncio", max_attempts=2)
        async def order(job: Order, ctx: pipeline.JobContext) -> Any:
            first = await ctx.step("first", on_asyncio, "one")
            await ctx.sleep(0.1)
            answer = await ctx.wait_for("go")
            if ctx.attempt == 1:
                raise RuntimeError("after the wait")  # the retry takes every recorded step back
            return [first, answer]

        config = attrs.evolve(config, worker=attrs.evolve(config.worker, poll_interval_ms=100, backoff_base_ms=20))
        async with pipeline.open_pipeline(config, reg) as p:
            job_id = await p.enqueue(Order(1))
            with trio.fail_after(10):
                while (record := await p.backend.get(job_id)) is None or record.awaiting_signal != "go":
                    await trio.sleep(0.02)
            assert await p.signal(job_id, "go", {"ok": True}) == "woken"
            assert await p.result(job_id, timeout=10) == ["one", {"ok": True}]
        assert calls == ["one"], f"{name}: the step ran {len(calls)} times"

    asyncio_host.run(on_each_store, tmp_path, scenario)


async def test_the_test_pipeline_skips_a_durable_sleep_and_leaves_a_wait_for_its_signal() -> None:
    reg = pipeline.Registry()

    @reg.job
    async def order(job: Order, ctx: pipeline.JobContext) -> Any:
        await ctx.sleep(3600)  # an hour: drain does not wait for it
        return await ctx.wait_for("approval")

    async with open_test_pipeline(reg) as tp:
        job_id = await tp.enqueue(Order(1))
        with trio.fail_after(10):
            await tp.drain()  # returns once only the wait is left
        record = await tp.get(job_id)
        assert record is not None and (record.status, record.awaiting_signal) == ("suspended", "approval")
        assert await tp.signal(job_id, "approval", "yes") == "woken"
        assert await tp.result(job_id, timeout=10) == "yes"


async def test_metrics_count_steps_suspensions_and_suspended_jobs(tmp_path: Path) -> None:
    from pipeline.admin.metrics import Metrics

    reg = pipeline.Registry()

    @reg.job
    async def order(job: Order, ctx: pipeline.JobContext) -> None:
        await ctx.step("one", lambda: 1)
        await ctx.step("two", lambda: 2)
        if job.n == 1:
            await ctx.wait_for("never")

    config = pipeline.Config.from_env({"DATABASE_URL": f"sqlite:///{tmp_path / 'm.db'}", "WORKER_POLL_INTERVAL_MS": "50"})
    metrics = Metrics()
    async with pipeline.open_pipeline(config, reg) as p:
        p.add_observer(metrics.observe)
        done = await p.enqueue(Order(0))
        waiting = await p.enqueue(Order(1))
        await p.result(done, timeout=10)
        with trio.fail_after(10):
            while (await p.backend.get(waiting)).status != "suspended":  # type: ignore[union-attr]
                await trio.sleep(0.02)
        text = metrics.render(await p.backend.stats())
    assert 'pipeline_steps_total{job_type="order"} 4' in text
    assert 'pipeline_jobs_processed_total{job_type="order",outcome="suspended"} 1' in text
    assert 'pipeline_jobs{status="suspended"} 1' in text
