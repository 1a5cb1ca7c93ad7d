"""The service's jobs: what ``python -m pipeline --app examples.fastapi_app.jobs:registry`` runs, and what the
web app (app.py) enqueues and, embedded, runs itself.

The payload is the web app's pydantic request body, ``Document``, enqueued as it is (docs/jobs.md, "Payload
classes"). Every handler is asyncio code (``Registry(runtime="asyncio")``) and shares one asyncpg pool, opened
once per process that runs jobs by ``@registry.lifespan`` and handed to each handler as ``ctx.state``. The
app's own data is in APP_DATABASE_URL (a Postgres database); the jobs are in DATABASE_URL (SQLite, Postgres or Redis).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pydantic

import pipeline

registry = pipeline.Registry(runtime="asyncio")

APP_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"  # unless APP_DATABASE_URL says otherwise

# The app's own table. (A real app migrates with its own tool; this one creates its table at start, under a
# lock, since several processes may start at once: uvicorn --workers, python -m pipeline --processes.)
SCHEMA = """
    SELECT pg_advisory_xact_lock(hashtext('examples.fastapi_app'));
    CREATE TABLE IF NOT EXISTS word_counts (
        document   text PRIMARY KEY,
        words      integer NOT NULL,
        counted_at timestamptz NOT NULL DEFAULT now()
    );
"""


@registry.lifespan
async def lifespan(config: pipeline.Config) -> AsyncIterator[dict[str, Any]]:
    """Once per process that runs jobs, before its first job; closed after its last one."""
    pool = await asyncpg.create_pool(os.environ.get("APP_DATABASE_URL", APP_DATABASE_URL), min_size=1, max_size=4)
    try:
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(SCHEMA)
        yield {"db": pool}  # ctx.state in every handler
    finally:
        await pool.close()


class Document(pydantic.BaseModel):
    """A document to count the words of: the body of ``POST /documents``, and the job's payload, unchanged.

    The job is stored as ``model_dump(mode="json")`` and read back with ``model_validate_json``, so this
    configuration applies to the stored JSON too: a payload with a key the model does not have is refused."""

    model_config = pydantic.ConfigDict(extra="forbid")

    name: str = pydantic.Field(min_length=1, max_length=200)  # the app's name for it
    text: str

    def words(self) -> int:
        return len(self.text.split())


@registry.job(concurrency=8, timeout=30)
async def count_words(job: Document, ctx: pipeline.JobContext) -> dict[str, Any]:
    """Count a document's words and store the count; answer it (the job's result)."""
    words = job.words()
    async with ctx.state["db"].acquire() as conn:
        await conn.execute(
            "INSERT INTO word_counts (document, words) VALUES ($1, $2) "
            "ON CONFLICT (document) DO UPDATE SET words = excluded.words, counted_at = now()",
            job.name, words,
        )
    return {"document": job.name, "words": words, "counted_by": os.getpid()}
