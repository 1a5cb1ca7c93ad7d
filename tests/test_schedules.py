"""Cron schedules end to end on a real SQLite file: declared in code and fired by the Scheduler
(one job per tick, a missed tick once), and the CLI's `schedule` commands with their errors.
(The store's part on every backend: tests/backends/test_schedules.py; several processes firing
one store: tests/backends/test_schedule_processes.py.)"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import attrs
import pytest
import trio
from jobkit import Echo, Tick, registry, tick

import pipeline
from pipeline import Config, InvalidPayload, UnknownJobType, UsageError
from pipeline.backends import open_backend
from pipeline.backends.base import ScheduleRecord
from pipeline.cli import main
from pipeline.clock import format_ts, now_ts, to_epoch
from pipeline.schedules import make_schedule


async def echo_jobs(p: pipeline.Pipeline) -> list[pipeline.JobRecord]:
    found, _ = await p.backend.list(job_type="echo", limit=1000)
    return sorted(found, key=lambda j: j.run_after)


async def test_a_schedule_declared_in_code_enqueues_one_job_per_tick(config: Config) -> None:
    reg = registry()
    reg.schedule("every-second", "* * * * * *", Echo("tick"))
    async with pipeline.open_pipeline(config, reg) as p:
        with trio.fail_after(6):  # three ticks: 2 to 3 s
            while len(await echo_jobs(p)) < 3:
                await trio.sleep(0.05)
        (stored,) = await p.backend.schedules()
        # read before the pipeline closes: a job its stop hands back (released) is due again from
        # that moment, and its run_after is no longer its tick
        jobs = await echo_jobs(p)
    ticks = sorted(j.run_after for j in jobs)
    assert len(ticks) >= 3, ticks
    # each job is due at its tick: whole seconds, one apart, none twice
    assert all(t.endswith(".000Z") for t in ticks)
    assert [to_epoch(b) - to_epoch(a) for a, b in zip(ticks, ticks[1:])] == [1.0] * (len(ticks) - 1)
    assert stored.origin == "code" and stored.last_run in ticks[-2:]
    assert json.loads(jobs[0].payload)["text"] == "tick"


async def test_a_tick_missed_while_nothing_ran_fires_once_on_return(config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.engine.actors import scheduler

    # rounds every 0.2 s (the interval caps the Scheduler's sleep; 1 s by default): more rounds in less time
    monkeypatch.setitem(scheduler.run_scheduler.__kwdefaults__, "interval", 0.2)
    hour = 3600
    three_ago = format_ts((time.time() // hour - 3) * hour)  # three hourly ticks ago
    async with open_backend(config) as backend:
        declared = make_schedule(registry(), "hourly", "0 * * * *", "echo", {"text": "hourly"})
        await backend.put_schedule(attrs.evolve(ScheduleRecord.of(declared, origin="operator"), next_run=three_ago))
    async with pipeline.open_pipeline(config, registry()) as p:
        with trio.fail_after(5):
            while not (await echo_jobs(p)):
                await trio.sleep(0.05)
        await trio.sleep(0.6)  # two more rounds of the Scheduler at least: no catching up
        jobs = await echo_jobs(p)
        (stored,) = await p.backend.schedules()
    assert len(jobs) == 1 and jobs[0].run_after == three_ago  # the missed tick, once
    assert stored.last_run == three_ago and stored.last_job_id == jobs[0].id
    # the next run is the first tick after the return, not the missed ones
    assert stored.next_run == format_ts((time.time() // hour + 1) * hour)


async def test_a_type_without_a_handler_here_still_fires_and_an_unknown_one_is_left_to_others(config: Config) -> None:
    from pipeline.site import types_registry

    async with open_backend(config) as backend:
        for name, job_type in (("sitemap", "generate_sitemap"), ("echo", "echo")):
            declared = make_schedule(registry(), name, "* * * * * *", job_type, {"text": "e"} if job_type == "echo" else {})
            await backend.put_schedule(ScheduleRecord.of(declared, origin="operator"))
    # the bundled site's types, none with a handler, and no "echo": another application's type
    async with pipeline.open_pipeline(config, types_registry()) as p:
        with trio.fail_after(5):
            while not (await p.backend.list(job_type="generate_sitemap"))[0]:
                await trio.sleep(0.05)
        await trio.sleep(1.2)
        assert (await p.backend.list(job_type="echo"))[1] == 0  # not fired here: a process that knows it does
        (sitemap, *_), _ = await p.backend.list(job_type="generate_sitemap")
        assert sitemap.status == "pending"  # for a process that has its handler


async def test_a_schedule_that_cannot_fire_is_logged_once_and_does_not_hold_up_the_others(
    config: Config, caplog: pytest.LogCaptureFixture,
) -> None:
    async with open_backend(config) as backend:
        good = ScheduleRecord.of(make_schedule(registry(), "b-good", "* * * * * *", "echo", {"text": "ok"}), origin="operator")
        await backend.put_schedule(good)
        # written by an older version of the code, or by hand: its payload no longer fits Echo
        await backend.put_schedule(attrs.evolve(good, name="a-stale", payload='{"words": "old"}'))
    caplog.set_level("INFO", logger="pipeline.scheduler")
    async with pipeline.open_pipeline(config, registry()) as p:
        with trio.fail_after(5):  # two ticks (1 to 2 s), at each of which the stale one was tried too
            while len(await echo_jobs(p)) < 2:
                await trio.sleep(0.05)
        fired = [j.payload for j in await echo_jobs(p)]
    assert len(fired) >= 2 and all('"text":"ok"' in payload for payload in fired)
    stale = [r.getMessage() for r in caplog.records if "a-stale" in r.getMessage()]
    assert len(stale) == 1 and "does not fit job type 'echo'" in stale[0], stale


async def test_a_schedule_gone_from_the_code_is_disabled_at_the_next_start(config: Config) -> None:
    reg = registry()
    reg.schedule("nightly", "0 3 * * *", Echo("n"), timezone="Europe/Paris")
    async with pipeline.open_pipeline(config, reg) as p:
        (stored,) = await p.backend.schedules()
        assert stored.enabled and stored.next_run.endswith(":00:00.000Z")
    async with pipeline.open_pipeline(config, registry()) as p:  # the same application, without it
        (stored,) = await p.backend.schedules()
    assert (stored.enabled, stored.to_json()["state"]) == (False, "removed from code")


async def test_a_process_that_only_enqueues_leaves_the_code_schedules_alone(config: Config) -> None:
    """A web app opening the pipeline to enqueue (no workers) with a registry that declares no
    schedules, or a service whose workers run other types, does not disable the schedules of the
    service that runs their job type."""
    reg = registry()
    reg.schedule("nightly", "0 3 * * *", Echo("n"))
    async with pipeline.open_pipeline(config, reg):
        pass
    async with pipeline.open_pipeline(config.replace(worker=attrs.evolve(config.worker, enabled=False)), registry()):
        pass
    other = pipeline.Registry()
    other.register("tick", Tick, tick)  # a service of another type only
    async with pipeline.open_pipeline(config, other):
        pass
    async with open_backend(config) as backend:
        (stored,) = await backend.schedules()
    assert stored.enabled and stored.to_json()["state"] != "removed from code"


def test_declaring_a_schedule_checks_every_part() -> None:
    reg = registry()
    with pytest.raises(UsageError, match="bad cron expression '61 \\* \\* \\* \\*': Bad minute"):
        reg.schedule("x", "61 * * * *", Echo("x"))
    with pytest.raises(UsageError, match="unknown time zone 'Mars/Olympus'"):
        reg.schedule("x", "* * * * *", Echo("x"), timezone="Mars/Olympus")
    with pytest.raises(UnknownJobType):
        reg.schedule("x", "* * * * *", object())
    with pytest.raises(UsageError, match="Bad day-of-month"):  # February 31st: never
        reg.schedule("x", "0 0 31 2 *", Echo("x"))
    with pytest.raises(InvalidPayload, match="does not fit Echo"):
        make_schedule(reg, "x", "* * * * *", "echo", {"text": 3})
    reg.schedule("x", "* * * * *", Echo("x"))
    with pytest.raises(ValueError, match="already declared"):
        reg.schedule("x", "* * * * *", Echo("y"))


# -- the CLI ------------------------------------------------------------------------------------------


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), stdout=out, registry=registry())
    return code, out.getvalue()


def listed() -> list[dict[str, object]]:
    code, out = run("schedule", "list", "--json")
    assert code == 0
    return json.loads(out)["schedules"]  # type: ignore[no-any-return]


def test_the_cli_adds_lists_pauses_resumes_and_removes_schedules(db: Path) -> None:
    code, out = run("schedule", "add", "nightly", "0 3 * * *", "echo", "--payload", '{"text": "n"}', "--timezone",
                    "Europe/Paris", "--json")
    assert code == 0
    added = json.loads(out)
    assert {k: added[k] for k in ("name", "cron", "timezone", "job_type", "payload", "state", "origin")} == {
        "name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Paris", "job_type": "echo",
        "payload": {"text": "n", "sleep": 0.0, "fail_times": 0, "mode": "ok"},  # stored as its type's canonical JSON
        "state": "active", "origin": "operator"}
    # 03:00 in Paris is 01:00 or 02:00 UTC, whatever the season
    assert added["next_run"][11:] in ("01:00:00.000Z", "02:00:00.000Z") and added["next_run"] > now_ts()
    assert listed() == [added]
    code, out = run("schedule")  # bare: the table
    assert code == 0 and "nightly" in out and "Europe/Paris" in out and added["next_run"] in out

    assert run("schedule", "pause", "nightly")[1] == "schedule nightly: paused\n"
    assert listed()[0]["state"] == "paused"
    code, out = run("schedule", "resume", "nightly")
    assert code == 0 and out.startswith("schedule nightly: next run ")
    assert listed()[0]["enabled"] is True
    assert run("schedule", "remove", "nightly") == (0, "removed schedule nightly\n")
    assert listed() == []


@pytest.mark.parametrize(("argv", "words"), [
    (["schedule", "add", "x", "61 * * * *", "echo", "--payload", '{"text": "a"}'], "bad cron expression '61 * * * *': Bad minute"),
    (["schedule", "add", "x", "* * *", "echo", "--payload", '{"text": "a"}'], "Wrong number of fields"),
    (["schedule", "add", "x", "0 3 * * *", "echo", "--payload", '{"text": "a"}', "--timezone", "Mars/Olympus"],
     "unknown time zone 'Mars/Olympus'"),
    (["schedule", "add", "x", "0 3 * * *", "no_such_type"], "unknown job type 'no_such_type'"),
    (["schedule", "add", "x", "0 3 * * *", "echo", "--payload", '{"text": 3}'], "does not fit Echo"),
    (["schedule", "add", "x", "0 3 * * *", "echo", "--payload", "[1]"], "--payload"),
    (["schedule", "add", "bad name!", "0 3 * * *", "echo", "--payload", '{"text": "a"}'], "schedule name 'bad name!'"),
    (["schedule", "add", "x", "0 3 * * *"], "required"),
])
def test_a_bad_schedule_exits_2_naming_the_problem_and_stores_nothing(
    db: Path, capsys: pytest.CaptureFixture[str], argv: list[str], words: str,
) -> None:
    code, out = run(*argv)
    err = capsys.readouterr().err
    assert code == 2 and words in err and out == ""
    assert listed() == []


def test_adding_a_name_in_use_exits_2_and_changes_nothing(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("schedule", "add", "x", "0 3 * * *", "echo", "--payload", '{"text": "a"}')[0] == 0
    before = listed()
    assert run("schedule", "add", "x", "* * * * *", "echo", "--payload", '{"text": "b"}')[0] == 2
    assert "a schedule named 'x' already exists" in capsys.readouterr().err
    assert listed() == before


@pytest.mark.parametrize("action", ["remove", "pause", "resume"])
def test_an_unknown_schedule_exits_1(db: Path, capsys: pytest.CaptureFixture[str], action: str) -> None:
    assert run("schedule", action, "nope")[0] == 1
    assert "no schedule named 'nope'" in capsys.readouterr().err
