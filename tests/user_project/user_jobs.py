"""A user's application: its job types and handlers (what `python -m pipeline --app user_jobs:registry` runs).
Its handlers are asyncio code (an asyncio web service's jobs), sharing what the lifespan opens."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import attrs

import pipeline

registry = pipeline.Registry(runtime="asyncio")


class Pool:
    """Stands for an asyncpg / redis.asyncio pool: made on a running asyncio loop, usable on that loop alone."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.lock = asyncio.Lock()
        self.closed = False

    async def fetch(self, value: int) -> int:
        assert asyncio.get_running_loop() is self.loop and not self.closed
        async with self.lock:
            await asyncio.sleep(0)
            return value


@registry.lifespan
async def lifespan() -> AsyncIterator[dict[str, Any]]:
    pool = Pool()
    yield {"pool": pool}  # ctx.state in every handler
    pool.closed = True


@attrs.frozen
class Add:
    a: int
    b: int


@attrs.frozen
class Double:
    pass  # doubles what the job before it in a chain returned


@attrs.frozen
class Charge:
    order: str
    fails: int = 0  # the first attempts that fail (a flaky payment provider)


@attrs.frozen
class Total:
    pass  # a batch's callback: the sum of its jobs' results


attempts: dict[str, int] = {}


@registry.job
async def add(job: Add, ctx: pipeline.JobContext) -> int:
    return await ctx.state["pool"].fetch(job.a + job.b)


@registry.job
async def double(job: Double, ctx: pipeline.JobContext) -> int:
    (before,) = (await ctx.parent_results()).values()
    await asyncio.sleep(0)
    return before * 2


@registry.job(max_attempts=3)
def charge(job: Charge, ctx: pipeline.JobContext) -> dict[str, str]:  # a plain def: run in a thread
    attempts[job.order] = ctx.attempt
    if ctx.attempt <= job.fails:
        raise ConnectionError(f"the provider hung up on attempt {ctx.attempt}")
    return {"order": job.order, "status": "paid"}


@registry.job
async def total(job: Total, ctx: pipeline.JobContext) -> int:
    outcome = await ctx.batch()
    return sum([member.result async for member in outcome.members() if member.status == "completed"])
