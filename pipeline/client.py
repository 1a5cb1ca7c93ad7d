"""Producers for code that is not trio: :class:`Client` for synchronous code (Django, Flask,
scripts, other queues' workers) and :class:`AsyncClient` for asyncio (it runs under trio too).

    client = pipeline.Client(registry=registry)          # DATABASE_URL, or Client("postgresql://...")
    job_id = client.enqueue(ResizeAvatar("u42"), delay=60)
    client.close()                                        # or: with pipeline.Client(...) as client:

A client runs the pipeline's producing half (the backend and its Ledger, the EventBus and the
Enqueuer; no Poller, no workers) on a trio loop in a thread of its own, opened with
``open_pipeline`` and ``WORKER_ENABLED=false``. Each call is handed to that loop and returns once
its rows are committed, with the same checks and errors as :meth:`Pipeline.enqueue` (raised
before anything is written). Concurrent calls share the Ledger's batches, as the engine's own
enqueues do, and a service on the same store is woken as by any insert (SQLite's WAL watch,
Postgres NOTIFY, Redis PUBLISH): it starts the job within milliseconds.

:class:`Client` is thread-safe: any number of threads may call one client at once (one per
process is enough). :class:`AsyncClient` answers on the caller's own event loop, asyncio or trio,
without a thread per call: the call runs as a task on the client's loop, which wakes the
caller's loop when it is done.
"""

from __future__ import annotations

import builtins
import datetime as dt
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import attrs
import outcome
import sniffio
import trio

from .backends.base import PRIORITY_DEFAULT, BatchRecord, JobRecord, NewBatch, NewJob
from .config import Config
from .engine.wiring import Pipeline, open_pipeline
from .errors import ClientClosed, UsageError
from .registry import Registry
from .requests import check_job_id
from .workflows import Batch, Chain

__all__ = ["AsyncClient", "Client"]

log = logging.getLogger("pipeline.client")

T = TypeVar("T")


class _OwnTransaction:
    """``connection=``'s default: the enqueue commits in a transaction of the client's own."""

    def __repr__(self) -> str:
        return "<a transaction of the client's own>"


OWN_TRANSACTION: Any = _OwnTransaction()


