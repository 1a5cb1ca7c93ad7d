"""The job tables in Postgres: numbered migrations, applied at start-up under an advisory lock.

Every process runs :func:`migrate` when it opens the backend. The migrations run in one
transaction that first takes ``pg_advisory_xact_lock`` on a key of the schema's name, so
processes starting at once apply them one after the other (the second finds them recorded),
and a crash mid-way leaves nothing half-done. That transaction waits at most a second for any
other lock (the writers queue behind a waiting ALTER TABLE), and is tried again while a long
transaction holds the jobs table. A migration that must read the whole jobs table (an index, a
check's validation: :class:`Online`) runs in it only while the table is small; on a big one it
is built online (CONCURRENTLY) once the migrations before it have committed, and every process
of the new version waits until it is done, while enqueues and outcomes go on. The tables live in the connection's current
schema (``public`` unless ``?options=-csearch_path%3DNAME`` says otherwise): a database
shared with an application can keep the pipeline's tables in a schema of their own.

Columns are SQLite's (the protocol's), with Postgres types: times are ``timestamptz``,
rounded to the millisecond by every statement that makes one (the protocol's text has
milliseconds, and a stored time must read back as the text it sorts as).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar

import attrs
import psycopg

from ...errors import SchemaTooNew, StoreError

log = logging.getLogger("pipeline.postgres")
T = TypeVar("T")

Migration = tuple[int, str, str]

MIGRATIONS: Final[list[Migration]] = [
    (
        1,
        "jobs and workers",
        """
        CREATE TABLE IF NOT EXISTS jobs (
            id               text PRIMARY KEY,                      -- UUID v7, chosen by the engine
            job_type         text NOT NULL,
            payload          text NOT NULL,                         -- canonical JSON, as the engine wrote it
            status           text NOT NULL DEFAULT 'pending'
                             CHECK (status IN ('pending', 'running', 'completed', 'dead')),
            attempts         integer NOT NULL DEFAULT 0,
            max_attempts     bigint NOT NULL DEFAULT 3 CHECK (max_attempts >= 1),
            run_after        timestamptz NOT NULL DEFAULT date_trunc('milliseconds', now()),
            error            text,
            created_at       timestamptz NOT NULL DEFAULT date_trunc('milliseconds', now()),
            updated_at       timestamptz NOT NULL DEFAULT date_trunc('milliseconds', now()),
            priority         bigint NOT NULL DEFAULT 5,             -- lower runs first
            lease_token      bigint NOT NULL DEFAULT 0,             -- +1 per claim, never reset: fences outcomes
            lease_owner      text,                                  -- the worker process holding a running job
            lease_expires_at timestamptz,                           -- running jobs: rescued after this
            started_at       timestamptz                            -- when the attempt of a running job began
        );
        -- the claim: equality on job_type, then the claim order, so LIMIT n reads n entries
        CREATE INDEX IF NOT EXISTS jobs_claim ON jobs (job_type, priority, run_after, id) WHERE status = 'pending';
        -- the lease keeper: expired leases without reading every running row
        CREATE INDEX IF NOT EXISTS jobs_leases ON jobs (lease_expires_at) WHERE status = 'running';
        -- operators: newest first by status or by type, and cleanup of finished rows by age
        CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status, id);
        CREATE INDEX IF NOT EXISTS jobs_type ON jobs (job_type, id);
        CREATE INDEX IF NOT EXISTS jobs_finished ON jobs (updated_at) WHERE status IN ('completed', 'dead');
        -- stats: how long the oldest due job has waited, whatever its type
        CREATE INDEX IF NOT EXISTS jobs_due ON jobs (run_after) WHERE status = 'pending';

        -- The worker processes and the job types each knows, kept fresh by each one's lease
        -- heartbeat: a pending job of a type no live worker knows is buried.
        CREATE TABLE IF NOT EXISTS workers (
            owner         text PRIMARY KEY,                         -- host:pid, as in jobs.lease_owner
            job_types     text NOT NULL,                            -- JSON array
            started_at    timestamptz NOT NULL,
            heartbeat_at  timestamptz NOT NULL,
            lease_seconds double precision NOT NULL DEFAULT 30
        );
        """,
    ),
    (
        2,
        "unique jobs",
        """
        -- While a job of a type and key is pending or running, no other job of that type and
        -- key can be: an insert that would break this inserts nothing (ON CONFLICT DO NOTHING)
        -- and answers the holder's id. Partial: rows without a key, and finished rows, are not
        -- in the index, so it costs nothing to jobs that do not use it.
        ALTER TABLE jobs ADD COLUMN IF NOT EXISTS unique_key text;
        CREATE UNIQUE INDEX IF NOT EXISTS jobs_unique ON jobs (job_type, unique_key)
            WHERE unique_key IS NOT NULL AND status IN ('pending', 'running');
        """,
    ),
    (
        3,
        "cron schedules",
        """
        -- The seed's scheduled_jobs, with a unique name and a time zone. A tick fires by moving
        -- next_run on, fenced by its old value, in the transaction that inserts the job: every
        -- process may try, one wins (pipeline/schedules.py).
        CREATE TABLE IF NOT EXISTS scheduled_jobs (
            id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            name        text NOT NULL UNIQUE,
            job_type    text NOT NULL,
            payload     text NOT NULL,                      -- canonical JSON of the job's class
            cron_expr   text NOT NULL,
            timezone    text NOT NULL DEFAULT 'UTC',        -- IANA name the expression is read in
            enabled     boolean NOT NULL DEFAULT true,
            origin      text NOT NULL DEFAULT 'operator' CHECK (origin IN ('code', 'operator')),
            declared    boolean NOT NULL DEFAULT true,      -- false: a code schedule its code no longer declares
            next_run    timestamptz NOT NULL,
            last_run    timestamptz,                        -- the tick last fired
            last_job_id text,
            created_at  timestamptz NOT NULL,
            updated_at  timestamptz NOT NULL
        );
        -- the Scheduler's read, every second in every process: the due ones, without reading the rest
        CREATE INDEX IF NOT EXISTS scheduled_jobs_due ON scheduled_jobs (next_run) WHERE enabled;
        """,
    ),
    (
        4,
        "retention",
        """
        -- The engine's periodic chores shared by every process on the store (retention): the
        -- next time one is due. A process takes a turn by moving it on: one at a time.
        CREATE TABLE IF NOT EXISTS upkeep (
            name    text PRIMARY KEY,
            next_at timestamptz NOT NULL
        );
        """,
    ),
    (
        5,
        "trace context",
        """
        -- The trace context of the code that enqueued a job (W3C traceparent, and tracestate
        -- after a space), handed to its attempts (pipeline/otel.py). NULL for most jobs.
        ALTER TABLE jobs ADD COLUMN IF NOT EXISTS trace text;
        """,
    ),
    (
        6,
        "control",
        """
        -- Issue 23. A final status cancelled: by an operator or a client, or not started by its
        -- expires_at. The new check is looser than the old one, so validating it (one read of the
        -- table) cannot fail.
        ALTER TABLE jobs DROP CONSTRAINT IF EXISTS jobs_status_check;
        ALTER TABLE jobs ADD CONSTRAINT jobs_status_check
            CHECK (status IN ('pending', 'running', 'completed', 'dead', 'cancelled')) NOT VALID;
        ALTER TABLE jobs VALIDATE CONSTRAINT jobs_status_check;
        -- Constant defaults: each ADD COLUMN changes the catalog only, whatever the table holds.
        ALTER TABLE jobs ADD COLUMN IF NOT EXISTS result text;                 -- SUCCEED's JSON text
        ALTER TABLE jobs ADD COLUMN IF NOT EXISTS progress double precision;   -- 0..1, the handler's last report
        ALTER TABLE jobs ADD COLUMN IF NOT EXISTS progress_message text;
        ALTER TABLE jobs ADD COLUMN IF NOT EXISTS snoozes integer NOT NULL DEFAULT 0;
        ALTER TABLE jobs ADD COLUMN IF NOT EXISTS expires_at timestamptz;      -- never started after this
        ALTER TABLE jobs ADD COLUMN IF NOT EXISTS cancel_requested boolean NOT NULL DEFAULT false;
        -- The claim ends the expired pending jobs of each type it claims, and the rescue those of
        -- every type (a loose scan of the types first): a seek per type, into an index that holds
        -- only the pending jobs that have an expires_at (empty where nobody uses it).
        CREATE INDEX IF NOT EXISTS jobs_expiring ON jobs (job_type, expires_at)
            WHERE status = 'pending' AND expires_at IS NOT NULL;
        -- cancel_requests(owner), twice a second in every process holding jobs: only the rows
        -- whose cancel is requested (the flag is cleared when a job stops running).
        CREATE INDEX IF NOT EXISTS jobs_cancel_requests ON jobs (lease_owner)
            WHERE cancel_requested AND status = 'running';
        -- Retention and the finished-per-minute view read cancelled rows by age, as jobs_finished
        -- serves completed and dead ones. An index of its own, rather than jobs_finished made
        -- again: building it sorts no row of a table made before this version.
        CREATE INDEX IF NOT EXISTS jobs_cancelled ON jobs (updated_at) WHERE status = 'cancelled';

        -- The paused job types, for every process on the store: no claim takes their jobs.
        CREATE TABLE IF NOT EXISTS paused_types (
            job_type  text PRIMARY KEY,
            paused_at timestamptz NOT NULL
        );
        """,
    ),
    (
        7,
        "limits",
        """
        -- Issue 23, second part. Each ADD COLUMN changes the catalog only.
        -- The key a job counts under for a claim's per-key limits (NewJob.limit_key); NULL: none.
        ALTER TABLE jobs ADD COLUMN IF NOT EXISTS limit_key text;
        -- A job whose unique key is held only while it is pending (unique_while='pending'): the
        -- lease token under which it holds it (0, the token of a new row, when inserted). Every
        -- claim moves lease_token on, so the claim's own statement frees the key (the row leaves
        -- jobs_unique below) without a word of its own; a job sent back to pending holds it again
        -- only when a statement sets this to its token (store.retake). NULL: the default, the key
        -- held while pending or running.
        ALTER TABLE jobs ADD COLUMN IF NOT EXISTS unique_token bigint;
        -- jobs_unique made again with that rule. Its rows are the old index's (every row has a NULL
        -- unique_token here), so the new one is built from the same keys and cannot fail; the
        -- inserts' ON CONFLICT names its predicate. (A process of version 6 still running finds no
        -- index matching its own ON CONFLICT: its keyed inserts fail until it is upgraded too.)
        CREATE UNIQUE INDEX IF NOT EXISTS jobs_unique_7 ON jobs (job_type, unique_key)
            WHERE unique_key IS NOT NULL AND status IN ('pending', 'running')
              AND (unique_token IS NULL OR unique_token = lease_token);
        DROP INDEX IF EXISTS jobs_unique;
        ALTER INDEX jobs_unique_7 RENAME TO jobs_unique;
        -- The keyed claim (limits._CLAIM_KEYED): a loose scan of a type's distinct keys (one seek each)
        -- and each key's first due jobs in claim order, whatever the size of other keys' backlogs.
        -- Keyed rows only: a job without a key costs it nothing (with an index of every pending row,
        -- a plain insert of 50,000 jobs took 7-9 % longer, a COPY of them 20 %: measured). The
        -- keyless jobs of a keyed type are looked for in jobs_claim instead, a bounded number a claim
        -- (limits.py).
        CREATE INDEX IF NOT EXISTS jobs_keyed ON jobs (job_type, limit_key, priority, run_after, id)
            WHERE status = 'pending' AND limit_key IS NOT NULL;

        -- Rate limits: the instants of a rate-limited type's recent claims, one row per job claimed.
        -- A claim of the type, under the type's lock, drops those older than its window, counts the
        -- rest and adds its own; rate_free_at reads the N-th newest.
        CREATE TABLE IF NOT EXISTS rate_claims (
            job_type text NOT NULL,
            at       timestamptz NOT NULL
        );
        CREATE INDEX IF NOT EXISTS rate_claims_at ON rate_claims (job_type, at);

        -- Per-key limits: where a type's keyed claims left off, when a claim looks at only part of
        -- the type, so that claim after claim every part gets its turn: the key after which the walk
        -- over its keys starts next (the last key it claimed from; NULL: the first key), and where in
        -- the claim order the look for its keyless jobs goes on (priority, run_after, id; NULL: the
        -- front). See limits.py.
        CREATE TABLE IF NOT EXISTS key_cursors (
            job_type  text PRIMARY KEY,
            limit_key text,
            priority  bigint,
            run_after timestamptz,
            id        text
        );
        """,
    ),
    (
        8,
        "workflows",
        """
        -- Issue 24 (graph.py). A status waiting: a job enqueued with after=[...] until its parents
        -- ended. The new check is looser than the old one: validating it cannot fail.
        ALTER TABLE jobs DROP CONSTRAINT IF EXISTS jobs_status_check;
        ALTER TABLE jobs ADD CONSTRAINT jobs_status_check
            CHECK (status IN ('waiting', 'pending', 'running', 'completed', 'dead', 'cancelled')) NOT VALID;
        ALTER TABLE jobs VALIDATE CONSTRAINT jobs_status_check;
        -- Each ADD COLUMN changes the catalog only; a plain job leaves them NULL (no byte of its row).
        -- waiting_for: a job with parents, the edges to it that have not counted yet (NULL: no parents).
        -- has_children: true once a job is named in another's after (set by that insert, under the
        -- parent's row lock): the statements that end a job return it, and only a job with children
        -- has edges to apply. runs_on_parent_failure: true for on_parent_failure="run" (NULL: the
        -- default, "cancel"; a flag rather than text: with two text columns more, the planner's guess
        -- of a row's width on a table without statistics made the keyed claim read its locked rows
        -- through jobs_due, every pending row, measured). batch_id: NewJob.batch_id; batch_position:
        -- its place in the call that inserted the batch (batch_jobs lists the members in that order).
        ALTER TABLE jobs ADD COLUMN IF NOT EXISTS waiting_for integer;
        ALTER TABLE jobs ADD COLUMN IF NOT EXISTS has_children boolean;
        ALTER TABLE jobs ADD COLUMN IF NOT EXISTS runs_on_parent_failure boolean;
        ALTER TABLE jobs ADD COLUMN IF NOT EXISTS batch_id text;
        ALTER TABLE jobs ADD COLUMN IF NOT EXISTS batch_position integer;
        -- A waiting job holds its unique key as a pending one: jobs_unique made again with 'waiting'
        -- in its predicate. No row is waiting yet, so it holds the old index's keys and cannot fail.
        -- The ON CONFLICT of a process of version 7 (status IN ('pending', 'running')) still implies
        -- this predicate, so its keyed inserts go on during a rolling upgrade.
        CREATE UNIQUE INDEX IF NOT EXISTS jobs_unique_8 ON jobs (job_type, unique_key)
            WHERE unique_key IS NOT NULL AND status IN ('waiting', 'pending', 'running')
              AND (unique_token IS NULL OR unique_token = lease_token);
        DROP INDEX IF EXISTS jobs_unique;
        ALTER INDEX jobs_unique_8 RENAME TO jobs_unique;
        -- batch(id) counts a batch's jobs by status, batch_jobs lists them in order: the jobs of
        -- batches only.
        CREATE INDEX IF NOT EXISTS jobs_batch ON jobs (batch_id, batch_position) WHERE batch_id IS NOT NULL;

        -- One edge per (parent, child): counted once, by the transaction that ends the parent (or
        -- the insert, when the parent had ended already). position: the parent's place in the
        -- child's after. No foreign keys: an edge outlives neither job (delete and retention
        -- remove both directions), and a parent removed by other means is the sweep's
        -- (rescue_waiting: applied as deleted).
        CREATE TABLE IF NOT EXISTS job_edges (
            parent_id text NOT NULL,
            child_id  text NOT NULL,
            position  integer NOT NULL,
            counted   boolean NOT NULL DEFAULT false,
            PRIMARY KEY (parent_id, child_id)
        );
        -- a child's parents in its after's order (get, parent_results, delete)
        CREATE INDEX IF NOT EXISTS job_edges_child ON job_edges (child_id, position);
        -- the edges still to count: what ending a parent applies, and the sweep's read
        CREATE INDEX IF NOT EXISTS job_edges_uncounted ON job_edges (parent_id, child_id) WHERE NOT counted;

        -- A batch (NewBatch): written with its jobs; removed with the last of them.
        CREATE TABLE IF NOT EXISTS batches (
            id          text PRIMARY KEY,
            callback_id text,
            created_at  timestamptz NOT NULL
        );
        """,
    ),
    (
        9,
        "workflows: the edges of ended jobs applied by one call",
        # store.apply_edges as one server-side function: what every path to a final status did in four
        # statements and more per level of the graph (count the parents' edges, lock the children in id
        # order, move them, NOTIFY) is one call, so the outcome of a job with children and its edges are
        # one statement (store.settle_parents; a link of a chain cost three times a plain job's CPU in
        # round trips). The text of a cancelled child's error is base.parent_failed's. Returns (woken,
        # cancelled, the ids of the pending children it locked: woken, or pending already, which a claim
        # meanwhile skipped); NOTIFYs then when ``notify``. Created in the schema of the job tables; its statements name them unqualified,
        # found through the caller's search_path as every statement's are.
        """
        CREATE OR REPLACE FUNCTION pipeline_apply_edges(
            parents text[], hows text[], e_parents text[], e_children text[], e_hows text[], notify boolean,
            OUT woken integer, OUT cancelled integer, OUT pending text[]
        ) LANGUAGE plpgsql AS $fn$
        DECLARE
            ch text[]; pos integer[]; par text[]; hw text[];
            more_ch text[]; more_pos integer[]; more_par text[]; more_hw text[];
            ids text[]; statuses text[]; waiting integer[]; errors text[]; next_parents text[];
            c record;
            new_status text;
            err text;
        BEGIN
            woken := 0;
            cancelled := 0;
            pending := '{}';
            LOOP
                ch := '{}'; pos := '{}'; par := '{}'; hw := '{}';
                IF cardinality(e_parents) > 0 THEN  -- the given edges (the sweep's), first round only
                    WITH x AS (
                        UPDATE job_edges e SET counted = true
                          FROM unnest(e_parents, e_children, e_hows) AS p(parent_id, child_id, how)
                         WHERE e.parent_id = ANY(e_parents) AND e.parent_id = p.parent_id
                           AND e.child_id = p.child_id AND NOT e.counted
                        RETURNING e.child_id, e.position, e.parent_id, p.how
                    ) SELECT coalesce(array_agg(x.child_id), '{}'), coalesce(array_agg(x.position), '{}'),
                             coalesce(array_agg(x.parent_id), '{}'), coalesce(array_agg(x.how), '{}')
                        INTO ch, pos, par, hw FROM x;
                    e_parents := '{}';
                END IF;
                IF cardinality(parents) > 0 THEN  -- every edge of the ended parents that has not counted
                    WITH x AS (
                        UPDATE job_edges e SET counted = true
                          FROM unnest(parents, hows) AS p(id, how)
                         WHERE e.parent_id = ANY(parents) AND e.parent_id = p.id AND NOT e.counted
                        RETURNING e.child_id, e.position, e.parent_id, p.how
                    ) SELECT coalesce(array_agg(x.child_id), '{}'), coalesce(array_agg(x.position), '{}'),
                             coalesce(array_agg(x.parent_id), '{}'), coalesce(array_agg(x.how), '{}')
                        INTO more_ch, more_pos, more_par, more_hw FROM x;
                    ch := ch || more_ch; pos := pos || more_pos; par := par || more_par; hw := hw || more_hw;
                END IF;
                EXIT WHEN cardinality(ch) = 0;
                ids := '{}'; statuses := '{}'; waiting := '{}'; errors := '{}'; next_parents := '{}';
                -- their children, locked in id order after the parents (which the caller's statement locked);
                -- the count moved under the child's lock, so K transactions ending parents at once bring it
                -- to zero once
                FOR c IN
                    WITH counted AS (SELECT * FROM unnest(ch, pos, par, hw) AS u(child_id, position, parent_id, how)),
                    per AS (
                        SELECT child_id, count(*)::integer AS k,
                               (array_agg(parent_id ORDER BY position, parent_id, how) FILTER (WHERE how <> 'completed'))[1]
                                   AS failed_parent,
                               (array_agg(how ORDER BY position, parent_id, how) FILTER (WHERE how <> 'completed'))[1]
                                   AS failed_how
                          FROM counted GROUP BY child_id
                    )
                    SELECT j.id, j.status, j.runs_on_parent_failure IS TRUE AS runs,
                           coalesce(j.waiting_for, 0) - per.k AS remaining, j.has_children IS TRUE AS kids,
                           per.failed_parent, per.failed_how
                      FROM jobs j JOIN per ON per.child_id = j.id
                     WHERE j.id = ANY(ch)
                     ORDER BY j.id
                       FOR UPDATE OF j
                LOOP
                    new_status := c.status;
                    err := NULL;
                    IF c.status = 'waiting' THEN
                        IF NOT c.runs AND c.failed_parent IS NOT NULL THEN
                            new_status := 'cancelled';
                            err := 'cancelled while waiting: its parent job ' || c.failed_parent
                                   || CASE WHEN c.failed_how = 'deleted' THEN ' was deleted' ELSE ' ended ' || c.failed_how END;
                            cancelled := cancelled + 1;
                            IF c.kids THEN
                                next_parents := next_parents || c.id;
                            END IF;
                        ELSIF c.remaining = 0 THEN
                            new_status := 'pending';
                            woken := woken + 1;
                        END IF;
                    END IF;
                    IF new_status = 'pending' THEN
                        pending := pending || c.id;
                    END IF;
                    ids := ids || c.id;
                    statuses := statuses || new_status;
                    waiting := waiting || c.remaining;
                    errors := errors || err;
                END LOOP;
                IF cardinality(ids) > 0 THEN
                    -- a woken job keeps its run_after (a past one: due at once); a cancelled one is final now
                    UPDATE jobs j SET status = m.status, waiting_for = m.waiting_for, error = coalesce(m.error, j.error),
                           updated_at = CASE WHEN m.status = j.status THEN j.updated_at
                                             ELSE date_trunc('milliseconds', now() + interval '500 microseconds') END
                      FROM unnest(ids, statuses, waiting, errors) AS m(id, status, waiting_for, error)
                     WHERE j.id = ANY(ids) AND j.id = m.id;
                END IF;
                -- down the graph: the edges of the children cancelled here
                parents := next_parents;
                hows := array_fill('cancelled'::text, ARRAY[cardinality(next_parents)]);
                EXIT WHEN cardinality(parents) = 0;
            END LOOP;
            IF cardinality(pending) > 0 AND notify THEN
                PERFORM pg_notify('pipeline_jobs', current_schema());
            END IF;
        END
        $fn$;
        """,
    ),
    (
        10,
        "idempotency keys",
        # Issue 32: enqueue(idempotency_key=K). A key of a job type names the job its first enqueue
        # answered until expires_at (JOB_IDEMPOTENCY_SECONDS after): an insert naming it meanwhile
        # inserts nothing and answers job_id, whatever became of that job. A table of its own: the key
        # outlives its job (retention removes jobs), and a job without a key costs nothing. The primary
        # key is what makes concurrent inserts of one key leave one job (store.insert_idempotent);
        # the inserts with keys remove expired ones, a few each (through the index).
        """
        CREATE TABLE IF NOT EXISTS idempotency_keys (
            job_type   text NOT NULL,
            key        text NOT NULL,
            job_id     text NOT NULL,
            expires_at timestamptz NOT NULL,
            PRIMARY KEY (job_type, key)
        );
        CREATE INDEX IF NOT EXISTS idempotency_keys_expiry ON idempotency_keys (expires_at);
        """,
    ),
    (
        11,
        "durable functions",
        # Issue 35 (docs/durable.md). Catalog changes and new tables only: nothing here reads the jobs
        # table, so the ACCESS EXCLUSIVE lock its ALTERs take is held for milliseconds whatever the table
        # holds (and waited for at most MIGRATION_LOCK_TIMEOUT: see migrate). What must read the table (the
        # check's validation, two indexes) is version 12's.
        """
        -- A status suspended: a job that left its worker in ctx.sleep or ctx.wait_for. The new check is
        -- looser than the old one, which every row passed: NOT VALID here (no read of the table), validated
        -- by version 12; new rows are checked either way.
        ALTER TABLE jobs DROP CONSTRAINT IF EXISTS jobs_status_check;
        ALTER TABLE jobs ADD CONSTRAINT jobs_status_check
            CHECK (status IN ('waiting', 'pending', 'running', 'suspended', 'completed', 'dead', 'cancelled')) NOT VALID;
        -- Without a default, ADD COLUMN changes the catalog only; a plain job leaves it NULL. durable: true
        -- once the job wrote a step, suspended or was sent a signal: only such a job has rows in job_steps,
        -- job_signals or job_waits, which go with it (delete, cleanup, retention); removing a plain job looks
        -- for none. A flag, and no text column in jobs (the signal a job awaits is job_waits'): with a text
        -- column more, the planner's guess of a row's width on a table without statistics made the keyed
        -- claim read its locked rows through jobs_due, every pending row (as version 8 found; measured again
        -- by test_postgres_limits).
        ALTER TABLE jobs ADD COLUMN IF NOT EXISTS durable boolean;

        -- The signal a job awaited when it last suspended (NULL: none, a sleep), written by each SUSPEND;
        -- it is the job's awaiting_signal while the job is suspended, and means nothing once it is not (read
        -- only under status = 'suspended': a wake changes the job's row alone).
        CREATE TABLE IF NOT EXISTS job_waits (
            job_id text PRIMARY KEY,
            signal text
        );

        -- A durable job's steps, one row per (job, name), replaced whole when written again under its
        -- name; position: the order first written (an upsert keeps it), from one sequence for all jobs.
        -- No foreign key (a check per deleted job, plain ones too): the paths that remove jobs remove them.
        CREATE TABLE IF NOT EXISTS job_steps (
            job_id     text NOT NULL,
            name       text NOT NULL,
            position   bigint GENERATED ALWAYS AS IDENTITY,
            status     text NOT NULL,
            value      text,                         -- JSON text
            started_at timestamptz NOT NULL,
            ended_at   timestamptz,
            PRIMARY KEY (job_id, name)
        );

        -- Signals sent to a job, consumed by its waits oldest first per name (seq: the order sent). key: a
        -- signed link's use-once, unique per job when given. Kept once consumed (a key stays used).
        CREATE TABLE IF NOT EXISTS job_signals (
            job_id   text NOT NULL,
            seq      bigint GENERATED ALWAYS AS IDENTITY,
            name     text NOT NULL,
            payload  text,                           -- JSON text (NULL: none)
            key      text,
            sent_at  timestamptz NOT NULL,
            consumed boolean NOT NULL DEFAULT false,
            PRIMARY KEY (job_id, seq)
        );
        CREATE UNIQUE INDEX IF NOT EXISTS job_signals_key ON job_signals (job_id, key) WHERE key IS NOT NULL;
        -- the oldest unconsumed signal of a name (take_signal), and whether one exists (SUSPEND)
        CREATE INDEX IF NOT EXISTS job_signals_waiting ON job_signals (job_id, name, seq) WHERE NOT consumed;
        """,
    ),
]


@attrs.frozen
class Online:
    """A migration that reads the whole jobs table (an index build, a check's validation). On a
    table of up to ONLINE_ABOVE_BYTES it runs in the migrations' transaction as any other (``sql``:
    its milliseconds of scan hold up the writers no longer than that). On a bigger one it is built
    online, after the transaction before it has committed (:func:`_build_online`): each index
    CONCURRENTLY, the check validated by a statement of its own (neither blocks inserts nor
    outcomes), then ``swap`` and the version's record in one short transaction."""

    version: int
    name: str
    validate: tuple[str, ...]  # constraints of jobs to validate
    indexes: tuple[tuple[str, str], ...]  # (name, "[UNIQUE] INDEX {name} ON ..."), built in this order
    swap: str

    def create(self, index: str, *, concurrently: bool) -> str:
        text = dict(self.indexes)[index]
        how = "CONCURRENTLY IF NOT EXISTS" if concurrently else "IF NOT EXISTS"
        return "CREATE " + text.replace("INDEX {name}", f"INDEX {how} {index}")

    @property
    def sql(self) -> str:
        return "\n".join([*(f"ALTER TABLE jobs VALIDATE CONSTRAINT {name};" for name in self.validate),
                          *(self.create(index, concurrently=False) + ";" for index, _ in self.indexes), self.swap])


ONLINE: Final = [
    Online(
        12,
        "durable functions: suspended jobs hold their unique key; the wake-up's index",
        validate=("jobs_status_check",),
        indexes=(
            # A suspended job holds its unique key as a pending one: jobs_unique made again with 'suspended'
            # in its predicate. No row is suspended before this version is recorded (every process of this
            # version waits in migrate until it is), so it holds the old index's keys and cannot fail. The
            # ON CONFLICT of a process of version 10 (waiting, pending, running) implies this predicate: its
            # keyed inserts go on during a rolling upgrade.
            ("jobs_unique_12", "UNIQUE INDEX {name} ON jobs (job_type, unique_key) "
             "WHERE unique_key IS NOT NULL AND status IN ('waiting', 'pending', 'running', 'suspended') "
             "AND (unique_token IS NULL OR unique_token = lease_token)"),
            # wake_suspended, about once a second in every process: the due suspended jobs and the next
            # one's time, without reading anything else (empty where nobody suspends)
            ("jobs_suspended", "INDEX {name} ON jobs (run_after) WHERE status = 'suspended'"),
        ),
        swap="DROP INDEX IF EXISTS jobs_unique; ALTER INDEX jobs_unique_12 RENAME TO jobs_unique;",
    ),
]
MIGRATIONS.extend((online.version, online.name, online.sql) for online in ONLINE)
LATEST: Final = max(v for v, _, _ in MIGRATIONS)
TABLE: Final = "pipeline_migrations"
# A jobs table bigger than this has its online migrations built online (Online); a smaller one reads in
# milliseconds. A module constant: tests lower it.
ONLINE_ABOVE_BYTES = 8 << 20
# Each migration transaction waits at most this long for a lock (the jobs table's ACCESS EXCLUSIVE, held
# by a long transaction: a bulk load, a session idle in a transaction), since the writers queue behind a
# waiting ALTER; it is tried again MIGRATION_LOCK_TRIES times, MIGRATION_LOCK_PAUSE apart, the writers
# going on in between. Module constants: tests lower them.
MIGRATION_LOCK_TIMEOUT = 1.0
MIGRATION_LOCK_TRIES = 60
MIGRATION_LOCK_PAUSE = 1.0
# How often a process waiting for another's online build looks whether it is done (never waiting on the
# lock itself: a wait holds a snapshot, which the build's CREATE INDEX CONCURRENTLY would wait for)
ONLINE_POLL = 0.2


def migrate(conn: psycopg.Connection[Any], shown: str) -> list[int]:
    """Apply every migration not yet recorded in the current schema; return those applied now.
    ``shown``: the masked URL, for messages. ``conn`` is in autocommit (an online build cannot run
    in a transaction block)."""
    applied: list[int] = []
    while True:
        done, online = _in_transaction(conn, shown)
        applied += done
        if online is None:
            return applied
        if _build_online(conn, shown, online):
            applied.append(online.version)


_MIGRATIONS_LOCK = "SELECT pg_advisory_xact_lock(hashtext('pipeline migrations ' || current_schema()))"
_ONLINE_LOCK = "SELECT pg_try_advisory_lock(hashtext('pipeline online migrations ' || current_schema()))"
_ONLINE_UNLOCK = "SELECT pg_advisory_unlock(hashtext('pipeline online migrations ' || current_schema()))"
_JOBS_BYTES = "SELECT coalesce(pg_relation_size(to_regclass('jobs')), 0)"
_INDEX_VALID = ("SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass(%s) "
                "AND to_regclass(%s) IS NOT NULL")


def _bounded(conn: psycopg.Connection[Any], shown: str, fn: Callable[[], T]) -> T:
    """``fn()`` in a transaction that takes the migrations' lock, then waits at most
    MIGRATION_LOCK_TIMEOUT for any other lock (see there); tried again while it times out."""
    for _ in range(MIGRATION_LOCK_TRIES):
        try:
            with conn.transaction():
                conn.execute(_MIGRATIONS_LOCK)
                conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{max(int(MIGRATION_LOCK_TIMEOUT * 1000), 1)}ms",))
                return fn()
        except psycopg.errors.LockNotAvailable:
            time.sleep(MIGRATION_LOCK_PAUSE)
    raise StoreError(
        f"database {shown}: the migrations could not take their lock on the job tables within {MIGRATION_LOCK_TIMEOUT:g} s, "
        f"{MIGRATION_LOCK_TRIES} times: a long transaction holds them (a bulk load, a session idle in a transaction: see "
        "pg_stat_activity); start again once it has ended"
    )


def _in_transaction(conn: psycopg.Connection[Any], shown: str) -> tuple[list[int], Online | None]:
    """The migrations not yet recorded, in one transaction (a crash mid-way leaves nothing
    half-done), up to the first online one the jobs table is too big to apply here: those applied,
    and that one (None: none left)."""
    def apply() -> tuple[list[int], Online | None]:
        row = conn.execute("SELECT current_schema()").fetchone()
        schema = row[0] if row else None
        if schema is None:
            raise StoreError(
                f"database {shown}: no schema to create the job tables in (the search_path names none that exists); "
                "create it (CREATE SCHEMA name) or fix ?options=-csearch_path%3Dname"
            )
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {TABLE} (version integer PRIMARY KEY, name text NOT NULL, "
            "applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {v for (v,) in conn.execute(f"SELECT version FROM {TABLE}")}
        if done and max(done) > LATEST:
            raise SchemaTooNew(
                f"database {shown} (schema {schema}): its job tables are at version {max(done)}, newer than this "
                f"pipeline knows ({LATEST}); upgrade the pipeline"
            )
        if not done:
            found = conn.execute(
                "SELECT string_agg(table_name, ', ') FROM information_schema.tables "
                "WHERE table_schema = current_schema() AND table_name IN ('jobs', 'workers')"
            ).fetchone()
            if found and found[0]:
                raise StoreError(
                    f"database {shown} (schema {schema}) already has tables named {found[0]} that the pipeline did not "
                    "create; give the pipeline a schema of its own: ?options=-csearch_path%3Dpipeline in DATABASE_URL "
                    "(after CREATE SCHEMA pipeline)"
                )
        online = {migration.version: migration for migration in ONLINE}
        applied: list[int] = []
        for version, name, sql in MIGRATIONS:
            if version in done:
                continue
            if version in online:
                size = conn.execute(_JOBS_BYTES).fetchone()
                if size is not None and size[0] > ONLINE_ABOVE_BYTES:
                    return applied, online[version]  # (committed up to here; built online next)
                _drop_leftovers(conn, online[version], concurrently=False)
            conn.execute(sql)
            conn.execute(f"INSERT INTO {TABLE} (version, name) VALUES (%s, %s)", (version, name))
            applied.append(version)
        return applied, None

    return _bounded(conn, shown, apply)


def _drop_leftovers(conn: psycopg.Connection[Any], online: Online, *, concurrently: bool) -> None:
    """The indexes of ``online`` that an online build which died half-way left invalid, dropped (built
    again next, whichever way)."""
    for index, _ in online.indexes:
        valid = conn.execute(_INDEX_VALID, (index, index)).fetchone()
        if valid is not None and not valid[0]:
            conn.execute(f"DROP INDEX {'CONCURRENTLY ' if concurrently else ''}IF EXISTS {index}")


def _build_online(conn: psycopg.Connection[Any], shown: str, online: Online) -> bool:
    """An online migration on a big jobs table, outside any transaction, by one process at a time
    (a session lock; the others wait for it by looking, see ONLINE_POLL): a leftover of a build that
    died (an invalid index) dropped, each index built CONCURRENTLY, the checks validated (SHARE
    UPDATE EXCLUSIVE: inserts and updates go on), then the swap and the record in one transaction.
    Whether this process applied it (False: another did meanwhile). Safe to run again at any point."""
    while not conn.execute(_ONLINE_LOCK).fetchone()[0]:  # type: ignore[index]
        time.sleep(ONLINE_POLL)
    try:
        if conn.execute(f"SELECT 1 FROM {TABLE} WHERE version = %s", (online.version,)).fetchone() is not None:
            return False
        log.warning("database %s: building %s on the jobs table online (CONCURRENTLY): this process starts once "
                    "it is done; enqueues and outcomes go on meanwhile", shown, ", ".join(n for n, _ in online.indexes))
        _drop_leftovers(conn, online, concurrently=True)
        for index, _ in online.indexes:
            if conn.execute(_INDEX_VALID, (index, index)).fetchone() is None:
                conn.execute(online.create(index, concurrently=True))
        for constraint in online.validate:
            conn.execute(f"ALTER TABLE jobs VALIDATE CONSTRAINT {constraint}")

        def swap() -> None:
            if conn.execute(f"SELECT 1 FROM {TABLE} WHERE version = %s", (online.version,)).fetchone() is None:
                conn.execute(online.swap)
                conn.execute(f"INSERT INTO {TABLE} (version, name) VALUES (%s, %s)", (online.version, online.name))

        _bounded(conn, shown, swap)
        return True
    finally:
        if not conn.closed:
            conn.execute(_ONLINE_UNLOCK)
