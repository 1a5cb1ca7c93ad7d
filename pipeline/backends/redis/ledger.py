"""The Redis Ledger: the batch writer of outcomes and inserts (River's batch completer, in trio terms).

It waits for the first command, drains whatever else is already waiting (up to
``batch_limit``), and writes the whole batch in **one round trip** (store.write_batch): one
SETTLE script with every tray's outcomes, each fenced by (id, running, token) on the server,
then one INSERT script per caller's rows, pipelined. Each script is atomic; a duplicate id
fails only the insert that holds it. A batch that fails as a whole (the server unreachable)
fails every caller with StoreError: workers try their outcomes again (fenced, so never
twice), an enqueue raises.

As with Postgres, claims, rescues and operator actions do not pass through here: each is one
script of its own on a pooled connection, fenced like everything else.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import redis
import trio

from ...errors import StoreError
from ..base import Claimed, ClaimOffer, Lease, Nudge, nudge
from ..batches import BATCH_LIMIT, Command, LedgerStats, answer, fail_in_hand, gather, makes_work_due, thread_taker
from . import store
from .db import Database

log = logging.getLogger("pipeline.ledger")

def _apply_batch(client: Any, prefix: str, batch: list[Command], shown: str,
                 take: Callable[[], ClaimOffer | None] | None = None, claimed: list[list[Lease]] | None = None,
                 own: str = "1") -> tuple[list[tuple[bool, object]], bool]:
    """Runs in a worker thread: the batch in one round trip; one (ok, value) per command, and
    whether this process's Poller should look (jobs woken that no claim here took).

    With ``take``, jobs that the outcomes woke (their last parent ended) are not PUBLISHed by the
    script: the Poller's standing offer is taken (from this thread, through the trio thread) and
    claimed for at once, its leases appended to ``claimed``; what that claim left is PUBLISHed for
    the other processes with the payload ``own``, which this process's listener skips (its Poller
    is nudged by the Ledger: an echo arriving late withdrew the offer the next link needed). A
    chain's next job starts in the process that ended the one before, and the others hear nothing:
    with two worker processes each heard every link and claimed in vain (a chain's job cost 2.3
    times a serial plain job's CPU)."""
    items = [item for command in batch if command.tray is not None for item in command.tray.items]
    inserts = [command.rows for command in batch if command.rows is not None]
    held, answers, woken = store.write_batch(client, prefix, items, inserts, shown, quiet=take is not None)
    look = False
    if woken:
        offer = take() if take is not None else None
        leases: list[Lease] = []
        try:
            if offer is not None:
                leases = store.claim(client, prefix, wants=offer.wants, owner=offer.owner,
                                     lease_seconds=offer.lease_seconds, start=offer.start, limits=offer.limits,
                                     rates=offer.rates, key_limits=offer.key_limits)
            if set(woken) - {lease.id for lease in leases}:
                look = True
                client.publish(prefix + "wake", own)
        except redis.RedisError as exc:  # the outcomes are written: answered as such; polls find the rest
            look = True
            log.warning("the claim or wake after outcomes that woke %d jobs failed (%s)", len(woken), exc)
        if claimed is not None and offer is not None:
            claimed.append(leases)
    results: list[tuple[bool, object]] = []
    start = 0
    inserted = iter(answers)
    for command in batch:
        if command.tray is not None:
            n = len(command.tray.items)
            results.append((True, held[start : start + n]))
            start += n
        else:
            answer = next(inserted)  # the ids stored for its rows, or the error that refused them
            results.append((False, answer) if isinstance(answer, BaseException) else (True, answer))
    return results, look


async def run_ledger(
    db: Database,
    inbox_recv: trio.MemoryReceiveChannel[Command],
    nudge_send: trio.MemorySendChannel[Nudge],
    stats: LedgerStats,
    *,
    offers_recv: trio.MemoryReceiveChannel[ClaimOffer] | None = None,
    own: str = "1",
    batch_limit: int = BATCH_LIMIT,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Write batches until every sender of the inbox has closed its end. Jobs woken by a batch's
    outcomes take the Poller's offer from ``offers_recv``, if one waits, and what they leave is
    PUBLISHed with the payload ``own`` (see _apply_batch): every offer taken is answered on
    ``nudge_send``."""
    batch: list[Command] = []
    taken: list[ClaimOffer] = []  # the offer that woken jobs took in the thread (_apply_batch), until answered
    claimed: list[list[Lease]] = []  # and its leases
    take_there = thread_taker(offers_recv, taken)
    with inbox_recv, nudge_send, (offers_recv or contextlib.nullcontext()):
        task_status.started()
        try:
            async for first in inbox_recv:
                outcomes = gather(first, inbox_recv, batch, batch_limit)
                taken.clear()
                claimed.clear()
                try:
                    results, look = await db.write(_apply_batch, batch, db.shown, take_there, claimed, own)
                except StoreError as exc:
                    stats.failed_batches += 1
                    stats.trouble = f"the Ledger could not write: {exc}"
                    log.warning("ledger batch of %d commands not written: %s", len(batch), exc)
                    for command in batch:
                        command.reply.fail(exc)
                    if taken:
                        answer(nudge_send, Claimed(taken.pop(), claimed[0] if claimed else []))
                    nudge(nudge_send)  # (jobs it woke, if it was written, were not PUBLISHed)
                    continue
                stats.batches += 1
                stats.trouble = None
                stats.commands += len(batch) + outcomes
                for command, (ok, value) in zip(batch, results):
                    if ok:
                        command.reply.set(value)
                    else:
                        command.reply.fail(value if isinstance(value, BaseException) else StoreError(str(value)))
                if taken:
                    answer(nudge_send, Claimed(taken.pop(), claimed[0] if claimed else []))
                if look or makes_work_due(batch):
                    nudge(nudge_send)  # this process's Poller: at once, before the PUBLISH comes back
        finally:
            fail_in_hand(batch, inbox_recv)
            if taken:
                answer(nudge_send, Claimed(taken.pop(), claimed[0] if claimed else []))
