"""The Postgres claim of a type with a rate limit or per-key limits (issue 23, second part), and
the rate window's answer to the Poller (:func:`rate_free_at`).

:func:`claim` sends here only the types of a claim that has ``rates`` or ``key_limits`` for them;
every other type, and every claim without them, runs store.py's statements as before. Such a
type's claim takes the type's lock (store._LIMIT_LOCK's: the one a globally limited claim takes,
so that the three kinds of limit are counted together), in the claim's transaction, and reads the
server's clock once it holds it: the claim's *instant*, from which it dates everything it writes
(leases, started_at, the rate's records) and against which it counts the window, instead of the
transaction's start (``now()``), which a wait for the lock would leave behind. Under the lock:

* a rate limit (N, window): the type's records in ``rate_claims`` older than the window are
  dropped, the rest counted, and at most N less that many jobs claimed; one record per job claimed
  (started or ahead), at the instant. Instants taken under the lock rise with each holder, so a
  record one holder drops is older than any later holder's window too; and every record within
  (instant − window, ∞) is counted, so no window of that length ever holds more than N.
* per-key limits (L): :data:`_CLAIM_KEYED` counts the type's running jobs by key, walks the keys
  that have pending jobs (one seek each into jobs_keyed, from where the last claim of the type left
  off, round to it) until it met 4 × wants keys with room (or KEY_WALK_CAP keys), and takes their
  due jobs round-robin: each key's first, in the claim order of the keys' first due jobs, then
  each key's second, and so on. Keyless jobs are one group, without a limit. What it reads is
  bounded by the keys it visits and the jobs it may take, never by one key's backlog.

Jobs without a key are in no index of their own (jobs_keyed holds keyed rows only: an index of
every pending row cost every plain insert, of every type, keyed or not, 7-20 %), so a keyed type's
keyless jobs are looked for among its due jobs in claim order (jobs_claim, the plain claim's
index), their limit_key read from each row, a bounded number at a time: the first KEYLESS_LOOK
(near), and when those hold too few keyless jobs, the last KEYLESS_LOOK (back: jobs enqueued
behind a keyed backlog, the usual way keyless jobs come to be behind one, found at once) and
KEYLESS_LOOK more from where the type's last such look ended (far: it goes round the backlog
claim after claim; once it found keyless jobs it did not all take, the next look starts before
them, so the group has its turn in each claim). At most 3 × KEYLESS_LOOK rows a claim. The trade:
a keyless job with more due jobs of its type than a look both before and after it is found within
backlog / KEYLESS_LOOK claims, not at once. (The SQLite store makes the same trade, with a look at
the front and one going round.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg

from ..base import Lease
from . import store
from .store import _CLAIM, _COUNTED, _EXPIRING, _PARKED, _RUNNING_OF_TYPE, MS, seconds_after

KEY_WALK_CAP = 1000  # keys a keyed claim visits at most (each one seek), full ones included
KEYS_PER_JOB = 4  # keys with room a keyed claim looks for, per job it wants
# Due jobs of the type read per look for its keyless jobs, three looks a claim at most: 768 rows,
# each about 1 us. Measured: a keyed claim of 4 over a 10,000-job backlog of one key, 0.4-0.55 ms
# with an index of every pending row (its keyless group one seek), 0.8-0.95 ms with these looks.
KEYLESS_LOOK = 256


def _at_instant(sql: str) -> str:
    """``sql`` with the claim's instant (the parameter ``now``, read under the type's lock) for
    the statement's ``now()``: the same statement, dated from when the claim could count."""
    return sql.replace("now()", "%(now)s::timestamptz")


# The type's lock (store._LIMIT_LOCK's key), then the server's clock: the subquery, volatile, is
# run before the outer target list. As text, to the microsecond (the session's DateStyle is ISO).
_LOCK_AT = ("SELECT clock_timestamp()::text FROM (SELECT pg_advisory_xact_lock(hashtext('pipeline limit ' || "
            "current_schema()), hashtext(%(job_type)s))) AS locked")

# -- rate limits ----------------------------------------------------------------------------------

