"""Shared by the admin tests: a store with jobs in every final state, and the admin server
served for real on a loopback port (in the test's own trio run, or in a thread for the
synchronous Playwright and schemathesis tests)."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from typing import Any

import trio

from pipeline import Config, PermanentError, Registry, open_pipeline
from pipeline.admin import run_admin_server
from pipeline.site import SendEmail, types_registry
from pipeline.site.jobs import GenerateSitemap, InvalidateCache

FAILING_SUBJECT = "bounce"


def seed_registry() -> Registry:
    """The built-in types; send_email and invalidate_cache have test handlers (the rest stay pending)."""
    registry = types_registry()

    async def send_email(job: SendEmail, ctx: Any) -> None:
        if job.subject.startswith(FAILING_SUBJECT):
            raise PermanentError(f"550 mailbox {job.to} unavailable")

    async def invalidate(job: InvalidateCache, ctx: Any) -> None:
        return None

    registry.register("send_email", SendEmail, send_email)
    registry.register("invalidate_cache", InvalidateCache, invalidate)
    return registry


async def seed(config: Config, *, completed: int = 3, dead: int = 2, pending: int = 2) -> dict[str, list[str]]:
    """Run a real pipeline until ``completed`` jobs completed and ``dead`` died; leave
    ``pending`` generate_sitemap jobs (no handler here) pending, with the unique keys sitemap-0,
    sitemap-1, ... Returns the ids by status."""
    registry = seed_registry()
    ids: dict[str, list[str]] = {"completed": [], "dead": [], "pending": []}
    async with open_pipeline(config, registry) as p:
        for i in range(completed):
            ids["completed"].append(await p.enqueue(SendEmail(to=f"user{i}@example.com", subject=f"hello {i}", body="hi")))
        for i in range(dead):
            ids["dead"].append(await p.enqueue(SendEmail(to=f"gone{i}@example.com", subject=f"{FAILING_SUBJECT} {i}", body="hi")))
        for i in range(pending):  # with unique keys, which the views show
            ids["pending"].append(await p.enqueue(GenerateSitemap(), unique_key=f"sitemap-{i}"))
        with trio.fail_after(10):
            for status in ("completed", "dead"):
                for job_id in ids[status]:
                    while (record := await p.backend.get(job_id)) is None or record.status != status:
                        await trio.sleep(0.01)
    return ids


@contextlib.contextmanager
def serve_in_thread(config: Config, registry: Registry | None = None) -> Iterator[str]:
    """The pipeline and its admin server in a thread of their own; yields the base URL."""
    handoff: queue.Queue[Any] = queue.Queue()

    async def main() -> None:
        stop = trio.Event()
        async with open_pipeline(config, registry or seed_registry()) as pipeline, trio.open_nursery() as tn:
            url = await tn.start(run_admin_server, pipeline, None, stop.wait)
            handoff.put((url, trio.lowlevel.current_trio_token(), stop))
            await stop.wait()

    def run() -> None:
        try:
            trio.run(main)
        except BaseException as exc:
            handoff.put(exc)
            raise

    thread = threading.Thread(target=run, name="admin-server", daemon=True)
    thread.start()
    item = handoff.get(timeout=30)
    if isinstance(item, BaseException):
        raise item
    url, token, stop = item
    try:
        yield url
    finally:
        trio.from_thread.run_sync(stop.set, trio_token=token)
        thread.join(timeout=30)
        assert not thread.is_alive(), "the admin server did not stop"
