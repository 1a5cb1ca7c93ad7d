"""For ``pipeline.testing``'s drain: every pending job made due now, and what is left to run."""

from __future__ import annotations

import sqlite3

from ...clock import now_ts
from ...sqlite_files import write_transaction


def make_due(conn: sqlite3.Connection) -> dict[str, int]:
    """Pending jobs due later (a retry's backoff, RetryLater, run_after) are due now; by job type,
    how many jobs are pending or running."""
    with write_transaction(conn):
        now = now_ts()
        conn.execute("UPDATE jobs SET run_after = ? WHERE status = 'pending' AND run_after > ?", (now, now))
        return dict(conn.execute("SELECT job_type, count(*) FROM jobs WHERE status IN ('pending', 'running') GROUP BY job_type"))
