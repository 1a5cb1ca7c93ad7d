"""The ``invalidate_cache`` handler and the cache it invalidates.

The cache is a pipeline resource named ``"cache"``: the handlers and the host
application reach the same store as ``pipeline.resources["cache"]``. Which store is
chosen by CACHE_URL:

* empty or ``memory://`` — :class:`MemoryCacheStore`, a dict in this process (the
  default; right for one process, gone on restart);
* ``redis://``, ``rediss://``, ``unix://`` — :class:`RedisCacheStore`, shared by every
  process that points at the same Redis.

Why redis-py's synchronous client in threads and not a trio-native client: redis-py is
the reference client (URLs, TLS, auth, RESP3, sentinel, cluster all handled and
maintained); its asyncio client does not run under trio, and the trio-native clients
are small and unmaintained. Cache calls are short (one round trip per batch: MGET, DEL,
a pipelined SET), so one thread hop per batch costs little; the store's own
CapacityLimiter, sized like its connection pool, keeps those threads from crowding out
the database's and caps the connections a burst can open.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs
import trio

from ..config import Config, without_password
from ..errors import ConfigError
from ..extras import require
from .jobs import InvalidateCache
from .settings import CacheSettings

if TYPE_CHECKING:
    from ..context import JobContext
    from ..registry import Registry

log = logging.getLogger("pipeline.cache")

RESOURCE = "cache"
REDIS_CONNECTIONS = 8  # threads (and pooled connections) a Redis store uses at once, handlers and host app together
REDIS_TIMEOUT = 5.0  # seconds for a connect or a reply, unless CACHE_URL says otherwise (?socket_timeout=)


@runtime_checkable
class CacheStore(Protocol):
    """Text values under text keys. Every call takes a batch: one round trip per call."""

    async def get_many(self, keys: Sequence[str]) -> dict[str, str]:
        """The values of those ``keys`` that exist (missing and expired keys are left out)."""

    async def set_many(self, items: Mapping[str, str], *, ttl: float | None = None) -> None:
        """Store every item; with ``ttl`` (seconds) each expires that long from now."""

    async def delete_many(self, keys: Sequence[str]) -> int:
        """Delete ``keys``; returns how many of them existed."""


def _check_ttl(ttl: float | None) -> None:
    if ttl is not None and not ttl > 0:
        raise ValueError(f"ttl must be a number of seconds > 0 (or None for no expiry), got {ttl!r}")


@attrs.define(eq=False)
class MemoryCacheStore:
    """A dict in this process. Expiry runs on trio's clock, so tests can use a MockClock."""

    _entries: dict[str, tuple[str, float | None]] = attrs.field(factory=dict)  # key -> (value, expires at)

    def _live(self, key: str, now: float) -> str | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        value, expires_at = entry
        if expires_at is not None and expires_at <= now:
            del self._entries[key]
            return None
        return value

    async def get_many(self, keys: Sequence[str]) -> dict[str, str]:
        now = trio.current_time()
        found = {key: self._live(key, now) for key in keys}
        return {key: value for key, value in found.items() if value is not None}

    async def set_many(self, items: Mapping[str, str], *, ttl: float | None = None) -> None:
        _check_ttl(ttl)
        expires_at = None if ttl is None else trio.current_time() + ttl
        for key, value in items.items():
            self._entries[key] = (value, expires_at)

    async def delete_many(self, keys: Sequence[str]) -> int:
        now = trio.current_time()
        deleted = 0
        for key in dict.fromkeys(keys):  # a key named twice counts once, as in Redis
            if self._live(key, now) is not None:
                del self._entries[key]
                deleted += 1
        return deleted


