"""A FastAPI app that embeds the pipeline in its lifespan with ``pipeline.aio.open_pipeline``, served by a
real uvicorn in a process of its own by tests/test_aio_embedding_uvicorn.py (not a test module itself).

Its two job types hold until a file exists (a test releases them), then answer the process and the loop
they ran in: ``nap_asyncio`` runs as a task of the app's own asyncio loop, ``nap_trio`` on the
pipeline's trio run, a guest of that same loop. Each notes its start in $NOTES. The store, the grace
and every other setting come from the environment (``open_pipeline(registry=...)``: Config.from_env()).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import time
from collections.abc import AsyncIterator

import trio
from fastapi import FastAPI, Request

import pipeline
import pipeline.aio

registry = pipeline.Registry()


@dataclasses.dataclass
class AioNap:
    release: str = ""  # a file: the job holds until it exists ("": it answers at once)


@dataclasses.dataclass
class TrioNap:
    release: str = ""


def note(**fields: object) -> None:
    fields.update(pid=os.getpid(), at=time.time())
    with open(os.environ["NOTES"], "a") as f:
        f.write(json.dumps(fields) + "\n")


@registry.job(runtime="asyncio", timeout=60)
async def nap_asyncio(job: AioNap, ctx: pipeline.JobContext) -> dict[str, object]:
    note(kind="started", id=ctx.id)
    while job.release and not os.path.exists(job.release):
        await asyncio.sleep(0.02)
    return {"pid": os.getpid(), "loop": id(asyncio.get_running_loop())}


@registry.job(timeout=60)
async def nap_trio(job: TrioNap, ctx: pipeline.JobContext) -> dict[str, object]:
    note(kind="started", id=ctx.id)
    try:
        while job.release and not os.path.exists(job.release):
            await trio.sleep(0.02)
    except trio.Cancelled:
        note(kind="cancelled", id=ctx.id)  # the end of the shutdown grace
        raise
    return {"pid": os.getpid(), "in_trio": trio.lowlevel.in_trio_task()}


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with pipeline.aio.open_pipeline(registry=registry) as p:
        app.state.pipeline = p
        yield
    note(kind="pipeline closed")


app = FastAPI(lifespan=lifespan)


@app.post("/naps/{runtime}")
async def nap(request: Request, runtime: str, release: str = "", wait: bool = True) -> dict[str, object]:
    p: pipeline.aio.Pipeline = request.app.state.pipeline
    job_id = await p.enqueue(AioNap(release) if runtime == "asyncio" else TrioNap(release))
    answer: dict[str, object] = {"id": job_id, "pid": os.getpid(), "loop": id(asyncio.get_running_loop())}
    if wait:
        answer["result"] = await p.result(job_id, timeout=30)
    return answer
