"""``pipeline.aio.open_pipeline`` in a FastAPI app served by a real uvicorn, in a process of its own, on each
store (issue 33, item 4 and "Done when"): a request enqueues a job and awaits its result, and the job ran
in the app's own process (an asyncio handler on the app's own loop, a trio one beside it); then SIGTERM
while two jobs run: uvicorn's shutdown completes (its log says so, and the app's lifespan exit ran), the
job released during the grace completes, the one that outlasts the grace is handed back to pending, and
no job is left running. uvicorn restores the signal's default handler after its shutdown and raises the
signal again, so the process ends by SIGTERM (-15); 0 is accepted too (a uvicorn that exits instead).

The app is tests/aio_embedding_app.py. The example app of docs/fastapi.md (examples/fastapi_app/), with
its asyncpg pool, runs both ways on Postgres: embedded, and as ``python -m pipeline --app``; its payload is
its pydantic request body, enqueued unchanged and handed to the handler as the model (issue 34, item 8)."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio
from backends import stores
from backends.stores import on_each_store

import pipeline
from pipeline import Config

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
GRACE = 3.0  # WORKER_SHUTDOWN_TIMEOUT of the app: a released job finishes within it, a held one outlasts it
EXITED_BY_SIGTERM = -signal.SIGTERM  # how uvicorn ends after its graceful shutdown (it raises the signal again)


def app_env(database_url: str, **settings: str) -> dict[str, str]:
    """The environment a user's shell would have: no setting of the test run's own."""
    values = {k: v for k, v in os.environ.items()
              if not k.startswith(("ADMIN_", "WORKER_", "LOG_", "DATABASE_", "PIPELINE_", "REDIS_", "SQLITE_"))}
    values.update(DATABASE_URL=database_url, PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS)]),
                  REDIS_ALLOW_NON_DURABLE="true", WORKER_POLL_INTERVAL_MS="50", **settings)
    return values


class Process:
    """A real process (uvicorn, or ``python -m pipeline``); its stderr (where both log) read as it comes."""

    def __init__(self, argv: list[str], cwd: Path, env: Mapping[str, str]) -> None:
        self.proc = subprocess.Popen(argv, cwd=cwd, env=dict(env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self.lines: list[str] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._new.put(line.rstrip("\n"))
        self._new.put(None)

    def wait_for(self, found: Callable[[list[str]], Any], what: str, timeout: float = 30.0) -> Any:
        """Read the log until ``found(lines so far)`` is truthy, and return it."""
        deadline = time.monotonic() + timeout
        while not (answer := found(self.lines)):
            try:
                line = self._new.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"no {what} within {timeout} s; the log:\n" + "\n".join(self.lines[-40:])) from None
            if line is None:
                raise AssertionError(f"the process ended (status {self.proc.wait()}) before {what}; the log:\n"
                                     + "\n".join(self.lines[-40:]))
            self.lines.append(line)
        return answer

    def logged(self, text: str, timeout: float = 30.0) -> None:
        self.wait_for(lambda lines: any(text in line for line in lines), repr(text), timeout)

    def end(self, timeout: float = 30.0) -> int:
        """Wait for the exit (the caller sent the signal); the rest of the log read."""
        code = self.proc.wait(timeout=timeout)
        while (line := self._new.get(timeout=10)) is not None:
            self.lines.append(line)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def uvicorn(app: str, folder: Path, env: Mapping[str, str]) -> tuple[Process, str]:
    """``python -m uvicorn APP`` on a free loopback port; the process and its URL, once the app started."""
    server = Process([sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", "0"], folder, env)
    try:
        url = server.wait_for(lambda lines: next((m.group(1) for line in lines
                                                  if (m := re.search(r"Uvicorn running on (http://\S+)", line))), None),
                              "uvicorn's address")
        server.logged("Application startup complete.")
    except BaseException:
        server.kill()
        raise
    return server, url


def notes(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_notes(path: Path, done: Callable[[list[dict[str, Any]]], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done(found := notes(path)):
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}; the app noted {found}"
        time.sleep(0.02)


async def stored(config: Config, *job_ids: str) -> tuple[list[pipeline.JobRecord], dict[str, Any]]:
    """The jobs as the store has them, and its counts by status, read by a pipeline of the test's own."""
    reader = config.replace(worker=attrs.evolve(config.worker, enabled=False))
    async with pipeline.open_pipeline(reader, pipeline.Registry()) as p:
        jobs = [await p.backend.get(job_id) for job_id in job_ids]
        stats = await p.backend.stats()
    assert all(job is not None for job in jobs), jobs
    return jobs, stats  # type: ignore[return-value]


