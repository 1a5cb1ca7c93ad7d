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

import logging

import trio

from ...errors import StoreError
from ..base import Nudge, nudge
from ..batches import BATCH_LIMIT, Command, LedgerStats, fail_in_hand, gather, makes_work_due
from . import store
from .db import Database

log = logging.getLogger("pipeline.ledger")

def _apply_batch(client: object, prefix: str, batch: list[Command], shown: str) -> list[tuple[bool, object]]:
    """Runs in a worker thread: the batch in one round trip; one (ok, value) per command."""
    items = [item for command in batch if command.tray is not None for item in command.tray.items]
    inserts = [command.rows for command in batch if command.rows is not None]
    held, answers = store.write_batch(client, prefix, items, inserts, shown)
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
    return results


async def run_ledger(
    db: Database,
    inbox_recv: trio.MemoryReceiveChannel[Command],
    nudge_send: trio.MemorySendChannel[Nudge],
    stats: LedgerStats,
    *,
    batch_limit: int = BATCH_LIMIT,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Write batches until every sender of the inbox has closed its end."""
    batch: list[Command] = []
    with inbox_recv, nudge_send:
        task_status.started()
        try:
            async for first in inbox_recv:
                outcomes = gather(first, inbox_recv, batch, batch_limit)
                try:
                    results = await db.write(_apply_batch, batch, db.shown)
                except StoreError as exc:
                    stats.failed_batches += 1
                    stats.trouble = f"the Ledger could not write: {exc}"
                    log.warning("ledger batch of %d commands not written: %s", len(batch), exc)
                    for command in batch:
                        command.reply.fail(exc)
                    continue
                stats.batches += 1
                stats.trouble = None
                stats.commands += len(batch) + outcomes
                for command, (ok, value) in zip(batch, results):
                    if ok:
                        command.reply.set(value)
                    else:
                        command.reply.fail(value if isinstance(value, BaseException) else StoreError(str(value)))
                if makes_work_due(batch):
                    nudge(nudge_send)  # this process's Poller: at once, before the PUBLISH comes back
        finally:
            fail_in_hand(batch, inbox_recv)
