"""Cross-process wake-ups on one SQLite file: a commit by another process starts its jobs
here in milliseconds, not at the next poll.

Every commit in WAL mode appends to the ``-wal`` file. On Linux, inotify tells us when it
is written (``inotify_simple``: ctypes over ``inotify_init1``/``inotify_add_watch``); the
trio task waits on the inotify descriptor itself, so an idle pipeline costs nothing. Each
burst of writes becomes one nudge to the Poller, which claims if its pools have room (our
own commits wake it too: a claim then finds nothing new, and writes nothing). Elsewhere, or
if the watch cannot be set, the Poller's poll interval is the fallback.
"""

from __future__ import annotations

import logging
from pathlib import Path

import trio

from ..base import Nudge, nudge

log = logging.getLogger("pipeline.ledger")


async def watch_commits(
    path: Path, nudge_send: trio.MemorySendChannel[Nudge], *, task_status: trio.TaskStatus[bool] = trio.TASK_STATUS_IGNORED
) -> None:
    """Nudge the Poller whenever the file's WAL is written, until cancelled. ``task_status``
    gets whether the watch is set (False: the platform has no inotify, or the WAL is missing)."""
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
        task_status.started(True)
        while True:
            await trio.lowlevel.wait_readable(watcher.fileno())
            try:
                watcher.read(timeout=0)  # every event waiting: one nudge for the burst
            except BlockingIOError:
                continue
            nudge(nudge_send)
