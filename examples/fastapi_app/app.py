"""The web app: FastAPI, its pipeline opened in its lifespan with ``pipeline.aio.open_pipeline``.

    uvicorn examples.fastapi_app.app:app                          # the jobs run in the web process itself
    WORKER_ENABLED=false uvicorn examples.fastapi_app.app:app     # ... or only enqueued here, and run by
    python -m pipeline --app examples.fastapi_app.jobs:registry   # the service, in processes of its own

docs/fastapi.md explains both.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request

import pipeline
import pipeline.aio

from .jobs import Document, registry


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # Config.from_env(): DATABASE_URL, WORKER_*... With WORKER_ENABLED=false this process only enqueues.
    # Leaving (uvicorn's shutdown, on SIGTERM or Ctrl-C) drains: running jobs get WORKER_SHUTDOWN_TIMEOUT.
    async with pipeline.aio.open_pipeline(registry=registry) as jobs:
        app.state.jobs = jobs
        yield


app = FastAPI(title="word counts", lifespan=lifespan)


def the_jobs(request: Request) -> pipeline.aio.Pipeline:
    jobs: pipeline.aio.Pipeline = request.app.state.jobs
    return jobs


Jobs = Annotated[pipeline.aio.Pipeline, Depends(the_jobs)]


@app.post("/documents", status_code=202)
async def submit(body: Document, jobs: Jobs) -> dict[str, str]:
    """Count the document's words in the background: the job's id, once the job is committed. The request
    body, a pydantic model validated by FastAPI, is the job's payload as it is."""
    job_id = await jobs.enqueue(body)
    return {"job": job_id}


@app.get("/jobs/{job_id}")
async def show(job_id: str, jobs: Jobs, wait: float = 0.0) -> dict[str, Any]:
    """A job's status and result; ``?wait=SECONDS`` (at most 30) waits that long for it to finish first."""
    try:
        if wait > 0:
            with contextlib.suppress(TimeoutError, pipeline.JobFailed):
                await jobs.result(job_id, timeout=min(wait, 30.0))
        record = await jobs.get(job_id)
    except (LookupError, pipeline.UsageError):
        record = None
    if record is None:
        raise HTTPException(status_code=404, detail=f"no job {job_id}")
    return {"id": record.id, "status": record.status, "attempts": record.attempts, "error": record.error,
            "payload": json.loads(record.payload),  # as stored: the request body's JSON
            "result": None if record.result is None else json.loads(record.result)}
