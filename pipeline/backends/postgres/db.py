"""The Postgres connections: a psycopg pool used from trio threads, and the one translation
of the driver's errors into the pipeline's.

psycopg 3's sync API runs in worker threads (``trio.to_thread.run_sync``), each kind of work
behind its own ``CapacityLimiter``: its async API is asyncio's, and a thin trio adapter over
libpq's non-blocking calls would be a second driver to maintain for little gain, since every
call here is one round trip whose thread hop (~30 us) is small beside it. The one place that
waits on the socket from trio itself is the LISTEN connection (listener.py).

The pool holds connections for the Ledger (one at a time, and always one left for it), the
Poller's claims, the lease keeper and the operators' reads (admin API, CLI); the heartbeat
thread and the listener each own one connection outside it. Every session says whose it is in
``pg_stat_activity``: its ``application_name`` is ``pipeline-`` and the role of its process (the
pool's: ``worker``, ``client``, ``supervisor``, ``admin``, ``cli``) or of the connection (``listener``,
``heartbeat``), unless the URL (or ``PGAPPNAME``) names one (:func:`session_name`). Every connection talks UTC in ISO
DateStyle, whatever the server's or the role's defaults (configure), and times come
back as the protocol's text (``2026-01-01T00:00:00.000Z``) straight from the wire format
(:class:`TextTimes`), without a datetime in between.
"""

from __future__ import annotations

import logging
import select
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple, TypeVar

import psycopg
import trio
from psycopg.adapt import Loader
from psycopg_pool import ConnectionPool, PoolTimeout

from ...config import masked_url, without_password
from ...errors import StoreError
from ..base import lost

log = logging.getLogger("pipeline.postgres")

T = TypeVar("T")

POOL_SIZE = 6  # the Ledger's one, and the rest for the Poller's claims, the lease keeper and operators' reads
CONNECT_TIMEOUT = 10.0  # seconds to wait for a pooled connection before the call fails with StoreError


class TextTimes(Loader):
    """timestamptz as the protocol's ISO 8601 text, from Postgres's UTC text form
    (``2026-01-01 00:00:00.12+00``; fraction optional, without trailing zeros). The stored times carry whole
    milliseconds (the SQL rounds every time it makes), so nothing is lost."""

    def load(self, data: Any) -> str:
        text = bytes(data).decode()
        if not text.endswith("+00"):  # the session's TimeZone is UTC (configure); anything else is a bug
            raise psycopg.DataError(f"timestamp {text!r} is not in UTC")
        # the fraction is written without trailing zeros, or not at all: ".07+00", "+00"
        millis = (text[20:-3] + "000")[:3] if text[19:20] == "." else "000"
        return f"{text[:10]}T{text[11:19]}.{millis}Z"


# What the code reads and writes times with, whatever the server, the database, the role or
# the URL's options set as the session's defaults: TextTimes reads ISO text in UTC (DateStyle
# SQL, German or Postgres write "01/12/2026 ..." or "Tue Dec 01 ..."), intervals as Postgres writes them.
# And which server session this is (ServerSession), in the same round trip.
_SESSION = ("SELECT set_config('TimeZone', 'UTC', false), set_config('DateStyle', 'ISO, YMD', false), "
            "set_config('IntervalStyle', 'postgres', false), pg_backend_pid(), "
            "(SELECT extract(epoch FROM backend_start)::text FROM pg_stat_activity WHERE pid = pg_backend_pid())")


class ServerSession(NamedTuple):
    """The server's process behind a connection: its pid and its ``backend_start`` (seconds since
    the epoch, as the server writes them: exact, whatever the session's TimeZone). Pids are reused;
    the pair names one session for the server's lifetime."""

    pid: int
    started: str


def configure(conn: psycopg.Connection[Any]) -> None:
    """Every new connection: times in UTC and ISO, read back as text; and which server session it is
    (kept on the connection for :func:`sent_on`)."""
    conn.adapters.register_loader("timestamptz", TextTimes)
    row = conn.execute(_SESSION).fetchone()
    # an attribute of the pipeline's own on the driver's connection: set once here, read only by
    # sent_on, when a statement's answer was lost on this connection
    conn._pipeline_session = (  # type: ignore[attr-defined]
        ServerSession(int(row[3]), str(row[4])) if row is not None and row[4] is not None else None)


# An insert whose connection dropped before its answer (base.lost) may still be running on the
# server: its statement waiting for a lock, or the server not yet aware that the client is gone; it
# may commit after anything a new connection reads. So every lost error says which server session
# might still be running what it sent (the attribute named _PENDING): None, nothing (the statement never
# left, or the server answered it); absent, not known. The insert's ask (PostgresBackend._ask) ends
# that session before it reads (end_session): only then is "not stored" final.
_PENDING = "pipeline_pending_session"