async def test_uvicorn_runs_the_jobs_in_its_process_and_drains_them_at_sigterm_on_each_store(tmp_path: Path) -> None:
    async def scenario(name: str, config: Config, folder: Path) -> None:
        ids = await trio.to_thread.run_sync(serve_then_sigterm, config, folder)
        (released, held), stats = await stored(config, *ids)
        assert released.status == "completed", released
        assert json.loads(released.result or "null")["pid"] != os.getpid()  # (its pid was checked against uvicorn's)
        assert held.status == "pending" and held.attempts == 0, held  # handed back, its attempt not counted
        assert stats["by_status"].get("running", 0) == 0, stats

    await on_each_store(tmp_path, scenario)


def serve_then_sigterm(config: Config, folder: Path) -> tuple[str, str]:
    log = folder / "notes.jsonl"
    env = app_env(config.database_url, NOTES=str(log), WORKER_SHUTDOWN_TIMEOUT=str(GRACE))
    server, url = uvicorn("aio_embedding_app:app", folder, env)
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            # a request enqueues, the job runs in uvicorn's own process, the endpoint's `await p.result(id)` answers
            for runtime in ("asyncio", "trio"):
                answer = http.post(f"/naps/{runtime}").raise_for_status().json()
                assert answer["pid"] == server.proc.pid, answer
                assert answer["result"]["pid"] == server.proc.pid, (runtime, answer)
            aio = http.post("/naps/asyncio").json()
            assert aio["result"]["loop"] == aio["loop"], aio  # the handler ran on the app's own loop
            assert http.post("/naps/trio").json()["result"]["in_trio"] is True

            # SIGTERM while two jobs run: one released during the grace, one that outlasts it
            release = folder / "release"
            released = http.post("/naps/asyncio", params={"release": str(release), "wait": "false"}).json()["id"]
            held = http.post("/naps/trio", params={"release": str(folder / "never"), "wait": "false"}).json()["id"]
        wait_notes(log, lambda found: {released, held} <= {n["id"] for n in found if n["kind"] == "started"},
                   "both jobs started")
        server.proc.send_signal(signal.SIGTERM)
        server.logged("Waiting for application shutdown.")  # the lifespan's exit: the pipeline's graceful stop
        release.touch()
        code = server.end(timeout=GRACE + 30)
    finally:
        server.kill()
    log_text = "\n".join(server.lines)
    assert "Application shutdown complete." in log_text and "Finished server process" in log_text, log_text
    assert code in (EXITED_BY_SIGTERM, 0), (code, log_text)
    found = notes(log)
    assert any(n["kind"] == "cancelled" and n["id"] == held for n in found), found  # at the end of the grace
    assert found[-1]["kind"] == "pipeline closed", found
    assert {n["pid"] for n in found} == {server.proc.pid}, found
    return released, held


