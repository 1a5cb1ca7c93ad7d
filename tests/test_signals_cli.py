"""Issue 35 from the command line: `jobs signal` (woken, kept, and the refusals with their exit statuses),
`jobs show`'s awaiting signal and steps, `jobs --status suspended`, and the replay `jobs retry --from-step`.
In-process through ``pipeline.cli.main(argv)`` on a real SQLite file (DATABASE_URL), the durable states made
through the Backend protocol (tests/test_signals_admin.py's signal_seed), what a command did read back from
the store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import fast_config
from test_cli import run
from test_signals_admin import signal_seed, store, take  # noqa: F401 -- store: each backend's fixture

from pipeline import Config
from pipeline.backends import JobRecord, open_backend


@pytest.fixture
def seeded(db: Path) -> dict[str, str]:
    return trio.run(signal_seed, fast_config(db))


def stored(db: Path, job_id: str) -> JobRecord:
    async def get() -> JobRecord:
        async with open_backend(fast_config(db)) as backend:
            found = await backend.get(job_id)
            assert found is not None
            return found

    return trio.run(get)


def taken(db: Path, job_id: str, name: str) -> list[Any]:
    """The signal ``name`` taken twice by the job's resumed wait: what it got, then nothing (consumed once)."""
    async def work() -> list[Any]:
        async with open_backend(fast_config(db)) as backend:
            return await take(backend, job_id, name, times=2)

    return trio.run(work)


def test_signal_wakes_the_waiting_job_or_is_kept(db: Path, seeded: dict[str, str]) -> None:
    waiting, pending = seeded["waiting"], seeded["pending"]
    code, out = run("jobs", "signal", waiting, "approval", "--payload", '{"ok": true, "by": "ann"}')
    assert (code, out) == (0, f"job {waiting}: woken (it was waiting for 'approval' and is pending now)\n")
    job = stored(db, waiting)
    assert (job.status, job.awaiting_signal) == ("pending", None)

    code, out = run("jobs", "signal", pending, "approval", "--json")  # no --payload: none
    assert code == 0
    assert json.loads(out) == {"outcome": "kept", "job_id": pending, "name": "approval"}
    assert stored(db, pending).status == "pending"

    assert taken(db, waiting, "approval") == [(True, '{"ok":true,"by":"ann"}'), (False, None)]
    assert taken(db, pending, "approval") == [(True, None), (False, None)]


