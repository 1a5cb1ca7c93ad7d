"""Trays: many workers' outcomes carried to a batching writer (a Ledger) as one command.

Shared by the backends whose writer batches (SQLite's Ledger, Postgres's): the worker that
settles while no tray is open sends the tray to the writer; the workers after it only add
their outcome and wait for the same answer (see :class:`Tray`). How the tray reaches the
writer is the backend's (``send``); what goes on it and how its answer is split is here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import attrs
import trio

from ..errors import PipelineClosed, StoreError
from ..replies import Reply
from ..states import Transition
from .base import Settlement


@attrs.define(eq=False)
class Tray:
    """Job outcomes on their way to the Ledger, carried by one command.

    The worker that settles while no tray is open sends the command; the workers after it
    only add their outcome to the open tray and wait for the same answer. A batch of N
    outcomes so costs one inbox message and one wake-up event, not N of each (the
    per-outcome message and event were a fifth of the trio thread's time per job when
    draining). The Ledger closes the tray when it takes the command into a batch; an
    outcome that comes after that opens the next tray. Worker tasks write ``items`` while
    the tray is open; the Ledger's thread reads them once it is closed.
    """

    items: list[Settlement] = attrs.field(factory=list)
    is_open: bool = True
    wakes_poller: bool = False  # it holds a RELEASE: that job is due again at once
    # answered with one bool per item, True if the lease still held; or the StoreError that
    # kept that item from being written
    reply: Reply = attrs.field(factory=Reply)

    def add_all(self, items: Sequence[Settlement]) -> int:
        """Add outcomes; returns where the first one stands (its answer's index)."""
        first = len(self.items)
        for item in items:  # (a loop: one outcome per call is the rule, and a generator costs more)
            self.items.append(item)
            if item.transition is Transition.RELEASE:
                self.wakes_poller = True
        return first


class Trays:
    """The open tray of one backend, and the settle path through it. Written and read on
    the trio thread only (by the workers' tasks); the writer closes a tray it takes."""

    def __init__(self, send: Callable[[Tray], Awaitable[None]]) -> None:
        self._send = send  # hands a new tray to the writer; ClosedResourceError once it has stopped
        self._open: Tray | None = None

    async def settle(self, outcomes: Sequence[Settlement]) -> list[bool]:
        """On the open tray if there is one, else on a new tray sent to the writer:
        concurrent callers share one command and one commit."""
        if not outcomes:
            return []
        tray = self._open
        if tray is not None and tray.is_open:
            first = tray.add_all(outcomes)
        else:
            tray = self._open = Tray()
            first = tray.add_all(outcomes)
            await self._hand_over(tray)
        held = (await tray.reply.wait())[first : first + len(outcomes)]
        for value in held:
            if isinstance(value, StoreError):  # that one could not be written: its caller tries again
                raise value
        return held

    async def _hand_over(self, tray: Tray) -> None:
        try:
            await self._send(tray)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            tray.is_open = False
            closed = PipelineClosed("the pipeline is shut down; the job store takes no more writes")
            tray.reply.fail(closed)
            raise closed from None
        except BaseException:
            # cancelled while the inbox was full: the outcomes added meanwhile were never
            # sent; their callers hear so and send them again
            tray.is_open = False
            tray.reply.fail(StoreError("outcome not handed to the Ledger (the task carrying it was cancelled); trying again"))
            raise
