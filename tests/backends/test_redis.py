"""What only the Redis backend promises: it refuses a server that can lose acknowledged jobs,
wakes other processes through PUBLISH, and on a server with ``appendonly yes`` and
``appendfsync always`` keeps every job whose insert returned through a ``kill -9`` of the
server mid-drain (the pipeline reconnects and finishes them)."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from conftest import fast_config

import pipeline
from pipeline import Config
from pipeline.backends import open_backend
from pipeline.config import RedisSettings
from pipeline.errors import ConfigError

from .kit import job
from .stores import BACKENDS, drop_redis_keys, redis_store

pytestmark = pytest.mark.skipif("redis" not in BACKENDS, reason="no redis entry")

REDIS_SERVER = shutil.which("redis-server")
# skips without the binary, but fails under PIPELINE_REQUIRE_SERVICES=1 (conftest.missing): these guard
# promises (AOF durability, the listener's back-off, a commit cut mid-way)
needs_server_binary = pytest.mark.usefixtures("redis_server_binary")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(port: int, directory: Path, *extra: str) -> subprocess.Popen[bytes]:
    assert REDIS_SERVER is not None
    proc = subprocess.Popen([REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
                             "--save", "", *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return proc
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {proc.returncode}")
        time.sleep(0.02)
    proc.kill()
    raise RuntimeError("redis-server did not start")


@contextlib.contextmanager
def own_server(directory: Path, *extra: str) -> Iterator[tuple[int, list[subprocess.Popen[bytes]]]]:
    """A redis-server of this test's own (the last process of the list is the live one)."""
    port = _free_port()
    procs = [_start(port, directory, *extra)]
    try:
        yield port, procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


DURABLE = ("--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction")


async def test_a_server_that_can_lose_acknowledged_jobs_is_refused_naming_the_settings(tmp_path: Path) -> None:
    async with redis_store(tmp_path) as config:  # the shared server keeps nothing on disk
        strict = config.replace(redis=RedisSettings(allow_non_durable=False))
        with pytest.raises(ConfigError) as refused:
            async with open_backend(strict):
                pass
        message = str(refused.value)
        for named in ("appendonly yes", "appendfsync always", "everysec", "one second", "maxmemory-policy noeviction",
                      "REDIS_ALLOW_NON_DURABLE=true"):
            assert named in message, f"{named!r} not in {message!r}"
        async with open_backend(config) as allowed:  # REDIS_ALLOW_NON_DURABLE=true
            await allowed.ping()


@needs_server_binary
async def test_a_server_whose_config_cannot_be_read_is_refused_unless_allowed(tmp_path: Path) -> None:
    with own_server(tmp_path, "--rename-command", "CONFIG", "") as (port, _):
        config = fast_config(tmp_path / "unused.db").replace(database_url=f"redis://127.0.0.1:{port}/0")
        with pytest.raises(ConfigError, match="CONFIG GET is refused"):
            async with open_backend(config):
                pass
        async with open_backend(config.replace(redis=RedisSettings(allow_non_durable=True))) as backend:
            await backend.ping()


@needs_server_binary
@pytest.mark.parametrize(("settings", "named"), [
    (("--appendfsync", "no"), "appendfsync no"),  # fsync left to the OS: up to ~30 s lost on power loss
    (("--appendfsync", "always", "--no-appendfsync-on-rewrite", "yes"), "no-appendfsync-on-rewrite yes"),
], ids=["appendfsync-no", "no-fsync-on-rewrite"])
async def test_an_aof_server_that_skips_fsyncs_is_refused_unless_allowed(
    tmp_path: Path, settings: tuple[str, ...], named: str,
) -> None:
    """A server that writes the append-only file but leaves fsyncs out (always, or while a rewrite
    runs) is refused by name, as one without the file is; REDIS_ALLOW_NON_DURABLE lets it start."""
    aof = ("--appendonly", "yes", "--maxmemory-policy", "noeviction")
    with own_server(tmp_path, *aof, *settings) as (port, _):
        config = fast_config(tmp_path / "unused.db").replace(database_url=f"redis://127.0.0.1:{port}/0")
        with pytest.raises(ConfigError) as refused:
            async with open_backend(config):
                pass
        message = str(refused.value)
        assert f"can lose acknowledged jobs ({named})" in message, message
        assert "REDIS_ALLOW_NON_DURABLE=true" in message
        async with open_backend(config.replace(redis=RedisSettings(allow_non_durable=True))) as backend:
            await backend.ping()
    with own_server(tmp_path, *aof, "--appendfsync", "always") as (port, _):  # the same server, fsyncing: accepted
        config = fast_config(tmp_path / "unused.db").replace(database_url=f"redis://127.0.0.1:{port}/0")
        async with open_backend(config) as backend:
            await backend.ping()


