"""Cross-process wake-ups on one SQLite file: a commit by another process starts its jobs
here in milliseconds, not at the next poll.

Every commit in WAL mode appends to the ``-wal`` file. On Linux, inotify tells us when it
is written (``inotify_simple``: ctypes over ``inotify_init1``/``inotify_add_watch``); the
trio task waits on the inotify descriptor itself, so an idle pipeline costs nothing. Our own
Ledger's commits write the WAL too. ``PRAGMA data_version`` on the Ledger's connection
changes only when another connection committed: every Ledger batch reads it as its
transaction begins and nudges the Poller when it moved (see :class:`Lookout`). On a burst of
writes the watch leaves the look to the Ledger's next batch when one is on its way, and
looks itself only when the Ledger is quiet: a busy pair of processes, whose every commit
wakes the other's watch, pays no extra trip to the database thread per commit (that trip
cost a tenth of the drain rate of two service processes). The watch's own look takes the
write lock, as a batch does (an empty transaction: it writes nothing): the first WAL write of
a commit wakes the watch before the commit is visible, and ``BEGIN IMMEDIATE`` waits for that
writer to finish, however long its fsync takes. Elsewhere, or while the watch cannot be set
(it is tried again, less and less often), the Poller's poll interval is the fallback. A look
the database refuses (an I/O error) nudges the Poller and the watch goes on.
"""
from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import trio

from ..base import Nudge, nudge
from .db import Database, begin_immediate

try:  # at import, not when a backend opens: an import then can fail for want of a descriptor
    import inotify_simple
except (ImportError, OSError):  # not Linux
    inotify_simple = None

log = logging.getLogger("pipeline.ledger")


def _version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


def _look(conn: sqlite3.Connection, wait_ms: int) -> int | None:
    """``data_version`` once the writer whose WAL write woke the watch has committed (or rolled
    back): ``BEGIN IMMEDIATE`` waits for its lock. None if the lock stayed taken ``wait_ms``."""
    try:
        begin_immediate(conn, wait_ms)
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            return None
        raise
    try:
        return _version(conn)
    finally:
        if conn.in_transaction:  # (SQLite rolls back itself on some I/O errors)
            conn.execute("COMMIT")  # nothing written: no WAL write, no event


LEDGER_WAIT = 0.05  # seconds the watch waits for a busy Ledger's next batch before it looks itself
LOOK_WAIT_MS = 1000  # the most a look waits for another writer's lock; then the Poller is nudged (its claim waits longer)
QUIET = 0.002  # seconds without a batch after which the Ledger counts as quiet: the watch watches again
# seconds the watch rests after a look the database refused, doubling while looks keep failing
# (a commit of another process wakes it each time: a lasting fault must not keep a thread busy)
FAILED_LOOK_REST = 0.05
FAILED_LOOK_REST_MOST = 2.0
# seconds before inotify is tried again after it could not be set, doubling up to the most
SETUP_RETRY = 1.0
SETUP_RETRY_MOST = 300.0


class Lookout:
    """What the Ledger's batches learn of other processes' commits, shared with the watch.

    A batch handed to the database thread after a commit of another process sees it in the
    ``data_version`` it reads as its transaction begins (no other writer can commit while it
    holds the lock). So on an inotify event the watch notes how many batches were handed
    (``handed``) and waits for a later one to have looked (``looked``); when the Ledger has
    nothing in hand or waiting, the watch reads the version itself."""

    def __init__(self) -> None:
        self.version: int | None = None  # data_version last read on the Ledger's connection
        self.handed = 0  # batches handed to the database thread
        self.finished = 0  # of those, how many came back (written or failed)
        self.looked = 0  # the last batch, by its number in ``handed``, that read the version
        self.inbox: trio.MemoryReceiveChannel[Any] | None = None  # the Ledger's inbox: commands waiting
        self.finished_at = -float("inf")  # trio time the last batch came back
        self._finished = trio.Event()
        self._handed = trio.Event()

    def saw(self, version: int) -> bool:
        """Note a version read on the Ledger's connection; True if another process committed since the last."""
        moved = self.version is not None and version != self.version
        self.version = version
        return moved

    def hand(self) -> int:
        self.handed += 1
        self._handed.set()
        self._handed = trio.Event()
        return self.handed

    def finish(self) -> None:
        self.finished += 1
        self.finished_at = trio.current_time()
        self._finished.set()
        self._finished = trio.Event()

    def idle(self) -> bool:
        waiting = self.inbox.statistics().current_buffer_used if self.inbox is not None else 0
        return self.finished == self.handed and not waiting

    async def _handed_soon(self) -> bool:
        """While the Ledger is idle: whether it is handed a batch within QUIET of its last one
        (a busy Ledger is idle for moments between batches); False once it is quiet."""
        left = self.finished_at + QUIET - trio.current_time()
        if left > 0:
            with trio.move_on_after(left):
                await self._handed.wait()
                return True
        return False

    async def ledger_looks_after(self, mark: int) -> bool:
        """Whether a batch handed after the ``mark``-th read the version (and nudged the Poller
        if it moved), waiting for one while the Ledger is busy; False once it is quiet (or
        after LEDGER_WAIT): then the caller looks itself."""
        with trio.move_on_after(LEDGER_WAIT):
            while self.looked <= mark:
                if not self.idle():
                    await self._finished.wait()
                elif not await self._handed_soon():
                    return False
            return True
        return False

    async def quiet(self) -> None:
        """Until the Ledger is quiet: while it writes batches, each one looks, and the watch
        need not wake for every commit."""
        while True:
            while not self.idle():
                await self._finished.wait()
            if not await self._handed_soon():
                return


