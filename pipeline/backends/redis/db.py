"""The Redis connections: redis-py's sync client used from trio threads, the scripts it runs,
the one translation of the driver's errors into the pipeline's, and the durability check.

redis-py's asyncio client is asyncio's, not trio's: its sync client runs in worker threads
(``trio.to_thread.run_sync``) behind ``CapacityLimiter``s, as the Postgres backend runs
psycopg. Every call is one round trip (a script, or a pipeline of scripts), so the thread hop
(~30-50 us) is small beside it. The listener (listener.py) waits on its socket from trio.

No call is retried by the driver (``Retry(NoBackoff(), 0)``): a script whose connection dropped
may have run, and sending it again would insert a job twice (refused as a duplicate) or answer
an outcome as stale that was written. Callers hear StoreError and decide (workers try their
fenced outcomes again; an enqueue raises). After a connection error, calls fail at once for a
back-off (50 ms doubling to 2 s) instead of each waiting for a connect timeout; the first call
after it reconnects.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
import trio
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, ResponseError
from redis.retry import Retry

from ...config import masked_url
from ...errors import ConfigError, SchemaTooNew, StoreError
from ..base import lost
from .scripts import ALL, Script

log = logging.getLogger("pipeline.redis")

T = TypeVar("T")

SCHEMA_VERSION = "7"
POOL_SIZE = 8  # the Ledger, the Poller's claim, the lease keeper, bulk loads, operator reads
CONNECT_TIMEOUT = 5.0
SOCKET_TIMEOUT = 30.0  # a script over a big batch may take a while; a dead server is seen by its socket closing
# (the URL's own ``socket_timeout=`` replaces it; a bulk load's commit waits longer: see __init__.py)
BACKOFF_FIRST, BACKOFF_MAX = 0.05, 2.0

DRIVER_ERRORS = (redis.exceptions.RedisError, OSError)


def split_url(url: str, default_prefix: str) -> tuple[str, str]:
    """DATABASE_URL as redis-py takes it (without ``prefix=``), and the key prefix: the URL's
    ``?prefix=NAME`` if given, else REDIS_KEY_PREFIX; as ``{NAME}:`` (a hash tag: one slot)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    prefix = default_prefix
    kept = []
    for key, value in query:
        if key == "prefix":
            prefix = value
        else:
            kept.append((key, value))
    if not prefix or any(c in prefix for c in "{}*?[] "):
        raise ConfigError(f"DATABASE_URL={masked_url(url)!r}: the key prefix {prefix!r} must be text without {{}}*?[] or spaces")
    return urlunsplit(parts._replace(query=urlencode(kept))), f"{{{prefix}}}:"


def client_for(url: str, *, size: int = POOL_SIZE, socket_timeout: float | None = None) -> redis.Redis:
    """A client on a blocking pool (threads wait for a free connection rather than fail), with
    no retry of its own (see the module's docstring). Its socket timeout is the URL's
    ``socket_timeout=``, else SOCKET_TIMEOUT; ``socket_timeout`` given replaces both."""
    if socket_timeout is not None:  # (redis-py lets the URL's query win over its arguments)
        parts = urlsplit(url)
        query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "socket_timeout"]
        url = urlunsplit(parts._replace(query=urlencode(query)))
    pool = redis.BlockingConnectionPool.from_url(
        url, max_connections=size, timeout=CONNECT_TIMEOUT, socket_connect_timeout=CONNECT_TIMEOUT,
        socket_timeout=SOCKET_TIMEOUT if socket_timeout is None else socket_timeout, socket_keepalive=True,
        retry=Retry(NoBackoff(), 0), decode_responses=False,
    )
    return redis.Redis(connection_pool=pool, retry=Retry(NoBackoff(), 0))


def socket_timeout_of(url: str) -> float:
    """The socket timeout of the clients made for ``url``: its ``socket_timeout=``, else SOCKET_TIMEOUT."""
    for key, value in parse_qsl(urlsplit(url).query):
        if key == "socket_timeout":
            return float(value)
    return SOCKET_TIMEOUT


