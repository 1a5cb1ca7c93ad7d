"""The stores PipelineBackend writes to: one shared :class:`pipeline.Client` per store and process,
and the reads made on Django's own connection (in its transaction) when the jobs are in its database.

Django makes a task backend per thread (its handler is a ``BaseConnectionHandler``), so the clients
cannot hang off the backend: each would start a loop thread and a pool of connections of its own
for every request thread. They are kept here, one per (store, job types), for the process; a
forked process makes its own (``Client`` sees the fork).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from ...backends.base import JobRecord
from ...client import Client
from ...config import Config
from .jobs import types_registry
from .options import BackendOptions

_lock = threading.Lock()
_clients: dict[tuple[str, tuple[str, ...]], Client] = {}


def client_for(options: BackendOptions, url: str) -> Client:
    """The process's client of ``url`` knowing ``options``' queues (made at first use)."""
    job_types = tuple(sorted(queue.job_type for queue in options.queues.values()))
    key = (url, job_types)
    with _lock:
        client = _clients.get(key)
        if client is None:
            config = Config.from_env().replace(database_url=url)
            client = _clients[key] = Client(registry=types_registry({options.alias: options}), config=config)
        return client


def close_clients() -> None:
    """Close every client this module made (tests that switch stores; at exit the loop threads are daemons)."""
    with _lock:
        clients = list(_clients.values())
        _clients.clear()
    for client in clients:
        client.close()


# -- reads in the caller's transaction ------------------------------------------------------------------


def get_here(client: Client, connection: Any, job_id: str) -> JobRecord | None:
    """The job as ``connection`` (Django's, whose database holds the store) sees it: in a
    transaction of its own, the rows it wrote and has not committed too."""
    raw = _raw(connection)
    if client.config.backend == "sqlite":
        from ...backends.sqlite import outbox as sqlite_outbox

        return sqlite_outbox.job_in_transaction(raw, job_id)
    from ...backends.postgres import outbox

    return outbox.job_in_transaction(raw, job_id, _schema(client))


def pending_here(client: Client, connection: Any, job_types: Sequence[str]) -> list[JobRecord]:
    """The pending jobs of ``job_types`` as ``connection`` sees them, in the order a worker claims them."""
    raw = _raw(connection)
    if client.config.backend == "sqlite":
        from ...backends.sqlite import outbox as sqlite_outbox

        return sqlite_outbox.pending_in_transaction(raw, job_types)
    from ...backends.postgres import outbox

    return outbox.pending_in_transaction(raw, job_types, _schema(client))


def _raw(connection: Any) -> Any:
    connection.ensure_connection()
    return connection.connection


def _schema(client: Client) -> str:
    if client._store_identity is None:  # (the client asks its own connection once, as its connection= does)
        from ...backends.postgres import outbox

        client._store_identity = client._call(lambda p: p.backend.database.run(outbox.store_of))  # type: ignore[attr-defined]
    return str(client._store_identity.schema)


# -- what run_tasks ran ----------------------------------------------------------------------------------

_ran: dict[str, Any] = {}  # job id -> the TaskResult run_tasks made (testing.py): what get_result answers for it


def ran_here(job_id: str) -> Any:
    with _lock:
        return _ran.get(job_id)


def remember_ran(job_id: str, result: Any) -> None:
    with _lock:
        _ran[job_id] = result
