"""Where job state lives: the :class:`Backend` protocol (base.py) and the one factory that
picks a backend from DATABASE_URL.

    async with open_backend(config) as backend:
        await backend.insert(jobs)

The engine, the CLI and the admin API reach job state only through what this returns.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from ..config import DATABASE_URL_FORMS, masked_url
from ..errors import ConfigError
from ..extras import require
from .base import (
    Backend,
    Claimed,
    ClaimOffer,
    HealthReport,
    JobRecord,
    Lease,
    LeaseRenewer,
    NewJob,
    Nudge,
    ScheduleRecord,
    Settlement,
    StepRecord,
    Topology,
    WorkerRecord,
    nudge,
)

if TYPE_CHECKING:
    import trio

    from ..config import Config

__all__ = [
    "Backend", "ClaimOffer", "Claimed", "JobRecord", "Lease", "LeaseRenewer", "NewJob", "Nudge", "ScheduleRecord", "Settlement",
    "StepRecord", "WorkerRecord", "masked_url", "nudge", "open_backend",
]



@asynccontextmanager
async def open_backend(
    config: Config,
    *,
    nudge_send: trio.MemorySendChannel[Nudge] | None = None,
    offers_recv: trio.MemoryReceiveChannel[ClaimOffer] | None = None,
    wiring: Topology | None = None,
    health: HealthReport | None = None,
    role: str | None = None,
) -> AsyncIterator[Backend]:
    """The backend DATABASE_URL names, open (its schema created or migrated) until the block ends.

    ``nudge_send`` is where the backend tells the Poller that work may be due (and answers
    its :class:`ClaimOffer` from ``offers_recv``, if the backend can claim with an insert).
    ``health``: where the server backends' wake-up listener says while it cannot listen.
    ``role``: what this process is to the store (Postgres: its sessions' application_name,
    ``pipeline-ROLE``); by default ``worker`` when a Poller listens for nudges, else ``client``."""
    url = config.database_url
    kind = config.backend
    if kind == "sqlite":
        from .sqlite import open_sqlite_backend

        async with open_sqlite_backend(
            config.database_path, url=masked_url(url), busy_timeout_ms=config.sqlite.busy_timeout_ms,
            synchronous=config.sqlite.synchronous, nudge_send=nudge_send, offers_recv=offers_recv, wiring=wiring,
        ) as backend:
            yield backend
        return
    if kind == "postgres":
        require("postgres", f"DATABASE_URL={masked_url(url)!r}")
        from .postgres import open_postgres_backend

        async with open_postgres_backend(url, nudge_send=nudge_send, offers_recv=offers_recv, wiring=wiring,
                                          health=health, role=role or ("client" if nudge_send is None else "worker")) as backend:
            yield backend
        return
    if kind == "redis":
        require("redis", f"DATABASE_URL={masked_url(url)!r}")
        from .redis import open_redis_backend

        async with open_redis_backend(
            url, key_prefix=config.redis.key_prefix, allow_non_durable=config.redis.allow_non_durable,
            nudge_send=nudge_send, offers_recv=offers_recv, wiring=wiring, health=health,
        ) as backend:
            yield backend
        return
    raise ConfigError(f"DATABASE_URL={masked_url(url)!r} is not valid: expected one of {DATABASE_URL_FORMS}")