_WINDOW_START = "%(now)s::timestamptz - %(window)s::float8 * interval '1 second'"
# The records the window no longer holds are dropped; those it holds counted (the count reads the
# snapshot of before the delete, so it names the window's bound too).
_RATE_ROOM = f"""
WITH gone AS (DELETE FROM rate_claims WHERE job_type = %(job_type)s AND at <= {_WINDOW_START})
SELECT count(*) FROM rate_claims WHERE job_type = %(job_type)s AND at > {_WINDOW_START}
"""
_RATE_RECORD = "INSERT INTO rate_claims (job_type, at) SELECT %(job_type)s, %(now)s::timestamptz FROM generate_series(1, %(n)s)"
# The window has room once its N-th newest record leaves it (one window after it was made); fewer
# than N records within the window: room now (no row). Reads at most N entries of rate_claims_at.
_RATE_FREE_AT = """
WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now)
SELECT extract(epoch FROM r.at + %(window)s::float8 * interval '1 second' - c.now)::float8
  FROM c CROSS JOIN LATERAL (
    SELECT at FROM rate_claims
     WHERE job_type = %(job_type)s AND at > c.now - %(window)s::float8 * interval '1 second'
     ORDER BY at DESC OFFSET %(skip)s LIMIT 1) r
"""


def rate_free_at(conn: psycopg.Connection[Any], job_type: str, limit: int, window_seconds: float) -> float:
    """Seconds until a claim of ``job_type`` limited to ``limit`` claims per ``window_seconds``
    may take a job again: 0.0 when fewer than ``limit`` claims lie within the last window."""
    if limit < 1:
        return float(window_seconds)  # never room: look again after a window
    row = conn.execute(_RATE_FREE_AT, {"job_type": job_type, "window": float(window_seconds), "skip": limit - 1}).fetchone()
    return max(float(row[0]), 0.0) if row else 0.0


# -- per-key limits -------------------------------------------------------------------------------

# A key's next key among the type's pending jobs, in key order: one seek into jobs_keyed.
_NEXT_KEY = ("(SELECT j.limit_key FROM jobs j WHERE j.status = 'pending' AND j.job_type = %(job_type)s "
             "AND j.limit_key > {after} ORDER BY j.limit_key LIMIT 1)")
_FIRST_KEY = ("(SELECT j.limit_key FROM jobs j WHERE j.status = 'pending' AND j.job_type = %(job_type)s "
              "AND j.limit_key IS NOT NULL ORDER BY j.limit_key LIMIT 1)")
# 1 for a key with room (fewer than L running), 0 for a full one
_HAS_ROOM = "(NOT EXISTS (SELECT 1 FROM busy b WHERE b.limit_key = {key} AND b.n >= %(key_limit)s))::int"
# The walk goes on while it has seen fewer than the cap, and met fewer keys with room than it looks for
_WALK_ON = "{seen} < %(cap)s AND {open} < %(budget)s"