async def test_the_fastapi_example_runs_its_jobs_embedded_and_under_python_m_pipeline(tmp_path: Path) -> None:
    """examples/fastapi_app/ on Postgres (its jobs' asyncpg pool, and the job store): served by uvicorn with the
    jobs run in the web process, then with WORKER_ENABLED=false beside ``python -m pipeline --app
    examples.fastapi_app.jobs:registry``, which runs them; the same code, as docs/fastapi.md shows it. Both
    ways the payload is the request body, a pydantic model: stored as the JSON posted, and the handler's
    ``job`` is that model (its ``words()`` method counts); the model's ``extra="forbid"`` refuses a
    hand-written payload with another key, as it refuses such a request body."""
    async with stores.migrated_postgres_store(tmp_path) as config:
        database = await trio.to_thread.run_sync(stores._run_db)
        schema = f"app_{os.urandom(6).hex()}"  # the app's own data: a schema of the test's
        await trio.to_thread.run_sync(lambda: stores._admin(f"CREATE SCHEMA {schema}", database=database))
        try:
            app_url = f"{stores._on_database(database)}?search_path={schema}"
            counts = await trio.to_thread.run_sync(run_the_example, config, tmp_path, app_url)
        finally:
            await trio.to_thread.run_sync(lambda: stores._admin(f"DROP SCHEMA {schema} CASCADE", database=database))
    assert counts == {"embedded": 3, "beside": 5}


def run_the_example(config: Config, folder: Path, app_url: str) -> dict[str, int]:
    import psycopg

    env = app_env(config.database_url, APP_DATABASE_URL=app_url, ADMIN_PORT="0", WORKER_PROCESSES="1")

    def count(url: str, document: str, text: str) -> dict[str, Any]:
        body = {"name": document, "text": text}
        with httpx.Client(base_url=url, timeout=30) as http:
            refused = http.post("/documents", json=dict(body, language="en"))  # not a field: extra="forbid"
            assert refused.status_code == 422, refused.text
            job = http.post("/documents", json=body).raise_for_status().json()["job"]
            shown = http.get(f"/jobs/{job}", params={"wait": 20}).raise_for_status().json()
        assert shown["status"] == "completed", shown  # the handler called job.words(): a Document's method
        assert shown["payload"] == body, shown  # stored as posted
        assert shown["result"]["document"] == document and shown["result"]["words"] == len(text.split()), shown
        return shown["result"]

    # embedded: the jobs run in uvicorn's process
    web, url = uvicorn("examples.fastapi_app.app:app", folder, env)
    try:
        result = count(url, "embedded", "one two three")
        assert result["counted_by"] == web.proc.pid, result
        web.proc.send_signal(signal.SIGTERM)
        assert web.end() in (EXITED_BY_SIGTERM, 0)
    finally:
        web.kill()
    assert any("Application shutdown complete." in line for line in web.lines), web.lines

    # beside the service: the web app only enqueues, python -m pipeline runs the jobs
    service = Process([sys.executable, "-m", "pipeline", "--app", "examples.fastapi_app.jobs:registry"], folder, env)
    web, url = uvicorn("examples.fastapi_app.app:app", folder, dict(env, WORKER_ENABLED="false"))
    try:
        service.logged("handling: count_words")
        result = count(url, "beside", "a b c d e")
        assert result["counted_by"] == service.proc.pid != web.proc.pid, result
        # a payload written by hand is read by the model too: its extra="forbid" refuses an unknown key
        cli = [sys.executable, "-m", "pipeline", "--app", "examples.fastapi_app.jobs:registry", "enqueue", "count_words"]
        done = subprocess.run([*cli, "--payload", '{"name": "cli", "text": "x", "language": "en"}'], cwd=folder,
                              env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode != 0 and "language" in done.stdout + done.stderr, (done.stdout, done.stderr)
        for process in (web, service):
            process.proc.send_signal(signal.SIGTERM)
        assert web.end() in (EXITED_BY_SIGTERM, 0) and service.end() == 0, service.lines
    finally:
        web.kill()
        service.kill()

    with psycopg.connect(app_url.replace("?search_path=", "?options=-csearch_path%3D")) as conn:
        return dict(conn.execute("SELECT document, words FROM word_counts").fetchall())


def test_the_app_module_imports_what_the_test_extra_installs() -> None:
    done = subprocess.run([sys.executable, "-c", "import fastapi, uvicorn, httpx, asyncpg"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
