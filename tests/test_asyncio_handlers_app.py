"""An application whose asyncio handlers use asyncio's own libraries, run by ``python -m pipeline --app ...
--processes 2`` on each store (issue 33, "Done when"): asyncpg on the machine's Postgres (its pool opened in
``@registry.lifespan``), redis.asyncio on 127.0.0.1:6379, httpx.AsyncClient to an HTTP server on loopback,
and ``asyncio.to_thread``. Each worker process hosts one asyncio loop, shared by its handlers; the timeout
and ``jobs cancel`` reach a handler as asyncio.CancelledError; the lifespan opens once per worker process
and closes at SIGTERM, after the last job."""

from __future__ import annotations

import http.server
import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from app_harness import Service, app_env, cli
from backends.stores import POSTGRES_URL, REDIS_URL, on_each_store
from conftest import require_service

from pipeline import Config

APP = textwrap.dedent('''
    """The app: its jobs on asyncio, its pool opened once per worker process."""
    import asyncio
    import dataclasses
    import json
    import os
    import time

    import asyncpg
    import httpx
    import redis.asyncio

    import pipeline

    registry = pipeline.Registry(runtime="asyncio")


    def note(**fields):
        fields.update(pid=os.getpid(), at=time.time())
        with open(os.environ["NOTES"], "a") as f:  # O_APPEND: whole lines, from every process
            f.write(json.dumps(fields) + "\\n")


    @registry.lifespan
    async def lifespan(config):
        pool = await asyncpg.create_pool(os.environ["APP_POSTGRES_URL"], min_size=1, max_size=2)
        cache = redis.asyncio.Redis.from_url(os.environ["APP_REDIS_URL"])
        http = httpx.AsyncClient(base_url=os.environ["APP_HTTP_URL"], timeout=10)
        note(kind="open", loop=id(asyncio.get_running_loop()))
        yield {"db": pool, "cache": cache, "http": http}
        await http.aclose()
        await cache.aclose()
        await pool.close()
        note(kind="close", loop=id(asyncio.get_running_loop()))


    @dataclasses.dataclass
    class Visit:
        n: int


    @dataclasses.dataclass
    class Hold:
        n: int


    @registry.job(concurrency=2)
    async def visit(job: Visit, ctx: pipeline.JobContext) -> dict:
        state = ctx.state
        async with state["db"].acquire() as conn:
            summed = await conn.fetchval("SELECT $1::int + 1", job.n)
        counted = await state["cache"].incr(os.environ["APP_REDIS_KEY"])
        answer = (await state["http"].get(f"/echo/{job.n}")).json()
        in_thread = await asyncio.to_thread(lambda: job.n * 2)
        await asyncio.sleep(0.2)  # long enough that both processes take some of them
        note(kind="visit", n=job.n, loop=id(asyncio.get_running_loop()), summed=summed, counted=counted,
             answer=answer, in_thread=in_thread)
        return summed


    @registry.job(timeout=1.0)
    async def hold(job: Hold, ctx: pipeline.JobContext) -> None:
        note(kind="started", id=ctx.id)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            note(kind="CancelledError", id=ctx.id)
            raise
''')


@pytest.fixture
def http_url() -> Iterator[str]:
    """A real HTTP server on loopback, in a thread of the test process."""

    class Echo(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"path": self.path}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def test_an_asyncio_app_runs_under_processes_2_on_each_store(tmp_path: Path, http_url: str) -> None:
    require_service("Redis", "127.0.0.1", 6379)
    require_service("PostgreSQL", "127.0.0.1", 5432)

    async def on(name: str, config: Config, folder: Path) -> None:
        await trio.to_thread.run_sync(run_the_app, name, config, folder, http_url)

    await on_each_store(tmp_path, on)