def sent_on(exc: BaseException, conn: psycopg.Connection[Any]) -> BaseException:
    """``exc`` (a driver error raised by a statement on ``conn``) says which session may still run
    that statement: the connection's, if it broke (the answer lost), else none (the server answered
    with the error: the statement is over, its transaction rolled back)."""
    if not (conn.broken or conn.closed):
        setattr(exc, _PENDING, None)
    elif (session := getattr(conn, "_pipeline_session", None)) is not None:
        setattr(exc, _PENDING, session)
    # (else a connection whose session is not known, never configured: left not known)
    return exc


def nothing_sent(error: StoreError) -> StoreError:
    """``error`` came before any statement was sent (no connection to be had)."""
    setattr(error, _PENDING, None)
    return error


def pending_session(error: BaseException) -> tuple[bool, ServerSession | None]:
    """Whether ``error`` says which session may still run what was sent, and that session (None: none)."""
    if not hasattr(error, _PENDING):
        return False, None
    return True, getattr(error, _PENDING)


SESSION_END_WAIT = 5.0  # seconds end_session waits for a terminated session to be gone

_SESSION_END = ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE pid = %(pid)s AND extract(epoch FROM backend_start)::text = %(started)s")
# by pid alone: a session of another role shows its pid but not its start (NULL), which is not "gone"
_SESSION_LOOK = "SELECT extract(epoch FROM backend_start)::text FROM pg_stat_activity WHERE pid = %(pid)s"


def end_session(conn: psycopg.Connection[Any], session: ServerSession, *, wait: float | None = None) -> bool:
    """Ends ``session`` (``pg_terminate_backend``, which a role may do to its own sessions) and waits
    until ``pg_stat_activity`` no longer shows it, ``wait`` seconds at most (SESSION_END_WAIT): whether
    it is gone. A terminated session's open transaction rolls back before it leaves the view, and
    what it committed is visible to every transaction begun after, so a read made once it is gone
    sees all the session will ever have written. A pid now of another session (its start differs)
    is left alone: that one is gone. False if the server refuses (a role that may not signal it), if
    its start cannot be read (another role's session: perhaps it), or if it is still there at the deadline."""
    named = {"pid": session.pid, "started": session.started}
    try:
        conn.execute(_SESSION_END, named)
    except psycopg.errors.InsufficientPrivilege as exc:
        log.warning("database: session %d, which may still commit an insert whose answer was lost, cannot be "
                    "ended (%s)", session.pid, _first_line(exc))
        return False
    deadline = time.monotonic() + (SESSION_END_WAIT if wait is None else wait)
    pause = 0.005
    while (row := conn.execute(_SESSION_LOOK, named).fetchone()) is not None:
        if row[0] is None:  # a session this role may not read: cannot tell whether it is that one
            log.warning("database: cannot tell whether session %d, which may still commit an insert whose answer "
                        "was lost, has ended (its start is hidden from this role)", session.pid)
            return False
        if row[0] != session.started:
            break  # the pid is another session's now
        if time.monotonic() >= deadline:
            log.warning("database: session %d, which may still commit an insert whose answer was lost, did not end "
                        "within %g s", session.pid, SESSION_END_WAIT if wait is None else wait)
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.1)
    return True


def session_name(url: str, role: str) -> dict[str, Any]:
    """The libpq parameter that names a session ``pipeline-ROLE`` in ``pg_stat_activity``:
    ``fallback_application_name``, which libpq uses only when neither the URL's
    ``application_name`` nor ``PGAPPNAME`` names one (the user's own name wins). A URL that sets
    its own fallback keeps it."""
    if "fallback_application_name" in psycopg.conninfo.conninfo_to_dict(url):
        return {}
    return {"fallback_application_name": f"pipeline-{role}"}


def connect(url: str, role: str, **params: Any) -> psycopg.Connection[Any]:
    """A connection outside the pool (the heartbeat's, the bulk loader's, the listener's),
    named for ``role`` (:func:`session_name`); ``params``: libpq's, over the URL's (the
    listener's keepalives)."""
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=int(CONNECT_TIMEOUT), **session_name(url, role),
                               **params)
    except psycopg.Error as exc:
        raise describe(exc, url) from None
    configure(conn)
    return conn


def describe(exc: BaseException, url: str) -> StoreError:
    """A driver error as the pipeline's: StoreError naming the (masked) server and what to do
    (and, from :func:`sent_on`, which session may still run what was sent)."""
    error = _describe(exc, url)
    if hasattr(exc, _PENDING):
        setattr(error, _PENDING, getattr(exc, _PENDING))
    return error


def _describe(exc: BaseException, url: str) -> StoreError:
    where = masked_url(url)
    said = without_password(_first_line(exc), url)  # libpq quotes what it could not parse, the password too
    if isinstance(exc, psycopg.errors.UniqueViolation):
        return StoreError(f"database {where}: a job with this id already exists ({said})")
    if isinstance(exc, psycopg.OperationalError | PoolTimeout):
        if "SSL error" in said or "certificate" in said:  # not something a retry cures
            return StoreError(f"database {where}: the TLS handshake failed ({said}); check sslmode and sslrootcert "
                              "in DATABASE_URL")
        if refused_for_good(said):
            return StoreError(f"database {where} refused the connection ({said})")
        return lost(StoreError(f"database {where} is unreachable or dropped the connection ({said}); retry later"))
    return StoreError(f"database {where}: {said}")


