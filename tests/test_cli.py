"""The CLI: `python -m pipeline ...` on a real database file, in-process through
``pipeline.cli.main(argv)`` and as real subprocesses (the service too)."""

from __future__ import annotations

import io
import json
import os
import pty
import queue
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from admin_harness import seed
from conftest import fast_config

from pipeline.backends.sqlite import queries, store
from pipeline.cli import main

ROOT = Path(__file__).resolve().parent.parent


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), stdout=out)
    return code, out.getvalue()


def rows(path: Path) -> list[store.JobRecord]:
    conn = store.connect(path)
    try:
        return queries.list_jobs(conn, limit=10_000)[0]
    finally:
        conn.close()


def status_of(path: Path, job_id: str) -> str | None:
    conn = store.connect(path)
    try:
        job = queries.get_job(conn, job_id)
        return None if job is None else job.status
    finally:
        conn.close()


# -- help -------------------------------------------------------------------------------------------


def test_help_explains_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for command in ("run", "enqueue", "emit", "jobs", "stats"):
        assert re.search(rf"^\s+{command}\s+\S", text, re.M), command
    assert "exit status: 0 success; 2 bad usage or configuration; 1 runtime failure" in text
    for argv, words in [
        (["enqueue", "--help"], ["--from-file FILE", "all or", "jobs.jsonl"]),
        (["emit", "--help"], ["--data DATA", "UserRegistered"]),
        (["jobs", "--help"], ["list", "show", "retry", "delete", "cleanup", "--status"]),
        (["jobs", "list", "--help"], ["--type JOB_TYPE", "--limit N", "--page N"]),
        (["jobs", "show", "--help"], ["payload"]),
        (["jobs", "retry", "--help"], ["dead job back to pending"]),
        (["jobs", "delete", "--help"], ["running"]),
        (["jobs", "cleanup", "--help"], ["--older-than SECONDS", "completed"]),
        (["stats", "--help"], ["last hour"]),
        (["run", "--help"], ["ADMIN_HOST:ADMIN_PORT", "WORKER_ENABLED"]),
    ]:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        for word in words:
            assert word in text, (argv, word)


# -- one job at a time ------------------------------------------------------------------------------------


def test_enqueue_list_show(db: Path) -> None:
    code, out = run("enqueue", "send_email", "--payload", '{"to": "a@example.com", "subject": "Hi", "body": "Hello"}',
                    "--priority", "2", "--max-attempts", "4")
    assert code == 0
    job_id = out.strip()
    assert status_of(db, job_id) == "pending"

    code, out = run("jobs")  # bare `jobs` lists
    assert code == 0 and job_id in out and "send_email" in out and "pending" in out and "1–1 of 1 jobs" in out
    assert run("jobs", "list")[1] == out
    code, listed = run("jobs", "--status", "pending", "list", "--type", "send_email", "--json")
    (job,) = json.loads(listed)["items"]  # GET /admin/jobs's shape
    assert (job["id"], job["priority"], job["max_attempts"]) == (job_id, 2, 4)
    assert json.loads(run("--json", "jobs", "--status", "dead")[1])["items"] == []  # --json before the command too

    code, out = run("jobs", "show", job_id)
    assert code == 0
    assert re.search(r"^status\s+pending$", out, re.M) and '"to": "a@example.com"' in out and re.search(r"^attempts\s+0 of 4$", out, re.M)
    assert json.loads(run("jobs", "show", job_id, "--json")[1]) == job

    code, out = run("enqueue", "generate_sitemap", "--json", "--delay", "60")
    created = json.loads(out)
    assert created["job_type"] == "generate_sitemap" and created["run_after"] > created["created_at"]


