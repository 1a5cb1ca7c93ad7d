"""Cross-process wake-ups on one SQLite file: a commit by another process starts its jobs
here in milliseconds, not at the next poll.

Every commit in WAL mode appends to the ``-wal`` file. On Linux, inotify tells us when it
is written (``inotify_simple``: ctypes over ``inotify_init1``/``inotify_add_watch``); the
trio task waits on the inotify descriptor itself, so an idle pipeline costs nothing. Our own
Ledger's commits write the WAL too: on each burst of writes the task reads ``PRAGMA
data_version`` on the Ledger's connection, which changes only when another connection
committed, and nudges the Poller only then (a claim for nothing would cost a transaction).
Elsewhere, or if the watch cannot be set, the Poller's poll interval is the fallback.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import trio

from ..base import Nudge, nudge
from .db import Database

log = logging.getLogger("pipeline.ledger")


def _version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


async def watch_commits(
    db: Database, nudge_send: trio.MemorySendChannel[Nudge], *, task_status: trio.TaskStatus[bool] = trio.TASK_STATUS_IGNORED
) -> None:
    """Nudge the Poller whenever another connection commits to the file, until cancelled.
    ``task_status`` gets whether the watch is set (False: no inotify here, or no WAL)."""
    path = db.path
    try:
        from inotify_simple import INotify, flags
    except (ImportError, OSError):  # not Linux
        task_status.started(False)
        return
    wal = Path(f"{path}-wal")
    try:
        watcher = INotify(nonblocking=True)
    except OSError as exc:  # e.g. the per-user inotify limit
        log.info("no cross-process wake-ups (inotify: %s); polling finds other processes' jobs", exc)
        task_status.started(False)
        return
    with watcher:
        try:
            watcher.add_watch(str(wal), flags.MODIFY)
        except OSError as exc:
            log.info("no cross-process wake-ups (cannot watch %s: %s); polling finds other processes' jobs", wal, exc)
            task_status.started(False)
            return
        seen = await db.write(_version)
        task_status.started(True)
        while True:
            await trio.lowlevel.wait_readable(watcher.fileno())
            try:
                watcher.read(timeout=0)  # every event waiting: one look for the burst
            except BlockingIOError:
                continue
            version = await db.write(_version)  # between the Ledger's batches, on its connection
            if version != seen:
                seen = version
                nudge(nudge_send)
