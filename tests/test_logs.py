"""Logs: one line per job outcome with the job's id, type, attempt, duration and error;
LOG_FORMAT=json gives one JSON object per line."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import config_of, fast_config

from pipeline import Config, PermanentError, Registry, open_pipeline
from pipeline.logs import configure as configure_logging
from pipeline.site import SendEmail, types_registry

TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    """Where `configure` sends the log; the loggers it changes are restored afterwards."""
    root, logger = logging.getLogger(), logging.getLogger("pipeline")
    saved = (root.handlers[:], root.level, logger.handlers[:], logger.level, logger.propagate)
    yield io.StringIO()
    root.handlers[:], logger.handlers[:] = saved[0], saved[2]
    root.level, logger.level, logger.propagate = saved[1], saved[3], saved[4]
    logging.captureWarnings(False)


def configure(config: Config, stream: io.StringIO) -> None:
    """``logs.configure`` as in a service process, whose root logger has no handler yet (pytest's
    capture handlers would be replaced, and the log would say so)."""
    logging.getLogger().handlers[:] = []
    configure_logging(config, stream)


def registry() -> Registry:
    reg = types_registry()
    tries: dict[str, int] = {}

    async def send_email(job: SendEmail, ctx: Any) -> None:
        tries[job.to] = tries.get(job.to, 0) + 1
        if job.subject == "flaky" and tries[job.to] == 1:
            raise ConnectionRefusedError("smtp.example.com:25 refused the connection")
        if job.subject == "never":
            raise PermanentError("550 no such mailbox")

    reg.register("send_email", SendEmail, send_email)
    return reg


async def run_jobs(db_path: Path) -> dict[str, str]:
    ids = {}
    # flaky's first failure waits 10-12 ms (1.15 × 10 at most) before its next attempt
    async with open_pipeline(fast_config(db_path, worker_backoff_base_ms=10), registry()) as p:
        for subject in ("fine", "flaky", "never"):
            ids[subject] = await p.enqueue(SendEmail(to=f"{subject}@example.com", subject=subject, body="b"))
        with trio.fail_after(10):
            for job_id in ids.values():
                while (await p.backend.get(job_id)).status not in ("completed", "dead"):
                    await trio.sleep(0.01)
    return ids


async def test_json_lines_carry_each_job_outcome(db_path: Path, log_stream: io.StringIO) -> None:
    configure(config_of(log_format="json", log_level="info"), log_stream)
    ids = await run_jobs(db_path)
    records = [json.loads(line) for line in log_stream.getvalue().splitlines()]  # every line is JSON
    outcomes = [r for r in records if "job_id" in r]
    by_job = {job_id: [r for r in outcomes if r["job_id"] == job_id] for job_id in ids.values()}

    (fine,) = by_job[ids["fine"]]
    assert fine["level"] == "info" and fine["logger"] == "pipeline" and TIME.match(fine["time"])
    assert (fine["job_type"], fine["attempt"], fine["max_attempts"], fine["outcome"], fine["status"]) == ("send_email", 1, 3, "ok", "completed")
    assert fine["error"] is None and fine["duration_ms"] >= 0 and fine["waited_ms"] >= 0
    assert fine["message"].startswith(f"job {ids['fine']} send_email attempt 1/3 ok → completed in ")

    first, second = by_job[ids["flaky"]]
    assert (first["attempt"], first["outcome"], first["status"], first["level"]) == (1, "error", "retry", "warning")
    assert first["error"] == "ConnectionRefusedError: smtp.example.com:25 refused the connection"
    assert 8.5 <= first["retry_delay_ms"] <= 11.5 and first["duration_ms"] >= 0  # backoff 10 ms × jitter, apart from the run time
    assert first["message"] == (f"job {ids['flaky']} send_email attempt 1/3 error → retry: failed after "
                                f"{first['duration_ms']:.1f} ms; next attempt in {first['retry_delay_ms']:.1f} ms: {first['error']}")
    assert fine["retry_delay_ms"] is None and second["retry_delay_ms"] is None
    assert (second["attempt"], second["outcome"], second["status"]) == (2, "ok", "completed")

    (never,) = by_job[ids["never"]]
    assert (never["outcome"], never["status"]) == ("permanent", "dead")
    assert never["error"] == "permanent error: 550 no such mailbox" and never["retry_delay_ms"] is None


async def test_text_lines_for_people(db_path: Path, log_stream: io.StringIO) -> None:
    configure(config_of(log_format="text", log_level="info"), log_stream)
    ids = await run_jobs(db_path)
    text = log_stream.getvalue()
    assert re.search(rf" INFO pipeline: job {ids['fine']} send_email attempt 1/3 ok → completed in \d+\.\d (ms|s)$", text, re.M), text
    # the run time and the wait before the next attempt, each named
    assert re.search(rf" WARNING pipeline: job {ids['flaky']} send_email attempt 1/3 error → retry: failed after \d+\.\d (ms|s); "
                     r"next attempt in (8\.[5-9]|9\.\d|1[01]\.\d) ms: ConnectionRefusedError: smtp.example.com:25 refused the connection$",
                     text, re.M), text
    assert re.search(rf"job {ids['never']} send_email attempt 1/3 permanent → dead: failed after \d+\.\d (ms|s): permanent error: 550",
                     text), text
    assert len([line for line in text.splitlines() if f"job {ids['flaky']} " in line]) == 2  # one line per outcome


async def test_log_level_filters(db_path: Path, log_stream: io.StringIO) -> None:
    configure(config_of(log_format="json", log_level="warning"), log_stream)
    ids = await run_jobs(db_path)
    records = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    assert {r["job_id"] for r in records if "job_id" in r} == {ids["flaky"], ids["never"]}
    assert all(r["level"] in ("warning", "error") for r in records)


def test_exceptions_are_one_json_line(log_stream: io.StringIO) -> None:
    configure(config_of(log_format="json"), log_stream)
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        logging.getLogger("pipeline.test").exception("it failed")
    (line,) = log_stream.getvalue().splitlines()
    record = json.loads(line)
    assert record["message"] == "it failed" and record["level"] == "error" and record["logger"] == "pipeline.test"
    assert "ValueError: boom\nsecond line" in record["exception"]


def test_outcome_lines_keep_their_place_before_a_later_record(log_stream: io.StringIO) -> None:
    """Outcome lines are gathered and written in batches; a record logged after them (a
    warning) is written after them, never before."""
    from pipeline import logs

    configure(config_of(log_format="text"), log_stream)
    lines = logs.outcome_lines()
    assert lines is not None
    for n in range(3):
        lines.write(logging.INFO, f"job {n} ok", {"job_id": str(n)})
    logging.getLogger("pipeline.poller").warning("a later warning")
    text = log_stream.getvalue().splitlines()
    assert [line.split(": ", 1)[1] for line in text] == ["job 0 ok", "job 1 ok", "job 2 ok", "a later warning"]
    assert all(re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (INFO|WARNING) pipeline", line) for line in text)  # UTC


def test_outcome_lines_are_written_within_a_tenth_of_a_second(log_stream: io.StringIO) -> None:
    import time

    from pipeline import logs

    configure(config_of(log_format="json"), log_stream)
    lines = logs.outcome_lines()
    assert lines is not None
    lines.write(logging.WARNING, "job 1 failed", {"job_id": "1", "outcome": "error"})
    time.sleep(0.3)
    (record,) = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    assert record["level"] == "warning" and record["job_id"] == "1" and TIME.match(record["time"])


def test_outcome_message_says_run_time_and_next_attempt_apart() -> None:
    from pipeline.logs import outcome_message

    base = {"job_id": "j1", "job_type": "send_email", "attempt": 1, "max_attempts": 3, "outcome": "error",
            "status": "retry", "duration_ms": 1.154, "retry_delay_ms": 10_312.0, "error": "OSError: down"}
    assert outcome_message(base) == ("job j1 send_email attempt 1/3 error → retry: failed after 1.2 ms; "
                                     "next attempt in 10.3 s: OSError: down")
    assert outcome_message({**base, "duration_ms": 95_000.0, "retry_delay_ms": 5_400_000.0}).endswith(
        "failed after 1.6 min; next attempt in 1.5 h: OSError: down")
    assert outcome_message({**base, "attempt": 3, "status": "dead", "retry_delay_ms": None}).endswith(
        "3/3 error → dead: failed after 1.2 ms: OSError: down")
    assert outcome_message({**base, "outcome": "ok", "status": "completed", "error": None}).endswith("ok → completed in 1.2 ms")
    assert outcome_message({**base, "outcome": "released", "status": "released", "error": None}).endswith(
        "released → released after 1.2 ms")


def test_handlers_of_the_applications_own_get_every_line_through_logging(log_stream: io.StringIO) -> None:
    from pipeline import logs

    configure(config_of(log_format="text"), log_stream)
    logging.getLogger("pipeline").addHandler(logging.NullHandler())
    assert logs.outcome_lines() is None
