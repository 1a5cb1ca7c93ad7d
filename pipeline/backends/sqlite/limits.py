"""The SQLite claim of a type with a rate limit or per-key limits (issue 23, second part), and the
rate window's answer to the Poller (:func:`rate_free_at`).

store.claim_leases comes here only for the types of a claim that has ``rates`` or ``key_limits``
for them; every other type, and every claim without them, runs the statements it ran before. All
of it runs in the claim's write transaction (BEGIN IMMEDIATE: one writer at a time, from whatever
process), so what it counts cannot change before it claims.

* A rate limit (N claims per window seconds): the type's records in ``rate_claims`` a window old
  are dropped, the rest counted, at most N less that many jobs claimed, and one record written for
  what the claim took (its instant, how many). Instants are read under the write lock, so they rise
  from one claim to the next; every record within (instant − window, instant] is counted: no window
  of that length ever holds more than N claims of the type.
* Per-key limits (L running jobs per ``limit_key``): :data:`_WALK` walks the type's keys with
  pending jobs in key order (one seek each into idx_jobs_keyed, from where the type's last claim
  left off, round to it), with each key's running jobs (idx_jobs_keyed_running) and first due job,
  until it met KEYS_PER_JOB keys with room and a due job per job wanted, or KEY_WALK_CAP keys. The
  jobs without a key are one group more, without a limit (:func:`_keyless`). The groups take turns
  in the claim order of their first due jobs: each one's first job, then each one's second, and so
  on. What it reads is bounded by the keys it visits and the jobs it may take, never by one key's
  backlog. When the walk saw only part of the keys, the next claim's starts after the last key this
  one took from, and the keys after that place come before those it comes round to: claim after
  claim, the keys take their turns, none left behind by the first keys' later jobs (the claim order
  of the groups' first jobs is then kept within each of the two parts).

Jobs without a key are in no index of their own (an index of every pending job would cost every
insert and claim of every type, keyed or not, about 1 us, a fifth of each: measured), so a keyed
type's keyless jobs are looked for in the claim order (idx_jobs_claim_order), a bounded number of
due jobs at a time: the first KEYLESS_LOOK, and KEYLESS_LOOK more from where the type's last look
ended (it goes round the backlog claim after claim). A keyless job behind more than KEYLESS_LOOK
due keyed jobs of its type is found within backlog / KEYLESS_LOOK claims, not at once (docs/jobs.md
says so: the group is looked for among the first few hundred due jobs in claim order). Two looks
read 512 rows at most: about 0.3 ms per keyed claim, measured, over a backlog of any size.
"""

from __future__ import annotations

import json
import math
import sqlite3
from typing import Any

KEY_WALK_CAP = 1000  # keys a keyed claim visits at most, full ones included
KEYS_PER_JOB = 4  # keys with room and a due job a keyed claim looks for, per job it may take
KEYLESS_LOOK = 256  # due jobs of the type read per look for its keyless jobs (two looks a claim at most)

# A job as the keyed claim sorts and picks it: its claim order, then its rowid (the claim's handle)
Job = tuple[int, str, str, int]  # priority, run_after, id, rowid

# -- rate limits ------------------------------------------------------------------------------------

_RATE_DROP = "DELETE FROM rate_claims WHERE job_type = ? AND at <= ?"
_RATE_COUNT = "SELECT coalesce(sum(n), 0) FROM rate_claims WHERE job_type = ?"
_RATE_RECORD = "INSERT INTO rate_claims (job_type, at, n) VALUES (?, ?, ?)"
# the window's records, newest first (idx_rate_claims, read backwards): rate_free_at stops at the
# one that keeps the window full
_RATE_WINDOW = "SELECT at, n FROM rate_claims WHERE job_type = ? AND at > ? ORDER BY at DESC"


def rate_room(conn: sqlite3.Connection, job_type: str, limit: int, window: float, *, at: float) -> int:
    """How many jobs of ``job_type`` a claim at instant ``at`` may take: ``limit`` less the claims
    recorded within the window before it (the older records are dropped). In the claim's transaction."""
    conn.execute(_RATE_DROP, (job_type, at - window))
    (used,) = conn.execute(_RATE_COUNT, (job_type,)).fetchone()
    return limit - int(used)


def record_claims(conn: sqlite3.Connection, job_type: str, n: int, *, at: float) -> None:
    """The claim at instant ``at`` took ``n`` jobs of ``job_type`` (started or ahead: both count)."""
    if n > 0:
        conn.execute(_RATE_RECORD, (job_type, at, n))


def rate_free_at(conn: sqlite3.Connection, job_type: str, limit: int, window: float, *, now: float) -> float:
    """Seconds from ``now`` until a claim of ``job_type`` limited to ``limit`` per ``window`` seconds
    may take a job: 0.0 when fewer than ``limit`` claims lie within the last window; otherwise when
    the newest record that keeps it full (the ``limit``-th newest claim) leaves it."""
    if limit < 1:
        return float(window)  # never room: the Poller looks again after a window
    total = 0
    for at, n in conn.execute(_RATE_WINDOW, (job_type, now - window)):
        total += n
        if total >= limit:
            return max(at + window - now, 0.0)
    return 0.0