async def watch_commits(
    db: Database, nudge_send: trio.MemorySendChannel[Nudge], lookout: Lookout | None = None, *,
    task_status: trio.TaskStatus[bool] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Nudge the Poller whenever another connection commits to the file, until cancelled.
    ``task_status`` gets whether the watch is set (False: no inotify here, or not now: it is
    tried again, after 1 s, then less and less often, up to every 5 minutes)."""
    lookout = lookout if lookout is not None else Lookout()
    if inotify_simple is None:
        task_status.started(False)
        return
    wal = Path(f"{db.path}-wal")
    retry, failed = SETUP_RETRY, 0
    while True:
        try:
            watcher = inotify_simple.INotify(nonblocking=True)
            try:
                watcher.add_watch(str(wal), inotify_simple.flags.MODIFY)
            except OSError:
                watcher.close()
                raise
        except OSError as exc:  # the per-user inotify limit, no descriptor left, ...
            failed += 1
            if failed == 1:
                task_status.started(False)
                log.info("no cross-process wake-ups for now (cannot watch %s: %s); polling finds other processes' jobs; "
                         "trying again in %.0f s", wal, exc, retry)
            else:
                log.debug("cross-process wake-ups still off (%s); trying again in %.0f s", exc, retry)
            await trio.sleep(retry)
            retry = min(retry * 2, SETUP_RETRY_MOST)
            continue
        with watcher:
            # the version to compare with, read once the watch is set: a commit before it is
            # seen by the Poller's claim (at start, or the nudge below), one after it by a look
            try:
                lookout.saw(await db.write(_version))
            except sqlite3.Error as exc:  # (the next version read, a batch's or a look's, is the start)
                log.warning("the WAL watch could not read %s's version (%s); it watches on", db.path, exc)
            if failed:
                log.info("cross-process wake-ups on: watching %s", wal)
                nudge(nudge_send)  # for what other processes committed while the watch was off
            else:
                task_status.started(True)
            await _watch(watcher, db, nudge_send, lookout)


async def _watch(watcher: Any, db: Database, nudge_send: trio.MemorySendChannel[Nudge], lookout: Lookout) -> None:
    """Wait for WAL writes and look (or leave the look to the Ledger), for ever."""
    rest = 0.0  # while looks fail: how long to rest after the next failure
    while True:
        await trio.lowlevel.wait_readable(watcher.fileno())
        try:
            watcher.read(timeout=0)  # every event waiting: one look for the burst
        except BlockingIOError:
            continue
        if await lookout.ledger_looks_after(lookout.handed):
            # the Ledger is busy: its batches look; watching again once it is quiet, the
            # events of the commits meanwhile wake us at once (they wait in inotify's queue)
            await lookout.quiet()
            continue
        # between the Ledger's batches, on its connection, once the writer that woke us is done
        try:
            version = await db.write(_look, LOOK_WAIT_MS)
        except sqlite3.Error as exc:
            # a read the disk refused for a moment (EIO), a page read while another process
            # wrote it ("malformed"): nothing says whether it committed, so the Poller claims
            # (a claim that fails is retried by the Poller, a lasting fault reported by the
            # Ledger at /healthz) and the watch watches on, resting a little longer each time
            rest = min(rest * 2, FAILED_LOOK_REST_MOST) if rest else FAILED_LOOK_REST
            (log.warning if rest == FAILED_LOOK_REST else log.debug)(
                "the WAL watch's look at %s failed (%s); the Poller claims, the watch goes on in %.2f s", db.path, exc, rest)
            nudge(nudge_send)
            await trio.sleep(rest)
            continue
        if rest:
            log.info("the WAL watch's looks at %s work again", db.path)
            rest = 0.0
        if version is None or lookout.saw(version):
            nudge(nudge_send)  # (a lock held that long: the Poller's claim waits for it)