async def test_a_unique_key_leaves_no_entry_behind_once_its_job_has_finished(tmp_path: Path) -> None:
    """The uniq:<type> hashes hold only keys of pending and running jobs: every way out of them
    (succeed, bury, rescue to dead, burial of an unknown type, delete) frees the key."""
    from .kit import SHORT, bury, claim_one, outlive, settle_one, succeed

    async with redis_store(tmp_path) as config, open_backend(config) as backend:
        db = backend.database  # type: ignore[attr-defined]
        entries = lambda job_type: db.client.hgetall(f"{db.prefix}uniq:{job_type}")  # noqa: E731
        rows = [job("s", unique_key="k"), job("b", unique_key="k"), job("r", unique_key="k", max_attempts=1),
                job("u", unique_key="k"), job("d", unique_key="k")]
        await backend.insert(rows)
        assert [entries(t) for t in "sbrud"] == [{b"k": row.id.encode()} for row in rows]
        assert await settle_one(backend, succeed(await claim_one(backend, "s")))
        assert await settle_one(backend, bury(await claim_one(backend, "b")))
        await backend.claim({"r": 1}, owner="w", lease_seconds=SHORT)
        await outlive(SHORT)
        assert await backend.rescue_expired(base_seconds=60.0) == 1
        assert await backend.bury_unknown_types(["s", "b", "r", "d"], grace_seconds=0.0) == 1
        await backend.delete(rows[4].id)
        assert [entries(t) for t in "sbrud"] == [{}] * 5
        # a revived job takes its key again
        await backend.revive(rows[1].id)
        assert entries("b") == {b"k": rows[1].id.encode()}


@attrs.frozen
class Noop:
    n: int


async def _noop(job: Noop, ctx: pipeline.JobContext) -> None:
    await trio.sleep(0.001)


async def _stats_patiently(p: pipeline.Pipeline) -> dict[str, Any]:
    while True:
        try:
            return await p.backend.stats()
        except pipeline.StoreError:
            await trio.sleep(0.05)


@needs_server_binary
async def test_every_acknowledged_job_survives_a_kill_9_of_the_server_mid_drain(tmp_path: Path) -> None:
    registry = pipeline.Registry()
    registry.register("noop", Noop, _noop, concurrency=16)
    n = 3000
    with own_server(tmp_path, *DURABLE) as (port, procs):
        prefix = f"kill9-{uuid.uuid4().hex[:8]}"
        url = f"redis://127.0.0.1:{port}/0?prefix={prefix}"
        config: Config = fast_config(tmp_path / "unused.db").replace(database_url=url)  # durable: no allowance needed
        config = config.replace(worker=attrs.evolve(config.worker, poll_interval_ms=50))
        acknowledged: list[str] = []
        async with pipeline.open_pipeline(config, registry) as p:
            killed = False
            with trio.fail_after(60):
                for i in range(0, n, 100):
                    try:
                        acknowledged += await p.enqueue_many([Noop(j) for j in range(i, i + 100)])
                    except pipeline.StoreError:
                        pass  # refused while the server was down: not acknowledged, not promised
                    if not killed and i >= n // 2:
                        stats = await _stats_patiently(p)
                        assert 0 < stats["by_status"]["completed"], "nothing ran before the kill: the test proves nothing"
                        procs[-1].send_signal(signal.SIGKILL)  # no chance to write anything more
                        procs[-1].wait()
                        killed = True
                        with pytest.raises(pipeline.StoreError):
                            await p.enqueue_many([Noop(-1)])
                        procs.append(await trio.to_thread.run_sync(lambda: _start(port, tmp_path, *DURABLE)))
                while True:
                    stats = await _stats_patiently(p)
                    if stats["by_status"]["completed"] >= len(acknowledged) and stats["by_status"]["pending"] == 0 \
                            and stats["by_status"]["running"] == 0:
                        break
                    await trio.sleep(0.05)
            assert killed
            records, total = await p.backend.list(status="completed", limit=n + 100)
            assert set(acknowledged) <= {r.id for r in records}, "a job whose enqueue had returned was lost"
            assert total == stats["total"], "a job is neither completed nor gone"
        await trio.to_thread.run_sync(drop_redis_keys, f"redis://127.0.0.1:{port}/0", prefix)