_CLAIM_KEYED = _at_instant(f"""
WITH RECURSIVE w AS MATERIALIZED (
    SELECT * FROM (VALUES (%(job_type)s::text, %(n)s::int, %(k)s::int)) AS w(job_type, n, k)
     WHERE NOT EXISTS (SELECT 1 FROM paused_types p WHERE p.job_type = w.job_type)
),
{_EXPIRING},
-- the type's running jobs by key, whoever holds them: a read of the running rows only (the type in
-- the aggregate's FILTER, as store._RUNNING_OF_TYPE says why)
busy AS MATERIALIZED (
    SELECT limit_key, n FROM (
        SELECT limit_key, count(*) FILTER (WHERE job_type = %(job_type)s) AS n FROM jobs
         WHERE status = 'running' AND limit_key IS NOT NULL GROUP BY limit_key) b
     WHERE n > 0
),
-- where the type's last claims left off: the walk over the keys (after), the look for keyless jobs
-- (priority, run_after, id); one row, of NULLs when the type has none
cursor AS MATERIALIZED (
    SELECT c.limit_key AS after, c.priority, c.run_after, c.id
      FROM (VALUES (1)) AS one(x) LEFT JOIN key_cursors c ON c.job_type = %(job_type)s
),
-- the keys after the cursor, in key order (seen: their place in the walk; open: keys with room so far)
ahead(limit_key, seen, open) AS (
    SELECT k.limit_key, 1, {_HAS_ROOM.format(key="k.limit_key")}
      FROM cursor c CROSS JOIN LATERAL (SELECT {_NEXT_KEY.format(after="c.after")} AS limit_key) k
     WHERE k.limit_key IS NOT NULL
    UNION ALL
    SELECT k.limit_key, a.seen + 1, a.open + {_HAS_ROOM.format(key="k.limit_key")}
      FROM ahead a CROSS JOIN LATERAL (SELECT {_NEXT_KEY.format(after="a.limit_key")} AS limit_key) k
     WHERE k.limit_key IS NOT NULL AND {_WALK_ON.format(seen="a.seen", open="a.open")}
),
-- then round from the first key up to the cursor, going on with the counts
around(limit_key, seen, open) AS (
    SELECT k.limit_key, e.seen + 1, e.open + {_HAS_ROOM.format(key="k.limit_key")}
      FROM (SELECT coalesce(max(seen), 0) AS seen, coalesce(max(open), 0) AS open FROM ahead) e
     CROSS JOIN cursor c CROSS JOIN LATERAL (SELECT {_FIRST_KEY} AS limit_key) k
     WHERE k.limit_key IS NOT NULL AND (c.after IS NULL OR k.limit_key <= c.after)
       AND {_WALK_ON.format(seen="e.seen", open="e.open")}
    UNION ALL
    SELECT k.limit_key, a.seen + 1, a.open + {_HAS_ROOM.format(key="k.limit_key")}
      FROM around a CROSS JOIN cursor c CROSS JOIN LATERAL (SELECT {_NEXT_KEY.format(after="a.limit_key")} AS limit_key) k
     WHERE k.limit_key IS NOT NULL AND (c.after IS NULL OR k.limit_key <= c.after)
       AND {_WALK_ON.format(seen="a.seen", open="a.open")}
),
-- each key visited with room, and how many of its jobs it may take: its room, at most n
room AS MATERIALIZED (
    SELECT s.limit_key, s.seen, least(w.n, %(key_limit)s - coalesce(b.n, 0)) AS r
      FROM (SELECT limit_key, seen FROM ahead UNION ALL SELECT limit_key, seen FROM around) s
     CROSS JOIN w LEFT JOIN busy b ON b.limit_key = s.limit_key
),
-- The keyless group, looked for in the type's due jobs in claim order (jobs_claim), at most
-- 3 × KEYLESS_LOOK rows a claim (see the module's docstring): near, the first %(look)s ...
near AS MATERIALIZED (
    SELECT j.id, j.priority, j.run_after, j.limit_key IS NULL AS keyless
      FROM w CROSS JOIN LATERAL (
        SELECT id, priority, run_after, limit_key FROM jobs
         WHERE status = 'pending' AND job_type = w.job_type AND run_after <= now()
           AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority, run_after, id
         LIMIT %(look)s) j
),
-- ... and when they fill the look and hold fewer keyless jobs than wanted, back and far:
reach AS MATERIALIZED (
    SELECT count(*) = %(look)s AND count(*) FILTER (WHERE keyless) < %(n)s AS far FROM near
),
-- back: the last %(look)s due jobs, read backwards from now in the type's last priority (one seek
-- for it, then one into jobs_claim); %(look)s entries read at most, due or not
top AS MATERIALIZED (
    SELECT j.priority FROM w CROSS JOIN LATERAL (
        SELECT priority FROM jobs WHERE status = 'pending' AND job_type = w.job_type
         ORDER BY priority DESC LIMIT 1) j
     WHERE (SELECT far FROM reach)
),
back AS MATERIALIZED (
    SELECT j.id, j.priority, j.run_after, j.limit_key IS NULL AS keyless
      FROM top t CROSS JOIN w CROSS JOIN LATERAL (
        SELECT id, priority, run_after, limit_key, expires_at FROM jobs
         WHERE status = 'pending' AND job_type = w.job_type AND (priority, run_after) <= (t.priority, now())
         ORDER BY priority DESC, run_after DESC, id DESC
         LIMIT %(look)s) j
     WHERE j.run_after <= now() AND (j.expires_at IS NULL OR j.expires_at > now())
),
-- far: %(look)s more after the near look's last or the last far look's end, whichever is further
-- (a seek into jobs_claim)
resume AS MATERIALIZED (
    SELECT e.priority, e.run_after, e.id
      FROM (SELECT priority, run_after, id FROM near UNION ALL SELECT priority, run_after, id FROM cursor) e
     WHERE e.id IS NOT NULL AND (SELECT far FROM reach)
     ORDER BY e.priority DESC, e.run_after DESC, e.id DESC LIMIT 1
),
far AS MATERIALIZED (
    SELECT j.id, j.priority, j.run_after, j.limit_key IS NULL AS keyless
      FROM resume e CROSS JOIN w CROSS JOIN LATERAL (
        SELECT id, priority, run_after, limit_key FROM jobs
         WHERE status = 'pending' AND job_type = w.job_type AND run_after <= now()
           AND (expires_at IS NULL OR expires_at > now())
           AND (priority, run_after, id) > (e.priority, e.run_after, e.id)
         ORDER BY priority, run_after, id
         LIMIT %(look)s) j
),
-- the keys' first due jobs in claim order (a seek each into jobs_keyed), and the keyless group's
-- first n of those looked at; not locked here: only the jobs picked are (locked, below). Ordered by
-- limit_key too (one value each): the order only jobs_keyed gives, which a table without
-- statistics (just filled) might otherwise not read them by.
cand AS MATERIALIZED (
    SELECT p.id, p.priority, p.run_after, r.limit_key, r.seen
      FROM room r CROSS JOIN w CROSS JOIN LATERAL (
        SELECT id, priority, run_after FROM jobs
         WHERE status = 'pending' AND job_type = w.job_type AND limit_key = r.limit_key AND run_after <= now()
           AND (expires_at IS NULL OR expires_at > now())
         ORDER BY limit_key, priority, run_after, id
         LIMIT greatest(r.r, 0)) p
     WHERE r.r > 0
    UNION ALL
    SELECT p.id, p.priority, p.run_after, NULL, NULL FROM (
        SELECT id, priority, run_after FROM near WHERE keyless
        UNION  -- (back and far may meet near, or each other, in a backlog of fewer than 3 looks)
        SELECT id, priority, run_after FROM back WHERE keyless
        UNION
        SELECT id, priority, run_after FROM far WHERE keyless
         ORDER BY priority, run_after, id
         LIMIT %(n)s) p
),
-- round-robin: every key's first job (turn 1), then every key's second, ...; within a turn the keys
-- in the claim order of their first due job; the first n
picked AS MATERIALIZED (
    SELECT id, %(job_type)s::text AS job_type, priority, run_after, limit_key, seen FROM (
        SELECT c.*, row_number() OVER k AS turn, first_value(c.priority) OVER k AS head_priority,
               first_value(c.run_after) OVER k AS head_run_after, first_value(c.id) OVER k AS head_id
          FROM cand c
        WINDOW k AS (PARTITION BY c.limit_key ORDER BY c.priority, c.run_after, c.id)) t
     ORDER BY turn, head_priority, head_run_after, head_id
     LIMIT (SELECT n FROM w)
),
-- the picked jobs no other transaction holds (one taking them now, a cancel), still pending
locked AS MATERIALIZED (
    SELECT id FROM jobs WHERE id = ANY(ARRAY(SELECT id FROM picked)) AND status = 'pending'
       FOR UPDATE SKIP LOCKED
),
claimed AS MATERIALIZED (
    SELECT p.*, row_number() OVER (ORDER BY p.priority, p.run_after, p.id) <= (SELECT k FROM w) AS counted
      FROM picked p WHERE p.id IN (SELECT id FROM locked)
),
-- the last claimed row that starts at once (the first k in claim order start)
cut AS MATERIALIZED (
    SELECT DISTINCT ON (job_type) job_type, priority, run_after, id FROM claimed WHERE counted
     ORDER BY job_type, priority DESC, run_after DESC, id DESC),
-- Where the next far look starts after, if this claim made one: before the first keyless job it
-- found and did not take (the group keeps its turns, claim after claim); else after its last job if
-- it filled the look, or at the front (none) if it did not: the backlog's end, round again.
left_behind AS MATERIALIZED (
    SELECT priority, run_after, id FROM far WHERE keyless AND id NOT IN (SELECT id FROM claimed)
     ORDER BY priority, run_after, id LIMIT 1
),
far_end AS MATERIALIZED (
    SELECT * FROM (
        SELECT e.priority, e.run_after, e.id
          FROM (SELECT priority, run_after, id FROM resume UNION ALL SELECT priority, run_after, id FROM far) e
         CROSS JOIN left_behind l
         WHERE (e.priority, e.run_after, e.id) < (l.priority, l.run_after, l.id)
         ORDER BY e.priority DESC, e.run_after DESC, e.id DESC LIMIT 1) before_it
    UNION ALL
    SELECT * FROM (
        SELECT priority, run_after, id FROM far
         WHERE NOT EXISTS (SELECT 1 FROM left_behind) AND (SELECT count(*) FROM far) = %(look)s
         ORDER BY priority DESC, run_after DESC, id DESC LIMIT 1) last_of_it
),
-- the next walk starts after the last key (in this walk's order) this claim took a job of, if it took
-- any; the far look's cursor as far_end says, where it was if no far look was made. One row.
moved AS (
    INSERT INTO key_cursors (job_type, limit_key, priority, run_after, id)
    SELECT %(job_type)s, coalesce(k.limit_key, c.after),
           CASE WHEN r.far THEN f.priority ELSE c.priority END,
           CASE WHEN r.far THEN f.run_after ELSE c.run_after END,
           CASE WHEN r.far THEN f.id ELSE c.id END
      FROM cursor c CROSS JOIN reach r
      LEFT JOIN LATERAL (
        SELECT limit_key FROM claimed WHERE limit_key IS NOT NULL ORDER BY seen DESC LIMIT 1) k ON true
      LEFT JOIN far_end f ON true
     WHERE k.limit_key IS NOT NULL OR r.far
    ON CONFLICT (job_type) DO UPDATE
       SET limit_key = EXCLUDED.limit_key, priority = EXCLUDED.priority, run_after = EXCLUDED.run_after,
           id = EXCLUDED.id
),
leased AS (
UPDATE jobs j
   SET status = 'running', lease_token = j.lease_token + 1,
       attempts = j.attempts + ({_COUNTED})::int,
       started_at = CASE WHEN {_COUNTED} THEN {MS} END,
       lease_owner = %(owner)s, lease_expires_at = {seconds_after('%(lease)s::float8')}, updated_at = {MS}
 WHERE j.id = ANY(ARRAY(SELECT id FROM locked))
RETURNING j.id, j.job_type, j.payload, j.attempts + (j.started_at IS NULL)::int, j.max_attempts, j.lease_token,
          j.created_at, j.run_after, j.priority, j.started_at IS NOT NULL, j.trace, j.expires_at)
SELECT * FROM leased UNION ALL {_PARKED}
""")
# A type with a rate limit and no per-key limit: store._CLAIM, dated from the claim's instant.
_CLAIM_AT = _at_instant(_CLAIM)