def test_emit(db: Path) -> None:
    code, out = run("emit", "MediaUploaded", "--data", '{"id": "m1"}', "--json")
    assert code == 0
    ids = json.loads(out)["job_ids"]
    assert sorted(j.job_type for j in rows(db)) == ["convert_webp", "generate_thumbnail"] and len(ids) == 2
    code, out = run("emit", "UserRegistered", "--data", '{"user_id": "u", "email": "u@example.com", "username": "u"}')
    assert code == 0 and len(out.split()) == 1


@pytest.mark.parametrize(
    "argv, words",
    [
        (["enqueue", "launch_rockets"], ["unknown job type 'launch_rockets'"]),
        (["enqueue", "send_email", "--payload", "{"], ["--payload is not valid JSON"]),
        (["enqueue", "send_email", "--payload", "[1]"], ["--payload must be a JSON object"]),
        (["enqueue", "send_email", "--payload", '{"to": "a"}'], ["does not fit SendEmail"]),
        (["enqueue", "generate_sitemap", "--priority", str(2**40)], ["priority must be between"]),
        (["enqueue", "generate_sitemap", "--priority", str(2**31)], ["priority must be between -2147483648 and 2147483647"]),
        (["enqueue", "generate_sitemap", "--priority", str(-(2**31) - 1)], ["priority must be between -2147483648"]),
        (["jobs", "--priority", str(2**31)], ["--priority must be from -2147483648 to 2147483647"]),
        (["jobs", "list", "--order", "oldest"], ["invalid choice: 'oldest'"]),
        (["enqueue", "generate_sitemap", "--max-attempts", "0"], ["max_attempts must be between 1"]),
        (["enqueue", "generate_sitemap", "--run-after", "someday"], ["run_after 'someday' is not an ISO 8601 time"]),
        (["enqueue"], ["needs a JOB_TYPE"]),
        (["enqueue", "generate_sitemap", "--from-file", "x.jsonl"], ["drop JOB_TYPE"]),
        (["enqueue", "generate_sitemap", "--unique-key", ""], ["--unique-key must not be empty"]),
        (["enqueue", "generate_sitemap", "--unique-key", "k" * 201], ["--unique-key must be at most 200 characters"]),
        (["enqueue", "--from-file", "x.jsonl", "--unique-key", "k"], ["drop --unique-key"]),
        (["emit", "MoonLanded"], ["unknown event 'MoonLanded'"]),
        (["jobs", "--status", "sleeping"], ["invalid choice: 'sleeping'"]),
        (["jobs", "list", "--limit", "0"], ["--limit must be from 1"]),
        (["jobs", "cleanup", "--older-than", "-5"], ["--older-than must be between 0"]),
        (["jobs", "cleanup", "--status", "pending"], ["invalid choice: 'pending'"]),
        (["jobs", "frobnicate"], ["invalid choice: 'frobnicate'"]),
    ],
)
def test_bad_usage_exits_2_naming_the_problem(db: Path, capsys: pytest.CaptureFixture[str], argv: list[str], words: list[str]) -> None:
    code, _ = run(*argv)
    err = capsys.readouterr().err
    assert code == 2, err
    for word in words:
        assert word in err, err
    assert not db.exists() or rows(db) == []


# -- operator actions on an existing store -------------------------------------------------------------------


@pytest.fixture
def seeded(db: Path) -> dict[str, list[str]]:
    return trio.run(seed, fast_config(db))


