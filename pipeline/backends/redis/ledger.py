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
import math

import attrs
import trio

from ...clock import now_ts
from ...engine.messages import Reply
from ...errors import PipelineClosed, StoreError
from ...states import Transition
from ..base import NewJob, Nudge, nudge
from ..trays import Tray
from . import store
from .db import Database

log = logging.getLogger("pipeline.ledger")

BATCH_LIMIT = 1024


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
    give_up_at: float = math.inf
    trouble: str | None = None  # why batches cannot be written right now (for /healthz), None while they can


def _apply_batch(client: object, prefix: str, batch: list[Command], shown: str) -> list[tuple[bool, object]]:
    """Runs in a worker thread: the batch in one round trip; one (ok, value) per command."""
    items = [item for command in batch if command.tray is not None for item in command.tray.items]
    inserts = [command.rows for command in batch if command.rows is not None]
    held, errors = store.write_batch(client, prefix, items, inserts, shown)
    results: list[tuple[bool, object]] = []
    start = 0
    failures = iter(errors)
    for command in batch:
        if command.tray is not None:
            n = len(command.tray.items)
            results.append((True, held[start : start + n]))
            start += n
        else:
            error = next(failures)
            results.append((True, None) if error is None else (False, error))
    return results


def _makes_work_due(batch: list[Command]) -> bool:
    """An insert of a job due now, or a release (due again at once): this process's Poller
    should look at once (other processes hear the scripts' PUBLISH)."""
    now: str | None = None
    for command in batch:
        if command.tray is not None and any(item.transition is Transition.RELEASE for item in command.tray.items):
            return True
        if command.rows:
            now = now or now_ts()
            if any(row.run_after <= now for row in command.rows):
                return True
    return False


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
                batch.clear()
                batch.append(first)
                while len(batch) < batch_limit:
                    try:
                        batch.append(inbox_recv.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                outcomes = 0
                for command in batch:
                    if command.tray is not None:
                        command.tray.is_open = False  # later outcomes go on the next tray
                        outcomes += len(command.tray.items) - 1
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
                if _makes_work_due(batch):
                    nudge(nudge_send)  # this process's Poller: at once, before the PUBLISH comes back
        finally:
            # only a cancellation gets here with work in hand: answer it all
            gone = PipelineClosed("the Ledger was cancelled before writing this")
            for command in batch:
                if not command.reply.answered:
                    command.reply.fail(gone)
            while True:
                try:
                    command = inbox_recv.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                if command.tray is not None:
                    command.tray.is_open = False
                command.reply.fail(gone)
