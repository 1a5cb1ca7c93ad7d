"""The Enqueuer: subscribes to the EventBus and turns events into jobs (DESIGN 5).

It drains whatever events are waiting, routes each through the registry's routing
table, inserts all their jobs with one Ledger command (one commit for the lot), then
answers each emitter with the ids of its jobs. An emitter hears back only after the
commit, so an event that ``emit`` accepted is never lost.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from .bus import Envelope
from .errors import PipelineError
from .queue import NewJob

if TYPE_CHECKING:
    from .app import Pipeline

log = logging.getLogger("pipeline.enqueuer")

DRAIN_LIMIT = 256


def jobs_for(pipeline: Pipeline, envelope: Envelope) -> list[NewJob]:
    """The routing table applied to one event, encoded and ready to insert."""
    registry, config = pipeline.registry, pipeline.config
    out = []
    for routed in registry.route(envelope.event, config):
        out.append(pipeline.new_job(routed.job, run_after=routed.run_after))
    return out


async def run_enqueuer(
    pipeline: Pipeline, events_recv: trio.MemoryReceiveChannel[Envelope], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
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
                    routed.append((envelope, jobs_for(pipeline, envelope)))
                except Exception as exc:  # a route that raised: that emitter hears why
                    envelope.reply.fail(exc if isinstance(exc, PipelineError) else PipelineError(f"routing {envelope.name} failed: {exc!r}"))
            rows = pipeline.queue.rows_for([job for _, jobs in routed for job in jobs])
            try:
                if rows:
                    await pipeline.queue.enqueue_rows(rows)
            except Exception as exc:  # every emitter of the batch hears why; the Enqueuer goes on
                error = exc if isinstance(exc, PipelineError) else PipelineError(f"inserting the routed jobs failed: {exc!r}")
                for envelope, _ in routed:
                    envelope.reply.fail(error)
                continue
            start = 0
            for envelope, jobs in routed:
                ids = [r.id for r in rows[start : start + len(jobs)]]
                start += len(jobs)
                log.debug("event %s → %d jobs", envelope.name, len(ids))
                envelope.reply.set(ids)
