"""`enqueue --from-file`'s writer: chunks of rows inserted from JSON on a worker thread, in one
transaction that keeps everything or nothing."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.backends import NewJob
from pipeline.backends.sqlite import migrations, store
from pipeline.backends.sqlite.bulk import BulkInsert
from pipeline.cli import main
from pipeline.ids import UUID7Factory

ROOT = Path(__file__).resolve().parent.parent
LINE = '{{"job_type": "invalidate_cache", "payload": {{"keys": ["post:{}"]}}}}'


def fresh(path: Path) -> sqlite3.Connection:
    conn = store.connect(path)
    migrations.migrate(conn, path)
    return conn


def stored(conn: sqlite3.Connection) -> list[tuple]:
    return conn.execute(
        "SELECT id, job_type, payload, max_attempts, run_after, priority, created_at, updated_at, status, attempts "
        "FROM jobs ORDER BY rowid"
    ).fetchall()


def lock_is_free(path: Path) -> bool:
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        other.close()


texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)  # every character SQLite can store


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(texts, texts, st.integers(1, 2**31 - 1), st.integers(-(2**31), 2**31 - 1)), min_size=1, max_size=30))
def test_rows_read_back_as_executemany_writes_them(tmp_path_factory: pytest.TempPathFactory, specs: list) -> None:
    # quotes, backslashes, NUL, U+2028, astral characters: the JSON detour must change nothing
    folder = tmp_path_factory.mktemp("bulk")
    new_id = UUID7Factory()
    rows = [NewJob(new_id(), job_type, payload, max_attempts, "2030-01-01T00:00:00.000Z", priority, "2026-11-30T00:00:00.000Z")
            for job_type, payload, max_attempts, priority in specs]
    plain, bulk = fresh(folder / "plain.db"), fresh(folder / "bulk.db")
    with store.write_transaction(plain):
        store.insert_jobs(plain, rows)
    with BulkInsert(bulk) as writer:
        for row in rows:
            writer.add(row)
    assert writer.count == len(rows)
    assert stored(bulk) == stored(plain)
    assert [type(v) for v in stored(bulk)[0]] == [str, str, str, int, str, int, str, str, str, int]
    plain.close()
    bulk.close()


def test_chunks_split_by_rows_and_by_bytes_and_keep_file_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conn = fresh(tmp_path / "t.db")
    statements: list[str] = []
    conn.set_trace_callback(lambda sql: statements.append(sql) if "json_each" in sql else None)
    new_id = UUID7Factory()
    now = "2026-11-30T00:00:00.000Z"
    small = [NewJob(new_id(), "t", json.dumps({"n": i}), 3, now, 5, now) for i in range(2 * BulkInsert.CHUNK_ROWS + 1)]
    big = [NewJob(new_id(), "t", json.dumps({"body": "é" * 900_000}, ensure_ascii=False), 3, now, 5, now) for _ in range(6)]
    with BulkInsert(conn) as writer:
        for row in small + big:
            writer.add(row)
    # 2 full chunks of rows, then the odd row with the first big ones until 4 MiB, then the rest
    assert len(statements) == 4, len(statements)
    assert [r[0] for r in stored(conn)] == [r.id for r in small + big]
    assert [r[2] for r in stored(conn)][-1] == big[-1].payload
    conn.close()


def test_a_full_disk_mid_file_keeps_nothing_and_frees_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    conn = fresh(path)
    (pages,) = conn.execute("PRAGMA page_count").fetchone()
    conn.execute(f"PRAGMA max_page_count = {pages + 40}")  # room for a chunk or two, not for all
    new_id = UUID7Factory()
    now = "2026-11-30T00:00:00.000Z"
    with pytest.raises(sqlite3.OperationalError, match="full"):
        with BulkInsert(conn) as writer:
            for i in range(20_000):
                writer.add(NewJob(new_id(), "t", json.dumps({"n": i, "pad": "x" * 100}), 3, now, 5, now))
    assert not conn.in_transaction
    assert stored(conn) == []
    assert lock_is_free(path)
    conn.execute("PRAGMA max_page_count = 1073741823")
    with BulkInsert(conn) as writer:  # the same connection works again
        writer.add(NewJob(new_id(), "t", "{}", 3, now, 5, now))
    assert len(stored(conn)) == 1
    conn.close()


@pytest.mark.parametrize("nul", [False, True])  # True: chunks with a NUL character go row by row
def test_an_error_that_rolls_back_the_whole_transaction_keeps_nothing(tmp_path: Path, nul: bool) -> None:
    # After some errors (I/O, a full disk in executemany) SQLite rolls the whole transaction
    # back; a chunk queued behind the failing one then ran in autocommit mode and kept its rows.
    path = tmp_path / "t.db"
    conn = fresh(path)
    conn.execute("CREATE TRIGGER boom BEFORE INSERT ON jobs WHEN NEW.payload LIKE '%boom%' "
                 "BEGIN SELECT RAISE(ROLLBACK, 'simulated I/O error'); END")
    new_id = UUID7Factory()
    now = "2026-11-30T00:00:00.000Z"
    pad = "\x00" if nul else "x"
    with pytest.raises(sqlite3.IntegrityError, match="simulated I/O error"):
        with BulkInsert(conn) as writer:
            for i in range(10_000):
                payload = json.dumps({"boom": i}) if i == 2500 else json.dumps({"n": i, "pad": pad}, ensure_ascii=False)
                writer.add(NewJob(new_id(), "t", payload, 3, now, 5, now))
    assert not conn.in_transaction
    assert stored(conn) == []
    assert lock_is_free(path)
    conn.close()


def test_integers_sqlite_cannot_hold_are_refused_as_executemany_refuses_them(tmp_path: Path) -> None:
    conn = fresh(tmp_path / "t.db")
    now = "2026-11-30T00:00:00.000Z"
    with pytest.raises(OverflowError, match="too large to convert to SQLite INTEGER"):
        with BulkInsert(conn) as writer:
            writer.add(NewJob(UUID7Factory()(), "t", "{}", 3, now, 2**63, now))
    assert stored(conn) == []
    conn.close()


def test_a_bad_line_after_chunks_were_inserted_rolls_all_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cli.db"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{path}")
    jobs = tmp_path / "jobs.jsonl"
    lines = [LINE.format(i) for i in range(7000)]
    lines[6500] = '{"job_type": "invalidate_cache", "payload": {"keys": "post:1"}}'
    jobs.write_text("\n".join(lines) + "\n")
    assert main(["enqueue", "--from-file", str(jobs)], stdout=io.StringIO()) == 2
    assert f"{jobs} line 6501: payload of 'invalidate_cache' does not fit InvalidateCache" in capsys.readouterr().err
    conn = store.connect(path)
    assert stored(conn) == []  # three chunks had been inserted before line 6501 was read
    conn.close()
    assert lock_is_free(path)


@pytest.mark.slow
def test_standard_input_is_read_before_the_write_lock_is_taken(tmp_path: Path) -> None:
    """A slow writer on the pipe must not hold the database's write lock while it dawdles."""
    path = tmp_path / "cli.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "LOG_"))}
    env.update(DATABASE_URL=f"sqlite:///{path}", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "enqueue", "--from-file", "-"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    try:
        assert proc.stdin is not None
        proc.stdin.write("".join(LINE.format(i) + "\n" for i in range(5000)).encode())  # more than two chunks
        proc.stdin.flush()
        time.sleep(1.5)  # the process has had time to start and read what there is
        assert proc.poll() is None
        assert lock_is_free(path) if path.exists() else True
        proc.stdin.write((LINE.format("last") + "\n").encode())
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out == b"enqueued 5001 jobs from standard input\n"
    conn = store.connect(path)
    assert [json.loads(r[2])["keys"] for r in stored(conn)][-2:] == [["post:4999"], ["post:last"]]
    conn.close()
