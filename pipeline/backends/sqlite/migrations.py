"""The jobs schema: numbered migrations, applied at start-up, recorded in ``schema_migrations``.

Each migration runs in its own ``BEGIN IMMEDIATE`` transaction together with the row
that records it, so two processes starting at once cannot both apply one, and a crash
mid-migration leaves nothing half-done. A database whose recorded version is newer
than :data:`LATEST` is refused: this code does not know what the newer one changed.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Final

from ...errors import StoreError
from ...sqlite_files import Migration, apply_migrations, recorded_versions, run_statements

MIGRATIONS: Final[list[Migration]] = [
    (
        1,
        "jobs",
        """
        -- the seed's migrations/006_jobs.sql, with what leases and priorities need
        CREATE TABLE IF NOT EXISTS jobs (
            id               TEXT PRIMARY KEY,                  -- UUID v7
            job_type         TEXT NOT NULL,
            payload          TEXT NOT NULL,                     -- JSON object
            status           TEXT NOT NULL DEFAULT 'pending'
                             CHECK (status IN ('pending', 'running', 'completed', 'dead')),
            attempts         INTEGER NOT NULL DEFAULT 0,
            max_attempts     INTEGER NOT NULL DEFAULT 3 CHECK (max_attempts >= 1),
            -- never NULL, so the claim index can range-scan it; "now" when not delayed
            run_after        TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
            error            TEXT,
            created_at       TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
            updated_at       TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
            priority         INTEGER NOT NULL DEFAULT 5,        -- lower runs first (seed 13)
            lease_owner      TEXT,                              -- worker holding a running job
            lease_token      INTEGER NOT NULL DEFAULT 0,        -- +1 per claim, never reset: fences outcomes
            lease_expires_at TEXT                               -- running jobs: rescue after this
        );
        CREATE INDEX IF NOT EXISTS idx_jobs_status ON jobs(status);
        CREATE INDEX IF NOT EXISTS idx_jobs_run_after ON jobs(run_after) WHERE status = 'pending';
        CREATE INDEX IF NOT EXISTS idx_jobs_type ON jobs(job_type);
        -- serves the claim query: equality on job_type, then already in claim order,
        -- so LIMIT n reads n entries instead of sorting every pending row
        CREATE INDEX IF NOT EXISTS idx_jobs_claim ON jobs(job_type, priority, run_after) WHERE status = 'pending';
        """,
    ),
    (
        3,
        "workers",
        """
        -- The worker processes on this file and the job types each knows, kept fresh by each
        -- one's lease heartbeat. A pending job of a type no process here knows goes dead only
        -- if no live worker knows it either (another process's backlog is not ours to bury).
        CREATE TABLE IF NOT EXISTS workers (
            owner        TEXT PRIMARY KEY,       -- host:pid, as in jobs.lease_owner
            job_types    TEXT NOT NULL,          -- JSON array
            started_at   TEXT NOT NULL,
            heartbeat_at TEXT NOT NULL
        );
        """,
    ),
    (
        5,
        "the bundled site's tables are its own",
        """
        -- Versions 2 and 4 created the bundled site's tables (users, posts, media, the search
        -- index) in every job database; the site now creates them itself, in site_migrations,
        -- only where it runs. Files that have them keep them; nothing else changes.
        SELECT 1;
        """,
    ),
    (
        6,
        "claim order ends with the id",
        """
        -- The claim order is priority, then due time, then id (the protocol's); ties of the
        -- first two were taken in insertion order. With id in the index the claim still walks
        -- it in order and reads only the rows it takes, however many share a due time.
        CREATE INDEX IF NOT EXISTS idx_jobs_claim_order ON jobs(job_type, priority, run_after, id) WHERE status = 'pending';
        DROP INDEX IF EXISTS idx_jobs_claim;
        """,
    ),
    (
        7,
        "a worker's own lease in the registry",
        """
        -- A worker beats every third of its lease: one that beat within its lease is alive,
        -- whatever WORKER_UNKNOWN_TYPE_GRACE_SECONDS another process runs with.
        ALTER TABLE workers ADD COLUMN lease_seconds REAL NOT NULL DEFAULT 30;
        """,
    ),
    (
        8,
        "when the running attempt started",
        """
        -- A job claimed ahead of a free worker (the prefetch) is running under its lease but
        -- has not started: its attempt counts only once it starts, when started_at is set. A
        -- lease that expires before that returns the job without charging an attempt.
        ALTER TABLE jobs ADD COLUMN started_at TEXT;
        UPDATE jobs SET started_at = updated_at WHERE status = 'running';
        """,
    ),
    (
        9,
        "unique jobs",
        """
        -- While a job of a type and key is pending or running, no other job of that type and
        -- key can be: an insert that would break this inserts nothing (ON CONFLICT DO
        -- NOTHING) and answers the holder's id. Partial: rows without a key, and finished
        -- rows, are not in the index, so it costs nothing to jobs that do not use it.
        ALTER TABLE jobs ADD COLUMN unique_key TEXT;
        CREATE UNIQUE INDEX IF NOT EXISTS idx_jobs_unique ON jobs(job_type, unique_key)
            WHERE unique_key IS NOT NULL AND status IN ('pending', 'running');
        """,
    ),
    (
        10,
        "cron schedules",
        """
        -- The seed's scheduled_jobs, with a unique name and a time zone. A tick fires by moving
        -- next_run on, fenced by its old value, in the transaction that inserts the job: every
        -- process may try, one wins (schedules.py).
        CREATE TABLE IF NOT EXISTS scheduled_jobs (
            id          INTEGER PRIMARY KEY,
            name        TEXT NOT NULL UNIQUE,
            job_type    TEXT NOT NULL,
            payload     TEXT NOT NULL,                  -- canonical JSON of the job's class
            cron_expr   TEXT NOT NULL,
            timezone    TEXT NOT NULL DEFAULT 'UTC',    -- IANA name the expression is read in
            enabled     INTEGER NOT NULL DEFAULT 1,
            origin      TEXT NOT NULL DEFAULT 'operator' CHECK (origin IN ('code', 'operator')),
            declared    INTEGER NOT NULL DEFAULT 1,     -- 0: a code schedule its code no longer declares
            next_run    TEXT NOT NULL,                  -- the next tick, UTC
            last_run    TEXT,                           -- the tick last fired
            last_job_id TEXT,
            created_at  TEXT NOT NULL,
            updated_at  TEXT NOT NULL
        );
        -- the Scheduler's read, every second in every process: the due ones, without reading the rest
        CREATE INDEX IF NOT EXISTS idx_scheduled_jobs_due ON scheduled_jobs(next_run) WHERE enabled = 1;
        """,
    ),
    (
        11,
        "retention",
        """
        -- Finished jobs by status and age, for retention (JOB_RETENTION_*): a look that finds
        -- nothing to remove reads nothing. Partial: pending and running rows are not in it.
        CREATE INDEX IF NOT EXISTS idx_jobs_finished ON jobs(status, updated_at) WHERE status IN ('completed', 'dead');
        -- The engine's periodic chores shared by every process on the file: the next time one
        -- is due. A process takes a turn by moving it on, in a write transaction: one at a time.
        CREATE TABLE IF NOT EXISTS upkeep (
            name    TEXT PRIMARY KEY,
            next_at TEXT NOT NULL
        );
        """,
    ),
    (
        12,
        "trace context",
        """
        -- The trace context of the code that enqueued a job (W3C traceparent, and tracestate
        -- after a space), handed to its attempts (pipeline/otel.py). NULL for most jobs.
        ALTER TABLE jobs ADD COLUMN trace TEXT;
        """,
    ),
    (13, "control", lambda conn: _control(conn)),  # SQL and a schema edit SQL cannot make: see _control
    (
        14,
        "limits",
        """
        -- Issue 23, second part: rate limits, per-key limits, unique keys held only while pending.
        -- The key a job counts under for a claim's per-key limits (NewJob.limit_key); NULL: none.
        ALTER TABLE jobs ADD COLUMN limit_key TEXT;
        -- A job whose unique key is held only while it is pending (unique_while 'pending'): the lease
        -- token under which it holds it (0, a new row's lease_token, when inserted). Every claim moves
        -- lease_token on, so the claim's own statement frees the key (the row leaves idx_jobs_unique)
        -- without a word of its own; a job sent back to pending holds it again only if the statement
        -- that sends it back sets this to its token (store.RETAKE: when nobody holds the key). NULL:
        -- the default, the key held while pending or running, as before.
        ALTER TABLE jobs ADD COLUMN unique_token INTEGER;
        -- idx_jobs_unique with that rule (store.HOLDS, which the inserts' ON CONFLICT names). Every row
        -- has a NULL unique_token here, so the new index holds the old one's entries and cannot fail.
        -- (A process of version 13 still running finds no index matching its ON CONFLICT: its keyed
        -- inserts fail until it is upgraded too; a new one refuses a file of a newer version.)
        DROP INDEX IF EXISTS idx_jobs_unique;
        CREATE UNIQUE INDEX IF NOT EXISTS idx_jobs_unique ON jobs(job_type, unique_key)
            WHERE unique_key IS NOT NULL AND status IN ('pending', 'running')
              AND (unique_token IS NULL OR unique_token = lease_token);
        -- Per-key limits. A type's pending jobs by key, each key's in claim order: the keyed claim walks
        -- the distinct keys (one seek each) and takes each key's first due jobs, whatever the size of
        -- another key's backlog. Its running jobs by key: one seek per key for its room. Keyed rows
        -- only: a job without a key costs neither index anything (an index of every pending row
        -- would cost every insert and claim of every type ~1 us, a fifth: measured).
        CREATE INDEX IF NOT EXISTS idx_jobs_keyed ON jobs(job_type, limit_key, priority, run_after, id)
            WHERE limit_key IS NOT NULL AND status = 'pending';
        CREATE INDEX IF NOT EXISTS idx_jobs_keyed_running ON jobs(job_type, limit_key)
            WHERE limit_key IS NOT NULL AND status = 'running';
        -- Where a type's keyed claims left off, when a claim looks at only part of the type: the key
        -- after which the walk over its keys starts next (limit_key), and where in the claim order the
        -- look for its keyless jobs goes on (priority, run_after, id). See limits.py.
        CREATE TABLE IF NOT EXISTS key_cursors (
            job_type  TEXT PRIMARY KEY,
            limit_key TEXT,
            priority  INTEGER,
            run_after TEXT,
            id        TEXT
        );
        -- Rate limits: a rate-limited type's recent claims, one row per claim (n jobs at the instant
        -- at, epoch seconds). A claim of the type drops those a window old, counts the rest and adds
        -- its own, in its write transaction; rate_free_at reads them.
        CREATE TABLE IF NOT EXISTS rate_claims (
            job_type TEXT NOT NULL,
            at       REAL NOT NULL,
            n        INTEGER NOT NULL
        );
        CREATE INDEX IF NOT EXISTS idx_rate_claims ON rate_claims(job_type, at);
        """,
    ),
    (15, "workflows", lambda conn: _workflows(conn)),  # a schema edit as version 13's: see _workflows
    (
        16,
        "idempotency keys",
        """
        -- Issue 32: enqueue(idempotency_key=K). A key of a job type names the job its first enqueue
        -- answered, until expires_at (JOB_IDEMPOTENCY_SECONDS after it): an insert naming it meanwhile
        -- inserts nothing and answers job_id, whatever became of that job. A table of its own, not a
        -- column of jobs: the key outlives its job (retention removes jobs, not keys), and a job
        -- without a key costs nothing. The inserts with keys remove expired ones (store.py).
        CREATE TABLE IF NOT EXISTS idempotency_keys (
            job_type   TEXT NOT NULL,
            key        TEXT NOT NULL,
            job_id     TEXT NOT NULL,
            expires_at TEXT NOT NULL,                     -- ISO 8601 UTC, as every time here
            PRIMARY KEY (job_type, key)
        );
        CREATE INDEX IF NOT EXISTS idx_idempotency_expiry ON idempotency_keys(expires_at);
        """,
    ),
    (17, "durable functions", lambda conn: _durable(conn)),  # a schema edit as version 13's: see _durable
]

# Issue 23's control: a final status "cancelled", what a handler reports and returns, snoozes,
# an expiry, a cancel request to a running job's worker, and paused job types.
CONTROL = """
-- what a completed job's handler returned (JSON text); its last reported progress (0..1) and
-- message; the times it snoozed; when it is ended unstarted (NULL: never); a cancel asked of
-- its worker while it runs (read only while running: see queries.COLUMNS)
ALTER TABLE jobs ADD COLUMN result TEXT;
ALTER TABLE jobs ADD COLUMN progress REAL;
ALTER TABLE jobs ADD COLUMN progress_message TEXT;
ALTER TABLE jobs ADD COLUMN snoozes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN expires_at TEXT;
ALTER TABLE jobs ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0;
-- The job types no claim takes, for every process on the file and across restarts.
CREATE TABLE IF NOT EXISTS paused_types (
    job_type  TEXT PRIMARY KEY,
    paused_at TEXT NOT NULL
);
-- The pending jobs that expire, by when: the claim's look for due ones (and the rescue's) is
-- one seek that finds nothing when none is due. Covering (job_type, and status, which the
-- planner reads from the row otherwise), so the claim reads no row of the types it does not
-- claim. Partial: jobs without an expiry are not in it, and cost nothing to insert or claim.
CREATE INDEX IF NOT EXISTS idx_jobs_expiring ON jobs(expires_at, job_type, status)
    WHERE status = 'pending' AND expires_at IS NOT NULL;
-- A worker's running jobs whose cancel was requested (cancel_requests, twice a second per
-- process): as many entries as requests, none otherwise.
CREATE INDEX IF NOT EXISTS idx_jobs_cancel_requests ON jobs(lease_owner)
    WHERE status = 'running' AND cancel_requested = 1;
