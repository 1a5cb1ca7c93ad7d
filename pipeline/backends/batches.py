"""What the three Ledgers (SQLite's, Postgres's, Redis's) share: taking a batch from the inbox,
answering the Poller's offer, and failing what is in hand when a Ledger is cancelled; and, for
the two server backends, their command and their counters.

Each Ledger waits for the first command, drains whatever else is already waiting (up to its
batch limit), and writes the batch in one go (see each backend's ledger.py for how).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Protocol, TypeVar

import attrs
import trio

from ..clock import now_ts
from ..engine.messages import Reply
from ..errors import PipelineClosed
from ..states import Transition
from .base import Claimed, ClaimOffer, NewJob, Nudge
from .trays import Tray

log = logging.getLogger("pipeline.ledger")

BATCH_LIMIT = 1024


class Carried(Protocol):
    """A Ledger command as these helpers see it: its answer, and the tray it may carry."""

    @property
    def reply(self) -> Reply: ...

    @property
    def tray(self) -> Tray | None: ...


C = TypeVar("C", bound=Carried)


def gather(first: C, inbox_recv: trio.MemoryReceiveChannel[C], batch: list[C], limit: int) -> int:
    """Fill ``batch`` with ``first`` and whatever else waits, up to ``limit``; close the trays
    taken (later outcomes go on the next one). Returns how many outcomes the trays hold beyond
    one each (a tray is one command: the counters count each outcome)."""
    batch.clear()
    batch.append(first)
    while len(batch) < limit:
        try:
            batch.append(inbox_recv.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            break
    extra = 0
    for command in batch:
        if command.tray is not None:
            command.tray.is_open = False
            extra += len(command.tray.items) - 1
    return extra


def fail_in_hand(batch: Sequence[Carried], inbox_recv: trio.MemoryReceiveChannel[C]) -> None:
    """Only a cancellation (the caller's scope, not a graceful stop) leaves a Ledger with work
    in hand: answer all of it, the batch and what still waits, so that nobody waits for ever."""
    gone = PipelineClosed("the Ledger was cancelled before writing this")
    for command in batch:
        if not command.reply.answered:
            command.reply.fail(gone)
    while True:
        try:
            waiting = inbox_recv.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel):
            break
        if waiting.tray is not None:
            waiting.tray.is_open = False
        waiting.reply.fail(gone)


def take_offer(offers_recv: trio.MemoryReceiveChannel[ClaimOffer] | None) -> ClaimOffer | None:
    """The Poller's standing offer, if one waits (see base.ClaimOffer)."""
    if offers_recv is None:
        return None
    try:
        return offers_recv.receive_nowait()
    except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
        return None


def answer(nudge_send: trio.MemorySendChannel[Nudge], claimed: Claimed) -> None:
    """Answer a taken offer on the Poller's nudge channel (every offer taken is answered)."""
    try:
        nudge_send.send_nowait(claimed)  # never full: one offer is out at a time (see base.nudge)
    except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
        # the Poller is gone: the jobs stay running under its lease, which nobody renews,
        # and are rescued when it expires
        if claimed.leases:
            log.warning("%d jobs claimed for a Poller that stopped; their leases will return them", len(claimed.leases))


# -- the server backends' Ledgers (Postgres, Redis) ---------------------------------------------------


@attrs.frozen
class Command:
    """A tray of outcomes, or the rows of one insert; answered on ``reply``."""

    reply: Reply
    tray: Tray | None = None
    rows: list[NewJob] | None = None


@attrs.define
class LedgerStats:
    """Written by the Ledger only; read by benchmarks and /metrics."""

    batches: int = 0
    commands: int = 0
    failed_batches: int = 0
    give_up_at: float = math.inf  # kept for symmetry with SQLite's: the driver's timeouts bound a stop here
    trouble: str | None = None  # why batches cannot be written right now (for /healthz), None while they can


def makes_work_due(batch: Sequence[Command]) -> bool:
    """An insert of a job due now, or a release (due again at once): this process's Poller
    should look at once. (A retry is due after its backoff: a poll finds it.)"""
    now: str | None = None
    for command in batch:
        if command.tray is not None and any(item.transition is Transition.RELEASE for item in command.tray.items):
            return True
        if command.rows:
            now = now or now_ts()
            if any(row.run_after <= now for row in command.rows):
                return True
    return False
