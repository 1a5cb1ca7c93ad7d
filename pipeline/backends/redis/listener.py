"""Wake-ups across processes: SUBSCRIBE to the store's ``wake`` channel, nudge the Poller.

The scripts that make work due (an insert of a due job, a release, a revive) PUBLISH on
``{prefix}:wake`` as they write; Redis delivers it to every subscribed connection, in every
process on any machine. This actor holds one connection outside the pool that only listens,
and waits on its socket from trio itself (``trio.lowlevel.wait_readable``); it reads what
arrived in a thread (redis-py's parser is blocking code), so no thread is parked on the
socket and cancelling it at shutdown is immediate.

A connection that goes silent without closing (a NAT or firewall dropping an idle connection, a
proxy that lost its upstream) is caught by TCP keepalives and by a PING sent on it after a quiet
spell, which must be answered within a deadline (batches.LISTENER_PING_*).

When the connection drops (a server restart) or goes silent, it reconnects with back-off and
nudges once it listens again: whatever was made due meanwhile is claimed then; meanwhile
/healthz says it does not listen. Polling stays the fallback (``WORKER_POLL_INTERVAL_MS``): a
message lost with a connection costs at most one interval.
"""

from __future__ import annotations

import functools
import logging
import socket
from typing import Any

import redis
import trio
from redis.backoff import NoBackoff
from redis.retry import Retry

from .. import batches
from ..base import HealthReport, Nudge
from .db import CONNECT_TIMEOUT

log = logging.getLogger("pipeline.redis")


# (client, its subscription, the subscription's socket: redis-py keeps it private, and replaces
# it on its own after an error, which this listener must see as the end of its connection)
Subscribed = tuple[redis.Redis, Any, socket.socket]


def _keepalive_options() -> dict[int, int]:
    idle, interval, count = batches.LISTENER_KEEPALIVE
    names = {"TCP_KEEPIDLE": idle, "TCP_KEEPALIVE": idle, "TCP_KEEPINTVL": interval, "TCP_KEEPCNT": count}
    return {getattr(socket, name): value for name, value in names.items() if hasattr(socket, name)}  # Linux, macOS


def _subscribed(url: str, channel: str) -> Subscribed:
    client = redis.Redis.from_url(url, socket_connect_timeout=CONNECT_TIMEOUT, socket_timeout=CONNECT_TIMEOUT,
                                  socket_keepalive=True, socket_keepalive_options=_keepalive_options(),
                                  retry=Retry(NoBackoff(), 0), single_connection_client=False)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    try:
        pubsub.subscribe(channel)
        pubsub.get_message(timeout=CONNECT_TIMEOUT)  # the subscription's confirmation (ignored, but read)
        connection = pubsub.connection
        sock = connection._sock if connection is not None else None
        if sock is None:
            raise redis.exceptions.ConnectionError("the subscription's connection closed")
    except BaseException:
        pubsub.close()
        client.close()
        raise
    return client, pubsub, sock


def _drain(subscribed: Subscribed, own: bytes | None = None) -> tuple[bool, bool]:
    """Read every message already here (the socket's and any the parser buffered): (a wake-up
    among them, the answer to the ping among them). A message whose payload is ``own`` was sent by
    this process's Ledger, which has nudged its Poller itself: not a wake-up here."""
    _, pubsub, sock = subscribed
    woken = answered = False
    while (message := pubsub.get_message(timeout=0.0)) is not None:
        if message["type"] == "pong":
            answered = True
        elif own is None or message.get("data") != own:
            woken = True
    if pubsub.connection is None or pubsub.connection._sock is not sock:
        raise redis.exceptions.ConnectionError("the subscription's connection closed")
    return woken, answered


async def _receive(subscribed: Subscribed, own: bytes | None = None) -> tuple[bool, bool]:
    # redis-py's parser is blocking code: in a thread (a message or the end of the connection is here)
    return await trio.to_thread.run_sync(_drain, subscribed, own)


async def _ping(subscribed: Subscribed) -> None:
    # a subscribed connection answers PING with a "pong" message; the send is bounded by socket_timeout
    await trio.to_thread.run_sync(subscribed[1].ping)


async def run_listener(url: str, channel: str, shown: str, nudge_send: trio.MemorySendChannel[Nudge], *,
                       health: HealthReport | None = None, own: str | None = None,
                       task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Nudge the Poller at every message on ``channel`` (but this process's Ledger's own, whose
    payload is ``own``), until cancelled; ``health`` says while it does not listen."""
    await batches.listen_for_work(
        f"redis {shown}", "SUBSCRIBE", connect=functools.partial(_subscribed, url, channel),
        socket_of=lambda subscribed: subscribed[2],
        receive=functools.partial(_receive, own=own.encode() if own is not None else None), ping=_ping,
        close=lambda subscribed: _close(*subscribed[:2]), errors=(redis.exceptions.RedisError, OSError),
        nudge_send=nudge_send, logger=log, health=health, task_status=task_status,
    )


def _close(client: redis.Redis, pubsub: Any) -> None:
    try:
        pubsub.close()
    finally:
        client.close()