-- Finished jobs by status and age (retention, the jobs finished per minute), cancelled ones too.
-- An OR, not IN: SQLite evaluates a partial index's condition at every write of a row, and an IN
-- of three values or more builds a table of them each time (measured: +1 to +2.5 us of CPU per
-- insert, claim and success; two values are compared in place, as before).
DROP INDEX IF EXISTS idx_jobs_finished;
CREATE INDEX IF NOT EXISTS idx_jobs_finished ON jobs(status, updated_at)
    WHERE status = 'completed' OR status = 'dead' OR status = 'cancelled';
"""

# The jobs table's status check as version 1 wrote it, and as it is from version 13 on: ORs, not
# IN, since SQLite checks it at every write of a row's status, and an IN of three values or more
# builds a table of them each time (measured with the four of before: 1.5 us of CPU per insert
# and per success, 2.5 us per claimed job, a fifth of each; as ORs they are compared in place)
_STATUS_CHECK = "CHECK (status IN ('pending', 'running', 'completed', 'dead'))"
_STATUS_CHECK_CANCELLED = (
    "CHECK (status = 'pending' OR status = 'running' OR status = 'completed' OR status = 'dead' OR status = 'cancelled')"
)


def _control(conn: sqlite3.Connection) -> None:
    """Version 13: the status check takes "cancelled" (and is written as ORs, see
    :data:`_STATUS_CHECK_CANCELLED`; in place: see :func:`_edit_status_check`), then :data:`CONTROL`."""
    _edit_status_check(conn, _STATUS_CHECK, _STATUS_CHECK_CANCELLED, 13)
    run_statements(conn, CONTROL)


# Issue 24's workflows: jobs that wait for other jobs (status "waiting"), and batches with a callback.
WORKFLOWS = """
-- A job enqueued with after=[...]: its parents not yet ended (edges not yet counted; 0 for every other
-- job), what a parent's failure does to it (NULL: "cancel", the default; 'run'), and its batch (a member
-- or the callback). has_children is 1 once a job was named as a parent: the success of a job without
-- children (the hot path) is fenced by has_children = 0 and reads nothing else (see store.settle).
ALTER TABLE jobs ADD COLUMN waiting_for INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN on_parent_failure TEXT;
ALTER TABLE jobs ADD COLUMN batch_id TEXT;
ALTER TABLE jobs ADD COLUMN has_children INTEGER NOT NULL DEFAULT 0;
-- One edge per (parent, child), its child's place in its after (position), counted = 1 once the parent
-- ended and the edge was applied to the child (exactly once: workflows.apply_edges). Kept after that, for
-- the reads (a job's parents and children, ctx.parent_results()), until retention removes either job.
CREATE TABLE IF NOT EXISTS edges (
    parent_id TEXT NOT NULL,
    child_id  TEXT NOT NULL,
    position  INTEGER NOT NULL,
    counted   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (parent_id, child_id)
) WITHOUT ROWID;
-- a job's parents in the order of its after
CREATE INDEX IF NOT EXISTS idx_edges_child ON edges(child_id, position);
-- the edges not yet counted, by parent: what a parent that ends looks for, and the sweep's
-- (rescue_waiting) whole read; as many entries as there are waiting edges, none for plain jobs
CREATE INDEX IF NOT EXISTS idx_edges_uncounted ON edges(parent_id) WHERE counted = 0;
-- A batch (enqueue_batch): its members are the jobs with its id in batch_id, but its callback.
CREATE TABLE IF NOT EXISTS batches (
    id          TEXT PRIMARY KEY,
    callback_id TEXT,
    created_at  TEXT NOT NULL
);
-- a batch's jobs, in insertion order (the rowid); jobs without a batch are not in it
CREATE INDEX IF NOT EXISTS idx_jobs_batch ON jobs(batch_id) WHERE batch_id IS NOT NULL;
-- A waiting job holds its unique key as a pending one does: idx_jobs_unique with "waiting" (store.HOLDS,
-- which the inserts' ON CONFLICT names; ORs, not an IN of three, see _STATUS_CHECK). No job is waiting
-- yet, so the new index holds the old one's entries and cannot fail. (A process of version 14 still
-- running finds no index matching its ON CONFLICT: its keyed inserts fail until it is upgraded too.)
DROP INDEX IF EXISTS idx_jobs_unique;
CREATE UNIQUE INDEX IF NOT EXISTS idx_jobs_unique ON jobs(job_type, unique_key)
    WHERE unique_key IS NOT NULL AND (status = 'pending' OR status = 'running' OR status = 'waiting')
      AND (unique_token IS NULL OR unique_token = lease_token);
"""

# The status check from version 15 on: "waiting" last, so that the other statuses compare as before
_STATUS_CHECK_WAITING = (
    "CHECK (status = 'pending' OR status = 'running' OR status = 'completed' OR status = 'dead' OR status = 'cancelled' "
    "OR status = 'waiting')"
)


def _edit_status_check(conn: sqlite3.Connection, old: str, new: str, version: int) -> None:
    """Replace the jobs table's status check ``old`` with ``new`` in the schema, in place.

    SQLite cannot alter a check. Rebuilding the table (copy, drop, rename) would copy every
    row, and, in a file the application shares, drop the triggers on it and fire the ON DELETE
    actions of any foreign key to it. A check that accepts one more value changes nothing
    stored (every row satisfies it still), so it is written into the schema in place, the way
    SQLite documents for removing a check (lang_altertable.html, "other kinds of table schema
    changes"): in the migration's transaction, ``writable_schema`` for the edit, the schema's
    version bumped so that every connection reads the table's definition again."""
    (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'jobs'").fetchone()
    if sql.count(old) != 1:
        raise StoreError(
            f"cannot upgrade the jobs table to schema version {version}: its status check is not {old}, "
            "as this package created it (was the table changed by hand?)"
        )
    (schema_version,) = conn.execute("PRAGMA schema_version").fetchone()
    conn.execute("PRAGMA writable_schema = ON")
    try:
        conn.execute("UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'jobs'", (sql.replace(old, new),))
        conn.execute(f"PRAGMA schema_version = {int(schema_version) + 1}")
    except sqlite3.DatabaseError as exc:  # SQLITE_DBCONFIG_DEFENSIVE refuses writable_schema
        raise StoreError(f"cannot upgrade the jobs table to schema version {version} (its status check): {exc}") from None
    finally:
        conn.execute("PRAGMA writable_schema = OFF")
    conn.execute("SELECT status FROM jobs LIMIT 0").fetchall()  # the new definition parses (else: rolled back)


def _workflows(conn: sqlite3.Connection) -> None:
    """Version 15: the status check takes "waiting" (written in place, as version 13's took
    "cancelled": see :func:`_edit_status_check`), then :data:`WORKFLOWS`."""
    _edit_status_check(conn, _STATUS_CHECK_CANCELLED, _STATUS_CHECK_WAITING, 15)
    run_statements(conn, WORKFLOWS)


# Issue 35's durable functions: a job's steps, the signals sent to it, and the status "suspended".
DURABLE = """
-- While a suspended job waits in ctx.wait_for: the signal's name (NULL otherwise, and for every other job).
ALTER TABLE jobs ADD COLUMN awaiting_signal TEXT;
-- A durable job's steps, one row per (job, name): written by a STEP or SUSPEND outcome or a take_signal,
-- under the job's lease, replaced whole when written again (its position kept: the order first written,
-- which steps() reads and a replay cuts at). Removed with their job (durable.forget) or by a replay.
CREATE TABLE IF NOT EXISTS job_steps (
    -- the rowid: a step first written is numbered above every step in the table (SQLite's max + 1), so a
    -- job's steps sort in the order first written; an upsert keeps it. (Not a per-job count: finding a
    -- job's last number would read all of its steps, at every step of a job of thousands.)
    position   INTEGER PRIMARY KEY,
    job_id     TEXT NOT NULL,
    name       TEXT NOT NULL,
    status     TEXT NOT NULL,                    -- base.STEP_STATUSES
    value      TEXT,                             -- JSON text (NULL: none)
    started_at TEXT NOT NULL,
    ended_at   TEXT,
    UNIQUE (job_id, name)
);
-- The signals sent to a job (Backend.signal), numbered per job in the order sent (seq); each consumed by
-- one wait (take_signal: the oldest not consumed of its name). Kept once consumed: a key stays used.
CREATE TABLE IF NOT EXISTS job_signals (
    job_id   TEXT NOT NULL,
    seq      INTEGER NOT NULL,
    name     TEXT NOT NULL,
    payload  TEXT,                               -- JSON text (NULL: none)
    key      TEXT,                               -- a signed link's use-once key (NULL: none)
    sent_at  TEXT NOT NULL,
    consumed INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;
-- the signals waiting to be consumed, by job and name, oldest first: take_signal's and SUSPEND's look
CREATE INDEX IF NOT EXISTS idx_signals_unconsumed ON job_signals(job_id, name, seq) WHERE consumed = 0;
-- a key is used once per job (any name)
CREATE UNIQUE INDEX IF NOT EXISTS idx_signals_key ON job_signals(job_id, key) WHERE key IS NOT NULL;
-- The suspended jobs by when they are due: wake_suspended's look (every process, once a second) is one
-- seek that reads nothing while none is due. Partial: no other job is in it.
CREATE INDEX IF NOT EXISTS idx_jobs_suspended ON jobs(run_after) WHERE status = 'suspended';
-- A suspended job holds its unique key as a pending one does: idx_jobs_unique with "suspended" (store.HOLDS,
-- which the inserts' ON CONFLICT names). No job is suspended yet, so the new index holds the old one's
-- entries and cannot fail. (A process of version 16 still running finds no index matching its ON CONFLICT:
-- its keyed inserts fail until it is upgraded too, as at versions 14 and 15.)
DROP INDEX IF EXISTS idx_jobs_unique;
CREATE UNIQUE INDEX IF NOT EXISTS idx_jobs_unique ON jobs(job_type, unique_key)
    WHERE unique_key IS NOT NULL
      AND (status = 'pending' OR status = 'running' OR status = 'waiting' OR status = 'suspended')
      AND (unique_token IS NULL OR unique_token = lease_token);
"""

# The status check from version 17 on: "suspended" after the statuses of before 15, so that they compare
# as before; ahead of "waiting" (both are rare: their order costs nothing), which keeps the check's end
# as version 15 wrote it, as test_sqlite_workflows reads it
_STATUS_CHECK_SUSPENDED = (
    "CHECK (status = 'pending' OR status = 'running' OR status = 'completed' OR status = 'dead' OR status = 'cancelled' "
    "OR status = 'suspended' OR status = 'waiting')"
)


def _durable(conn: sqlite3.Connection) -> None:
    """Version 17: the status check takes "suspended" (in place, as version 15's took "waiting": see
    :func:`_edit_status_check`), then :data:`DURABLE`."""
    _edit_status_check(conn, _STATUS_CHECK_WAITING, _STATUS_CHECK_SUSPENDED, 17)
    run_statements(conn, DURABLE)


RETIRED: Final = (2, 4)  # the site's, once: known here, no longer applied
LATEST: Final = max(v for v, _, _ in MIGRATIONS)
TABLE: Final = "schema_migrations"


def migrate(conn: sqlite3.Connection, path: Path | str = "<database>") -> list[int]:
    """Apply every migration not yet recorded; return the versions applied now."""
    return apply_migrations(conn, MIGRATIONS, table=TABLE, path=path, known=RETIRED)


def current_version(conn: sqlite3.Connection) -> int:
    """The highest version recorded; 0 for a new file. Reads only."""
    return max(recorded_versions(conn, TABLE), default=0)
