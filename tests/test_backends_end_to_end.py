"""What users see, on every backend: the CLI as subprocesses and the service as a process of
its own (``python -m pipeline --processes 1``), with DATABASE_URL naming a fresh store of each
kind (tests/backends/stores.py: skipped without the server, failed in CI without it).

One test per backend walks the whole path, in the order an operator would: enqueue from flags
and from a file, list, show, stats; the service starts, answers /healthz, /admin/jobs and
/metrics, runs what was waiting and a job created over HTTP, buries the job it cannot send;
then retry of that dead job, delete, cleanup, and stats again on the stopped store.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from backends.stores import on_each_store

from pipeline import Config

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def environment(config: Config, cwd: Path) -> dict[str, str]:
    """The environment of every process on the store ``config`` names: its DATABASE_URL, the
    shared Redis's non-durable allowance, and short timings; nothing inherited from the caller's."""
    values = {k: v for k, v in os.environ.items()
              if not k.startswith(("ADMIN_", "WORKER_", "LOG_", "DATABASE_", "REDIS_", "SQLITE_", "SMTP_", "SITE_"))}
    values.update(
        DATABASE_URL=config.database_url, PYTHONPATH=str(ROOT), WORKER_PROCESSES="1", WORKER_POLL_INTERVAL_MS="50",
        SMTP_HOST="",  # no mail server: send_email is dead at once (PermanentError)
    )
    if config.redis.allow_non_durable:
        values["REDIS_ALLOW_NON_DURABLE"] = "true"
    return values


class Cli:
    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env, self.cwd = env, cwd

    def run(self, *argv: str, code: int = 0) -> str:
        done = subprocess.run([sys.executable, "-m", "pipeline", *argv], env=self.env, cwd=self.cwd,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == code, f"{argv}: exit {done.returncode}\n{done.stderr}"
        return done.stdout if code == 0 else done.stderr

    def json(self, *argv: str) -> Any:
        return json.loads(self.run(*argv, "--json"))


def log_records(proc: subprocess.Popen[str]) -> Iterator[dict[str, Any]]:
    assert proc.stderr is not None
    for line in proc.stderr:
        yield json.loads(line)
    raise AssertionError(f"the service ended early with status {proc.wait()}")


def wait_for(check: Any, what: str, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while (value := check()) is None or value is False:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.05)
    return value


async def test_the_cli_and_the_service_work_the_same_on_every_backend(tmp_path: Path) -> None:
    """The three stores side by side: each walk is a chain of processes, mostly waited for."""
    async def on(backend: str, config: Config, folder: Path) -> None:
        await trio.to_thread.run_sync(walk, environment(config, folder), folder, backend)

    await on_each_store(tmp_path, on)


def walk(env: dict[str, str], cwd: Path, backend: str) -> None:
    cli = Cli(env, cwd)

    # -- the CLI on a store no service runs on: enqueue, list, show, stats
    first = cli.json("enqueue", "invalidate_cache", "--payload", '{"keys": ["post:1"]}', "--priority", "3")
    assert (first["job_type"], first["status"], first["priority"], first["payload"]) == (
        "invalidate_cache", "pending", 3, {"keys": ["post:1"]})
    mail = cli.run("enqueue", "send_email", "--payload", '{"to": "a@example.com", "subject": "Hi", "body": "x"}',
                   "--max-attempts", "2").strip()
    lines = cwd / "jobs.jsonl"
    lines.write_text("".join(json.dumps({"job_type": "invalidate_cache", "payload": {"keys": [f"k{i}"]}}) + "\n"
                             for i in range(3)))
    loaded = cli.json("enqueue", "--from-file", str(lines))
    assert (loaded["enqueued"], loaded["transactions"], len(loaded["job_ids"])) == (3, 1, 3)
    listed = cli.json("jobs", "list")["items"]
    assert {j["id"] for j in listed} == {first["id"], mail, *loaded["job_ids"]}
    assert all(j["status"] == "pending" for j in listed)
    assert [j["id"] for j in cli.json("jobs", "list", "--type", "send_email")["items"]] == [mail]
    assert len(cli.json("jobs", "list", "--status", "pending", "--limit", "2", "--page", "2")["items"]) == 2
    shown = cli.json("jobs", "show", mail)
    assert (shown["payload"]["to"], shown["max_attempts"], shown["attempts"]) == ("a@example.com", 2, 0)
    assert "no job with id 'nope'" in cli.run("jobs", "show", "nope", code=1)
    stats = cli.json("stats")
    assert stats["by_status"].get("pending") == 5 and stats["by_type"]["invalidate_cache"]["pending"] == 4

    # -- the service: health, the admin API, metrics; what waited runs, and a job sent over HTTP
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "--processes", "1"],
                            env={**env, "ADMIN_PORT": "0", "LOG_FORMAT": "json", "LOG_LEVEL": "info"}, cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        records = log_records(proc)
        url = None
        for record in records:
            if match := re.match(r"admin API on (http://127\.0\.0\.1:\d+) ", record["message"]):
                url = match.group(1)
            if record["message"].startswith("pipeline running on"):
                break
        assert url, "no admin URL in the service's log"
        with httpx.Client(base_url=url, timeout=10) as http:
            assert http.get("/healthz").json() == {"status": "ok", "workers": True}
            created = http.post("/admin/jobs", json={"job_type": "invalidate_cache", "payload": {"keys": ["http"]}})
            assert created.status_code == 201, created.text
            over_http = created.json()["id"]

            def statuses() -> dict[str, str] | None:
                items = http.get("/admin/jobs", params={"per_page": 100}).json()["items"]
                found = {j["id"]: j["status"] for j in items}
                return found if all(s in ("completed", "dead") for s in found.values()) else None

            found = wait_for(statuses, "every job finished")
            assert found == {first["id"]: "completed", mail: "dead", over_http: "completed",
                             **dict.fromkeys(loaded["job_ids"], "completed")}
            dead = http.get(f"/admin/jobs/{mail}").json()
            assert dead["attempts"] == 1 and "SMTP_HOST is empty" in dead["error"]
            metrics = http.get("/metrics").text
            assert re.search(r'^pipeline_jobs\{status="completed"\} 5(\.0)?$', metrics, re.M), metrics
            assert re.search(r'^pipeline_jobs\{status="dead"\} 1(\.0)?$', metrics, re.M), metrics
            assert 'pipeline_jobs_processed_total{job_type="invalidate_cache",outcome="ok"} 5' in metrics
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    # -- the CLI again, on the stopped store: retry the dead job, delete it, clean up, stats
    retried = cli.json("jobs", "retry", mail)
    assert (retried["status"], retried["attempts"]) == ("pending", 0)  # the last error stays, for the record
    assert cli.json("jobs", "delete", mail) == {"deleted": mail}
    assert "no job with id" in cli.run("jobs", "show", mail, code=1)
    assert cli.json("jobs", "cleanup", "--older-than", "3600") == {"deleted": 0}  # all finished just now
    assert cli.json("jobs", "cleanup") == {"deleted": 5}
    assert cli.json("jobs", "list")["items"] == []
    stats = cli.json("stats")
    assert sum(stats["by_status"].values()) == 0, stats
    # the site's content is not job state: `search` reads its own SQLite file whatever the job store
    assert cli.run("search", "anything") == "no hits\n"
    assert (cwd / "site.db").exists() == (backend != "sqlite")  # on SQLite: the DATABASE_URL file holds both
