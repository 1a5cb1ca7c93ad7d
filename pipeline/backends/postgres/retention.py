"""Retention on Postgres: whose turn it is, and the bounded deletes of finished jobs (with their
edges, steps, signals and emptied batches) and of the worker-registry entries of processes long gone. Each
``fn(conn, ...)`` runs on a pooled connection, by the server's clock."""

from __future__ import annotations

from typing import Any

import psycopg

from ...states import check_finished
from . import durable, graph

TURN = "retention"


def take_turn(conn: psycopg.Connection[Any], interval_seconds: float) -> bool:
    """True, and the next turn set ``interval_seconds`` on, if no process took one within the
    last interval (the row's lock makes concurrent callers wait, and then find it moved on)."""
    return conn.execute(
        "INSERT INTO upkeep (name, next_at) VALUES (%(name)s, now() + %(every)s::float8 * interval '1 second') "
        "ON CONFLICT (name) DO UPDATE SET next_at = EXCLUDED.next_at WHERE upkeep.next_at <= now()",
        {"name": TURN, "every": interval_seconds},
    ).rowcount == 1


def prune(conn: psycopg.Connection[Any], status: str, older_than_seconds: float, limit: int) -> int:
    """Up to ``limit`` jobs of the final ``status`` last updated more than ``older_than_seconds``
    ago, oldest first (the partial indexes jobs_finished and jobs_cancelled), except the jobs of a
    batch whose callback has not finished; in the same transaction, their edges and each batch none
    of whose jobs is left (graph.forget), and the steps and signals of durable ones (durable.forget)."""
    check_finished([status], "retention removes")
    with conn.transaction():
        row = conn.execute(PRUNE, {"status": status, "age": older_than_seconds, "limit": limit}).fetchone()
        assert row is not None
        n, linked, batches, durable_ids = row
        graph.forget(conn, linked, batches)
        durable.forget(conn, durable_ids)
    return int(n)


# A job of a batch whose callback has not finished is kept: the callback reads every job of its batch
# (ctx.batch()), and the batch's record goes with the last of them (graph.forget). A plain job pays the
# NULL test. The callback's status is a scalar subquery, so it is read by primary key: as a join, the
# planner read the whole jobs table to hash it.
KEPT_FOR_ITS_CALLBACK = (
    "EXISTS (SELECT 1 FROM batches b WHERE b.id = j.batch_id "
    "AND (SELECT c.status FROM jobs c WHERE c.id = b.callback_id) NOT IN ('completed', 'dead', 'cancelled'))"
)
# By status and age: jobs_finished for completed and dead jobs, jobs_cancelled for cancelled ones;
# then = ANY(ARRAY(...)), the rows by primary key (as IN (...), a hash join that read the whole
# table to find the few it deletes). Of the rows removed, those with edges (a parent, a child) and
# their batches, for graph.forget, and the durable ones, for durable.forget: none for plain jobs.
PRUNE = (
    "WITH gone AS (DELETE FROM jobs WHERE id = ANY(ARRAY(SELECT id FROM jobs j WHERE status = %(status)s "
    "AND updated_at < now() - %(age)s::float8 * interval '1 second' "
    f"AND (j.batch_id IS NULL OR NOT {KEPT_FOR_ITS_CALLBACK}) ORDER BY updated_at LIMIT %(limit)s "
    "FOR UPDATE OF j SKIP LOCKED)) RETURNING id, batch_id, has_children IS TRUE OR waiting_for IS NOT NULL AS linked, "
    "durable) SELECT count(*), coalesce(array_agg(id) FILTER (WHERE linked), '{}'), "
    "coalesce(array_agg(DISTINCT batch_id) FILTER (WHERE batch_id IS NOT NULL), '{}'), "
    "coalesce(array_agg(id) FILTER (WHERE durable), '{}') FROM gone"
)


def prune_workers(conn: psycopg.Connection[Any], older_than_seconds: float) -> int:
    """Worker entries whose lease (heartbeat + its length) ran out more than ``older_than_seconds`` ago."""
    return conn.execute(
        "DELETE FROM workers WHERE heartbeat_at + (lease_seconds + %(age)s::float8) * interval '1 second' < now()",
        {"age": older_than_seconds},
    ).rowcount
