"""Issue 24's workflows from the command line: `enqueue --after ID` (repeatable) and
`--on-parent-failure`, "after" and "on_parent_failure" in `--from-file` lines, what `jobs show` says of
a job's parents, children and batch, `jobs --status waiting`, `jobs cancel` of a waiting job, and
`batches show`. In-process through ``pipeline.cli.main(argv)`` on a real SQLite file (DATABASE_URL), the
workflow made by tests/test_admin_workflows.py's workflow_seed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import fast_config
from test_admin_workflows import workflow_seed
from test_cli import run
from test_cli_control import job

from pipeline.backends import open_backend


@pytest.fixture
def seeded(db: Path) -> dict[str, Any]:
    return trio.run(workflow_seed, fast_config(db))


def count(db: Path) -> int:
    async def total() -> int:
        async with open_backend(fast_config(db)) as backend:
            return int((await backend.stats())["total"])

    return trio.run(total)


def test_enqueue_after_and_what_jobs_show_says(db: Path, seeded: dict[str, Any], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    done, pending = seeded["done"], seeded["pending"]
    code, out = run("enqueue", "generate_sitemap", "--after", pending, "--after", done, "--on-parent-failure", "run", "--json")
    assert code == 0
    made = json.loads(out)
    assert (made["status"], made["parents"], made["waiting_for"], made["on_parent_failure"], made["duplicate"]) == (
        "waiting", [pending, done], 1, "run", False)
    code, out = run("enqueue", "generate_sitemap", "--after", done)  # its one parent completed already
    assert code == 0 and job(db, out.strip()).status == "pending"  # type: ignore[union-attr]

    # refused before anything is written, exit 2 naming the problem, as the other enqueue errors
    capsys.readouterr()
    before = count(db)
    for argv, words in [
        (["--after", "no-such-job"], "unknown parent job in after: no-such-job"),
        (["--after", done, "--after", done], "after names a job more than once"),
        (["--on-parent-failure", "run"], "on_parent_failure is given without after"),
        (["--after", ""], "after must hold job ids (non-empty text)"),
    ]:
        code, out = run("enqueue", "generate_sitemap", *argv)
        err = capsys.readouterr().err
        assert (code, out) == (2, ""), err
        assert f"error: {words}" in err, err
    code, _ = run("enqueue", "generate_sitemap", "--on-parent-failure", "maybe")
    assert code == 2 and "invalid choice: 'maybe'" in capsys.readouterr().err
    assert count(db) == before

    # --from-file lines take after and on_parent_failure; a bad one writes nothing
    lines = tmp_path / "jobs.jsonl"
    lines.write_text(json.dumps({"job_type": "generate_sitemap", "after": [pending], "on_parent_failure": "run"}) + "\n"
                     + json.dumps({"job_type": "invalidate_cache", "payload": {"keys": ["x"]}, "after": [done]}) + "\n")
    code, out = run("enqueue", "--from-file", str(lines), "--json")
    assert code == 0, capsys.readouterr().err
    first, second = json.loads(out)["job_ids"]
    assert (job(db, first).status, job(db, first).on_parent_failure, job(db, second).status) == (  # type: ignore[union-attr]
        "waiting", "run", "pending")
    before = count(db)
    for content, words in [
        ([{"job_type": "generate_sitemap", "after": pending}], "line 1: the job: after must be an array of job ids, got a string"),
        ([{"job_type": "generate_sitemap"}, {"job_type": "generate_sitemap", "after": ["no-such-job"]}],
         "unknown parent job in after: no-such-job"),
    ]:
        lines.write_text("".join(json.dumps(line) + "\n" for line in content))
        code, _ = run("enqueue", "--from-file", str(lines))
        err = capsys.readouterr().err
        assert code == 2 and words in err, err
    code, _ = run("enqueue", "--from-file", str(lines), "--after", done)
    assert code == 2 and "drop --after" in capsys.readouterr().err
    assert count(db) == before

    # jobs show: parents with their statuses, children, batch, what a parent's failure does
    code, out = run("jobs", "show", seeded["child"])
    assert code == 0
    lines_out = [" ".join(line.split()) for line in out.splitlines()]
    assert "waiting for 1 of its 2 parents" in lines_out
    assert "on parent failure cancel (a parent that ends dead or cancelled cancels it)" in lines_out
    at = lines_out.index("parents (2)")
    assert lines_out[at + 1:at + 3] == [f"{done} completed", f"{pending} pending"]
    assert "children" not in out and "batch" not in out
    code, out = run("jobs", "show", pending)
    lines_out = [" ".join(line.split()) for line in out.splitlines()]
    at = lines_out.index("children (3)")  # the seed's child, and the first jobs of the command and of the file above
    assert lines_out[at + 1:at + 4] == [f"{seeded['child']} waiting", f"{made['id']} waiting", f"{first} waiting"]
    code, out = run("jobs", "show", seeded["members"][0])
    assert f"batch {seeded['batch']} (python -m pipeline batches show {seeded['batch']})" in " ".join(out.split())
    assert f"{seeded['callback']} waiting" in " ".join(out.split())  # its child: the callback
    code, out = run("jobs", "show", seeded["child"], "--json")
    shown = json.loads(out)
    assert (shown["parents"], shown["parent_count"], shown["waiting_for"], shown["batch"]) == ([done, pending], 2, 1, None)

    # waiting: a status like the others
    code, out = run("jobs", "--status", "waiting", "--json")
    assert code == 0
    assert {j["id"] for j in json.loads(out)["items"]} == {seeded["child"], seeded["callback"], made["id"], first}
    code, out = run("jobs", "list", "--status", "waiting")
    assert code == 0 and "1–4 of 4 jobs" in out and " waiting " in out
    code, out = run("stats", "--json")
    assert json.loads(out)["by_status"]["waiting"] == 4
    code, out = run("jobs", "cancel", seeded["child"])
    assert (code, out) == (0, f"{seeded['child']}: cancelled\n")
    code, out = run("jobs", "cancel", "--status", "waiting", "--type", "generate_sitemap")
    assert (code, out) == (0, "cancelled 3 of 3 waiting jobs of type generate_sitemap\n")


def test_batches_show(db: Path, seeded: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    members, batch_id = seeded["members"], seeded["batch"]
    code, out = run("batches", "show", batch_id)
    assert code == 0
    text = [" ".join(line.split()) for line in out.splitlines()]
    assert f"id {batch_id}" in text
    assert "jobs 3, 2 finished" in text
    assert "by status 1 pending, 1 completed, 1 dead" in text
    assert f"callback {seeded['callback']} waiting" in text
    rows = [line for line in text if line.split(" ")[0] in members]
    assert rows == [f"{members[0]} send_email completed", f"{members[1]} send_email dead 550 mailbox unavailable",
                    f"{members[2]} invalidate_cache pending"]
    assert "1–3 of 3 jobs, in the order enqueued" in text

    code, out = run("batches", "show", batch_id, "--json", "--limit", "2", "--offset", "1")
    assert code == 0
    shown = json.loads(out)
    assert {k: shown[k] for k in ("id", "callback_id", "callback_status", "total", "finished", "counts", "limit", "offset")} == {
        "id": batch_id, "callback_id": seeded["callback"], "callback_status": "waiting", "total": 3, "finished": 2,
        "counts": {"completed": 1, "dead": 1, "pending": 1}, "limit": 2, "offset": 1}
    assert shown["jobs"] == [
        {"id": members[1], "job_type": "send_email", "status": "dead", "result": None, "error": "550 mailbox unavailable"},
        {"id": members[2], "job_type": "invalidate_cache", "status": "pending", "result": None, "error": None}]
    code, out = run("batches", "show", batch_id, "--json", "--limit", "1")
    assert json.loads(out)["jobs"][0]["result"] == {"sent": 2}
    code, out = run("batches", "show", batch_id, "--offset", "3")
    assert code == 0 and "no jobs on this page (3 in the batch)" in out

    capsys.readouterr()
    code, out = run("batches", "show", "no-such-batch")
    assert (code, out) == (1, "") and "error: no batch with id 'no-such-batch'" in capsys.readouterr().err
    code, _ = run("batches", "show", batch_id, "--limit", "0")
    assert code == 2 and "--limit must be from 1 to 10000, got 0" in capsys.readouterr().err
    code, _ = run("batches")
    assert code == 2 and "ACTION" in capsys.readouterr().err
