"""The Enqueuer: subscribes to the EventBus and turns events into jobs (DESIGN 5).

It drains whatever events are waiting, routes each through the registry's routing
table, inserts all their jobs with one backend call (one commit for the lot), then
answers each emitter with the ids of its jobs. An emitter hears back only after the
commit, so an event that ``emit`` accepted is never lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from ...backends.base import Backend, NewJob
from ...errors import PipelineError
from .bus import Envelope

log = logging.getLogger("pipeline.enqueuer")

DRAIN_LIMIT = 256


async def run_enqueuer(
    backend: Backend,
    route: Callable[[object, str | None], list[NewJob]],
    events_recv: trio.MemoryReceiveChannel[Envelope],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """``route(event, trace)``: the jobs an event leads to, validated and ready to insert, with
    the emitter's trace context."""
    with events_recv:
        task_status.started()
        async for first in events_recv:
            batch = [first]
            while len(batch) < DRAIN_LIMIT:
                try:
                    batch.append(events_recv.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            routed: list[tuple[Envelope, list[NewJob]]] = []
            for envelope in batch:
                try:
                    routed.append((envelope, route(envelope.event, envelope.trace)))
                except Exception as exc:  # a route that raised: that emitter hears why
                    envelope.reply.fail(exc if isinstance(exc, PipelineError) else PipelineError(f"routing {envelope.name} failed: {exc!r}"))
            rows = [job for _, jobs in routed for job in jobs]
            try:
                ids = await backend.insert(rows)  # per row, the id stored (a duplicate's: its holder's)
            except Exception as exc:  # every emitter of the batch hears why; the Enqueuer goes on
                error = exc if isinstance(exc, PipelineError) else PipelineError(f"inserting the routed jobs failed: {exc!r}")
                for envelope, _ in routed:
                    envelope.reply.fail(error)
                continue
            start = 0
            for envelope, jobs in routed:
                log.debug("event %s → %d jobs", envelope.name, len(jobs))
                envelope.reply.set(ids[start : start + len(jobs)])
                start += len(jobs)
