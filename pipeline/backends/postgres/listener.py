"""Wake-ups across processes: LISTEN on the store's channel, nudge the Poller on NOTIFY.

A batch that makes work due (an insert, a release, a revive) sends ``NOTIFY pipeline_jobs``
with its schema as payload, in its own transaction: Postgres delivers it at commit, to every
listening connection, in every process on any machine. This actor holds one connection
outside the pool that only listens, and waits on its socket from trio itself
(``trio.lowlevel.wait_readable``, then libpq's non-blocking ``consume_input``/``notifies``):
no thread is parked on it, and cancelling it at shutdown is immediate.

When the connection drops (a server restart, ``pg_terminate_backend``), it reconnects with
back-off and nudges once it listens again: whatever was made due meanwhile is claimed then.
Polling stays the fallback (``WORKER_POLL_INTERVAL_MS``): a notification lost with a
connection costs at most one interval.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import psycopg
import trio
from psycopg import pq

from ...config import masked_url
from ...errors import StoreError
from ..base import Nudge, nudge
from ..batches import listen_for_work
from .db import connect
from .store import CHANNEL

log = logging.getLogger("pipeline.postgres")


def _listening(url: str) -> tuple[psycopg.Connection[Any], str]:
    conn = connect(url)
    try:
        row = conn.execute("SELECT current_schema()").fetchone()
        conn.execute(f"LISTEN {CHANNEL}")
    except psycopg.Error:
        conn.close()
        raise
    return conn, (row[0] if row else None) or ""


async def run_listener(url: str, nudge_send: trio.MemorySendChannel[Nudge], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Nudge the Poller at every notification for this schema, until cancelled."""

    async def listen(listening: tuple[psycopg.Connection[Any], str]) -> None:
        conn, schema = listening
        pgconn = conn.pgconn
        while True:
            await trio.lowlevel.wait_readable(pgconn.socket)
            pgconn.consume_input()  # raises once the server has closed the connection
            if pgconn.status == pq.ConnStatus.BAD:
                raise psycopg.OperationalError("the connection is broken")
            woken = False
            while (note := pgconn.notifies()) is not None:
                woken = woken or note.extra.decode() == schema
            if woken:
                nudge(nudge_send)

    await listen_for_work(
        f"database {masked_url(url)}", "LISTEN", connect=functools.partial(_listening, url), listen=listen,
        close=lambda listening: listening[0].close(), errors=(StoreError, psycopg.Error, OSError),
        nudge_send=nudge_send, logger=log, task_status=task_status,
    )