class Client:
    """Enqueue and emit from synchronous code; see the module docstring.

    ``database_url``: the job store (default: ``DATABASE_URL`` from the environment or ``.env``);
    ``registry``: the job types, events and routes this client may enqueue (the service's own);
    ``config``: every other setting (default: ``Config.from_env()``).
    """

    def __init__(self, database_url: str | None = None, *, registry: Registry, config: Config | None = None) -> None:
        config = config if config is not None else Config.from_env()
        if database_url is not None:
            config = config.replace(database_url=database_url)
        self.config = config.replace(worker=attrs.evolve(config.worker, enabled=False))
        self.registry = registry
        self._lock = threading.Lock()
        self._opened = threading.Event()
        self._failure: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._pipeline: Pipeline | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._waits: set[trio.CancelScope] = set()  # result() waits in flight: close() ends them; the loop's only
        self._store_identity: Any = None  # Postgres: where its tables are (outbox.Store), once asked
        self._closed = False
        self._start_loop()
        if self._failure is not None:
            raise self._failure

    def _start_loop(self) -> None:
        """Start the client's loop in a thread of its own, and wait until the store is open."""
        self._pid = os.getpid()
        self._opened = threading.Event()
        self._failure = None
        self._token = None
        self._thread = threading.Thread(target=self._run, name="pipeline-client", daemon=True)
        self._thread.start()
        self._opened.wait()
        if self._failure is not None:
            self._thread.join()

    def _loop(self) -> trio.lowlevel.TrioToken:
        """The running loop's token. In a process forked since (gunicorn --preload, multiprocessing,
        a prefork worker) the loop's thread did not come along: a new loop is started, on new connections."""
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid() and not self._closed:
                    self._start_loop()
                    if self._failure is not None:
                        raise self._failure
        token = self._token
        if token is None:
            raise ClientClosed("the client is closed" if self._failure is None or self._closed else
                               f"the client's loop failed: {self._failure!r}")
        return token

    # -- the client's own loop ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # noqa: BLE001 - the opener learns why (a bad URL, a store that refuses)
            if self._opened.is_set():  # it ran, then failed: later calls say so
                log.error("pipeline client: its loop failed; later calls raise ClientClosed", exc_info=exc)
            self._failure = exc
        finally:
            self._token = None
            self._opened.set()

    async def _main(self) -> None:
        async with open_pipeline(self.config, self.registry) as pipeline, trio.open_nursery() as nursery:
            self._pipeline, self._nursery, self._stop = pipeline, nursery, trio.Event()
            self._token = trio.lowlevel.current_trio_token()
            self._opened.set()
            await self._stop.wait()  # then the nursery waits for the calls in flight, and the pipeline closes

    def _call(self, fn: Callable[[Pipeline], Awaitable[T]], *, wait: bool = False) -> T:
        """``fn(pipeline)`` run on the client's loop, answered in the calling thread. Not
        ``trio.from_thread.run``: its task is cancelled when the loop ends, and the thread would get a
        ``trio.Cancelled`` that ``except Exception`` does not catch; here it gets ClientClosed."""
        answered = threading.Event()
        box: list[outcome.Outcome[T]] = []

        def done(result: outcome.Outcome[T]) -> None:
            box.append(result)
            answered.set()

        self._start(fn, done, wait=wait)
        while not answered.wait(1.0):
            if not self._thread.is_alive() and not answered.is_set():  # the loop ended without a word
                raise ClientClosed("the client's loop ended before it answered")
        return box[0].unwrap()

    def _start(self, fn: Callable[[Pipeline], Awaitable[Any]], done: Callable[[outcome.Outcome[Any]], None], *,
               wait: bool = False) -> Callable[[], None]:
        """Run ``fn(pipeline)`` as a task of the client's loop; ``done(its outcome)`` there, once it
        ends (ClientClosed if the client closed first). Returns ``abandon``, for a caller that stops
        waiting: a ``wait`` (result()) is cancelled at once, and ended by close(); any other call (an
        enqueue) always runs to its end, so what it committed is not left in doubt."""
        token, pipeline = self._loop(), self._pipeline
        if pipeline is None:
            raise ClientClosed("the client is closed")
        scope = trio.CancelScope()

        async def task() -> None:
            answer: outcome.Outcome[Any] = outcome.Error(ClientClosed("the client was closed while this call waited"))
            try:
                with scope:
                    try:
                        answer = outcome.Value(await fn(pipeline))
                    except Exception as exc:  # noqa: BLE001 - the caller's to raise; Cancelled is not caught
                        answer = outcome.Error(exc)
            finally:
                self._waits.discard(scope)
                try:
                    done(answer)
                except Exception:  # noqa: BLE001 - the caller's loop is gone: nobody to answer, and the client goes on
                    log.debug("pipeline client: a caller left before its answer", exc_info=True)

        def spawn() -> None:
            if self._nursery is None or self._stop is None or self._stop.is_set():
                done(outcome.Error(ClientClosed("the client is closed")))
            else:
                if wait:
                    self._waits.add(scope)
                self._nursery.start_soon(task)

        try:
            token.run_sync_soon(spawn)
        except trio.RunFinishedError:
            raise ClientClosed("the client is closed") from None

        def abandon() -> None:
            try:
                token.run_sync_soon(scope.cancel)  # (CancelScope is the loop's: cancelled there)
            except trio.RunFinishedError:
                pass  # the loop ended, and the wait with it

        return abandon if wait else _nothing

    # -- producing ---------------------------------------------------------------------------------

    def enqueue(self, job: Any, *, priority: int | None = None, run_after: Any = None, delay: float | dt.timedelta | None = None,
                max_attempts: int | None = None, unique_key: str | None = None, connection: Any = OWN_TRANSACTION,
                expires_at: Any = None, unique_while: str | None = None, after: Any = None,
                on_parent_failure: str | None = None, idempotency_key: str | None = None) -> str:
        """Commit one job; its id. ``run_after``: a datetime, ISO 8601 text or epoch seconds;
        ``delay``: seconds (or a timedelta) from now, instead. With ``unique_key``: while a job
        of the same type and key is pending or running nothing is inserted, and that job's id is
        returned (``unique_while="pending"``: only while it is pending; the key frees when it starts).
        ``expires_at`` (as ``run_after``): a job not started by then never starts; it ends cancelled,
        its error saying it expired. ``after``, ``on_parent_failure``: the job waits for these jobs
        (ids) to complete, as :meth:`pipeline.Pipeline.enqueue`'s (docs/workflows.md).

        ``connection``: your own ``sqlite3.Connection`` to the same file, or psycopg 3
        ``Connection`` to the same database and schema: the job is written in your transaction
        (it commits or rolls back with your rows; nothing here commits), and a service learns of
        it when you commit.

        ``idempotency_key``: a second enqueue of the same type and key within JOB_IDEMPOTENCY_SECONDS
        answers the first one's id, whatever became of its job: an enqueue whose answer was lost
        (:class:`pipeline.errors.CommitUnknown`, a timeout) can be sent again safely (docs/jobs.md,
        "Retrying an enqueue safely"). Not with ``connection``, whose transaction is yours to retry."""
        when = _when(run_after, delay)
        connection = _yours(connection)
        _no_key_in_yours(idempotency_key, connection)
        if connection is not None:
            rows = [self._pipeline_here().new_job(job, run_after=when, max_attempts=max_attempts, priority=_priority(priority),
                                                  unique_key=unique_key, expires_at=expires_at, unique_while=unique_while,
                                                  after=after, on_parent_failure=on_parent_failure)]
            return self._insert_in(connection, rows)[0]
        trace = _trace_here(self.registry)
        return self._call(lambda p: p.enqueue(job, run_after=when, max_attempts=max_attempts, priority=_priority(priority),
                                              unique_key=unique_key, trace=trace, expires_at=expires_at,
                                              unique_while=unique_while, after=after, on_parent_failure=on_parent_failure,
                                              idempotency_key=idempotency_key))

    def enqueue_many(self, jobs: Sequence[Any], *, priority: int | None = None,
                     unique_keys: Sequence[str | None] | None = None, connection: Any = OWN_TRANSACTION,
                     idempotency_keys: Sequence[str | None] | None = None) -> builtins.list[str]:
        """Commit many jobs in one transaction; their ids (as :meth:`enqueue`'s, ``connection`` too).
        A :func:`pipeline.chain` (as ``jobs``, or among them) enqueues its jobs each waiting for the
        one before. ``idempotency_keys``: one per job (None: none), as :meth:`enqueue`'s ``idempotency_key``."""
        jobs = jobs if isinstance(jobs, Chain) else list(jobs)
        connection = _yours(connection)
        _no_key_in_yours(idempotency_keys, connection)
        if connection is not None:
            return self._insert_in(connection, self._pipeline_here().new_rows(jobs, priority=_priority(priority),
                                                                             unique_keys=unique_keys))
        trace = _trace_here(self.registry)
        return self._call(lambda p: p.enqueue_many(jobs, priority=_priority(priority), unique_keys=unique_keys, trace=trace,
                                                   idempotency_keys=idempotency_keys))

    def enqueue_batch(self, jobs: Sequence[Any], *, then: Any = None, priority: int | None = None,
                      connection: Any = OWN_TRANSACTION) -> Batch:
        """Commit a batch of jobs and its callback ``then`` in one transaction, as
        :meth:`pipeline.Pipeline.enqueue_batch` (docs/workflows.md); with ``connection``, in your
        transaction instead, as :meth:`enqueue`'s."""
        jobs = list(jobs)
        connection = _yours(connection)
        trace = _trace_here(self.registry)
        if connection is not None:
            rows, batch = self._pipeline_here().batch_rows(jobs, then=then, priority=_priority(priority), trace=trace)
            return _batch_of(batch, self._insert_in(connection, rows, batch))
        return self._call(lambda p: p.enqueue_batch(jobs, then=then, priority=_priority(priority), trace=trace))

    def batch(self, batch_id: str) -> BatchRecord | None:
        """A batch's progress (its jobs counted by status, its callback's status); None if unknown."""
        return self._call(lambda p: p.batch(batch_id))

    def _pipeline_here(self) -> Pipeline:
        """The client's pipeline, to make checked rows here (Pipeline.new_job is thread-safe)."""
        self._loop()
        pipeline = self._pipeline
        if pipeline is None:
            raise ClientClosed("the client is closed")
        return pipeline

    def _insert_in(self, connection: Any, rows: Sequence[NewJob], batch: NewBatch | None = None) -> builtins.list[str]:
        """``rows`` (and ``batch``'s record) written with the caller's connection, in the caller's transaction."""
        if self._joining(connection) == "sqlite":
            from .backends.sqlite import outbox as sqlite_outbox

            if batch is not None:
                return sqlite_outbox.insert_batch_in_transaction(connection, rows, batch)
            return sqlite_outbox.insert_in_transaction(connection, rows)
        if _is_async(connection):
            raise UsageError("connection= is a psycopg AsyncConnection: enqueue with pipeline.AsyncClient, or pass a Connection")
        from .backends.postgres import outbox

        outbox.check_joinable(connection.info, connection.autocommit)  # before any statement of ours on it
        if self._store_identity is None:
            self._store_identity = self._call(lambda p: p.backend.database.run(outbox.store_of))  # type: ignore[attr-defined]
        outbox.check_store(connection, self._store_identity)  # the same database; its search_path may be the app's
        written = outbox.write_in_transaction(connection, rows, batch, self._store_identity.schema)
        self._confirm_after_commit(written)
        return written.ids

    def _confirm_after_commit(self, written: Any) -> None:
        """Postgres: rows written in the caller's transaction named jobs already in the store as
        parents, read without a lock (a lock would hold up their outcomes until the caller commits).
        A task of the client's loop waits for that transaction to end (polling its status, without
        holding a connection meanwhile) and, once it committed, confirms the parents (outbox.
        confirm_after_commit): one that ended in between has the new edges counted then, so its
        child is pending (or cancelled) at once, not at the minute's repair sweep. Closing the client
        looks once more; a transaction still open then is left to that sweep."""
        if not written.parents:
            return
        from .backends.postgres import outbox

        async def confirm(p: Pipeline) -> None:
            stop, delay = self._stop, 0.005
            while True:
                status = await p.backend.database.run(outbox.xact_status, written.xact)  # type: ignore[attr-defined]
                if status != "in progress" or stop is None or stop.is_set():
                    break
                with trio.move_on_after(delay):
                    await stop.wait()
                delay = min(delay * 2, 0.25)
            if status == "committed":
                await p.backend.database.run(outbox.confirm_after_commit, written.parents)  # type: ignore[attr-defined]
            elif status == "in progress":
                log.info("pipeline client: closed before a transaction that enqueued children of %d jobs committed; "
                         "the repair sweep (once a minute) counts what their parents' ends could not", len(written.parents))

        def done(result: outcome.Outcome[Any]) -> None:
            if isinstance(result, outcome.Error):
                log.warning("pipeline client: confirming the parents of a transactional enqueue failed (%r); the repair "
                            "sweep (once a minute) counts what their ends could not", result.error)

        self._start(confirm, done)

    def _joining(self, connection: Any) -> str:
        """Which store's transaction ``connection`` offers ("sqlite" or "postgres"), if it is this
        client's kind (and, for SQLite, its file); UsageError, naming why, otherwise."""
        kind = self.config.backend
        if isinstance(connection, sqlite3.Connection):
            if kind != "sqlite":
                raise UsageError(f"connection= is a sqlite3 connection, but this client's store is {kind}")
            _same_sqlite_file(connection, self.config.database_path)
            autocommit = connection.isolation_level is None or getattr(connection, "autocommit", None) is True  # 3.12+
            if not connection.in_transaction and autocommit:
                raise UsageError("the sqlite3 connection is in autocommit mode with no transaction open, so the job would "
                                 "commit on its own; execute BEGIN first")
            return "sqlite"
        if type(connection).__module__.startswith("psycopg"):
            if kind != "postgres":
                raise UsageError(f"connection= is a psycopg connection, but this client's store is {kind}")
            return "postgres"
        if kind == "redis":
            raise UsageError("the Redis store has no transaction of yours to join (connection=): enqueue without it")
        raise UsageError(f"connection= takes a sqlite3 or psycopg connection, not {type(connection).__name__}")

    def emit(self, event: Any) -> builtins.list[str]:
        """Route a domain event by the registry's routes; the ids of its jobs, once committed."""
        trace = _trace_here(self.registry)
        return self._call(lambda p: p.emit(event, trace=trace))

    def get(self, job_id: str) -> JobRecord | None:
        """The job's record (``status``, ``attempts``, ``error``, ...), or None if there is none."""
        check_job_id(job_id)
        return self._call(lambda p: p.backend.get(job_id))

    # -- control -----------------------------------------------------------------------------------

    def cancel(self, job_id: str) -> str:
        """Cancel a job: "cancelled" (it was pending), "cancelling" (it runs: its process stops it
        within a second or so), or its final status, unchanged. LookupError for an unknown id."""
        return self._call(lambda p: p.cancel(job_id, reason="cancelled by a client"))

    def signal(self, job_id: str, name: str, payload: Any = None, *, key: str | None = None) -> str:
        """Send the signal ``name`` (with ``payload``, any JSON value) to a job: "woken" (it was suspended in
        ``ctx.wait_for(name)`` and resumes) or "kept" (its wait will take it). LookupError for an unknown
        job, UsageError for a finished one, SignalKeyUsed when ``key`` was used for it already
        (docs/durable.md)."""
        return self._call(lambda p: p.signal(job_id, name, payload, key=key))

    def pause_type(self, job_type: str) -> None:
        """No new job of this type starts, in any process sharing the store, until :meth:`resume_type`
        (kept in the store); enqueues are still accepted and running jobs finish, as
        :meth:`pipeline.Pipeline.pause_type`. UsageError for a type the registry does not know."""
        self._call(lambda p: p.pause_type(job_type))

    def resume_type(self, job_type: str) -> None:
        """Let the type's jobs start again, in every process sharing the store."""
        self._call(lambda p: p.resume_type(job_type))

    def result(self, job_id: str, timeout: float | None = None) -> Any:
        """Wait for the job to finish and return its result (its handler's return value, as JSON);
        JobFailed / JobCancelled if it ended dead / cancelled, TimeoutError after ``timeout`` seconds
        (>= 0; a finished job answers even at 0), ClientClosed if :meth:`close` ends the wait."""
        return self._call(lambda p: p.result(job_id, timeout=timeout), wait=True)

    # -- closing -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the client's loop once the calls in flight have committed (what was committed stays
        committed); a ``result()`` wait in flight, in any thread, raises ClientClosed at once, and so
        does every call after it."""
        with self._lock:
            self._closed = True
            if self._pid != os.getpid():  # forked: the loop is the parent's, its thread not here
                return
            token = self._token
            if token is not None:
                try:
                    trio.from_thread.run_sync(self._stop_now, trio_token=token)
                except trio.RunFinishedError:
                    pass
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _stop_now(self) -> None:
        if self._stop is not None:
            self._stop.set()
        for scope in list(self._waits):
            scope.cancel()  # each wait's task answers its caller ClientClosed

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncClient:
    """:class:`Client` for asyncio (and trio) code: the same calls, awaited.

        async with pipeline.AsyncClient(registry=registry) as client:
            job_id = await client.enqueue(ResizeAvatar("u42"))

    Opening it (``async with``, or ``await client.open()``) opens the store in a thread; each call
    then runs on the client's loop and wakes the caller's loop when it is done (no thread per
    call). A caller cancelled while it waits (``asyncio.wait_for``, a trio cancel scope) stops
    waiting: a ``result()`` wait stops with it, at once; an enqueue still completes.
    """

    def __init__(self, database_url: str | None = None, *, registry: Registry, config: Config | None = None) -> None:
        self._args = (database_url, registry, config)
        self._client: Client | None = None
        self._closed = False

    async def open(self) -> AsyncClient:
        if self._closed:
            raise ClientClosed("the client is closed: make a new AsyncClient")
        if self._client is None:
            database_url, registry, config = self._args
            self._client = await _in_thread(lambda: Client(database_url, registry=registry, config=config))
        return self

    async def close(self) -> None:
        """As :meth:`Client.close`: a ``result()`` wait in flight raises ClientClosed at once."""
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await _in_thread(client.close)

    async def __aenter__(self) -> AsyncClient:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _call(self, fn: Callable[[Pipeline], Awaitable[T]], *, wait: bool = False) -> T:
        client = self._open()
        answer, done = _answer_here()
        abandon = client._start(fn, done, wait=wait)
        try:
            return await answer()
        except BaseException:  # the caller cancelled (asyncio.CancelledError, trio.Cancelled): a wait stops too
            abandon()
            raise

    async def enqueue(self, job: Any, *, priority: int | None = None, run_after: Any = None,
                      delay: float | dt.timedelta | None = None, max_attempts: int | None = None,
                      unique_key: str | None = None, connection: Any = OWN_TRANSACTION, expires_at: Any = None,
                      unique_while: str | None = None, after: Any = None, on_parent_failure: str | None = None,
                      idempotency_key: str | None = None) -> str:
        """As :meth:`Client.enqueue`; ``connection`` may also be a psycopg ``AsyncConnection``."""
        when = _when(run_after, delay)
        connection = _yours(connection)
        _no_key_in_yours(idempotency_key, connection)
        if connection is not None:
            rows = [self._open()._pipeline_here().new_job(
                job, run_after=when, max_attempts=max_attempts, priority=_priority(priority), unique_key=unique_key,
                expires_at=expires_at, unique_while=unique_while, after=after, on_parent_failure=on_parent_failure)]
            return (await self._insert_in(connection, rows))[0]
        trace = _trace_here(self._open().registry)
        return await self._call(lambda p: p.enqueue(job, run_after=when, max_attempts=max_attempts, priority=_priority(priority),
                                                    unique_key=unique_key, trace=trace, expires_at=expires_at,
                                                    unique_while=unique_while, after=after,
                                                    on_parent_failure=on_parent_failure, idempotency_key=idempotency_key))

    async def enqueue_many(self, jobs: Sequence[Any], *, priority: int | None = None,
                           unique_keys: Sequence[str | None] | None = None, connection: Any = OWN_TRANSACTION,
                           idempotency_keys: Sequence[str | None] | None = None) -> builtins.list[str]:
        """As :meth:`Client.enqueue_many`."""
        jobs = jobs if isinstance(jobs, Chain) else list(jobs)
        connection = _yours(connection)
        _no_key_in_yours(idempotency_keys, connection)
        if connection is not None:
            rows = self._open()._pipeline_here().new_rows(jobs, priority=_priority(priority), unique_keys=unique_keys)
            return await self._insert_in(connection, rows)
        trace = _trace_here(self._open().registry)
        return await self._call(lambda p: p.enqueue_many(jobs, priority=_priority(priority), unique_keys=unique_keys,
                                                         trace=trace, idempotency_keys=idempotency_keys))

    async def enqueue_batch(self, jobs: Sequence[Any], *, then: Any = None, priority: int | None = None,
                            connection: Any = OWN_TRANSACTION) -> Batch:
        """As :meth:`Client.enqueue_batch`; ``connection`` may also be a psycopg ``AsyncConnection``."""
        jobs = list(jobs)
        connection = _yours(connection)
        trace = _trace_here(self._open().registry)
        if connection is not None:
            rows, batch = self._open()._pipeline_here().batch_rows(jobs, then=then, priority=_priority(priority), trace=trace)
            return _batch_of(batch, await self._insert_in(connection, rows, batch))
        return await self._call(lambda p: p.enqueue_batch(jobs, then=then, priority=_priority(priority), trace=trace))

    async def batch(self, batch_id: str) -> BatchRecord | None:
        """As :meth:`Client.batch`."""
        return await self._call(lambda p: p.batch(batch_id))

    async def _insert_in(self, connection: Any, rows: Sequence[NewJob], batch: NewBatch | None = None) -> builtins.list[str]:
        client = self._open()
        if not _is_async(connection):  # a sqlite3 or sync psycopg connection: the caller's own, used here as it would
            return client._insert_in(connection, rows, batch)
        client._joining(connection)
        from .backends.postgres import outbox

        outbox.check_joinable(connection.info, connection.autocommit)  # before any statement of ours on it
        if client._store_identity is None:
            client._store_identity = await self._call(lambda p: p.backend.database.run(outbox.store_of))  # type: ignore[attr-defined]
        await outbox.check_store_async(connection, client._store_identity)
        written = await outbox.write_in_transaction_async(connection, rows, batch, client._store_identity.schema)
        client._confirm_after_commit(written)
        return written.ids

    def _open(self) -> Client:
        if self._client is None:
            raise ClientClosed("the client is closed" if self._closed else
                               "the client is not open: use `async with AsyncClient(...)` or `await client.open()`")
        return self._client

    async def emit(self, event: Any) -> builtins.list[str]:
        """As :meth:`Client.emit`."""
        trace = _trace_here(self._open().registry)
        return await self._call(lambda p: p.emit(event, trace=trace))

    async def get(self, job_id: str) -> JobRecord | None:
        """As :meth:`Client.get`."""
        check_job_id(job_id)
        return await self._call(lambda p: p.backend.get(job_id))

    async def cancel(self, job_id: str) -> str:
        """As :meth:`Client.cancel`."""
        return await self._call(lambda p: p.cancel(job_id, reason="cancelled by a client"))

    async def signal(self, job_id: str, name: str, payload: Any = None, *, key: str | None = None) -> str:
        """As :meth:`Client.signal`."""
        return await self._call(lambda p: p.signal(job_id, name, payload, key=key))

    async def pause_type(self, job_type: str) -> None:
        """As :meth:`Client.pause_type`."""
        await self._call(lambda p: p.pause_type(job_type))

    async def resume_type(self, job_type: str) -> None:
        """As :meth:`Client.resume_type`."""
        await self._call(lambda p: p.resume_type(job_type))

    async def result(self, job_id: str, timeout: float | None = None) -> Any:
        """As :meth:`Client.result`; a caller that stops waiting (cancelled) stops the wait at once."""
        return await self._call(lambda p: p.result(job_id, timeout=timeout), wait=True)


# -- the caller's event loop ------------------------------------------------------------------------


def _answer_here() -> tuple[Callable[[], Awaitable[Any]], Callable[[outcome.Outcome[Any]], None]]:
    """A ``wait`` for the calling task and a ``done`` that any thread may call once with the
    outcome: it wakes the caller's loop (asyncio or trio) without blocking the thread that calls it."""
    library = sniffio.current_async_library()
    if library == "asyncio":
        import asyncio

        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def set_result(result: outcome.Outcome[Any]) -> None:
            if not future.done():  # a caller cancelled meanwhile left it done
                future.set_result(result)

        async def wait_asyncio() -> Any:
            result: outcome.Outcome[Any] = await future
            return result.unwrap()

        def done_asyncio(result: outcome.Outcome[Any]) -> None:
            try:
                loop.call_soon_threadsafe(set_result, result)
            except RuntimeError:  # the caller's loop is closed: nobody waits
                pass

        return wait_asyncio, done_asyncio
    if library == "trio":
        token = trio.lowlevel.current_trio_token()
        event = trio.Event()
        box: list[outcome.Outcome[Any]] = []

        def done(result: outcome.Outcome[Any]) -> None:
            box.append(result)
            try:
                token.run_sync_soon(event.set)
            except trio.RunFinishedError:
                pass  # the caller's loop ended: nobody waits

        async def wait_trio() -> Any:
            await event.wait()
            return box[0].unwrap()

        return wait_trio, done
    raise RuntimeError(f"AsyncClient runs under asyncio or trio, not {library}")


