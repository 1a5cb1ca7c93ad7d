"""Whether checkpoints keep the WAL small: its size for ``/metrics``, and a reason for
``/healthz`` while a reader holds them back.

SQLite copies the WAL back into the database file by itself (a PASSIVE checkpoint after a
commit that leaves it above 1,000 pages, about 4 MB), and the next writer after a complete
checkpoint starts the WAL again from its beginning, truncating the file to
``journal_size_limit`` (``sqlite_files.WAL_SIZE_LIMIT``). A checkpoint cannot copy a frame
past the oldest snapshot a reader still reads: a read transaction left open (a backup, a
``sqlite3`` shell at its prompt, a stuck handler) stops every checkpoint there, and the WAL
grows with every commit for as long as it stays open (every read then searches a longer WAL).

Every ``CHECK_EVERY`` seconds :func:`run_wal_check` reads the WAL's size; while it is above the
limit, it runs a PASSIVE checkpoint itself (which never waits for nor blocks a reader or a
writer) on a reader connection: its answer (busy, frames in the WAL, frames copied back)
tells whether some frames could not be copied. Frames left over while the WAL grew since the
last look: checkpoints cannot keep up, and ``/healthz`` says so until a checkpoint copies
everything or the WAL is back under the limit.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path

import trio

from ... import sqlite_files
from ...errors import StoreError
from .db import Database

log = logging.getLogger("pipeline.ledger")

CHECK_EVERY = 5.0  # seconds between looks at the WAL's size


class WalCheck:
    """The WAL's size and, while checkpoints cannot keep up, why (for ``/healthz``).
    Written by :func:`run_wal_check`, read by the backend's ``counters`` and ``trouble``."""

    def __init__(self, path: Path) -> None:
        self.wal = Path(f"{path}-wal")
        self.trouble: str | None = None

    def size(self) -> int:
        """Bytes of the ``-wal`` file now (0 when there is none: no connection is open)."""
        try:
            return os.stat(self.wal).st_size
        except FileNotFoundError:
            return 0


def _checkpoint(conn: sqlite3.Connection) -> tuple[int, int, int]:
    busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return int(busy), int(frames), int(copied)


async def run_wal_check(db: Database, check: WalCheck, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Look at the WAL every CHECK_EVERY seconds, until cancelled (see the module docstring)."""
    task_status.started()
    before = check.size()
    while True:
        await trio.sleep(CHECK_EVERY)
        size, limit = check.size(), sqlite_files.WAL_SIZE_LIMIT
        if size <= limit:
            if check.trouble is not None:
                log.warning("the WAL of %s is back to %d bytes: checkpoints keep up again", db.path, size)
            check.trouble, before = None, size
            continue
        try:
            busy, frames, copied = await db.read(_checkpoint)
        except StoreError as exc:  # the Ledger reports a database that does not answer
            log.debug("the WAL check's checkpoint of %s failed: %s", db.path, exc)
            continue
        if busy:  # another checkpoint was running: nothing learnt
            continue
        if copied < frames and size > before:
            if check.trouble is None:
                log.warning("the WAL of %s is %d bytes and growing: checkpoints cannot copy it back", db.path, size)
            check.trouble = (
                f"the WAL of {db.path} is {size / 2**20:.1f} MB and growing: a checkpoint could copy back only {copied} "
                f"of its {frames} pages, held back by a connection with a read transaction open (a backup, a sqlite3 "
                f"shell, a long query?); it shrinks once that transaction ends"
            )
        elif copied == frames:
            if check.trouble is not None:
                log.warning("the WAL of %s was checkpointed whole: checkpoints keep up again", db.path)
            check.trouble = None
        before = size