def claim_type(
    conn: psycopg.Connection[Any], job_type: str, n: int, *, owner: str, lease_seconds: float,
    start: Mapping[str, int] | None, limit: int | None, rate: tuple[int, float] | None, key_limit: int | None,
) -> list[Any]:
    """In the caller's transaction: up to ``n`` jobs of ``job_type``, within its global ``limit``,
    its ``rate`` (N, window seconds) and its ``key_limit``, whichever are given (at least one of
    the last two); the rows of store._CLAIM's RETURNING (and its row of NULLs, store._PARKED)."""
    row = conn.execute(_LOCK_AT, {"job_type": job_type}).fetchone()
    assert row is not None
    now = row[0]
    if limit is not None:
        row = conn.execute(_RUNNING_OF_TYPE, {"job_type": job_type}).fetchone()
        n = min(n, limit - (row[0] if row else 0))
    if rate is not None:
        most, window = rate
        row = conn.execute(_RATE_ROOM, {"job_type": job_type, "now": now, "window": float(window)}).fetchone()
        n = min(n, most - (row[0] if row else 0))
    if n <= 0:
        return []
    k = n if start is None else max(0, min(n, start.get(job_type, 0)))
    params: dict[str, Any] = {"owner": owner, "lease": float(lease_seconds), "now": now}
    if key_limit is not None:
        params.update(job_type=job_type, n=n, k=k, key_limit=key_limit, budget=KEYS_PER_JOB * n, cap=KEY_WALK_CAP,
                      look=KEYLESS_LOOK)
        rows = conn.execute(_CLAIM_KEYED, params).fetchall()
    else:
        params.update(types=[job_type], limits=[n], starts=[k])
        rows = conn.execute(_CLAIM_AT, params).fetchall()
    claimed = sum(row[0] is not None for row in rows)  # (not the row of NULLs of store._PARKED)
    if rate is not None and claimed:
        conn.execute(_RATE_RECORD, {"job_type": job_type, "now": now, "n": claimed})
    return rows

