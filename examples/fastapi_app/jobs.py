"""The service's jobs: what ``python -m pipeline --app examples.fastapi_app.jobs:registry`` runs, and what the
web app (app.py) enqueues and, embedded, runs itself.

Every handler is asyncio code (``Registry(runtime="asyncio")``) and shares one asyncpg pool, opened once per
process that runs jobs by ``@registry.lifespan`` and handed to each handler as ``ctx.state``. The app's own
data is in APP_DATABASE_URL (a Postgres database); the jobs are in DATABASE_URL (SQLite, Postgres or Redis).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

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


@dataclasses.dataclass
class CountWords:
    document: str  # the app's name for it
    text: str


@registry.job(concurrency=8, timeout=30)
async def count_words(job: CountWords, ctx: pipeline.JobContext) -> dict[str, Any]:
    """Count a document's words and store the count; answer it (the job's result)."""
    words = len(job.text.split())
    async with ctx.state["db"].acquire() as conn:
        await conn.execute(
            "INSERT INTO word_counts (document, words) VALUES ($1, $2) "
            "ON CONFLICT (document) DO UPDATE SET words = excluded.words, counted_at = now()",
            job.document, words,
        )
    return {"document": job.document, "words": words, "counted_by": os.getpid()}