async def _in_thread(fn: Callable[[], T]) -> T:
    """``fn()`` in a thread, awaited from asyncio or trio."""
    if sniffio.current_async_library() == "trio":
        return await trio.to_thread.run_sync(fn)
    import asyncio

    return await asyncio.to_thread(fn)


# -- arguments ----------------------------------------------------------------------------------------


def _nothing() -> None:
    """``abandon`` for a call that runs to its end whoever waits."""


def _yours(connection: Any) -> Any:
    """The caller's DB-API connection to write in (None: none given, a transaction of the client's own).
    ``None`` given is refused: it is what Django's ``connection.connection`` is before the connection's
    first query, and taking it for "no connection" committed the job on its own, outside the caller's
    transaction. Django's own connection (``django.db.connection``, ``connections["name"]``) is taken
    inside ``transaction.atomic()``: opened if it is not yet, and its DB-API connection used."""
    if connection is OWN_TRANSACTION:
        return None
    if connection is None:
        raise UsageError("connection=None: there is no transaction of yours to join (Django's connection.connection is "
                         "None until its first query). Pass your connection itself (with Django: django.db.connection, "
                         "inside transaction.atomic()), or leave connection= out to commit in a transaction of the "
                         "client's own")
    if hasattr(connection, "in_atomic_block") and hasattr(connection, "ensure_connection"):  # Django's (or its proxy)
        if not connection.in_atomic_block and connection.get_autocommit():
            raise UsageError(f"connection= is Django's connection {connection.alias!r} outside transaction.atomic(), so "
                             "the job would commit on its own: enqueue inside `with transaction.atomic():`, or leave "
                             "connection= out")
        connection.ensure_connection()  # (atomic() has opened it; a connection with AUTOCOMMIT off may not be yet)
        return connection.connection
    return connection