def describe(exc: BaseException, shown: str) -> StoreError:
    """A driver error as the pipeline's: StoreError naming the (masked) server and what to do."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, ResponseError) and text.startswith("DUPLICATE "):
        return StoreError(f"redis {shown}: {text[len('DUPLICATE '):]}")
    if isinstance(exc, redis.exceptions.AuthenticationError) or (isinstance(exc, ResponseError) and
                                                                   text.startswith(("WRONGPASS", "NOAUTH"))):
        # (redis-py's AuthenticationError is a ConnectionError: not something a retry cures)
        return StoreError(f"redis {shown} refused the credentials ({text}); check the user and password in the URL")
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError | OSError):
        if "CERTIFICATE" in text or "SSL" in text:  # not something a retry cures
            return StoreError(f"redis {shown}: the TLS handshake failed ({text}); check the URL's ssl_* parameters "
                              "(e.g. ssl_ca_certs=/path/ca.pem)")
        return lost(StoreError(f"redis {shown} is unreachable or dropped the connection ({text}); retry later"))
    return StoreError(f"redis {shown}: {text}")


def run_script(client: Any, script: Script, args: Sequence[Any]) -> Any:
    """EVALSHA, loading the script first if the server does not have it (a restart, SCRIPT FLUSH)."""
    try:
        return client.evalsha(script.sha, 0, *args)
    except NoScriptError:
        client.script_load(script.source)
        return client.evalsha(script.sha, 0, *args)


def run_pipelined(client: redis.Redis, calls: Sequence[tuple[Script, Sequence[Any]]]) -> list[Any]:
    """Several scripts in one round trip; each is atomic on its own, and answers for itself
    (a ResponseError in its place: a duplicate id fails that insert, not the others)."""
    results = _execute(client, calls)
    missing = [n for n, r in enumerate(results) if isinstance(r, NoScriptError)]
    if missing:  # NOSCRIPT: those did not run; load them and run them again
        for script in {calls[n][0] for n in missing}:
            client.script_load(script.source)
        for n, value in zip(missing, _execute(client, [calls[n] for n in missing])):
            results[n] = value
    return results


def _execute(client: redis.Redis, calls: Sequence[tuple[Script, Sequence[Any]]]) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for script, args in calls:
        pipe.evalsha(script.sha, 0, *args)
    results: list[Any] = pipe.execute(raise_on_error=False)
    return results


NEEDED = ("`appendonly yes`; `appendfsync always` (every write on disk before it is acknowledged) or `everysec` "
          "(which can lose up to one second of acknowledged jobs on power loss or an OS crash); "
          "`no-appendfsync-on-rewrite no` (with yes, nothing is fsynced while an AOF rewrite or a snapshot runs in the "
          "background: up to 30 s of acknowledged jobs, with Linux's default settings, can be lost on power loss or an "
          "OS crash, whatever appendfsync says); "
          "`maxmemory-policy noeviction` (no job key evicted when memory runs short)")

# Each setting that can lose acknowledged jobs, and the values that cannot.
DURABLE_SETTINGS = (
    ("appendonly", ("yes",)),
    ("appendfsync", ("always", "everysec")),
    ("no-appendfsync-on-rewrite", ("no",)),
    ("maxmemory-policy", ("noeviction",)),
)


def check_durability(client: redis.Redis, shown: str, *, allow: bool) -> None:
    """Refuse a server whose settings can lose acknowledged jobs, unless allowed."""
    advice = ("set them on the server (redis.conf, or CONFIG SET then CONFIG REWRITE), or accept the risk with "
              "REDIS_ALLOW_NON_DURABLE=true")
    try:
        raw = client.config_get(*(name for name, _ in DURABLE_SETTINGS))
    except ResponseError as exc:
        message = (f"redis {shown}: CONFIG GET is refused ({exc}), so the pipeline cannot check that acknowledged jobs "
                   f"survive a restart; it needs {NEEDED}")
        if allow:
            log.warning("%s; starting anyway (REDIS_ALLOW_NON_DURABLE=true)", message)
            return
        raise ConfigError(f"{message}; {advice}") from None
    found = {_text(k): _text(v) for k, v in raw.items()}
    wrong = [f"{name} {found.get(name)}" for name, ok in DURABLE_SETTINGS if found.get(name) not in ok]
    if wrong:
        message = f"redis {shown} can lose acknowledged jobs ({', '.join(wrong)}): the pipeline needs {NEEDED}"
        if not allow:
            raise ConfigError(f"{message}; {advice}")
        log.warning("%s (starting anyway: REDIS_ALLOW_NON_DURABLE=true)", message)
    elif found.get("appendfsync") == "everysec":
        log.info("redis %s: appendfsync everysec: up to one second of acknowledged jobs may be lost on power loss or an "
                 "OS crash (appendfsync always closes that window)", shown)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Database:
    """The client, the key prefix, and how trio code runs a blocking call on it."""

    def __init__(self, url: str, prefix: str, *, shown: str) -> None:
        self.url = url  # as redis-py takes it (with any password): never shown
        self.prefix = prefix
        self.shown = shown
        self.client = client_for(url)
        self.socket_timeout = socket_timeout_of(url)
        self.write_limiter = trio.CapacityLimiter(1)  # the Ledger: one batch at a time
        self.limiter = trio.CapacityLimiter(POOL_SIZE - 1)  # everyone else
        self._lock = threading.Lock()
        self._down_until = 0.0  # time.monotonic() before which calls fail at once (back-off)
        self._delay = 0.0
        self.trouble: str | None = None  # why the server cannot be reached right now, for /healthz

    def open(self, *, allow_non_durable: bool) -> None:
        try:
            self.client.ping()
            check_durability(self.client, self.shown, allow=allow_non_durable)
            version = _text(run_script(self.client, ALL["schema"], [self.prefix, SCHEMA_VERSION]))
        except DRIVER_ERRORS as exc:
            raise describe(exc, self.shown) from None
        if version != SCHEMA_VERSION:
            raise SchemaTooNew(f"redis {self.shown}: keys {self.prefix}* hold layout version {version}; this pipeline "
                               f"knows version {SCHEMA_VERSION}; upgrade it, or use another REDIS_KEY_PREFIX")

    def close(self) -> None:
        self.client.close()
        self.client.connection_pool.disconnect()

    def run_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(client, prefix, *args)``; driver errors as StoreError, with the back-off."""
        with self._lock:
            wait = self._down_until - time.monotonic()
            if wait > 0:
                raise StoreError(f"{self.trouble}; trying again in {wait:.2f} s")
        try:
            value = fn(self.client, self.prefix, *args)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            error = describe(exc, self.shown)
            with self._lock:
                self._delay = min(max(self._delay * 2, BACKOFF_FIRST), BACKOFF_MAX)
                self._down_until = time.monotonic() + self._delay
                self.trouble = str(error)
            raise error from None
        except redis.exceptions.RedisError as exc:
            raise describe(exc, self.shown) from None
        if self.trouble is not None:
            with self._lock:
                if self.trouble is not None:
                    log.info("redis %s answers again", self.shown)
                self._delay, self.trouble = 0.0, None
        return value

    def answered(self) -> None:
        """The server answered a call made on the client outside :meth:`run_blocking` (an insert's
        answer asked again): the back-off ends."""
        with self._lock:
            if self.trouble is not None:
                log.info("redis %s answers again", self.shown)
            self._delay, self._down_until, self.trouble = 0.0, 0.0, None

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        """For the Ledger, one batch at a time."""
        return await trio.to_thread.run_sync(self.run_blocking, fn, *args, limiter=self.write_limiter)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(self.run_blocking, fn, *args, limiter=self.limiter)