def notes(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(path: Path, done: Any, what: str, timeout: float = 30.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while not done(found := notes(path)):
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}; the app noted {found}"
        time.sleep(0.02)
    return found


def run_the_app(name: str, config: Config, folder: Path, http_url: str) -> None:
    app = folder / "app"
    app.mkdir()
    (app / "aioshop.py").write_text(APP)
    log = folder / "notes.jsonl"
    key = f"pipeline-test-asyncio-app-{name}-{time.time_ns()}"
    env = app_env(app, config.database_url, NOTES=str(log), ADMIN_PORT="0", WORKER_SHUTDOWN_TIMEOUT="5",
                  REDIS_ALLOW_NON_DURABLE="true", APP_POSTGRES_URL=POSTGRES_URL, APP_REDIS_URL=REDIS_URL,
                  APP_HTTP_URL=http_url, APP_REDIS_KEY=key)
    service = Service(app, env, "--app", "aioshop:registry", "--processes", "2")
    try:
        service.ready(2, "hold, visit")
        opened = wait_for(log, lambda found: len([n for n in found if n["kind"] == "open"]) == 2, "two lifespans open")

        lines = [{"job_type": "visit", "payload": {"n": n}} for n in range(12)]
        lines += [{"job_type": "hold", "payload": {"n": 1}, "max_attempts": 1}, {"job_type": "hold", "payload": {"n": 2}}]
        done = cli(app, env, "--app", "aioshop:registry", "enqueue", "--from-file", "-", "--json",
                   input="".join(json.dumps(line) + "\n" for line in lines))
        assert done.returncode == 0, done.stderr
        *visits, timed_out, held = json.loads(done.stdout)["job_ids"]
        wait_for(log, lambda found: any(n["kind"] == "started" and n["id"] == held for n in found), "the held job started")
        cancel = cli(app, env, "--app", "aioshop:registry", "jobs", "cancel", held)
        assert cancel.returncode == 0, cancel.stderr
        found = wait_for(log, lambda found: len([n for n in found if n["kind"] == "visit"]) == 12
                         and {held, timed_out} <= {n["id"] for n in found if n["kind"] == "CancelledError"},
                         "every visit, and both holds cancelled")

        listed = cli(app, env, "--app", "aioshop:registry", "jobs", "--limit", "100", "--json")
        shown = {job["id"]: job for job in json.loads(listed.stdout)["items"]}
        assert {shown[v]["status"] for v in visits} == {"completed"}
        assert shown[held]["status"] == "cancelled", shown[held]
        assert shown[timed_out]["status"] == "dead" and "timed out after 1 s" in shown[timed_out]["error"], shown[timed_out]

        service.proc.send_signal(signal.SIGTERM)
        assert service.proc.wait(timeout=30) == 0
    finally:
        service.kill()

    found = notes(log)
    workers = {n["pid"]: n["loop"] for n in opened}
    assert len(workers) == 2, opened  # one lifespan per worker process
    ran = [n for n in found if n["kind"] == "visit"]
    # one loop per process, shared by its handlers and its lifespan; both processes ran visits
    assert {(n["pid"], n["loop"]) for n in ran} == set(workers.items()), (workers, ran)
    assert sorted(n["summed"] for n in ran) == list(range(1, 13))  # asyncpg
    assert sorted(n["counted"] for n in ran) == list(range(1, 13))  # redis.asyncio, one counter for both processes
    assert sorted(n["answer"]["path"] for n in ran) == sorted(f"/echo/{n}" for n in range(12))  # httpx.AsyncClient
    assert sorted(n["in_thread"] for n in ran) == [2 * n for n in range(12)]  # asyncio.to_thread
    closed = [n for n in found if n["kind"] == "close"]
    assert {n["pid"]: n["loop"] for n in closed} == workers  # closed at SIGTERM, in the loop it opened in
    assert min(n["at"] for n in closed) >= max(n["at"] for n in found if n["kind"] != "close")  # after the last job


def test_the_app_module_imports_what_the_extras_install() -> None:
    # asyncpg is in the test extra; redis.asyncio and httpx come with the redis and demo extras (which it pulls)
    done = subprocess.run([sys.executable, "-c", "import asyncpg, redis.asyncio, httpx, uvloop"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
