"""The server backends' wake-up listener notices a connection that went silent without closing
(a NAT or firewall forgetting an idle connection, a proxy whose upstream went away): it pings,
gives the connection up when the ping goes unanswered, says so in /healthz's reasons while it
cannot listen, and listens again on a new connection, so that pickup does not fall back to the
poll for good. Tested through a TCP proxy written here, between the pipeline and the server."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import attrs
import pytest
import trio

import pipeline
from pipeline import Config, Registry
from pipeline.backends import batches, open_backend

from .stores import BACKENDS
from .test_redis import needs_server_binary, own_server

SERVERS = [name for name in ("postgres", "redis") if name in BACKENDS]


@attrs.define
class Link:
    """One client connection through the proxy."""

    listener: bool = False  # it sent LISTEN or SUBSCRIBE
    silent: bool = False  # nothing passes either way, and the proxy keeps both sockets open


class Proxy:
    """Forwards TCP connections to ``upstream``. ``silence(link)`` drops a connection's bytes in
    both directions without closing it; while ``refusing_listeners``, a connection that sends
    LISTEN or SUBSCRIBE is closed instead (the server is out of reach for new listeners)."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.links: list[Link] = []
        self.refusing_listeners = False
        self.port = 0

    def listeners(self) -> list[Link]:
        return [link for link in self.links if link.listener]

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        await trio.serve_listeners(self._handle, listeners, task_status=task_status)

    async def _handle(self, client: trio.SocketStream) -> None:
        link = Link()
        self.links.append(link)
        try:
            server = await trio.open_tcp_stream(*self.upstream)
        except OSError:
            await client.aclose()
            return
        async with client, server, trio.open_nursery() as tn:
            tn.start_soon(self._pump, client, server, link, True, tn.cancel_scope)
            tn.start_soon(self._pump, server, client, link, False, tn.cancel_scope)

    async def _pump(self, source: trio.SocketStream, sink: trio.SocketStream, link: Link, upstream: bool,
                    both: trio.CancelScope) -> None:
        try:
            while data := await source.receive_some(65536):
                if upstream and (b"LISTEN " in data or b"SUBSCRIBE" in data):
                    link.listener = True
                    if self.refusing_listeners:
                        break
                if not link.silent:
                    await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        both.cancel()  # one side ended: end the other


def through(config: Config, port: int) -> Config:
    parts = urlsplit(config.database_url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return config.replace(database_url=urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host)))


@attrs.frozen
class Wake:
    n: int


async def wait_until(condition: Callable[[], bool], timeout: float) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.005)


@pytest.mark.parametrize("name", SERVERS)
async def test_a_silenced_listener_is_noticed_reported_and_replaced(name: str, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batches, "LISTENER_PING_INTERVAL", 0.2)  # production: 15 s of quiet, 5 s to answer
    monkeypatch.setattr(batches, "LISTENER_PING_DEADLINE", 0.3)
    started: dict[int, float] = {}

    async def handle(job: Wake, ctx: pipeline.JobContext) -> None:
        started[job.n] = time.perf_counter()

    registry = Registry()
    registry.register("wake", Wake, handle)
    async with BACKENDS[name](tmp_path) as direct, trio.open_nursery() as tn:
        parts = urlsplit(direct.database_url)
        proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or (5432 if name == "postgres" else 6379))
        await tn.start(proxy.serve)
        # the poll would find a job only after a minute: a start within seconds is the listener's
        config = through(direct, proxy.port)
        config = config.replace(worker=attrs.evolve(config.worker, poll_interval_ms=60_000))
        async with pipeline.open_pipeline(config, registry) as p, open_backend(direct) as other:
            await wait_until(lambda: len(proxy.listeners()) == 1, 5)
            assert "listener" not in p.health.problems

            # the listener's connection goes silent; new listeners cannot reach the server
            proxy.refusing_listeners = True
            (silenced,) = proxy.listeners()
            silenced.silent = True
            t0 = trio.current_time()
            await wait_until(lambda: "listener" in p.health.problems, 5)
            assert trio.current_time() - t0 < 3.0  # production: within interval + deadline (20 s)
            (reason,) = [r for r in p.health.reasons(trio.current_time()) if r.startswith("listener:")]
            # noticed by its unanswered ping; on a loaded machine the reason may already be the refused
            # reconnection that followed (which only a noticed silence starts)
            assert "not listening" in reason and ("ping" in reason or "cannot connect again" in reason), reason
            await trio.sleep(0.5)  # its reconnections are refused meanwhile: it still says so
            assert "listener" in p.health.problems

            proxy.refusing_listeners = False
            await wait_until(lambda: "listener" not in p.health.problems, 10)
            assert len(proxy.listeners()) >= 2 and not proxy.listeners()[-1].silent

            t1 = time.perf_counter()
            await other.insert([p.new_job(Wake(1))])  # committed by another connection, not the proxy's
            await wait_until(lambda: 1 in started, 10)
            assert started[1] - t1 < 2.0, f"picked up after {started[1] - t1:.2f} s: by the poll, not a wake-up"
        tn.cancel_scope.cancel()


def _keepalive_of(fd: int) -> tuple[int, int, int, int]:
    sock = socket.socket(fileno=fd)
    try:
        return (sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT))
    finally:
        sock.detach()  # the driver's socket: not closed here


@pytest.mark.skipif(not hasattr(socket, "TCP_KEEPIDLE"), reason="reads Linux's TCP keepalive options")
@pytest.mark.parametrize("name", SERVERS)
async def test_the_listening_connection_sends_tcp_keepalives(name: str, tmp_path: Path) -> None:
    expected = (1, *batches.LISTENER_KEEPALIVE)
    assert expected == (1, 30, 10, 3)
    async with BACKENDS[name](tmp_path) as config:
        if name == "postgres":
            from pipeline.backends.postgres import listener as pg_listener

            conn, _ = await trio.to_thread.run_sync(pg_listener._listening, config.database_url)
            try:
                assert _keepalive_of(conn.pgconn.socket) == expected
            finally:
                conn.close()
        else:
            from pipeline.backends.redis import listener as redis_listener
            from pipeline.backends.redis.db import split_url

            url, prefix = split_url(config.database_url, config.redis.key_prefix)
            client, pubsub, sock = await trio.to_thread.run_sync(redis_listener._subscribed, url, f"{prefix}wake")
            try:
                assert _keepalive_of(sock.fileno()) == expected
            finally:
                redis_listener._close(client, pubsub)


@needs_server_binary
async def test_a_listener_killed_as_soon_as_it_listens_backs_off(tmp_path: Path) -> None:
    """A middlebox (or an operator's CLIENT KILL) that ends the listening connection right after
    it subscribes: the listener connected again at once, every time, a tight loop of connects and
    claims; now a connection that did not live a ping interval is followed by a growing pause."""
    import redis
    from conftest import fast_config

    from pipeline.config import RedisSettings

    with own_server(tmp_path) as (port, _):
        config = fast_config(tmp_path / "unused.db").replace(database_url=f"redis://127.0.0.1:{port}/0",
                                                             redis=RedisSettings(allow_non_durable=True))
        admin = redis.Redis(port=port)
        try:
            async with pipeline.open_pipeline(config, Registry()):
                before = int(admin.info("stats")["total_connections_received"])
                with trio.move_on_after(1.5):
                    while True:
                        await trio.to_thread.run_sync(lambda: admin.client_kill_filter(_type="pubsub"))
                        await trio.sleep(0.005)
                opened = int(admin.info("stats")["total_connections_received"]) - before
        finally:
            admin.close()
    assert opened <= 12, f"{opened} connections in 1.5 s"