def test_retry_delete_cleanup(db: Path, seeded: dict[str, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    dead = seeded["dead"][0]
    code, out = run("jobs", "retry", dead)
    assert code == 0 and "dead → pending" in out
    job = queries.get_job(store.connect(db), dead)
    assert job is not None and (job.status, job.attempts) == ("pending", 0)
    code, _ = run("jobs", "retry", dead)
    assert code == 2 and "only dead or cancelled jobs can be retried" in capsys.readouterr().err
    code, _ = run("jobs", "retry", "no-such-id")
    assert code == 1 and "no job with id 'no-such-id'" in capsys.readouterr().err
    assert json.loads(run("jobs", "retry", seeded["dead"][1], "--json")[1])["status"] == "pending"

    completed = seeded["completed"][0]
    assert run("jobs", "delete", completed, "--json") == (0, json.dumps({"deleted": completed}, indent=2) + "\n")
    assert status_of(db, completed) is None
    code, _ = run("jobs", "delete", completed)
    assert code == 1 and "no job with id" in capsys.readouterr().err
    code, _ = run("jobs", "show", completed)
    assert code == 1

    assert run("jobs", "cleanup", "--older-than", "3600") == (0, "deleted 0 completed and dead jobs last updated more than 3600 s ago\n")
    assert json.loads(run("jobs", "cleanup", "--json")[1]) == {"deleted": 2}  # the two completed left
    assert {j.status for j in rows(db)} == {"pending"}


def test_delete_refuses_a_running_job(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run("enqueue", "generate_sitemap")
    job_id = out.strip()
    conn = store.connect(db)
    with store.write_transaction(conn):  # a worker of another process holds it
        (claimed,) = store.claim(conn, "generate_sitemap", 1, now="9999-01-01T00:00:00.000Z", owner="other:1",
                                 expires="9999-01-01T00:00:30.000Z")
    conn.close()
    code, _ = run("jobs", "delete", job_id)
    assert code == 2 and "is running" in capsys.readouterr().err
    assert status_of(db, job_id) == "running"


def test_stats(db: Path, seeded: dict[str, list[str]]) -> None:
    code, out = run("stats")
    assert code == 0
    # waiting first, suspended among the live statuses (pipeline/admin/console.py's SHOWN_STATUSES)
    assert re.search(r"^send_email\s+0\s+0\s+0\s+0\s+3\s+2\s+0$", out, re.M), out
    assert re.search(r"^generate_sitemap\s+0\s+2\s+0\s+0\s+0\s+0\s+0$", out, re.M), out
    assert re.search(r"^all types\s+0\s+2\s+0\s+0\s+3\s+2\s+0$", out, re.M), out
    assert "finished in the last hour: 5 (3 completed, 2 dead, 0 cancelled)" in out
    assert "oldest due pending job: waiting" in out
    stats = json.loads(run("stats", "--json")[1])
    assert stats["by_status"] == {"waiting": 0, "pending": 2, "running": 0, "completed": 3, "dead": 2, "cancelled": 0,
                                  "suspended": 0}
    assert len(stats["finished_per_minute"]) == 60 and stats["oldest_due_pending_age_seconds"] >= 0


def test_lists_page_through_the_store(db: Path, seeded: dict[str, list[str]]) -> None:
    pages = [json.loads(run("jobs", "--json", "--limit", "3", "--page", str(p))[1])["items"] for p in (1, 2, 3)]
    assert [len(p) for p in pages] == [3, 3, 1]
    code, out = run("jobs", "--limit", "3", "--page", "3")
    assert "7–7 of 7 jobs" in out
    assert "no jobs on this page (7 match)" in run("jobs", "--page", "9")[1]


def test_jobs_list_by_priority_and_in_claim_order(db: Path) -> None:
    made: dict[int, list[str]] = {}
    for priority in (3, -7, 3, 0):
        code, out = run("enqueue", "generate_sitemap", "--priority", str(priority))
        assert code == 0
        made.setdefault(priority, []).append(out.strip())
    claim = json.loads(run("jobs", "--json", "--order", "claim")[1])["items"]
    assert [j["id"] for j in claim] == [*made[-7], *made[0], *made[3]]
    threes = json.loads(run("jobs", "list", "--json", "--priority", "3")[1])["items"]
    assert [j["id"] for j in threes] == made[3][::-1]
    code, out = run("jobs", "--status", "pending", "--priority", "-7", "--order", "claim")
    assert code == 0 and made[-7][0] in out and "1–1 of 1 jobs" in out


# -- bulk ------------------------------------------------------------------------------------------


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


GOOD = [
    '{"job_type": "send_email", "payload": {"to": "a@example.com", "subject": "s", "body": "b"}}',
    '{"job_type": "invalidate_cache", "payload": {"keys": ["post:1"]}, "priority": 1}',
    "",
    '{"job_type": "generate_sitemap", "run_after": "2030-01-01T00:00:00Z", "max_attempts": 9}',
]


@pytest.mark.parametrize(
    "bad, words",
    [
        ('{"job_type": "send_email", "payload": {"to": "x"}}', ["does not fit SendEmail"]),
        ('{"job_type": "nope"}', ["unknown job type 'nope'"]),
        ('{"job_type": "generate_sitemap", "payload": {}', ["not valid JSON"]),
        ('["generate_sitemap"]', ["must be a JSON object"]),
        ('{"job_type": "generate_sitemap", "when": "now"}', ["unknown field 'when'"]),
        ('{"job_type": "generate_sitemap", "priority": 1.5}', ["priority must be an integer"]),
        ('{"job_type": "generate_sitemap", "unique_key": ""}', ["unique_key must not be empty"]),
        ('{"job_type": "generate_sitemap", "unique_key": 7}', ["unique_key must be a string"]),
    ],
)
def test_from_file_is_all_or_nothing(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str, words: list[str]) -> None:
    path = write_lines(tmp_path / "jobs.jsonl", [*GOOD, bad, GOOD[0]])
    code, out = run("enqueue", "--from-file", str(path))
    err = capsys.readouterr().err
    assert code == 2 and out == ""
    assert f"{path} line 5: " in err, err
    for word in words:
        assert word in err
    assert not db.exists() or rows(db) == []  # nothing of the good lines either


def test_from_file_inserts_every_line_in_order(db: Path, tmp_path: Path) -> None:
    path = write_lines(tmp_path / "jobs.jsonl", GOOD * 50)
    code, out = run("enqueue", "--from-file", str(path))
    assert (code, out) == (0, f"enqueued 150 jobs from {path}\n")
    jobs = rows(db)
    assert len(jobs) == 150
    assert [j.job_type for j in reversed(jobs)] == ["send_email", "invalidate_cache", "generate_sitemap"] * 50  # file order
    sitemap = next(j for j in jobs if j.job_type == "generate_sitemap")
    assert (sitemap.run_after, sitemap.max_attempts) == ("2030-01-01T00:00:00.000Z", 9)
    assert next(j for j in jobs if j.job_type == "invalidate_cache").priority == 1
    code, out = run("enqueue", "--from-file", str(path), "--json")
    result = json.loads(out)
    assert result["enqueued"] == 150 and len(set(result["job_ids"])) == 150 and len(rows(db)) == 300


def test_from_file_commit_every_commits_in_parts_and_says_what_was_kept(db: Path, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    good = '{{"job_type": "invalidate_cache", "payload": {{"keys": ["p{}"]}}}}'
    path = write_lines(tmp_path / "jobs.jsonl", [good.format(i) for i in range(4500)])
    assert run("enqueue", "--from-file", str(path), "--commit-every", "1000") == (0, f"enqueued 4500 jobs from {path} in 5 transactions\n")
    assert len(rows(db)) == 4500
    lines = [good.format(i) for i in range(5000)]
    lines[2500] = '{"job_type": "invalidate_cache", "payload": {"keys": "p"}}'
    bad = write_lines(tmp_path / "bad.jsonl", lines)
    code, out = run("enqueue", "--from-file", str(bad), "--commit-every", "1000")
    err = capsys.readouterr().err
    assert (code, out) == (2, "")
    assert f"{bad} line 2501: payload of 'invalidate_cache'" in err
    assert "the 2000 jobs before it were enqueued (in parts of 1000), nothing from there on" in err
    assert len(rows(db)) == 4500 + 2000
    assert run("enqueue", "--from-file", str(path), "--commit-every", "0")[0] == 2
    assert "--commit-every must be a number of jobs >= 1, got 0" in capsys.readouterr().err
    assert run("enqueue", "generate_sitemap", "--commit-every", "5")[0] == 2
    assert "--commit-every goes with --from-file" in capsys.readouterr().err
    assert len(rows(db)) == 6500


def test_from_file_bad_input(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(GOOD[0].encode() + b"\n" + b'{"job_type": "\xff"}\n')
    assert run("enqueue", "--from-file", str(binary))[0] == 2
    assert "line 2: not UTF-8 text" in capsys.readouterr().err
    empty = write_lines(tmp_path / "empty.jsonl", ["", "  "])
    assert run("enqueue", "--from-file", str(empty))[0] == 2
    assert "holds no jobs" in capsys.readouterr().err
    assert run("enqueue", "--from-file", str(tmp_path / "missing.jsonl"))[0] == 1
    assert "missing.jsonl" in capsys.readouterr().err
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + GOOD[0].encode() + b"\n")
    assert run("enqueue", "--from-file", str(bom))[0] == 0


# -- real processes ---------------------------------------------------------------------------------------


def cli(*argv: str, env: dict[str, str], input: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline", *argv], env=env, input=input, capture_output=True, text=True,
                          timeout=timeout, cwd=env["CWD"])


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    values = {k: v for k, v in os.environ.items() if not k.startswith(("ADMIN_", "WORKER_", "LOG_", "DATABASE_"))}
    # the service in one process (tests/test_supervisor.py runs it with several)
    values.update(DATABASE_URL=f"sqlite:///{tmp_path / 'proc.db'}", CWD=str(tmp_path), PYTHONPATH=str(ROOT), WORKER_PROCESSES="1")
    return values


@pytest.mark.slow
def test_subprocess_commands_and_exit_codes(env: dict[str, str]) -> None:
    done = cli("enqueue", "--from-file", "-", "--json", env=env, input="\n".join(GOOD) + "\n")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["enqueued"] == 3
    listed = cli("jobs", "list", "--json", env=env)
    assert listed.returncode == 0 and len(json.loads(listed.stdout)["items"]) == 3
    bad = cli("enqueue", "send_email", "--payload", "{", env=env)
    assert bad.returncode == 2 and "--payload is not valid JSON" in bad.stderr
    missing = cli("jobs", "show", "nope", env=env)
    assert missing.returncode == 1 and "no job with id 'nope'" in missing.stderr
    config = cli("stats", env={**env, "WORKER_CONCURRENCY": "lots"})
    assert config.returncode == 2 and "WORKER_CONCURRENCY='lots' is not valid" in config.stderr
    refused = cli("run", env={**env, "ADMIN_HOST": "0.0.0.0"})
    assert refused.returncode == 2 and "not a loopback address and ADMIN_TOKEN is empty" in refused.stderr


@pytest.mark.slow
def test_progress_bar_on_a_terminal(env: dict[str, str], tmp_path: Path) -> None:
    path = write_lines(tmp_path / "many.jsonl", GOOD * 2000)
    primary, secondary = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "enqueue", "--from-file", str(path)],
                            env={**env, "COLUMNS": "120", "TERM": "xterm"}, cwd=env["CWD"],
                            stdout=subprocess.PIPE, stderr=secondary, text=True)
    os.close(secondary)
    seen = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([primary], [], [], 1)
        if ready:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    os.close(primary)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out == f"enqueued 6000 jobs from {path}\n"
    screen = seen.decode(errors="replace")
    assert "enqueueing lines of" in screen and "8000/8000" in screen, screen[-2000:]  # blank lines count too


@pytest.mark.slow
def test_service_serves_the_admin_api_and_logs_json(env: dict[str, str]) -> None:
    """`python -m pipeline` with ADMIN_PORT=0: the port it got is in its (JSON) log; jobs
    enqueued over HTTP run; SIGTERM stops it with status 0."""
    proc = subprocess.Popen([sys.executable, "-m", "pipeline"], env={**env, "ADMIN_PORT": "0", "LOG_FORMAT": "json"},
                            cwd=env["CWD"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = _lines(proc)
        url = None
        for record in lines:
            if match := re.match(r"admin API on (http://127\.0\.0\.1:\d+) ", record["message"]):
                url = match.group(1)
            if record["message"].startswith("pipeline running on"):
                break
        assert url, "no admin URL in the log"
        assert "admin API http://127.0.0.1:" in record["message"]
        assert httpx.get(f"{url}/healthz").json() == {"status": "ok", "workers": True}
        created = httpx.post(f"{url}/admin/jobs", json={"job_type": "invalidate_cache", "payload": {"keys": ["a"]}})
        assert created.status_code == 201
        job_id = created.json()["id"]
        outcome = next(r for r in lines if r.get("job_id") == job_id)
        assert (outcome["job_type"], outcome["attempt"], outcome["outcome"], outcome["status"]) == ("invalidate_cache", 1, "ok", "completed")
        assert outcome["duration_ms"] >= 0 and outcome["error"] is None and outcome["level"] == "info"
        assert httpx.get(f"{url}/admin/jobs/{job_id}").json()["status"] == "completed"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert any(r["message"] == "pipeline stopped" for r in lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_service_without_admin_api(env: dict[str, str]) -> None:
    """ADMIN_ENABLED=false: no server, so even a non-loopback ADMIN_HOST without a token is fine."""
    proc = subprocess.Popen([sys.executable, "-m", "pipeline"], cwd=env["CWD"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**env, "ADMIN_ENABLED": "false", "ADMIN_HOST": "0.0.0.0", "LOG_FORMAT": "json"}, text=True)
    try:
        record = next(r for r in _lines(proc) if r["message"].startswith("pipeline running on"))
        assert "admin API off" in record["message"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _lines(proc: subprocess.Popen[str], timeout: float = 30) -> Iterator[dict[str, Any]]:
    """The service's JSON log records as they come (each line must be JSON); a silent
    service fails the test after ``timeout`` seconds instead of hanging it."""
    assert proc.stderr is not None
    stream = proc.stderr
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            raise AssertionError(f"the service wrote nothing expected within {timeout} s") from None
        if line is None:
            raise AssertionError(f"the service ended early with status {proc.wait()}")
        yield json.loads(line)


def test_from_file_reads_a_fifo_as_it_reads_standard_input(db: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "jobs.fifo"
    os.mkfifo(fifo)

    def writer() -> None:
        with open(fifo, "w") as f:
            f.write("\n".join(GOOD * 10) + "\n")

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        code, out = run("enqueue", "--from-file", str(fifo))
    finally:
        thread.join(timeout=10)
    assert (code, out) == (0, f"enqueued 30 jobs from {fifo}\n")
    assert len(rows(db)) == 30


@pytest.mark.parametrize("endless", [True, False], ids=["dev-zero", "one-long-line"])
def test_from_file_refuses_a_line_longer_than_any_job(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      endless: bool) -> None:
    """/dev/zero has no newline and no end: it is refused once its first line is too long to
    be a job (6 × the 1 MiB payload limit + 64 KiB), not read for ever."""
    if endless:
        path = Path("/dev/zero")
    else:
        path = write_lines(tmp_path / "jobs.jsonl", [GOOD[0], '{"job_type": "x", "payload": {"k": "' + "y" * 7_000_000 + '"}}'])
    done: list[tuple[int, str]] = []
    thread = threading.Thread(target=lambda: done.append(run("enqueue", "--from-file", str(path))), daemon=True)
    thread.start()
    thread.join(timeout=20)
    assert done, "enqueue --from-file never returned"
    assert done[0] == (2, "")
    err = capsys.readouterr().err
    assert f"{path} line {1 if endless else 2} is longer than 6,356,992 bytes" in err, err
    assert not db.exists() or rows(db) == []
