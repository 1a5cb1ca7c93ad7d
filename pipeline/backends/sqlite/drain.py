"""For ``pipeline.testing``'s drain: every pending job made due now, and what is left to run."""

from __future__ import annotations

import sqlite3

from ...clock import now_ts
from ...sqlite_files import write_transaction


def make_due(conn: sqlite3.Connection) -> dict[str, int]:
    """Pending jobs due later (a retry's backoff, RetryLater, Snooze, run_after) and durable sleeps are due now; by job
    type, how many jobs are running, or pending of a type that is not paused (those of a paused
    type wait for its resume: a drain does not wait for them)."""
    with write_transaction(conn):
        now = now_ts()
        conn.execute("UPDATE jobs SET run_after = ? WHERE status = 'pending' AND run_after > ?", (now, now))
        # a durable sleep (ctx.sleep) is over at once too; a wait for a signal is not: the test sends it
        conn.execute("UPDATE jobs SET run_after = ? WHERE status = 'suspended' AND awaiting_signal IS NULL AND run_after > ?",
                     (now, now))
        return dict(conn.execute(_LEFT))


_LEFT = (
    "SELECT job_type, count(*) FROM jobs WHERE status = 'running' "
    "OR status = 'pending' AND job_type NOT IN (SELECT job_type FROM paused_types) "
    "OR status = 'suspended' AND awaiting_signal IS NULL GROUP BY job_type"
)
