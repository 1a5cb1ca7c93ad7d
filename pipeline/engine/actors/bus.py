"""The EventBus: business code emits events; every subscriber gets every event.

Where the seed's broadcast channel skipped events when a subscriber lagged, this bus
never drops one: it awaits each subscriber's bounded channel in turn, so a slow
subscriber slows ``emit`` down (backpressure) instead of losing events.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio

from ...replies import Reply


@attrs.frozen
class Envelope:
    """An event on its way; ``reply`` receives the ids of the jobs it led to, once committed."""

    name: str
    event: Any
    reply: Reply
    trace: str | None = None  # the emitter's trace context, for the jobs the event routes to


async def run_event_bus(
    bus_recv: trio.MemoryReceiveChannel[Envelope],
    subscriber_sends: list[trio.MemorySendChannel[Envelope]],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Fan each event out to every subscriber; closing ``bus_recv``'s senders ends it,
    and it then closes the subscribers' channels in turn."""
    try:
        with bus_recv:
            task_status.started()
            async for envelope in bus_recv:
                for send in subscriber_sends:
                    await send.send(envelope)
    finally:
        for send in subscriber_sends:
            send.close()
