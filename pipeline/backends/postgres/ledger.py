"""The Postgres Ledger: the batch writer of outcomes and inserts. River's batch completer, in trio terms.

It waits for the first command, drains whatever else is already waiting (up to
``batch_limit``), and writes the whole batch as **one statement** (store.write_batch): the
outcomes of every tray, fenced row by row, and every inserted row, with the NOTIFY that wakes
the other processes when the batch made work due. One statement in autocommit is one
transaction and one round trip, with no BEGIN or COMMIT of its own.

Unlike SQLite's, this Ledger is not the only writer: Postgres takes concurrent writers, so
claims, rescues and operator actions run on pooled connections of their own (each one
statement or one short transaction, fenced like everything else). What the Ledger groups
are the two commands that come by thousands: outcomes (on trays, see trays.Tray) and inserts.

When a batch makes work due (an insert of a due job, a release) and the Poller's offer
waits (base.ClaimOffer), the claim rides in the batch's transaction, as a second statement
after the first: a job enqueued by this process starts as soon as its insert commits, with no
claim of its own after it (and no nudge, no thread hop, no second commit).

The Poller's own claims come here too (PostgresBackend.claim): a claim sent while outcomes wait
rides their transaction, as a second statement after theirs, so that the outcomes of one batch and
the claim of the jobs that replace them cost one commit and one WAL flush, not two
(benchmarks/pg_claim_growth.py --one-transaction: 6 to 11 % of the server's CPU per job). A claim
that comes alone is a transaction of its own, as before. Claims of types with a global, rate or key
limit never come here: they take the type's lock, which another process's claim may hold, and the
batch would wait with them. A batch with keyed inserts (which may wait
for another transaction's key) has its claims made first, alone; and a claim the Ledger has not
taken within postgres.CLAIM_RIDE_WAIT is withdrawn by its sender and made on a connection of its own.

Inserts with a unique key are written after the rest of the batch has committed, in a
transaction of their own, and the claim (when an offer was taken) after them: such an insert
waits while another transaction holds its key uncommitted, and the outcomes' rows stay
unlocked meanwhile.

The outcomes of jobs with children (workflows) are left out of the batch's statement and written
after it by store.settle_parents, one statement that applies the edges of the jobs they end (waking
or cancelling children); a batch of plain jobs is the one statement it was. Those outcomes take the
Poller's standing offer (from the worker thread, through the trio thread) and claim right after
their statement: a chain's next job starts in the process that ended the one before, and the NOTIFY
goes out only for woken jobs that claim left to the others. Inserts with parents or a
batch do not come here: each is a transaction of its own (graph.insert_jobs).

A batch whose statement the database refuses for one caller's sake (a duplicate id) is
written again split: the outcomes together, then each caller's rows alone, so only that
caller hears the error. A batch that fails as a whole (the server unreachable) fails every
caller with StoreError: workers try their outcomes again (fenced, so never twice), an
enqueue raises.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import psycopg
import trio

from ...errors import StoreError
from ..base import Claimed, ClaimOffer, Lease, NewJob, Nudge, Settlement, nudge
from ..batches import BATCH_LIMIT, Command, LedgerStats, answer, fail_in_hand, gather, makes_work_due, take_offer, thread_taker
from . import limits, store
from .db import Database, describe, sent_on

log = logging.getLogger("pipeline.ledger")

def _is_outage(exc: BaseException, conn: psycopg.Connection[Any]) -> bool:
    return isinstance(exc, psycopg.OperationalError) or conn.broken or conn.closed


Take = Callable[[], "ClaimOffer | None"]  # the Poller's offer, taken from a worker thread (see _write)


def _apply_batch(conn: psycopg.Connection[Any], batch: list[Command], notify: bool,
                 offer: ClaimOffer | None = None,
                 take: Take | None = None) -> tuple[list[tuple[bool, Any]], list[Lease] | None, bool]:
    """Runs in a worker thread: the batch, and with ``offer`` the claim after it in the same
    transaction; the answers, the leases claimed (None: no claim ran), and whether an outcome woke
    a waiting job (its parent ended: store.settle_parents). Without ``offer``, outcomes of jobs
    with children take the offer through ``take`` and claim after their edges (see :func:`_write`).

    Inserts with a unique key come last, in a transaction of their own, after the rest of the
    batch has committed, and the claim after them: such an insert waits while another
    transaction holds the same key uncommitted (a keyed bulk load), and it must not keep the
    outcomes' rows locked meanwhile (the heartbeat skips locked rows, store.renew: their leases
    would not be renewed)."""
    keyed = [command.rows is not None and any(row.unique_key is not None for row in command.rows) for command in batch]
    if not any(keyed):
        return _write_and_claim(conn, batch, notify, offer, take)
    results: list[tuple[bool, Any]] = [(True, None)] * len(batch)
    woke = False
    first = [i for i, k in enumerate(keyed) if not k]
    if first:
        commands = [batch[i] for i in first]
        answers, woke = _write(conn, commands, notify and makes_work_due(commands))
        for i, result in zip(first, answers):
            results[i] = result
    last = [i for i, k in enumerate(keyed) if k]
    commands = [batch[i] for i in last]
    try:
        answers, woke_too = _write(conn, commands, notify and makes_work_due(commands))
        woke = woke or woke_too
    except (psycopg.Error, StoreError) as exc:
        if not first:
            raise
        if isinstance(exc, psycopg.Error):  # (which session may still run them, for an answer lost: db.sent_on)
            sent_on(exc, conn)
        answers = [(False, exc)] * len(commands)  # the rest of the batch is committed: only these callers fail
    for i, result in zip(last, answers):
        results[i] = result
    leases: list[Lease] | None = None
    if offer is not None:
        # a statement of its own after the inserts: their transaction may have waited, and a
        # claim in it would date its leases from the transaction's start (now()), expired already
        try:
            leases = _claim(conn, offer)
        except psycopg.Error as exc:
            log.warning("the claim after a batch failed (%s); the Poller claims on its own", exc)
    return results, leases, woke


def _write_and_claim(conn: psycopg.Connection[Any], batch: list[Command], notify: bool,
                     offer: ClaimOffer | None, take: Take | None = None) -> tuple[list[tuple[bool, Any]], list[Lease] | None, bool]:
    """A batch without keyed inserts as one statement, and with ``offer`` the claim after it in
    the same transaction."""
    if offer is not None:
        try:
            with conn.transaction():
                # outcomes of parents take the offer (_write): their claim takes the children they
                # woke, and NOTIFYs only for those it left; else the claim comes after the batch
                woken: list[list[Lease]] = []
                results, woke = _write(conn, batch, notify, split=False, take=lambda: offer, claimed=woken)
                leases = woken[0] if woken else _claim(conn, offer)
            return results, leases, woke
        except psycopg.Error as exc:
            if _is_outage(exc, conn):
                raise
            # refused for one caller's sake (rolled back whole): written split below, without the
            # claim (the Poller claims on its own)
        results, woke = _write(conn, batch, notify)
        return results, None, woke
    claimed: list[list[Lease]] = []
    results, woke = _write(conn, batch, notify, take=take, claimed=claimed)
    return results, (claimed[0] if claimed else None), woke


def _write(conn: psycopg.Connection[Any], batch: list[Command], notify: bool,
           *, split: bool = True, take: Take | None = None,
           claimed: list[list[Lease]] | None = None) -> tuple[list[tuple[bool, Any]], bool]:
    """The batch as one statement; split if the database refused it (or, with ``split``
    False, raise). Then the outcomes it left (jobs with children, stale ones) in a statement
    of their own that applies the edges of the jobs they end (store.settle_parents): if that
    fails, only the trays of outcomes fail (the inserts have committed; an outcome written already
    answers False when its worker writes it again). Whether one of them woke a waiting job.

    With ``take``, those outcomes take the Poller's standing offer first, if one waits, and the
    claim follows their statement, on this connection (its leases appended to ``claimed``): a
    child that a parent's end woke starts in the process that ended the parent as soon as that
    commits, with no NOTIFY heard by every process, no nudge and no claim of the Poller's (the
    NOTIFY is sent only for woken children the claim did not take). A chain's link was three
    times the CPU of a serial plain job on Postgres without it."""
    items = [item for command in batch if command.tray is not None for item in command.tray.items]
    inserts = [(i, command.rows) for i, command in enumerate(batch) if command.rows is not None]
    rows = [row for _, command_rows in inserts for row in command_rows]
    results: list[tuple[bool, Any]] = [(True, None)] * len(batch)
    stored: dict[str, str] = {}  # a row not inserted, its unique key held: the holder's id
    try:
        if any(row.unique_key is not None for row in rows):
            held, stored = _write_keyed(conn, items, rows, notify)
        else:  # the common case: the one statement, as before unique keys
            held = store.write_batch(conn, items, rows, notify=notify, parents=False)
    except psycopg.Error as exc:
        if _is_outage(exc, conn) or not split:
            raise
        log.info("a batch of %d outcomes and %d inserts was refused (%s); writing it split", len(items), len(rows), exc)
        stored = {}
        held = _outcomes_alone(conn, items, notify=notify and not rows)
        for i, command_rows in inserts:
            try:
                results[i] = (True, store.insert_jobs(conn, command_rows, notify=notify))
            except psycopg.Error as insert_exc:
                if _is_outage(insert_exc, conn):
                    raise
                results[i] = (False, insert_exc)
    else:
        for i, command_rows in inserts:
            results[i] = (True, [stored.get(row.id, row.id) for row in command_rows] if stored
                          else [row.id for row in command_rows])
    woke = False
    rest = [n for n, written in enumerate(held) if not written]
    failed: BaseException | None = None
    if rest:  # (none in a batch of plain jobs whose leases held)
        offer = take() if take is not None else None
        try:
            answers, woken, pending = store.settle_parents(conn, [items[n] for n in rest], notify=offer is None)
            if offer is not None and claimed is not None:
                claimed.append(_claim_woken(conn, offer, pending))
        except psycopg.Error as exc:
            if _is_outage(exc, conn):
                raise
            log.warning("%d outcomes of jobs with children were not written (%s); their workers write them again",
                        len(rest), exc)
            failed = exc
        else:
            woke = woken > 0
            for n, written in zip(rest, answers):
                held[n] = written
    start = 0
    for i, command in enumerate(batch):
        if command.tray is not None:
            n = len(command.tray.items)
            results[i] = (False, failed) if failed is not None else (True, held[start : start + n])
            start += n
    return results, woke


def _claim(conn: psycopg.Connection[Any], request: ClaimOffer) -> list[Lease]:
    return limits.claim(conn, request.wants, owner=request.owner, lease_seconds=request.lease_seconds,
                        start=request.start, limits=request.limits, rates=request.rates, key_limits=request.key_limits)


def _apply_with_claims(conn: psycopg.Connection[Any], batch: list[Command], notify: bool, offer: ClaimOffer | None,
                       take: Take | None, requests: list[ClaimOffer],
                       ) -> tuple[list[tuple[bool, Any]], list[Lease] | None, bool, list[tuple[bool, Any]]]:
    """Runs in a worker thread: :func:`_apply_batch`, and the claims the Poller sent (``requests``):
    the first in the batch's transaction (the batch's ``offer`` then; the Ledger takes no standing
    offer beside one), any other, or one the batch could not carry (its statement refused for a
    caller's sake, and written split), alone after it. A batch with keyed inserts, which may wait for
    another transaction's key, has its claims made first, each alone: no claim waits behind such a
    wait. Their answers come last: (True, leases) or (False, the error). The leases returned for the
    batch are [] when the claims came after its writes (they saw what it made due: no nudge)."""
    if not requests:
        return (*_apply_batch(conn, batch, notify, offer, take), [])
    keyed = any(command.rows is not None and any(row.unique_key is not None for row in command.rows)
                for command in batch)
    answers: list[tuple[bool, Any]] = []
    if keyed:
        answers = [_claim_alone(conn, request) for request in requests]
        return (*_apply_batch(conn, batch, notify, None, None), answers)
    results: list[tuple[bool, Any]] = []
    leases: list[Lease] | None = None
    woke = False
    if batch:
        results, leases, woke = _apply_batch(conn, batch, notify, requests[0], None)
    for n, request in enumerate(requests):
        answers.append((True, leases) if n == 0 and leases is not None else _claim_alone(conn, request))
    return results, [], woke, answers


def _claim_alone(conn: psycopg.Connection[Any], request: ClaimOffer) -> tuple[bool, Any]:
    try:
        return True, _claim(conn, request)
    except psycopg.Error as exc:
        if _is_outage(exc, conn):
            raise
        return False, exc


def _claim_woken(conn: psycopg.Connection[Any], offer: ClaimOffer, pending: list[str]) -> list[Lease]:
    """The claim of a taken offer after the outcomes of parents committed (a statement of its
    own), and the NOTIFY of the pending children it left to other processes."""
    try:
        leases = _claim(conn, offer)
    except psycopg.Error as exc:
        if _is_outage(exc, conn) or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raise  # (in a transaction, the batch's own: it is rolled back, and written again without the claim)
        log.warning("the claim after outcomes of jobs with children failed (%s); the Poller claims on its own", exc)
        leases = []
    if set(pending) - {lease.id for lease in leases}:
        conn.execute(store.NOTIFY)
    return leases


def _write_keyed(conn: psycopg.Connection[Any], items: list[Settlement], rows: list[NewJob],
                 notify: bool) -> tuple[list[bool], dict[str, str]]:
    """A batch with rows that have a unique key, in one transaction: the outcomes and the other
    rows as one statement, then the keyed rows (store.insert_unique). The outcomes' answers,
    and the id stored for each keyed row."""
    with conn.transaction():
        held = store.write_batch(conn, items, [row for row in rows if row.unique_key is None], notify=False,
                                 parents=False)
        stored = store.insert_unique(conn, [row for row in rows if row.unique_key is not None])
        if notify:
            conn.execute(store.NOTIFY)
    return held, stored


def _outcomes_alone(conn: psycopg.Connection[Any], items: list[Settlement], *, notify: bool) -> list[bool]:
    """The outcomes of a split batch together; if even they are refused, each alone (one the
    database will not take counts as not held: its lease returns the job)."""
    if not items:
        return []
    try:
        return store.write_batch(conn, items, [], notify=notify, parents=False)
    except psycopg.Error as exc:
        if _is_outage(exc, conn):
            raise
    held = []
    for item in items:
        try:
            held.extend(store.write_batch(conn, [item], [], notify=notify, parents=False))
        except psycopg.Error as exc:
            if _is_outage(exc, conn):
                raise
            log.error("job %s: its outcome could not be written: %r", item.id, exc)
            held.append(False)
    return held


async def run_ledger(
    db: Database,
    inbox_recv: trio.MemoryReceiveChannel[Command],
    nudge_send: trio.MemorySendChannel[Nudge],
    stats: LedgerStats,
    *,
    offers_recv: trio.MemoryReceiveChannel[ClaimOffer] | None = None,
    batch_limit: int = BATCH_LIMIT,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Write batches until every sender of the inbox has closed its end. A batch that makes
    work due takes the Poller's standing offer from ``offers_recv``, if one waits, claims for
    it in the same transaction, and answers it on ``nudge_send`` (with no leases if the batch
    failed): every offer taken is answered."""
    batch: list[Command] = []
    offer: ClaimOffer | None = None  # the offer in the batch in hand, until answered
    taken: list[ClaimOffer] = []  # or the offer that outcomes of parents took in the thread (_write), until answered
    take_there = thread_taker(offers_recv, taken)
    with inbox_recv, nudge_send, (offers_recv or contextlib.nullcontext()):
        task_status.started()
        try:
            async for first in inbox_recv:
                outcomes = gather(first, inbox_recv, batch, batch_limit)
                writes = [command for command in batch if command.claim is None]
                requests = [command.claim for command in batch if command.claim is not None]
                if requests:  # (a claim its sender withdrew is made on its own: left out)
                    requests = [request for request in requests if not request.withdrawn]
                    for request in requests:
                        request.taken.set()
                    claims = [command for command in batch if command.claim in requests]
                    batch[:] = [*writes, *claims]
                    if not batch:
                        continue
                else:
                    claims = []
                wakes = makes_work_due(writes)
                offer = take_offer(offers_recv) if wakes and not requests else None
                taken.clear()
                try:
                    results, leases, woke, claimed = await db.write(
                        _apply_with_claims, writes, wakes, offer, take_there if offer is None and not requests else None,
                        [request.offer for request in requests])
                except StoreError as exc:
                    stats.failed_batches += 1
                    stats.trouble = f"the Ledger could not commit: {exc}"
                    log.warning("ledger batch of %d commands not written: %s", len(batch), exc)
                    for command in batch:
                        command.reply.fail(exc)
                    if offer is not None or taken:
                        answer(nudge_send, Claimed(offer or taken.pop(), []))
                        offer = None
                    continue
                stats.batches += 1
                stats.trouble = None
                stats.commands += len(batch) + outcomes
                for command, (ok, value) in zip([*writes, *claims], [*results, *claimed]):
                    if ok:
                        command.reply.set(value)
                    else:
                        command.reply.fail(describe(value, db.url) if isinstance(value, psycopg.Error) else value)
                if offer is not None or taken:
                    answer(nudge_send, Claimed(offer or taken.pop(), leases or []))
                    offer = None
                if leases is None and (wakes or woke):  # (an answered claim is the nudge: it saw everything this batch made due)
                    nudge(nudge_send)  # this process's Poller: at once, before the NOTIFY comes back
        finally:
            fail_in_hand(batch, inbox_recv)
            if offer is not None or taken:
                answer(nudge_send, Claimed(offer or taken.pop(), []))
