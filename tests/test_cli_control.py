"""Issue 23's control from the command line: `jobs cancel`, the bulk forms of `jobs cancel/retry/delete`,
`jobs retry` of a cancelled job, `types list/pause/resume`, `enqueue --expires-in` and expires_at in
`--from-file` lines, and what `jobs show`, `jobs --status cancelled` and `stats` say. In-process through
``pipeline.cli.main(argv)`` on a real SQLite file (DATABASE_URL), its states made through the Backend
protocol (tests/test_admin_control.py's control_seed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import fast_config
from test_admin_control import control_seed
from test_cli import run

from pipeline.backends import JobRecord, open_backend
from pipeline.clock import format_ts, now_ts, to_epoch


@pytest.fixture
def seeded(db: Path) -> dict[str, list[str]]:
    return trio.run(control_seed, fast_config(db))


def job(db: Path, job_id: str) -> JobRecord | None:
    async def get() -> JobRecord | None:
        async with open_backend(fast_config(db)) as backend:
            return await backend.get(job_id)

    return trio.run(get)


def paused(db: Path) -> set[str]:
    async def get() -> set[str]:
        async with open_backend(fast_config(db)) as backend:
            return await backend.paused_types()

    return trio.run(get)


def test_cancel_by_id_says_what_became_of_each(db: Path, seeded: dict[str, list[str]],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    pending, running, completed = seeded["pending"][0], seeded["running"][0], seeded["completed"][0]
    code, out = run("jobs", "cancel", pending, running, completed)
    assert code == 0
    assert out.splitlines() == [f"{pending}: cancelled", f"{running}: running: cancel requested",
                                f"{completed}: already completed"]
    cancelled = job(db, pending)
    assert cancelled is not None and cancelled.status == "cancelled"
    assert cancelled.error == "cancelled before it started: by an operator (python -m pipeline jobs cancel)"
    assert job(db, running).cancel_requested  # type: ignore[union-attr]

    code, out = run("jobs", "cancel", pending, "no-such-job")  # an unknown id: exit 1, the others still done
    assert code == 1
    assert out.splitlines() == [f"{pending}: already cancelled", "no-such-job: no such job"]
    assert "error: no job with id 'no-such-job'" in capsys.readouterr().err

    code, out = run("jobs", "cancel", seeded["pending"][1], running, "--json")
    assert code == 0
    assert json.loads(out) == {"jobs": [
        {"id": seeded["pending"][1], "outcome": "cancelled", "status": "cancelled"},
        {"id": running, "outcome": "cancel_requested", "status": "running"}]}


def test_bulk_cancel_retry_and_delete(db: Path, seeded: dict[str, list[str]]) -> None:
    code, out = run("jobs", "cancel", "--type", "send_email", "--status", "pending")
    assert (code, out) == (0, "cancelled 2 of 2 pending jobs of type send_email\n")
    assert {job(db, i).status for i in seeded["pending"][:2]} == {"cancelled"}  # type: ignore[union-attr]
    assert job(db, seeded["pending"][2]).status == "pending"  # type: ignore[union-attr]

    code, out = run("jobs", "cancel", "--type", "invalidate_cache")  # pending and running
    assert (code, out) == (0, "cancelled 0 of 1 waiting or pending or running or suspended jobs of type invalidate_cache; "
                              "1 running: cancel requested (their workers stop them)\n")

    code, out = run("jobs", "retry", "--status", "dead", "--json")
    assert code == 0 and json.loads(out) == {"matched": 2, "retried": 2, "skipped": 0, "reasons": []}
    assert {job(db, i).status for i in seeded["dead"]} == {"pending"}  # type: ignore[union-attr]
    code, out = run("jobs", "retry", "--type", "generate_sitemap")  # dead or cancelled
    assert (code, out) == (0, "retried 1 of 1 dead or cancelled jobs of type generate_sitemap\n")

    code, out = run("jobs", "delete", "--status", "cancelled")
    assert (code, out) == (0, "deleted 2 of 2 cancelled jobs\n")
    assert job(db, seeded["pending"][0]) is None
    code, out = run("jobs", "delete", "--status", "completed", "--type", "send_email", "--json")
    assert json.loads(out) == {"matched": 1, "deleted": 1, "skipped": 0, "reasons": []}


def test_retry_of_a_cancelled_job_puts_it_back_to_pending(db: Path, seeded: dict[str, list[str]]) -> None:
    job_id = seeded["cancelled"][0]
    code, out = run("jobs", "retry", job_id)
    assert (code, out) == (0, f"job {job_id}: cancelled → pending (attempts reset, due now)\n")
    assert job(db, job_id).status == "pending"  # type: ignore[union-attr]
    code, out = run("jobs", "retry", seeded["dead"][0])
    assert (code, out) == (0, f"job {seeded['dead'][0]}: dead → pending (attempts reset, due now)\n")


@pytest.mark.parametrize(
    "argv, words",
    [
        (["jobs", "cancel"], ["jobs cancel needs job ids, or --type and/or --status for every matching job"]),
        (["jobs", "cancel", "x", "--type", "send_email"], ["jobs cancel takes ids or --type/--status, not both"]),
        (["jobs", "cancel", "--status", "dead"], ["argument --status: invalid choice: 'dead'"]),
        (["jobs", "retry", "--status", "pending"], ["argument --status: invalid choice: 'pending'"]),
        (["jobs", "retry"], ["jobs retry needs a job id, or --type and/or --status"]),
        (["jobs", "delete", "--type", "send_email"], ["delete of every job of a type needs a --status too"]),
        (["jobs", "delete", "--status", "running"], ["argument --status: invalid choice: 'running'"]),
        (["jobs", "cancel", "--type", ""], ["--type must be a non-empty string"]),
        (["types", "pause"], ["the following arguments are required: name"]),
    ],
)
def test_bulk_forms_refuse_what_they_do_not_take(db: Path, seeded: dict[str, list[str]], argv: list[str],
                                                 words: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(*argv)
    assert code == 2 and out == ""
    err = capsys.readouterr().err
    for word in words:
        assert word in err, err
    assert run("jobs", "--status", "pending", "--json")[1].count('"id"') == 3  # nothing changed


def test_types_list_pause_and_resume(db: Path, seeded: dict[str, list[str]], capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_GLOBAL_LIMITS", "send_email=1")
    monkeypatch.setenv("WORKER_RATE_LIMITS", "send_email=30/h")
    code, out = run("types", "pause", "send_email")
    assert code == 0 and out.startswith("type send_email: paused (no new job of it starts in any process")
    assert paused(db) == {"send_email"}

    code, out = run("types", "list", "--json")
    types = {t["name"]: t for t in json.loads(out)["types"]}
    assert types["send_email"] == {"name": "send_email", "paused": True, "registered": True, "concurrency": 1,
                                   "global_limit": 1, "rate_limit": "30/h",
                                   "counts": {"waiting": 0, "pending": 2, "running": 0, "completed": 1, "dead": 2, "cancelled": 0,
                                              "suspended": 0}}
    assert types["generate_sitemap"]["concurrency"] == 1  # its own (the site's handler registers concurrency=1)
    assert types["invalidate_cache"]["paused"] is False and types["invalidate_cache"]["counts"]["running"] == 1

    code, out = run("types")  # = types list, for people
    lines = {line.split()[0]: line.split() for line in out.splitlines()[2:] if line.strip()}
    # waiting first, suspended among the live statuses
    assert lines["send_email"] == ["send_email", "paused", "0", "2", "0", "0", "1", "2", "0", "1", "1", "30/h"]
    assert lines["generate_sitemap"][-1] == "-"  # no rate limit
    assert lines["generate_sitemap"][1] == "active" and lines["generate_sitemap"][8] == "1"

    assert run("types", "resume", "send_email") == (0, "type send_email: resumed\n")
    assert paused(db) == set()
    code, out = run("types", "pause", "send_emial")
    assert (code, out) == (1, "")
    err = capsys.readouterr().err
    assert "error: no job type named 'send_emial' (known: " in err and "send_email" in err and "generate_sitemap" in err
    assert paused(db) == set()


def test_enqueue_with_expires_in_and_expires_at_in_a_file(db: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    before = to_epoch(now_ts())
    code, out = run("enqueue", "generate_sitemap", "--expires-in", "600", "--json")
    assert code == 0
    stored = json.loads(out)
    assert before + 600 <= to_epoch(stored["expires_at"]) <= to_epoch(now_ts()) + 600
    assert job(db, stored["id"]).expires_at == stored["expires_at"]  # type: ignore[union-attr]

    for argv, words in [
        (["--expires-in", "0"], ["--expires-in must be a number of seconds > 0, got 0.0"]),
        (["--expires-in", "-5"], ["--expires-in must be a number of seconds > 0"]),
        (["--expires-in", "10", "--delay", "60"], ["--expires-in 10 is not after --delay 60", "never run"]),
        (["--expires-in", "10", "--run-after", "2999-01-01T00:00:00Z"], ["is not after the job's run_after"]),
    ]:
        code, _ = run("enqueue", "generate_sitemap", *argv)
        err = capsys.readouterr().err
        assert code == 2 and all(word in err for word in words), err

    soon = format_ts(to_epoch(now_ts()) + 3600)
    lines = tmp_path / "jobs.jsonl"
    lines.write_text(json.dumps({"job_type": "generate_sitemap", "expires_at": soon}) + "\n"
                     + json.dumps({"job_type": "generate_sitemap"}) + "\n")
    code, out = run("enqueue", "--from-file", str(lines), "--json")
    assert code == 0
    first, second = json.loads(out)["job_ids"]
    assert job(db, first).expires_at == soon and job(db, second).expires_at is None  # type: ignore[union-attr]

    lines.write_text(json.dumps({"job_type": "generate_sitemap"}) + "\n"
                     + json.dumps({"job_type": "generate_sitemap", "expires_at": "2001-01-01T00:00:00Z"}) + "\n")
    code, _ = run("enqueue", "--from-file", str(lines))
    err = capsys.readouterr().err
    assert code == 2 and "jobs.jsonl line 2: expires_at '2001-01-01T00:00:00Z' is not in the future" in err
    lines.write_text(json.dumps({"job_type": "generate_sitemap", "expires_at": "soon"}) + "\n")
    code, _ = run("enqueue", "--from-file", str(lines))
    assert code == 2 and "line 1: expires_at 'soon' is not an ISO 8601 time" in capsys.readouterr().err
    code, _ = run("enqueue", "--from-file", str(lines), "--expires-in", "60")
    assert code == 2 and "drop --expires-in" in capsys.readouterr().err
    assert len(json.loads(run("jobs", "--json")[1])["items"]) == 3  # the refused files inserted nothing


def test_show_gives_result_progress_snoozes_expiry_and_the_cancel_request(db: Path, seeded: dict[str, list[str]]) -> None:
    code, out = run("jobs", "show", seeded["completed"][0])
    assert code == 0
    result = out.split("result\n", 1)[1]
    assert json.loads(result.split("\n\nerror", 1)[0]) == {"sent": 1, "to": "ok@example.com"}
    assert "expires at  never" in out

    run("jobs", "cancel", seeded["running"][0])
    code, out = run("jobs", "show", seeded["running"][0])
    assert "status      running (cancel requested: its worker stops it)" in out
    assert "progress    40% [########............]  40 of 100 keys" in out
    shown: dict[str, Any] = json.loads(run("jobs", "show", seeded["running"][0], "--json")[1])
    assert shown["progress"] == {"fraction": 0.4, "message": "40 of 100 keys"}
    assert (shown["cancel_requested"], shown["snoozes"], shown["result"]) == (True, 0, None)
    assert shown["status"] == "running"  # its worker (another process) ends it


def test_list_and_stats_know_cancelled(db: Path, seeded: dict[str, list[str]]) -> None:
    listed = json.loads(run("jobs", "--status", "cancelled", "--json")[1])["items"]
    assert [j["id"] for j in listed] == seeded["cancelled"]
    code, out = run("jobs", "list", "--status", "cancelled")
    assert code == 0 and seeded["cancelled"][0] in out and "cancelled before it started: by the test" in out
    code, out = run("stats")
    assert "CANCELLED" in out.splitlines()[0]
    assert "finished in the last hour: 4 (1 completed, 2 dead, 1 cancelled)" in out
    stats = json.loads(run("stats", "--json")[1])
    assert stats["by_status"]["cancelled"] == 1
    code, out = run("jobs", "cleanup", "--status", "cancelled")
    assert (code, out) == (0, "deleted 1 cancelled jobs\n")


def test_the_cli_and_from_file_store_each_jobs_limit_key_and_unique_while(db: Path) -> None:
    """A keyed type's key is computed from the job by its limit_key function on every enqueue path (not
    only Pipeline.enqueue): a job the CLI or a --from-file line enqueued counts under its tenant."""
    import dataclasses
    import io

    import pipeline
    from pipeline.cli import main

    reg = pipeline.Registry()

    @dataclasses.dataclass
    class Report:
        tenant: str

    async def report(job: Report, ctx: pipeline.JobContext) -> None: ...

    reg.register("report", Report, report, limit_key=lambda job: f"tenant:{job.tenant}", key_limit=2)

    def cli(*argv: str) -> tuple[int, str]:
        out = io.StringIO()
        return main(list(argv), registry=reg, stdout=out), out.getvalue()

    code, out = cli("enqueue", "report", "--payload", '{"tenant": "acme"}', "--unique-key", "r", "--unique-while", "pending",
                    "--json")
    assert code == 0, out
    first = json.loads(out)["id"]
    lines = db.parent / "jobs.jsonl"
    lines.write_text(json.dumps({"job_type": "report", "payload": {"tenant": "zeta"}, "unique_key": "z",
                                 "unique_while": "pending"}) + "\n")
    code, out = cli("enqueue", "--from-file", str(lines))
    assert code == 0, out
    records = trio.run(_all, db)
    assert {(r.limit_key, r.unique_key) for r in records} == {("tenant:acme", "r"), ("tenant:zeta", "z")}
    assert job(db, first).limit_key == "tenant:acme"  # type: ignore[union-attr]
    code, out = cli("enqueue", "report", "--payload", '{"tenant": "x"}', "--unique-while", "pending")
    assert code == 2  # without a key it says nothing: refused, naming why


async def _all(db: Path) -> list[JobRecord]:
    async with open_backend(fast_config(db)) as backend:
        return (await backend.list(limit=100))[0]