def _no_key_in_yours(key: Any, connection: Any) -> None:
    """An idempotency key makes a retry of a lost answer safe; with ``connection=`` the commit (and
    its retry) is the caller's own, which no key of ours can see: refused, not silently dropped."""
    if key is not None and connection is not None:
        raise UsageError("an idempotency key is not taken with connection=: your transaction commits the job, so "
                         "retrying it is yours to decide (a unique_key, or a row of your own, guards it)")


def _when(run_after: Any, delay: float | dt.timedelta | None) -> Any:
    if delay is None:
        return run_after
    if run_after is not None:
        raise UsageError("give run_after or delay, not both")
    seconds = delay.total_seconds() if isinstance(delay, dt.timedelta) else delay
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds >= 0:
        raise UsageError(f"delay must be a number of seconds >= 0 or a timedelta, got {delay!r}")
    return time.time() + seconds


def _trace_here(registry: Registry) -> str:
    """The caller's trace context (registry.trace_context, pipeline/otel.py), captured in the
    caller's thread before the call is handed to the client's loop, where it is not current;
    "" for none (so the loop captures nothing of its own)."""
    hook = registry.trace_context
    return (hook() or "") if hook is not None else ""


def _priority(priority: int | None) -> int:
    return PRIORITY_DEFAULT if priority is None else priority


def _batch_of(batch: NewBatch, ids: Sequence[str]) -> Batch:
    """What enqueue_batch answers, from the ids its rows were stored under (the callback's last)."""
    return Batch(batch.id, tuple(ids[: len(ids) - (batch.callback_id is not None)]), batch.callback_id)


def _is_async(connection: Any) -> bool:
    return type(connection).__module__.startswith("psycopg") and type(connection).__name__.startswith("Async")


def _same_sqlite_file(connection: sqlite3.Connection, path: os.PathLike[str] | str) -> None:
    """UsageError unless ``connection``'s main database is the file at ``path``."""
    found = next((row[2] for row in connection.execute("PRAGMA database_list") if row[1] == "main"), "")
    if not found or os.path.realpath(found) != os.path.realpath(path):
        raise UsageError(f"connection= is a connection to {found or 'an in-memory database'!r}; this client's jobs are in "
                         f"{os.path.realpath(path)!r}")

