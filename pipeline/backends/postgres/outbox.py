"""Enqueue inside the caller's own Postgres transaction (the outbox pattern), on the caller's
psycopg 3 connection, sync or async: the rows and their NOTIFY are written in the caller's
transaction, so a rollback leaves no job and the commit delivers the wake-up with the rows.
Nothing here commits.

The statements are one plan (:func:`statements`, see store.Plan), run on a ``Connection`` by
store.run_plan and awaited on an ``AsyncConnection`` here. The caller's connection is the
application's: its search_path is the application's own (``public``), where the pipeline's tables may
not be (docs/backends.md advises a schema of their own). So the plan's statements name the pipeline's
schema (:func:`in_schema`), and the connection need only be on the same database (:func:`check_store`);
its search_path is never changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, TypeVar

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from ...errors import UsageError
from ..base import JobRecord, NewBatch, NewJob
from . import graph, queries, store

T = TypeVar("T")


class Store(NamedTuple):
    """Where a pipeline's tables are, as its own connection sees them: the database, the schema
    (its search_path's first) and the oid of its ``jobs`` table (the same database on another
    server, or a copy of it, has another)."""

    database: str
    schema: str
    jobs: int


_STORE = "SELECT current_database(), current_schema(), 'jobs'::regclass::oid"


def store_of(conn: psycopg.Connection[Any]) -> Store:
    """The pipeline's store, on one of its own connections (once per client)."""
    row = conn.execute(_STORE).fetchone()
    assert row is not None
    return Store(str(row[0]), str(row[1]), int(row[2]))


# A caller's connection: its database and role, and the pipeline's jobs table as seen from it, read in
# the catalog (which every role may read: a statement that failed here would fail the caller's
# transaction), with the privileges an enqueue needs.
_SEEN = """
SELECT current_database(), current_user, c.oid, has_schema_privilege(n.oid, 'USAGE'),
       has_table_privilege(c.oid, 'INSERT') AND has_table_privilege(c.oid, 'SELECT')
  FROM (SELECT 1) AS one
  LEFT JOIN pg_namespace n ON n.nspname = %(schema)s
  LEFT JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = 'jobs' AND c.relkind IN ('r', 'p')
"""


def check_store(conn: psycopg.Connection[Any], ours: Store) -> None:
    """UsageError, naming the problem and the fix, unless the caller's connection is on the
    pipeline's database and may write its tables. Any search_path will do."""
    row = conn.execute(_SEEN, {"schema": ours.schema}).fetchone()
    _check_seen(row, ours)


async def check_store_async(conn: psycopg.AsyncConnection[Any], ours: Store) -> None:
    row = await (await conn.execute(_SEEN, {"schema": ours.schema})).fetchone()
    _check_seen(row, ours)


def _check_seen(row: Any, ours: Store) -> None:
    assert row is not None
    database, role, jobs, usage, writable = row
    if database != ours.database:
        raise UsageError(
            f"connection= is on database {database!r}, but this client's jobs are in database {ours.database!r} "
            f"(schema {ours.schema!r}): pass a connection to that database (DATABASE_URL's; any search_path will "
            "do: the enqueue names the schema), or enqueue without connection= (a transaction of its own)")
    if jobs != ours.jobs:
        raise UsageError(
            f"connection= is on a database named {database!r} whose schema {ours.schema!r} does not hold this "
            "client's jobs table (another server, or a copy of the database?): connect it to the server and "
            "database of DATABASE_URL, or enqueue without connection=")
    if not (usage and writable):
        raise UsageError(
            f"connection= is on database {database!r} as role {role!r}, which may not write the pipeline's tables "
            f"in schema {ours.schema!r}: GRANT USAGE ON SCHEMA {ours.schema} TO {role}; GRANT SELECT, INSERT, UPDATE "
            f"ON ALL TABLES IN SCHEMA {ours.schema} TO {role}; or enqueue without connection=")