@attrs.define(eq=False)
class RedisCacheStore:
    """Keys in Redis (``prefix`` + key), through redis-py's sync client in threads."""

    client: Any  # redis.Redis; its connection pool is as large as the limiter
    limiter: trio.CapacityLimiter
    prefix: str = ""

    async def _run(self, fn: Any, *args: Any) -> Any:
        # abandon_on_cancel: a cancelled cache call may finish in the background; every
        # operation here is idempotent, and the socket timeout ends the thread soon anyway
        return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter, abandon_on_cancel=True)

    async def get_many(self, keys: Sequence[str]) -> dict[str, str]:
        keys = list(keys)
        if not keys:
            return {}
        values = await self._run(self.client.mget, [self.prefix + key for key in keys])
        return {key: value for key, value in zip(keys, values) if value is not None}

    async def set_many(self, items: Mapping[str, str], *, ttl: float | None = None) -> None:
        _check_ttl(ttl)
        if not items:
            return
        px = None if ttl is None else max(1, round(ttl * 1000))

        def write() -> None:
            with self.client.pipeline(transaction=False) as pipe:
                for key, value in items.items():
                    pipe.set(self.prefix + key, value, px=px)
                pipe.execute()

        await self._run(write)

    async def delete_many(self, keys: Sequence[str]) -> int:
        names = list(dict.fromkeys(self.prefix + key for key in keys))
        if not names:
            return 0
        return int(await self._run(self.client.delete, *names))


def redacted(url: str) -> str:
    """A Redis URL without its password, for logs and error messages."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


@asynccontextmanager
async def open_redis_store(url: str, *, prefix: str = "", connections: int = REDIS_CONNECTIONS) -> AsyncIterator[RedisCacheStore]:
    """A Redis store for ``url``. Connects lazily: a Redis that is down fails the calls (and
    so retries the invalidations), not the pipeline's start."""
    require("redis", f"CACHE_URL={redacted(url)!r}")
    import redis  # only needed when CACHE_URL points at Redis

    parts = urllib.parse.urlsplit(url)
    if parts.scheme in ("redis", "rediss") and parts.path.strip("/") and not parts.path.strip("/").isdigit():
        # redis-py would silently fall back to database 0 here
        raise ConfigError(f"CACHE_URL={redacted(url)!r}: the path must be a database number, as in redis://HOST:PORT/0")
    try:
        client = redis.Redis.from_url(
            url,
            decode_responses=True,
            max_connections=connections,
            socket_timeout=REDIS_TIMEOUT,
            socket_connect_timeout=REDIS_TIMEOUT,
        )
    except ValueError as exc:
        raise ConfigError(f"CACHE_URL={redacted(url)!r} is not a usable Redis URL: {without_password(str(exc), url)}") from None
    log.info("cache: Redis at %s", redacted(url))
    try:
        yield RedisCacheStore(client, trio.CapacityLimiter(connections), prefix)
    finally:
        with trio.CancelScope(shield=True):  # close the sockets even when we are being cancelled
            await trio.to_thread.run_sync(client.close)


@asynccontextmanager
async def open_cache_store(url: str, *, prefix: str = "") -> AsyncIterator[CacheStore]:
    """The store CACHE_URL names: memory (empty or ``memory://``) or Redis."""
    if url in ("", "memory://"):
        yield MemoryCacheStore()
    elif url.startswith(("redis://", "rediss://", "unix://")):
        async with open_redis_store(url, prefix=prefix) as store:
            yield store
    else:
        raise ConfigError(f"CACHE_URL={redacted(url)!r}: expected empty, memory:// or redis://HOST:PORT/DB")


# -- handler -----------------------------------------------------------------------------------


async def invalidate_cache(job: InvalidateCache, ctx: JobContext) -> None:
    """Delete the job's keys. Deleting a key that is not there is success: the cache is cold."""
    store: CacheStore = ctx.resources[RESOURCE]
    deleted = await store.delete_many(job.keys)
    log.debug("job %s: invalidated %d of %d cache keys", ctx.id, deleted, len(job.keys))


def install(registry: Registry, config: Config, *, prefix: str = "") -> None:
    """Attach ``invalidate_cache`` and the ``"cache"`` resource (chosen by CACHE_URL when the
    pipeline opens). ``prefix`` goes in front of every key in Redis, for sharing a database."""

    def factory(config: Config, registry: Registry) -> Any:
        return open_cache_store(config.section(CacheSettings).url, prefix=prefix)

    registry.add_resource(RESOURCE, factory)
    registry.register("invalidate_cache", InvalidateCache, invalidate_cache)