# -- per-key limits ---------------------------------------------------------------------------------

# The type's keys after :after ({op}: '>' or '>=') in key order, :batch at most (the recursive CTE's
# LIMIT counts the NULL that ends it); each with its running jobs and its first due job (claim order
# and rowid, as JSON: NULL when none is due). One seek per key into each index: INDEXED BY, since a
# count over idx_jobs_status would read every running job.
_KEYED = "limit_key IS NOT NULL AND status = 'pending' AND job_type = :job_type"
_WALK = f"""
WITH RECURSIVE walk(k) AS (
    SELECT (SELECT limit_key FROM jobs INDEXED BY idx_jobs_keyed WHERE {_KEYED} AND limit_key {{op}} :after
             ORDER BY limit_key LIMIT 1)
    UNION ALL
    SELECT (SELECT limit_key FROM jobs INDEXED BY idx_jobs_keyed WHERE {_KEYED} AND limit_key > walk.k
             ORDER BY limit_key LIMIT 1)
      FROM walk WHERE walk.k IS NOT NULL
     LIMIT :batch
)
SELECT k,
       (SELECT count(*) FROM jobs INDEXED BY idx_jobs_keyed_running
         WHERE limit_key IS NOT NULL AND status = 'running' AND job_type = :job_type AND limit_key = walk.k),
       (SELECT json_array(priority, run_after, id, rowid) FROM jobs INDEXED BY idx_jobs_keyed
         WHERE {_KEYED} AND limit_key = walk.k AND run_after <= :now ORDER BY priority, run_after, id LIMIT 1)
  FROM walk WHERE k IS NOT NULL
"""
_WALK_AFTER = _WALK.format(op=">")
_WALK_FROM = _WALK.format(op=">=")
# One key's first due jobs, in claim order
_KEY_JOBS = (
    f"SELECT priority, run_after, id, rowid FROM jobs INDEXED BY idx_jobs_keyed WHERE {_KEYED} AND limit_key = :key "
    "AND run_after <= :now ORDER BY priority, run_after, id LIMIT :n"
)
# The look for a keyed type's jobs without a key, in a window of its due jobs in claim order (the
# first :n, or the :n after a place in it): the keyless ones among them, and the window's last job
# (the place the next look starts after), each with whether it has no key and how many the window
# holds. The limit key is read from each row (idx_jobs_claim_order has none), in SQLite: only the
# jobs found come back to Python. (No OFFSET: with ANALYZE's statistics SQLite read such a query's
# index whole, by a skip-scan.)
_DUE = (
    "SELECT rowid AS r, priority, run_after, id FROM jobs INDEXED BY idx_jobs_claim_order "
    "WHERE status = 'pending' AND job_type = :job_type AND run_after <= :now{after} ORDER BY priority, run_after, id LIMIT :n"
)
_KEYLESS = """
WITH d AS MATERIALIZED ({due}),
     last AS (SELECT r FROM d ORDER BY priority DESC, run_after DESC, id DESC LIMIT 1)
SELECT d.priority, d.run_after, d.id, d.r, j.limit_key IS NULL, (SELECT count(*) FROM d)
  FROM d JOIN jobs AS j ON j.rowid = d.r
 WHERE j.limit_key IS NULL OR d.r IN last
 ORDER BY d.priority, d.run_after, d.id
"""
_KEYLESS_FROM_START = _KEYLESS.format(due=_DUE.format(after=""))
_KEYLESS_AFTER = _KEYLESS.format(due=_DUE.format(after=" AND (priority, run_after, id) > (:priority, :run_after, :id)"))

_CURSOR = "SELECT limit_key, priority, run_after, id FROM key_cursors WHERE job_type = ?"
_KEY_CURSOR = ("INSERT INTO key_cursors (job_type, limit_key) VALUES (?, ?) "
               "ON CONFLICT (job_type) DO UPDATE SET limit_key = excluded.limit_key")
_KEYLESS_CURSOR = ("INSERT INTO key_cursors (job_type, priority, run_after, id) VALUES (?, ?, ?, ?) ON CONFLICT (job_type) "
                   "DO UPDATE SET priority = excluded.priority, run_after = excluded.run_after, id = excluded.id")


