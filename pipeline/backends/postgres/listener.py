"""Wake-ups across processes: LISTEN on the store's channel, nudge the Poller on NOTIFY.

A batch that makes work due (an insert, a release, a revive) sends ``NOTIFY pipeline_jobs``
with its schema as payload, in its own transaction: Postgres delivers it at commit, to every
listening connection, in every process on any machine. This actor holds one connection
outside the pool that only listens, and waits on its socket from trio itself
(``trio.lowlevel.wait_readable``, then libpq's non-blocking ``consume_input``/``notifies``):
no thread is parked on it, and cancelling it at shutdown is immediate.

A connection that goes silent without closing (a NAT or firewall dropping an idle connection, a
proxy that lost its upstream) is caught by TCP keepalives and by a ``SELECT 1`` sent on it
after a quiet spell, which must be answered within a deadline (batches.LISTENER_PING_*).

When the connection drops (a server restart, ``pg_terminate_backend``) or goes silent, it
reconnects with back-off and nudges once it listens again: whatever was made due meanwhile is
claimed then; meanwhile /healthz says it does not listen. Polling stays the fallback
(``WORKER_POLL_INTERVAL_MS``): a notification lost with a connection costs at most one interval.
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
from .. import batches
from ..base import HealthReport, Nudge
from .db import connect
from .store import CHANNEL

log = logging.getLogger("pipeline.postgres")


def _listening(url: str) -> tuple[psycopg.Connection[Any], str]:
    idle, interval, count = batches.LISTENER_KEEPALIVE
    conn = connect(url, "listener", keepalives=1, keepalives_idle=idle, keepalives_interval=interval, keepalives_count=count)
    try:
        row = conn.execute("SELECT current_schema()").fetchone()
        conn.execute(f"LISTEN {CHANNEL}")
        conn.pgconn.nonblocking = 1  # from here on, libpq is driven from trio (a ping's send never blocks)
    except psycopg.Error:
        conn.close()
        raise
    return conn, (row[0] if row else None) or ""


async def _receive(listening: tuple[psycopg.Connection[Any], str]) -> tuple[bool, bool]:
    """What arrived: (a notification for this schema, the answer to the ping)."""
    conn, schema = listening
    pgconn = conn.pgconn
    pgconn.consume_input()  # raises once the server has closed the connection
    if pgconn.status == pq.ConnStatus.BAD:
        raise psycopg.OperationalError("the connection is broken")
    answered = False
    while not pgconn.is_busy() and (result := pgconn.get_result()) is not None:
        answered = True
        if result.status == pq.ExecStatus.FATAL_ERROR:
            raise psycopg.OperationalError(f"the ping failed: {(result.error_message or b'').decode(errors='replace')}")
    woken = False
    while (note := pgconn.notifies()) is not None:
        woken = woken or note.extra.decode() == schema
    return woken, answered


async def _ping(listening: tuple[psycopg.Connection[Any], str]) -> None:
    pgconn = listening[0].pgconn
    pgconn.send_query(b"SELECT 1")  # raises if libpq cannot
    while pgconn.flush():  # 1: not all sent yet (non-blocking)
        await trio.lowlevel.wait_writable(pgconn.socket)


async def run_listener(url: str, nudge_send: trio.MemorySendChannel[Nudge], *, health: HealthReport | None = None,
                       task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Nudge the Poller at every notification for this schema, until cancelled; ``health``
    says while it does not listen."""
    await batches.listen_for_work(
        f"database {masked_url(url)}", "LISTEN", connect=functools.partial(_listening, url),
        socket_of=lambda listening: listening[0].pgconn.socket, receive=_receive, ping=_ping,
        close=lambda listening: listening[0].close(), errors=(StoreError, psycopg.Error, OSError),
        nudge_send=nudge_send, logger=log, health=health, task_status=task_status,
    )