# what a server says while it cannot take a session yet (a restart, a failover, a full house)
_NOT_YET = ("starting up", "shutting down", "recovery mode", "too many clients", "remaining connection slots")


def refused_for_good(said: str) -> bool:
    """A connection error that waiting will not cure: the server answered FATAL (an unknown role
    or database, a password or pg_hba.conf refusal), or the TLS handshake failed."""
    if any(words in said for words in _NOT_YET):
        return False
    return "FATAL" in said or "TLS handshake failed" in said


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _idle_and_sound(conn: psycopg.Connection[Any]) -> bool:
    """A pooled connection waits idle and listens to nothing: a socket with something to
    read means the server spoke first, which it does only to end the session (a restart,
    ``pg_terminate_backend``, ``idle_session_timeout``). A select of zero seconds, not a
    round trip: the connection is dropped before a statement is lost on it. ``poll``, not
    ``select``, which refuses a descriptor numbered 1024 or more (a process with many files
    open: a web application embedding the pipeline)."""
    if conn.closed or conn.broken:
        return False
    try:
        looking = select.poll()
        looking.register(conn.pgconn.socket, select.POLLIN)
        return not looking.poll(0)  # anything (data, end of stream, an error, a hang-up): not sound
    except (OSError, ValueError, psycopg.OperationalError):
        return False


class Database:
    """The pool, and how trio code runs a blocking function on one of its connections. ``role``:
    what this process is to the store (its sessions' application_name, :func:`session_name`)."""

    def __init__(self, url: str, *, role: str = "worker", size: int = POOL_SIZE) -> None:
        self.url = url
        self.role = role
        self.shown = masked_url(url)
        try:
            named = session_name(url, role)
        except psycopg.Error:
            named = {}  # a URL libpq cannot parse: open() says so, masked
        self.pool = ConnectionPool(
            url, min_size=2, max_size=size, kwargs={"autocommit": True, **named}, configure=configure, open=False,
            name="pipeline", timeout=CONNECT_TIMEOUT, reconnect_timeout=365 * 86400.0,  # keep trying: a server restart ends
        )
        self.write_limiter = trio.CapacityLimiter(1)  # the Ledger: one batch at a time
        # everyone else, one connection fewer than the pool holds: that one is always the
        # Ledger's, so that slow operators' reads (six of them once took the whole pool) never
        # make an enqueue or an outcome wait for a connection. (The heartbeat's is outside the pool.)
        self.limiter = trio.CapacityLimiter(max(size - 1, 1))

    def open(self) -> None:
        try:
            # a URL libpq cannot parse fails here, at once and masked, rather than in the pool's
            # retries for CONNECT_TIMEOUT, whose log lines quote libpq (and so the password)
            psycopg.conninfo.conninfo_to_dict(self.url)
        except psycopg.Error as exc:
            raise describe(exc, self.url) from None
        try:
            # one connection first: a server that answers and refuses (a role, a password, a
            # database that does not exist, a certificate) is said at once, not after the pool's
            # CONNECT_TIMEOUT of retries; one that does not answer yet is the pool's to wait for
            connect(self.url, self.role).close()
        except StoreError as exc:
            if refused_for_good(str(exc)):
                raise
        try:
            self.pool.open(wait=True, timeout=CONNECT_TIMEOUT)
        except PoolTimeout:
            # the pool's own error says only "timeout": connect once to learn why
            connect(self.url, self.role).close()
            raise StoreError(f"database {self.shown}: no connection within {CONNECT_TIMEOUT:g} s") from None

    def close(self) -> None:
        self.pool.close(timeout=5.0)

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A sound pooled connection (see _idle_and_sound); driver errors become StoreError."""
        try:
            for _ in range(self.pool.max_size + 1):
                conn = self.pool.getconn()
                if _idle_and_sound(conn):
                    break
                log.info("database %s dropped a pooled connection; reconnecting", self.shown)
                conn.close()
                self.pool.putconn(conn)  # closed: the pool replaces it
            else:
                raise StoreError(f"database {self.shown}: every pooled connection was dropped; retry later")
        except (psycopg.Error, PoolTimeout) as exc:
            raise nothing_sent(describe(exc, self.url)) from None
        try:
            yield conn
        except psycopg.Error as exc:
            raise describe(sent_on(exc, conn), self.url) from None
        finally:
            self.pool.putconn(conn)

    def run_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        with self.connection() as conn:
            return fn(conn, *args)

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(conn, *args)`` for the Ledger, one at a time."""
        return await trio.to_thread.run_sync(self.run_blocking, fn, *args, limiter=self.write_limiter)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(conn, *args)`` on a pooled connection, in a thread."""
        return await trio.to_thread.run_sync(self.run_blocking, fn, *args, limiter=self.limiter)