def pick_keyed(conn: sqlite3.Connection, job_type: str, limit: int, key_limit: int, *, now: str) -> list[Job]:
    """Up to ``limit`` due jobs of ``job_type`` to claim, at most ``key_limit`` running per key (those
    running now included), in the order they are picked: round-robin across the groups (each key,
    and the jobs without a key) in the claim order of each group's first due job. Reads only; but
    for where the type's walks left off (key_cursors), written when a claim saw only part of them."""
    cursor = conn.execute(_CURSOR, (job_type,)).fetchone()
    visited, cut = _walk(conn, job_type, key_limit, min(KEYS_PER_JOB * limit, KEY_WALK_CAP), now=now,
                         after=None if cursor is None else cursor[0])
    # (order, head, key, room): a group with a due job and room; the keyless one's room has no end.
    # When the walk saw every key, the groups take turns in the claim order of their first due jobs;
    # when it saw part of them, the keys after the cursor (lap 0) before those it came round to (lap
    # 1): claim after claim, the walk goes through the keys in turn, none of them left behind by the
    # first keys' later jobs.
    groups: list[tuple[tuple[int, Job], Job, str | None, float]] = []
    for key, busy, head, lap in visited:
        if head is not None and busy < key_limit:
            first: Job = tuple(json.loads(head))
            groups.append(((lap if cut else 0, first), first, key, key_limit - busy))
    keyless = _keyless(conn, job_type, limit, now=now, cursor=None if cursor is None else cursor[1:])
    if keyless:
        groups.append(((0, keyless[0]), keyless[0], None, math.inf))
    groups.sort(key=lambda group: group[0])
    groups = groups[:limit]  # round one takes a job of each group in turn: the later ones would get none
    jobs: list[list[Job]] = []
    for _, first, group_key, room in groups:
        if group_key is None:
            jobs.append(keyless)
        elif len(groups) == limit or room <= 1:  # its first job is all it can give
            jobs.append([first])
        else:
            params = {"job_type": job_type, "key": group_key, "now": now, "n": min(room, limit)}
            jobs.append([tuple(row) for row in conn.execute(_KEY_JOBS, params)])
    picked: list[Job] = []
    taken_from: set[str] = set()
    turn = 0
    while len(picked) < limit:
        more = False
        for (_, _, group_key, room), of_group in zip(groups, jobs):
            if turn < len(of_group) and turn < room and len(picked) < limit:
                picked.append(of_group[turn])
                more = True
                if group_key is not None:
                    taken_from.add(group_key)
        if not more:
            break
        turn += 1
    if cut and visited:  # the walk saw part of the keys: the next one starts after the last it took from
        keys = [visit[0] for visit in visited]
        last = max((keys.index(taken) for taken in taken_from), default=len(keys) - 1)
        conn.execute(_KEY_CURSOR, (job_type, keys[last]))
    return picked


def _walk(conn: sqlite3.Connection, job_type: str, key_limit: int, budget: int, *, now: str,
          after: str | None) -> tuple[list[tuple[str, int, str | None, int]], bool]:
    """The keys visited (key, running jobs, first due job as JSON or None, lap), in walk order: those
    after ``after`` in key order (lap 0), then from the first one round to ``after`` (lap 1); and
    whether it stopped before it saw them all (``budget`` keys with room and a due job met, or
    KEY_WALK_CAP keys seen)."""
    visited: list[tuple[str, int, str | None, int]] = []
    useful = 0
    laps = [(_WALK_FROM, "", None)] if after is None else [(_WALK_AFTER, after, None), (_WALK_FROM, "", after)]
    for lap, (sql, start, stop) in enumerate(laps):
        while True:
            batch = min(KEY_WALK_CAP - len(visited), max(2 * (budget - useful), 16))
            rows = conn.execute(sql, {"job_type": job_type, "after": start, "batch": batch, "now": now}).fetchall()
            for key, busy, head in rows:
                if stop is not None and key > stop:  # round to where it began
                    return visited, False
                visited.append((key, busy, head, lap))
                useful += head is not None and busy < key_limit
                if useful >= budget or len(visited) >= KEY_WALK_CAP:
                    return visited, True
            if len(rows) < batch:
                break  # no key after these
            sql, start = _WALK_AFTER, rows[-1][0]
    return visited, False


def _keyless(conn: sqlite3.Connection, job_type: str, limit: int, *, now: str, cursor: Any) -> list[Job]:
    """Up to ``limit`` due jobs of ``job_type`` without a key, in claim order, from the first
    KEYLESS_LOOK due jobs of the type and, when there are more, KEYLESS_LOOK more from where the last
    look ended (``cursor``: priority, run_after, id, or NULLs), written back for the next one."""
    params: dict[str, Any] = {"job_type": job_type, "now": now, "n": KEYLESS_LOOK}
    rows = conn.execute(_KEYLESS_FROM_START, params).fetchall()
    found: list[Job] = [row[:4] for row in rows if row[4]]
    if len(found) >= limit or not rows or rows[0][5] < KEYLESS_LOOK:
        return found[:limit]  # enough, or every due job of the type was looked at
    end = rows[-1][:3]
    if cursor is not None and cursor[0] is not None and tuple(cursor) > end:
        end = tuple(cursor)
    rows = conn.execute(_KEYLESS_AFTER, {**params, "priority": end[0], "run_after": end[1], "id": end[2]}).fetchall()
    found += [row[:4] for row in rows if row[4]]
    full = bool(rows) and rows[0][5] == KEYLESS_LOOK
    conn.execute(_KEYLESS_CURSOR, (job_type, *(rows[-1][:3] if full else (None, None, None))))  # (else: the front next)
    return sorted(found)[:limit]