def claim(
    conn: psycopg.Connection[Any], wants: Mapping[str, int], *, owner: str, lease_seconds: float,
    start: Mapping[str, int] | None = None, limits: Mapping[str, int] | None = None,
    rates: Mapping[str, tuple[int, float]] | None = None, key_limits: Mapping[str, int] | None = None,
) -> list[Lease]:
    """pending → running for up to ``wants[type]`` due jobs of each type, in claim order; the
    first ``start[type]`` of each start at once (all when None), the rest are claimed ahead.
    A type in ``limits`` takes at most its limit less its running jobs (see store._LIMIT_LOCK); a type
    in ``rates`` or ``key_limits`` is claimed by :func:`claim_type`. Without ``rates`` and
    ``key_limits``, the statements of before them."""
    wanted = [(t, n) for t, n in wants.items() if n > 0]
    if not wanted:
        return []
    controlled = {*(rates or ()), *(key_limits or ())}
    bound = {*(limits or ()), *controlled}
    if bound and any(t in bound for t, _ in wanted):
        # One transaction for the whole claim: a limited type's part that fails leaves nothing of
        # the others claimed under a lease no worker holds. The locks are taken in the order of
        # the types' names, whatever order each process registered them in, so that two claims
        # (or a claim and an insert's batch claiming with it) never wait for each other in a circle.
        with conn.transaction():
            rows = store._claim_rows(conn, [(t, n) for t, n in wanted if t not in bound], owner, lease_seconds, start)
            for job_type, n in sorted((t, n) for t, n in wanted if t in bound):
                if job_type in controlled:
                    rows += claim_type(
                        conn, job_type, n, owner=owner, lease_seconds=lease_seconds, start=start,
                        limit=(limits or {}).get(job_type), rate=(rates or {}).get(job_type),
                        key_limit=(key_limits or {}).get(job_type))
                    continue
                assert limits is not None
                conn.execute(store._LIMIT_LOCK, {"job_type": job_type})
                row = conn.execute(store._RUNNING_OF_TYPE, {"job_type": job_type}).fetchone()
                n = min(n, limits[job_type] - (row[0] if row else 0))
                rows += store._claim_rows(conn, [(job_type, n)], owner, lease_seconds, start)
    else:
        rows = store._claim_rows(conn, wanted, owner, lease_seconds, start)
    if any(row[0] is None for row in rows):
        # a row of NULLs (store._PARKED): an expired job with children, which the claim's statement
        # left pending; ended now, its edges applied, in a transaction of its own
        rows = [row for row in rows if row[0] is not None]
        store.expire_parents(conn, [t for t, _ in wanted])
    # RETURNING's order is unspecified: by type as asked, started ones first, each in claim order
    order = {t: i for i, (t, _) in enumerate(wanted)}
    rows.sort(key=lambda r: (order[r[1]], not r[9], r[8], r[7], r[0]))
    return [Lease(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[9], row[10], row[11])
            for row in rows]
