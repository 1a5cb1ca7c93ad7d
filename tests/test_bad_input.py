"""Hostile input at the command line: each gets a clear error and changes nothing."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

HOSTILE_IDS = [
    b"\xff\xfe",  # not UTF-8
    b"'; DROP TABLE jobs; --",
    b"x" * 100_000,
    b"%_*?",
    b"01a22ad8-890b-7000-a731-92a6edb50da4\x00tail"[:36],
]


def run(db: Path, *args: bytes) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{db}", "ADMIN_ENABLED": "false"}
    return subprocess.run([sys.executable, "-m", "pipeline", *args], env=env, capture_output=True, timeout=60, cwd=db.parent)


@pytest.fixture(scope="module")
def one_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding one pending job, enqueued through the CLI once for the module (each CLI
    start is a quarter of a second of CPU: once per test, it was half of the module's time)."""
    path = tmp_path_factory.mktemp("one-job") / "jobs.db"
    done = run(path, b"enqueue", b"invalidate_cache", b"--payload", b'{"keys": ["a"]}')
    assert done.returncode == 0, done.stderr
    return path


@pytest.fixture
def db(one_job: Path, tmp_path: Path) -> Path:
    """A copy of that store, the test's own (sqlite3's backup: whole and consistent)."""
    path = tmp_path / "jobs.db"
    source, copy = sqlite3.connect(one_job), sqlite3.connect(path)
    try:
        source.backup(copy)
    finally:
        source.close()
        copy.close()
    return path


def rows(db: Path) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT id, status, attempts FROM jobs ORDER BY id").fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize("hostile", HOSTILE_IDS)
@pytest.mark.parametrize("action", [b"show", b"retry", b"delete"])
def test_hostile_ids_get_a_clear_error_and_change_nothing(db: Path, hostile: bytes, action: bytes) -> None:
    before = rows(db)
    proc = run(db, b"jobs", action, hostile)
    assert proc.returncode in (1, 2), proc.stderr
    assert b"Traceback" not in proc.stderr
    assert proc.stderr.startswith(b"error: ")
    assert rows(db) == before


@pytest.mark.parametrize("hostile", HOSTILE_IDS)
def test_hostile_filters_get_a_clear_answer(db: Path, hostile: bytes) -> None:
    proc = run(db, b"jobs", b"list", b"--type", hostile)
    assert b"Traceback" not in proc.stderr
    if proc.returncode == 0:
        assert b"0 of 0" in proc.stdout or b"no jobs" in proc.stdout.lower()
    else:
        assert proc.returncode == 2 and proc.stderr.startswith(b"error: ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([b"enqueue", b"send_email", b"--payload", b"{not json"], b"not valid JSON"),
        ([b"enqueue", b"send_email", b"--payload", b'{"to": 5, "subject": "s", "body": "b"}'], b"expected a string"),
        ([b"enqueue", b"no_such_type"], b"unknown job type"),
        ([b"emit", b"NoSuchEvent", b"--data", b"{}"], b"unknown event"),
        ([b"emit", b"UserRegistered", b"--data", b'{"user_id": 1}'], b"does not fit UserRegistered"),
        ([b"enqueue", b"send_email", b"--payload", b"\xff"], b"not valid UTF-8"),
    ],
)
def test_bad_jobs_and_events_are_refused_and_nothing_is_written(db: Path, args: list[bytes], message: bytes) -> None:
    before = rows(db)
    proc = run(db, *args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and b"Traceback" not in proc.stderr
    assert rows(db) == before


def test_an_oversized_payload_is_refused_naming_the_limit(db: Path) -> None:
    big = db.parent / "big.jsonl"
    body = "x" * 1_100_000
    big.write_text('{"job_type": "invalidate_cache", "payload": {"keys": ["a"]}}\n'
                   f'{{"job_type": "send_email", "payload": {{"to": "a@example.com", "subject": "s", "body": "{body}"}}}}\n')
    before = rows(db)
    proc = run(db, b"enqueue", b"--from-file", str(big).encode())
    assert proc.returncode == 2, proc.stderr
    assert b"line 2" in proc.stderr and b"over the limit of 1,048,576" in proc.stderr
    assert rows(db) == before  # all or nothing: line 1 was not written either