def in_schema(plan: store.Plan[T], schema: str, conn: Any) -> store.Plan[T]:
    """``plan`` with every statement naming the tables of ``schema`` (where store.SCHEMA marks
    them) and ``schema`` as the NOTIFY's payload, quoted for ``conn`` (the caller's)."""
    prefix = sql.Identifier(schema).as_string(conn) + "."
    literal = sql.Literal(schema).as_string(conn)
    try:
        text, params = next(plan)
        while True:
            rows = yield text.replace(store.SCHEMA, prefix).replace("current_schema()", literal), params
            text, params = plan.send(rows)
    except StopIteration as done:
        return done.value


def check_joinable(info: Any, autocommit: bool) -> None:
    """UsageError, before anything is written, unless the connection has (or will open) a
    transaction of the caller's to join."""
    status = info.transaction_status
    if status == TransactionStatus.INERROR:
        raise UsageError("the connection's transaction has failed; roll it back before enqueueing in it")
    if status == TransactionStatus.ACTIVE:
        raise UsageError("the connection is running a statement; enqueue once it is done")
    if autocommit and status == TransactionStatus.IDLE:
        raise UsageError("the connection is in autocommit mode with no transaction open, so the job would commit on its "
                         "own; enqueue inside `with conn.transaction():` (or use a connection that is not autocommit)")


class Written(NamedTuple):
    """What an insert in the caller's transaction wrote: per row, the id stored for it; and, when its
    rows named jobs already in the store as parents, those parents and the caller's transaction id
    (``txid_current()``), for :func:`confirm_after_commit` once that transaction has committed."""

    ids: list[str]
    parents: frozenset[str] = frozenset()
    xact: int | None = None


_XACT = "SELECT txid_current()"


def statements(rows: Sequence[NewJob], batch: NewBatch | None = None) -> store.Plan[Written]:
    """The plan of an insert in the caller's transaction (and of a batch's record, with ``batch``).
    Rows with parents or a batch take the workflow insert (graph.insert_plan). Parents already in
    the store are read without a lock (graph.insert_plan's ``later``): a lock would hold up their
    outcomes, and every outcome batched with them, until the caller commits. A parent that ends
    between that read and the caller's commit does not see the new edge (not committed yet): the
    answer then names the parents and the caller's transaction, and :func:`confirm_after_commit`,
    once that transaction has committed, counts what the parent's end could not."""
    if batch is not None or any(graph.is_linked(row) for row in rows):
        later: set[str] = set()
        ids = yield from graph.insert_plan(rows, batch, later=later)
        if not later:
            return Written(ids)
        ((xact,),) = yield _XACT, {}
        return Written(ids, frozenset(later), int(xact))
    plain = [row for row in rows if row.unique_key is None]
    if plain:
        yield store.insert_statement(plain), store.insert_params(plain)
    keyed = [row for row in rows if row.unique_key is not None]
    stored = (yield from store.unique_rounds(keyed)) if keyed else {}
    yield store.NOTIFY, {}  # delivered at the caller's commit, with the rows; dropped by a rollback
    return Written([stored.get(row.id, row.id) for row in rows])


def _plan(conn: Any, rows: Sequence[NewJob], batch: NewBatch | None, schema: str | None) -> store.Plan[Written]:
    plan = statements(rows, batch)
    return plan if schema is None else in_schema(plan, schema, conn)


def write_in_transaction(conn: psycopg.Connection[Any], rows: Sequence[NewJob], batch: NewBatch | None = None,
                         schema: str | None = None) -> Written:
    """:func:`statements` run on the caller's connection (the clients' ``connection=``), naming the
    tables of ``schema`` (None: those its search_path finds)."""
    check_joinable(conn.info, conn.autocommit)
    return store.run_plan(conn, _plan(conn, rows, batch, schema))


