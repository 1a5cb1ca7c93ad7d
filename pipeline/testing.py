"""Run your handlers in a test, without a service: the real engine on a throw-away SQLite store.

    async def test_resize() -> None:                      # pytest-trio (or trio.run)
        async with pipeline.testing.open_test_pipeline(registry) as p:
            job_id = await p.enqueue(ResizeAvatar("u42"))
            (record,) = await p.drain()                   # every job run to its end: retries and delays included
            assert record.status == "completed"

    def test_resize_plain() -> None:                      # a plain pytest function
        record = pipeline.testing.run(registry, ResizeAvatar("u42"))
        assert record.status == "completed"

``drain()`` makes every pending job due at once, again and again, until none is pending or running:
a retry's backoff, ``RetryLater(delay=...)`` and ``run_after`` are not waited out, and jobs that
handlers enqueue or emit run too. It returns every job's final record, oldest first.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from .backends.base import JobRecord
from .backends.sqlite import drain as store
from .config import Config
from .engine.wiring import Pipeline, open_pipeline
from .errors import UsageError
from .registry import Registry
from .sqlite_files import connect

__all__ = ["TestPipeline", "open_test_pipeline", "run"]

POLL_MS = 5  # how soon the engine finds a job drain() made due


class TestPipeline:
    """What :func:`open_test_pipeline` yields: the pipeline's ``enqueue``, ``enqueue_many``,
    ``enqueue_batch`` and ``emit``, and ``drain``."""

    __test__ = False  # not a test class, whatever pytest thinks of its name

    def __init__(self, pipeline: Pipeline, path: Path) -> None:
        self.pipeline = pipeline
        self.backend = pipeline.backend
        self.path = path
        self.enqueue = pipeline.enqueue
        self.enqueue_many = pipeline.enqueue_many
        self.enqueue_batch = pipeline.enqueue_batch
        self.emit = pipeline.emit

    async def drain(self, *, timeout: float = 30.0) -> list[JobRecord]:
        """Run every job until none is pending or running; every job's record, oldest first.
        TimeoutError if jobs are still unfinished after ``timeout`` seconds (a handler that hangs)."""
        handled = set(self.pipeline.registry.handled())
        with trio.fail_after(timeout):
            while left := await trio.to_thread.run_sync(self._make_due):
                unhandled = sorted(set(left) - handled)
                if unhandled:
                    raise UsageError(f"jobs of types no handler here runs are pending: {', '.join(unhandled)}; "
                                     "register their handlers in the registry under test")
                await trio.sleep(POLL_MS / 1000)
        records, _ = await self.backend.list(limit=1_000_000_000)
        return list(reversed(records))

    def _make_due(self) -> dict[str, int]:
        conn = connect(self.path, synchronous="normal")
        try:
            return store.make_due(conn)
        finally:
            conn.close()


@asynccontextmanager
async def open_test_pipeline(registry: Registry, config: Config | None = None, **settings: Any) -> AsyncIterator[TestPipeline]:
    """The real engine (``open_pipeline``) on a new SQLite file in a temporary folder, removed
    afterwards; ``config`` or ``settings`` (variables in lower case, e.g. ``worker_concurrency=4``)
    for anything else. Leaving the block stops it as a service stops."""
    if config is not None and settings:
        raise UsageError("give a config or settings, not both")
    with tempfile.TemporaryDirectory(prefix="pipeline-test-") as folder:
        path = Path(folder) / "test.db"
        if config is None:  # not the environment's: a test runs the same on every machine
            config = Config.from_env({"SQLITE_SYNCHRONOUS": "normal", **{name.upper(): str(value) for name, value in settings.items()}},
                                     env_file=None)
        config = attrs.evolve(config, database_url=f"sqlite:///{path}", worker=attrs.evolve(config.worker, poll_interval_ms=POLL_MS))
        async with open_pipeline(config, registry) as pipeline:
            yield TestPipeline(pipeline, path)


def run(registry: Registry, job: Any, **settings: Any) -> JobRecord:
    """Enqueue ``job`` on a new test pipeline, drain it, and return the job's final record (a
    plain function, for test suites that are not async). A job that is not of a registered type,
    or does not fit it, raises UnknownJobType or InvalidPayload, as enqueue does."""
    registry.encode(job)  # its errors here, not wrapped in the engine's exception group

    async def main() -> JobRecord:
        async with open_test_pipeline(registry, **settings) as p:
            job_id = await p.enqueue(job)
            records = await p.drain()
        return next(record for record in records if record.id == job_id)

    return trio.run(main)