def test_signal_refuses_an_unknown_or_finished_job_and_bad_input(db: Path, seeded: dict[str, str],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    code, out = run("jobs", "signal", "no-such-job", "approval")
    assert (code, out) == (1, "")
    assert capsys.readouterr().err == "error: no job with id 'no-such-job'\n"
    for status in ("completed", "dead", "cancelled"):
        code, _ = run("jobs", "signal", seeded[status], "approval", "--payload", "true")
        assert code == 1
        assert capsys.readouterr().err == f"error: job {seeded[status]} is {status}: a finished job takes no signal\n"

    waiting = seeded["waiting"]
    code, _ = run("jobs", "signal", waiting, "approval", "--payload", "{yes}")
    assert code == 2
    assert capsys.readouterr().err.startswith("error: --payload is not valid JSON: ")
    code, _ = run("jobs", "signal", waiting, "x" * 201)
    assert code == 2
    assert "a signal's name must be at most 200 characters" in capsys.readouterr().err
    code, _ = run("jobs", "signal", waiting)
    assert code == 2 and "the following arguments are required: NAME" in capsys.readouterr().err
    # nothing was sent: the job still waits, and its wait finds nothing kept once woken
    job = stored(db, waiting)
    assert (job.status, job.awaiting_signal) == ("suspended", "approval")
    assert run("jobs", "signal", waiting, "approval")[0] == 0
    assert taken(db, waiting, "approval") == [(True, None), (False, None)]


def test_show_gives_the_awaited_signal_and_the_steps(db: Path, seeded: dict[str, str]) -> None:
    waiting = seeded["waiting"]
    code, out = run("jobs", "show", waiting)
    assert code == 0
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert "status suspended" in lines
    assert "awaiting signal approval" in lines
    assert "suspended until its signal (no timeout)" in lines
    assert "steps (2)" in lines
    charge = next(line for line in lines if line.startswith("charge "))
    assert charge.startswith("charge completed ") and charge.endswith('{"charge_id": "ch_1"}')
    approval = next(line for line in lines if line.startswith("approval "))
    assert approval.startswith("approval waiting ") and approval.endswith("- -")  # no end, no value yet

    code, out = run("jobs", "show", waiting, "--json")
    job = json.loads(out)
    assert (code, job["status"], job["awaiting_signal"]) == (0, "suspended", "approval")
    assert [(s["name"], s["status"], s["value"]) for s in job["steps"]] == [
        ("charge", "completed", {"charge_id": "ch_1"}), ("approval", "waiting", None)]

    code, out = run("jobs", "show", seeded["sleeping"])  # asleep: no signal awaited, its wake-up time shown
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert not any(line.startswith("awaiting signal") for line in lines)
    assert any(line.startswith("suspended until 20") for line in lines)


def test_list_by_status_suspended(db: Path, seeded: dict[str, str]) -> None:
    code, out = run("jobs", "--status", "suspended", "--json")
    assert code == 0
    listed = json.loads(out)
    assert sorted(j["id"] for j in listed["items"]) == sorted([seeded["waiting"], seeded["sleeping"]])
    assert {j["id"]: j["awaiting_signal"] for j in listed["items"]} == {seeded["waiting"]: "approval",
                                                                         seeded["sleeping"]: None}
    code, out = run("jobs", "list", "--status", "suspended")
    assert code == 0 and seeded["waiting"] in out and seeded["sleeping"] in out and seeded["pending"] not in out
    assert "1–2 of 2 jobs" in out


def test_retry_from_a_step_replays_from_there(db: Path, seeded: dict[str, str],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    done = seeded["completed"]
    capsys.readouterr()
    code, _ = run("jobs", "retry", done, "--from-step", "z")
    assert code == 2
    err = capsys.readouterr().err
    assert "'z'" in err and "'a'" in err and "'c'" in err  # the store names the job's steps
    code, _ = run("jobs", "retry", "--status", "dead", "--from-step", "a")
    assert code == 2
    assert "--from-step replays one job: give its id" in capsys.readouterr().err
    assert [s.name for s in stored(db, done).steps] == ["a", "b", "c"]  # nothing changed

    code, out = run("jobs", "retry", done, "--from-step", "b")
    assert code == 0
    assert out == (f"job {done}: completed → pending (attempts reset, due now), from its step 'b': it and the steps "
                   "after it run again\n")
    job = stored(db, done)
    assert (job.status, job.result, [s.name for s in job.steps]) == ("pending", None, ["a"])


def test_the_tables_show_every_status_suspended_among_the_live_ones(db: Path, seeded: dict[str, str]) -> None:
    from pipeline.admin.console import SHOWN_STATUSES
    from pipeline.states import Status

    assert sorted(SHOWN_STATUSES) == sorted(s.value for s in Status)
    code, out = run("stats")
    assert code == 0
    lines = [line.split() for line in out.splitlines()]
    assert lines[0] == ["TYPE", "WAITING", "PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "DEAD", "CANCELLED"]
    assert ["send_email", "0", "1", "0", "2", "1", "1", "1"] in lines
    code, out = run("types", "list")
    assert ["send_email", "active", "0", "1", "0", "2", "1", "1", "1", "2", "-", "-"] in [line.split() for line in out.splitlines()]


async def test_signal_show_and_replay_on_each_store(store: Config, tmp_path: Path,  # noqa: F811
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands' one path on each backend (the tests above run on SQLite): in a thread, as a shell runs
    them, on the store DATABASE_URL names."""
    ids = await signal_seed(store)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DATABASE_URL", store.database_url)
    monkeypatch.setenv("REDIS_ALLOW_NON_DURABLE", "true")  # (the test server keeps nothing on disk)
    monkeypatch.setenv("ADMIN_SIGNING_KEY", "k" * 40)

    async def cli(*argv: str) -> tuple[int, str]:
        return await trio.to_thread.run_sync(lambda: run(*argv))

    waiting, done = ids["waiting"], ids["completed"]
    code, out = await cli("jobs", "--status", "suspended", "--json")
    assert (code, sorted(j["id"] for j in json.loads(out)["items"])) == (0, sorted([waiting, ids["sleeping"]]))
    code, out = await cli("jobs", "show", waiting, "--json")
    assert [s["name"] for s in json.loads(out)["steps"]] == ["charge", "approval"]
    code, out = await cli("jobs", "signal-link", waiting, "approval", "--payload", "true")
    assert code == 0 and out.startswith("http://127.0.0.1:8000/signal-links/")
    assert await cli("jobs", "signal", waiting, "approval", "--payload", "[1]") == (
        0, f"job {waiting}: woken (it was waiting for 'approval' and is pending now)\n")
    assert (await cli("jobs", "signal", done, "approval"))[0] == 1
    assert (await cli("jobs", "retry", done, "--from-step", "c"))[0] == 0
    async with open_backend(store) as backend:
        assert (await backend.get(waiting)).status == "pending"  # type: ignore[union-attr]
        assert [s.name for s in await backend.steps(done)] == ["a", "b"]
        assert await take(backend, waiting, "approval", times=2) == [(True, "[1]"), (False, None)]