async def write_in_transaction_async(conn: psycopg.AsyncConnection[Any], rows: Sequence[NewJob],
                                     batch: NewBatch | None = None, schema: str | None = None) -> Written:
    """:func:`statements` awaited on the caller's ``AsyncConnection``."""
    check_joinable(conn.info, conn.autocommit)
    plan = _plan(conn, rows, batch, schema)
    try:
        sql, params = next(plan)
        while True:
            cursor = await conn.execute(sql, params)
            sql, params = plan.send(await cursor.fetchall() if cursor.description else [])
    except StopIteration as done:
        return done.value


def insert_in_transaction(conn: psycopg.Connection[Any], rows: Sequence[NewJob]) -> list[str]:
    """Per row, the id stored for it. Without a client to confirm the parents after the commit
    (:func:`confirm_after_commit`), a parent that ends before the caller commits leaves its child to
    the repair sweep (a minute): the clients' ``connection=`` does confirm them."""
    return write_in_transaction(conn, rows).ids


async def insert_in_transaction_async(conn: psycopg.AsyncConnection[Any], rows: Sequence[NewJob]) -> list[str]:
    return (await write_in_transaction_async(conn, rows)).ids


# -- after the caller's commit ------------------------------------------------------------------------------

_XACT_STATUS = "SELECT txid_status(%(xact)s::bigint)"


def xact_status(conn: psycopg.Connection[Any], xact: int) -> str:
    """The caller's transaction: "in progress", "committed" or "aborted" (None, too old to know: "committed",
    which :func:`confirm_after_commit` may take either way)."""
    row = conn.execute(_XACT_STATUS, {"xact": xact}).fetchone()
    return "committed" if row is None or row[0] is None else str(row[0])


def confirm_after_commit(conn: psycopg.Connection[Any], parents: frozenset[str]) -> None:
    """Once the caller's transaction committed (:func:`xact_status`): graph.confirm_parents on the
    parents it named, in a short transaction of its own: each locked (so an outcome in flight commits
    first), flagged as having children (so its later outcome applies the new edges), and those that
    ended meanwhile (or were deleted) have the edges their end could not see applied now. Each edge
    counts once whoever gets there first: after a rollback there is nothing to count."""
    graph.confirm_parents(conn, set(parents))


# -- reads in the caller's transaction (pipeline.contrib.django: a test's uncommitted jobs) -------------------

_JOB_HERE = f"SELECT {queries._COLUMNS} FROM {store.SCHEMA}jobs WHERE id = %(id)s"
_PENDING_HERE = (f"SELECT {queries._COLUMNS} FROM {store.SCHEMA}jobs WHERE status = 'pending' AND job_type = ANY(%(types)s) "
                 "ORDER BY priority, run_after, id LIMIT %(limit)s")


def _named(text: str, schema: str, conn: Any) -> str:
    return text.replace(store.SCHEMA, sql.Identifier(schema).as_string(conn) + ".")


def job_in_transaction(conn: psycopg.Connection[Any], job_id: str, schema: str) -> JobRecord | None:
    """The job as the caller's connection sees it (its own uncommitted rows too), in ``schema``."""
    row = conn.execute(_named(_JOB_HERE, schema, conn), {"id": job_id}).fetchone()
    return _as_stored(queries._record(row)) if row else None


def pending_in_transaction(conn: psycopg.Connection[Any], job_types: Sequence[str], schema: str,
                           limit: int = 1000) -> list[JobRecord]:
    """The pending jobs of ``job_types`` as the caller's connection sees them, in claim order."""
    rows = conn.execute(_named(_PENDING_HERE, schema, conn), {"types": list(job_types), "limit": limit}).fetchall()
    return [_as_stored(queries._record(row)) for row in rows]


def _as_stored(record: JobRecord) -> JobRecord:
    """Times as the store's own connections read them (db.TextTimes): the caller's connection has its
    own loaders, and its session's TimeZone (psycopg reads timestamptz as datetimes in it)."""
    import datetime as dt

    import attrs

    from ...clock import format_ts

    changed: dict[str, Any] = {field: format_ts(value.timestamp()) for field, value in attrs.asdict(record, recurse=False).items()
               if isinstance(value, dt.datetime)}
    return attrs.evolve(record, **changed) if changed else record
