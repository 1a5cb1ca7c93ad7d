"""A Redis bulk load's commit (one script over every staged row of a part) answers what it did:
a commit that outlasts the socket timeout is waited for, not reported failed; an answer lost
with its connection is asked for again (the script answers the same the second time,
inserting nothing more); and only when no answer can be had at all does the load fail,
saying that the rows may have been committed and how to check.

Each test runs a redis-server of its own (a long script stops every client of its server);
the socket timeout is scaled down through the URL's ``socket_timeout=``. That the commit did
outlast it is the server's own measure (SLOWLOG), not a time taken here."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import fast_config

from pipeline.backends import open_backend
from pipeline.backends.redis.scripts import ALL
from pipeline.config import RedisSettings
from pipeline.errors import StoreError

from .kit import job
from .stores import BACKENDS
from .test_redis import needs_server_binary, own_server

pytestmark = [pytest.mark.skipif("redis" not in BACKENDS, reason="no redis entry"), needs_server_binary]

TIMEOUT = 0.1  # the scaled-down socket timeout (30 s as configured by default)
# the cutting proxy's tests: no read there waits for the timeout (a cut connection is closed), and the
# staging commands through the proxy's threads may take longer than TIMEOUT on a loaded machine
PROXIED_TIMEOUT = 5.0


def _config(tmp_path: Path, port: int, timeout: float = TIMEOUT) -> Any:
    return fast_config(tmp_path / "unused.db").replace(
        database_url=f"redis://127.0.0.1:{port}/0?socket_timeout={timeout}", redis=RedisSettings(allow_non_durable=True))


def _pending(port: int) -> int:
    client = redis.Redis(port=port)
    try:
        return sum(int(client.zcard(b"{pipeline}:st:pending:" + t)) for t in client.smembers("{pipeline}:types"))
    finally:
        client.close()


async def test_a_commit_that_outlasts_the_socket_timeout_is_waited_for(tmp_path: Path) -> None:
    """9b02048: "unreachable or dropped the connection … retry later" while every row
    were in (a retry loaded them twice). About 10 us a row on a quiet machine: 30,000 rows take
    three times the timeout."""
    with own_server(tmp_path, "--slowlog-log-slower-than", str(round(TIMEOUT * 1e6))) as (port, _):
        async with open_backend(_config(tmp_path, port)) as backend:
            assert await backend.bulk_insert(job(payload={"n": i}) for i in range(30_000)) == 30_000
        assert _pending(port) == 30_000
        client = redis.Redis(port=port)
        slow = [entry for entry in client.slowlog_get(10) if b"EVALSHA" in entry["command"].upper()]
        client.close()
        assert slow, "the commit took less than the socket timeout: the test proves nothing (more rows)"


class CuttingProxy:
    """A TCP proxy in front of the server that, once armed, drops the answer to the first
    command naming the staged commit's script and closes that connection (the script has run
    on the server); with ``refuse``, it then closes every new connection at once."""

    def __init__(self, port: int, *, refuse: bool) -> None:
        self.upstream = port
        self.refuse = refuse
        self.armed = False
        self.cut = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self.listener.accept()
            except OSError:
                return
            self.sockets.append(near)
            if self.cut.is_set() and self.refuse:
                near.close()
                continue
            far = socket.create_connection(("127.0.0.1", self.upstream))
            self.sockets.append(far)
            marked = threading.Event()  # this connection sent the commit
            threading.Thread(target=self._pump, args=(near, far, marked, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(far, near, marked, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, marked: threading.Event, upward: bool) -> None:
        sha = ALL["insert_staged"].sha.encode()
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if upward and self.armed and not self.cut.is_set() and sha in data:
                    marked.set()
                elif not upward and marked.is_set() and not self.cut.is_set():
                    self.cut.set()  # the commit's answer: dropped, the connection closed
                    break
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.close()


@contextlib.contextmanager
def proxy(port: int, *, refuse: bool) -> Iterator[CuttingProxy]:
    p = CuttingProxy(port, refuse=refuse)
    try:
        yield p
    finally:
        p.close()


async def test_a_commit_whose_answer_was_lost_is_asked_again_and_counted_once(tmp_path: Path) -> None:
    with own_server(tmp_path) as (port, _), proxy(port, refuse=False) as cutter:
        async with open_backend(_config(tmp_path, cutter.port, PROXIED_TIMEOUT)) as backend:
            redis.Redis(port=port).script_load(ALL["insert_staged"].source)  # its first EVALSHA runs it
            cutter.armed = True
            assert await backend.bulk_insert(job(payload={"n": i}) for i in range(300)) == 300
            assert cutter.cut.is_set(), "no answer was lost: the test proves nothing"
        assert _pending(port) == 300
        assert not list(redis.Redis(port=port).scan_iter(match="{pipeline}:bulk:*")), "a staging list or answer was left"


async def test_a_commit_with_no_answer_at_all_says_it_may_have_been_committed_and_how_to_check(tmp_path: Path) -> None:
    with own_server(tmp_path) as (port, _), proxy(port, refuse=True) as cutter:
        async with open_backend(_config(tmp_path, cutter.port, PROXIED_TIMEOUT)) as backend:
            redis.Redis(port=port).script_load(ALL["insert_staged"].source)
            cutter.armed = True
            rows = [job(payload={"n": i}) for i in range(300)]
            with pytest.raises(StoreError) as failed:
                await backend.bulk_insert(rows)
        message = str(failed.value)
        assert "may have been committed" in message and "check before retrying" in message, message
        assert "retry later" not in message, message
        assert f"jobs show {rows[0].id}" in message, message
        (answer_key,) = re.findall(r"GET '([^']+)'", message)
        client = redis.Redis(port=port)
        assert client.get(answer_key) is not None  # the check the message names answers: it was committed
        assert _pending(port) == 300
        client.close()


async def test_a_load_in_many_parts_commits_them_on_one_connection(tmp_path: Path) -> None:
    """Each part's commit once opened a connection of its own (and closed it): 200 parts of 10
    rows, 200 connections, and a load five times slower; a refused first commit was waited out
    for the whole patience and said "may have been committed" though nothing was sent."""
    with own_server(tmp_path) as (port, _):
        async with open_backend(_config(tmp_path, port)) as backend:
            client = redis.Redis(port=port)
            try:
                before = int(client.info("stats")["total_connections_received"])
                assert await backend.bulk_insert((job(payload={"n": i}) for i in range(2000)), commit_every=10) == 2000
                opened = int(client.info("stats")["total_connections_received"]) - before
            finally:
                client.close()
        assert opened <= 3, f"{opened} connections for one load"
        assert _pending(port) == 2000
