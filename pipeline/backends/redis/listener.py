"""Wake-ups across processes: SUBSCRIBE to the store's ``wake`` channel, nudge the Poller.

The scripts that make work due (an insert of a due job, a release, a revive) PUBLISH on
``{prefix}:wake`` as they write; Redis delivers it to every subscribed connection, in every
process on any machine. This actor holds one connection outside the pool that only listens,
and waits on its socket from trio itself (``trio.lowlevel.wait_readable``); it reads what
arrived in a thread (redis-py's parser is blocking code), so no thread is parked on the
socket and cancelling it at shutdown is immediate.

When the connection drops (a server restart), it reconnects with back-off and nudges once it
listens again: whatever was made due meanwhile is claimed then. Polling stays the fallback
(``WORKER_POLL_INTERVAL_MS``): a message lost with a connection costs at most one interval.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import redis
import trio
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..base import Nudge, nudge
from ..batches import listen_for_work
from .db import CONNECT_TIMEOUT

log = logging.getLogger("pipeline.redis")


def _subscribed(url: str, channel: str) -> tuple[redis.Redis, Any]:
    client = redis.Redis.from_url(url, socket_connect_timeout=CONNECT_TIMEOUT, socket_keepalive=True,
                                  retry=Retry(NoBackoff(), 0), single_connection_client=False)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    try:
        pubsub.subscribe(channel)
        pubsub.get_message(timeout=CONNECT_TIMEOUT)  # the subscription's confirmation (ignored, but read)
    except BaseException:
        pubsub.close()
        client.close()
        raise
    return client, pubsub


def _drain(pubsub: Any) -> int:
    """Read every message already here (the socket's and any the parser buffered); how many."""
    n = 0
    while pubsub.get_message(timeout=0.0) is not None:
        n += 1
    if pubsub.connection is None or pubsub.connection._sock is None:
        raise redis.exceptions.ConnectionError("the subscription's connection closed")
    return n


async def run_listener(url: str, channel: str, shown: str, nudge_send: trio.MemorySendChannel[Nudge], *,
                       task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Nudge the Poller at every message on ``channel``, until cancelled."""

    async def listen(subscribed: tuple[redis.Redis, Any]) -> None:
        _, pubsub = subscribed
        # (redis-py keeps the socket private; the subscription's connection is its own)
        sock = pubsub.connection._sock
        while True:
            await trio.lowlevel.wait_readable(sock)
            # at least one message, or the end of the connection (which raises)
            if await trio.to_thread.run_sync(_drain, pubsub):
                nudge(nudge_send)
            elif pubsub.connection is None or pubsub.connection._sock is not sock:
                raise redis.exceptions.ConnectionError("the subscription's connection was replaced")

    await listen_for_work(
        f"redis {shown}", "SUBSCRIBE", connect=functools.partial(_subscribed, url, channel), listen=listen,
        close=lambda subscribed: _close(*subscribed), errors=(redis.exceptions.RedisError, OSError),
        nudge_send=nudge_send, logger=log, task_status=task_status,
    )


def _close(client: redis.Redis, pubsub: Any) -> None:
    try:
        pubsub.close()
    finally:
        client.close()
