"""The Ledger: the only writer of job state. River's batch completer, in trio terms.

It waits for the first command, drains whatever else is already waiting (up to
``batch_limit``), crosses to the database thread once, and runs the whole batch in one
``BEGIN IMMEDIATE ... COMMIT``: inserts, claims, outcomes, rescues of expired leases and
operator actions together, so a burst of N jobs costs far fewer than N commits. One that
fails (a duplicate id, a dead job that is no longer dead) is rolled back alone, under a
savepoint, and its caller gets the error; the rest commit. (Lease renewals are the one
write outside it: the heartbeat thread in leases.py moves ``lease_expires_at`` forward, so
that a blocked event loop cannot starve them; it never changes a job's status.)

Its inbox is bounded: that bound is the backpressure for everyone who writes. The loop
ends only when every sender has closed its end, so the last batch is always written.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio

from ...clock import format_ts, now_ts
from ...errors import StoreError
from ...replies import Reply
from .. import batches
from ..base import Claimed, ClaimOffer, NewJob, Nudge, nudge
from ..batches import BATCH_LIMIT, answer, fail_in_hand, gather, take_offer
from ..trays import Tray
from . import store, workflows
from .db import Database, begin_immediate, describe
from .watch import Lookout

log = logging.getLogger("pipeline.ledger")



@attrs.frozen
class Command:
    """One unit of work for the Ledger: ``fn(conn, now)`` inside the batch's transaction,
    or, for the two most common commands by far, a tray of job outcomes or rows to insert,
    which the Ledger writes together with every other outcome or insert of the batch.

    ``kind`` names it in logs and metrics; ``wakes_poller`` says that committing it may
    have made jobs due (an insert, a revive), so the Poller should look at once.
    """

    kind: str
    fn: Callable[[sqlite3.Connection, str], Any] | None
    reply: Reply
    wakes_poller: bool = False
    tray: Tray | None = None
    rows: list[NewJob] | None = None  # an insert: written with every other insert of the batch

    @property
    def wakes(self) -> bool:
        return self.wakes_poller or (self.tray is not None and self.tray.wakes_poller)


def _apply_batch(conn: sqlite3.Connection, batch: list[Command], wait_ms: int) -> tuple[list[tuple[bool, Any]], int, bool]:
    """Runs in the database thread: one transaction; all outcomes in one executemany per
    kind, all inserted rows in one executemany; every other command under a savepoint of
    its own. ``BEGIN IMMEDIATE`` waits at most ``wait_ms`` for another writer's lock.
    Returns the results, ``PRAGMA data_version`` as the transaction began (see Lookout), and
    whether the batch woke waiting jobs (a parent's end made them pending: see workflows.WOKEN)."""
    woken: list[str] = []
    token = workflows.WOKEN.set(woken)  # (this thread's context, for this call)
    try:
        results, version = _apply(conn, batch, wait_ms)
    finally:
        workflows.WOKEN.reset(token)
    return results, version, bool(woken)


def _apply(conn: sqlite3.Connection, batch: list[Command], wait_ms: int) -> tuple[list[tuple[bool, Any]], int]:
    results: list[tuple[bool, Any]] = [(False, None)] * len(batch)
    begin_immediate(conn, wait_ms)
    version = int(conn.execute("PRAGMA data_version").fetchone()[0])
    # the clock is read once the lock is ours: a lease claimed after a long wait for the
    # lock runs its full length from the commit, not from when the batch began to wait
    now = now_ts()
    try:
        trays = [(i, command.tray) for i, command in enumerate(batch) if command.tray is not None]
        if trays:
            items = [item for _, tray in trays for item in tray.items]
            conn.execute("SAVEPOINT outcomes")
            try:
                held: Sequence[bool | StoreError]
                if store.settle(conn, items, now=now) == len(items):
                    held = [True] * len(items)
                else:  # some leases were stale: redo one at a time to learn which
                    conn.execute("ROLLBACK TO outcomes")
                    held = store.settle_each(conn, items, now=now)
            except Exception as exc:
                if not conn.in_transaction:
                    raise  # rolled back whole by SQLite (see _alone)
                # one outcome the database will not take must not sink the others: write each
                # alone; one that still fails counts as not held (its lease returns the job)
                conn.execute("ROLLBACK TO outcomes")
                log.warning("writing %d outcomes together failed (%r); writing them one by one", len(items), exc)
                held = each = []
                for item in items:
                    ok, value = _alone(conn, functools.partial(store.settle, conn, [item], now=now))
                    if not ok:  # its worker hears so and writes it again (never taken for stale)
                        log.error("job %s: its outcome could not be written: %r", item.id, value)
                        each.append(StoreError(f"job {item.id}: its outcome could not be written: {value}"))
                    else:
                        each.append(value == 1)
            start = 0
            for i, tray in trays:
                results[i] = (True, held[start : start + len(tray.items)])
                start += len(tray.items)
            conn.execute("RELEASE outcomes")
        inserts = [(i, command.rows) for i, command in enumerate(batch) if command.rows is not None]
        for i, command in enumerate(batch):
            if command.fn is not None:
                results[i] = _alone(conn, functools.partial(command.fn, conn, now))
            elif inserts and i == inserts[0][0]:
                # every insert of the batch in one executemany, where the first one stands in
                # the batch (commands keep their order: a claim sent before an insert does not see it)
                _insert_all(conn, inserts, results)
        _commit(conn)
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return results, version


def _commit(conn: sqlite3.Connection) -> None:
    """(A function of its own so that a profile tells the commit's fsync, a wait, from the batch's CPU.)"""
    conn.execute("COMMIT")


def _insert_all(conn: sqlite3.Connection, inserts: list[tuple[int, list[NewJob]]], results: list[tuple[bool, Any]]) -> None:
    conn.execute("SAVEPOINT inserts")
    try:
        # per row, the id stored for it (a unique key held by another job: that job's id)
        ids = store.insert_jobs(conn, [row for _, rows in inserts for row in rows])
    except Exception:
        if not conn.in_transaction:
            raise  # rolled back whole by SQLite (see _alone)
        # one caller's rows do not fit (a duplicate id): redo each alone, so only it hears
        conn.execute("ROLLBACK TO inserts")
        for i, rows in inserts:
            results[i] = _alone(conn, functools.partial(store.insert_jobs, conn, rows))
    else:
        start = 0
        for i, rows in inserts:
            results[i] = (True, ids[start : start + len(rows)])
            start += len(rows)
    conn.execute("RELEASE inserts")


def _alone(conn: sqlite3.Connection, fn: Callable[[], Any]) -> tuple[bool, Any]:
    """Run one command under a savepoint of its own: if it fails, only it is undone."""
    conn.execute("SAVEPOINT command")
    try:
        value = fn()
    except Exception as exc:  # the command's own failure: undo it alone
        if not conn.in_transaction:
            # SQLite rolled the whole transaction back itself (it may on SQLITE_FULL,
            # SQLITE_IOERR, SQLITE_NOMEM): nothing of this batch was written
            raise
        conn.execute("ROLLBACK TO command")
        conn.execute("RELEASE command")
        return False, exc
    conn.execute("RELEASE command")
    return True, value


LOCK_PATIENCE = 30.0  # seconds a batch waits, in all, while another process holds the write lock


async def _write_patiently(db: Database, batch: list[Command], stats: LedgerStats) -> tuple[list[tuple[bool, Any]], int, bool]:
    """Run the batch; while another process holds the write lock, wait for it (SQLite's
    busy handler) and try again, until LOCK_PATIENCE has passed on the clock since the
    first try: one deadline, whatever busy_timeout is, so that nobody waits longer than that
    for the Ledger. Then the batch fails, and each caller decides (an enqueue raises, a worker
    tries its outcome again, the Poller claims again)."""
    now = trio.current_time()
    deadline = min(now + stats.patience, stats.give_up_at)
    delay = 0.05
    while True:
        wait_ms = max(0, min(db.busy_timeout_ms, int((deadline - trio.current_time()) * 1000)))
        try:
            done = await db.write(_apply_batch, batch, wait_ms)
        except sqlite3.OperationalError as exc:
            locked = "locked" in str(exc) or "busy" in str(exc)
            left = deadline - trio.current_time()
            if not locked or left <= 0:
                raise
            if stats.trouble is None:
                since = format_ts(time.time() - (trio.current_time() - now))
                stats.trouble = f"database {db.path} is locked by another writer; the Ledger has waited for it since {since}"
            log.warning("database %s is locked by another writer; retrying the batch of %d for %.1f s more", db.path, len(batch), left)
            await trio.sleep(min(delay, left))
            delay = min(delay * 2, 1.0)
            continue
        stats.trouble = None
        return done


@attrs.define
class LedgerStats(batches.LedgerStats):
    """The server Ledgers' counters, and how long a batch waits for another writer's lock;
    ``give_up_at`` is written by the wiring when a graceful stop begins (a locked database
    then fails the batch at once)."""

    patience: float = attrs.field(factory=lambda: LOCK_PATIENCE)  # read when the Ledger starts (tests shorten it)


async def run_ledger(
    db: Database,
    inbox_recv: trio.MemoryReceiveChannel[Command],
    nudge_send: trio.MemorySendChannel[Nudge],
    stats: LedgerStats,
    *,
    offers_recv: trio.MemoryReceiveChannel[ClaimOffer] | None = None,
    lookout: Lookout | None = None,
    batch_limit: int = BATCH_LIMIT,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Write batches until every sender of the inbox has closed its end.

    Whenever a batch makes work due (an insert, a revive, a release), the Ledger takes the
    Poller's standing offer from ``offers_recv``, if one waits, and claims for it in the
    same transaction: a job written by this process starts as soon as its insert commits.
    The leases go back on ``nudge_send`` as a :class:`Claimed`; every offer taken is
    answered, with no leases if the batch failed. Every batch tells ``lookout`` whether
    another process committed since the last one (and nudges the Poller if so)."""
    lookout = lookout if lookout is not None else Lookout()
    lookout.inbox = inbox_recv
    batch: list[Command] = []
    taken: list[ClaimOffer] = []  # the offer in the batch in hand, until answered
    with inbox_recv, nudge_send, (offers_recv or _NO_OFFERS):
        task_status.started()
        try:
            await _serve(db, inbox_recv, nudge_send, stats, offers_recv, lookout, batch_limit, batch, taken)
        finally:
            fail_in_hand(batch, inbox_recv)  # (the Poller, shielded, must not wait for ever)
            for offer in taken:
                answer(nudge_send, Claimed(offer, []))


_NO_OFFERS = contextlib.nullcontext()


async def _serve(
    db: Database,
    inbox_recv: trio.MemoryReceiveChannel[Command],
    nudge_send: trio.MemorySendChannel[Nudge],
    stats: LedgerStats,
    offers_recv: trio.MemoryReceiveChannel[ClaimOffer] | None,
    lookout: Lookout,
    batch_limit: int,
    batch: list[Command],
    taken: list[ClaimOffer],
) -> None:
    """The Ledger's loop. ``batch`` and ``taken`` are the caller's lists, so that what is
    in hand when a cancellation lands can still be answered."""
    async for first in inbox_recv:
        outcomes = gather(first, inbox_recv, batch, batch_limit)
        offer = take_offer(offers_recv) if any(command.wakes for command in batch) else None
        if offer is not None:
            taken.append(offer)
            batch.append(Command("claim", functools.partial(store.claim_leases, wants=offer.wants, owner=offer.owner,
                                                            lease_seconds=offer.lease_seconds, start=offer.start,
                                                            limits=offer.limits, rates=offer.rates,
                                                            key_limits=offer.key_limits), Reply()))
        handed = lookout.hand()
        try:
            results, version, woke = await _write_patiently(db, batch, stats)
        except sqlite3.Error as exc:
            # the transaction as a whole failed (locked past busy_timeout, disk full at
            # COMMIT, I/O error): nothing of it was written; every caller hears so and
            # decides (an enqueue raises, a worker retries its outcome)
            stats.failed_batches += 1
            error = describe(exc, db.path)
            stats.trouble = f"the Ledger could not commit: {error}"
            log.warning("ledger batch of %d commands not written: %s", len(batch), error)
            for command in batch:
                command.reply.fail(error)
            if offer is not None:
                taken.clear()
                answer(nudge_send, Claimed(offer, []))
            continue
        finally:
            lookout.finish()  # (a batch that failed did not look: the watch waiting for it looks itself)
        # another process committed before this batch began: tell the Poller (the WAL watch
        # leaves it to a busy Ledger, see watch.py); or the batch woke waiting jobs (a parent
        # ended): their Poller is told as an insert's is
        wake = lookout.saw(version) or woke
        lookout.looked = handed  # (before the watch woken by finish() runs: no checkpoint in between)
        stats.batches += 1
        stats.commands += len(batch) + outcomes  # each outcome counts as one
        for command, (ok, value) in zip(batch, results):
            if ok:
                command.reply.set(value)
                wake = wake or command.wakes
            else:
                if isinstance(value, sqlite3.Error):
                    value = describe(value, db.path)
                command.reply.fail(value)
        if offer is not None:
            ok, value = results[-1]
            taken.clear()
            answer(nudge_send, Claimed(offer, value if ok else []))
            # the answer is the nudge: its claim saw everything this batch made due, for every
            # pool with room (a pool full of claimed jobs nudges the Poller when it has room)
            wake = not ok
        if wake:
            nudge(nudge_send)
