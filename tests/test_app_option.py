"""`python -m pipeline --app MODULE:ATTR` and PIPELINE_APP: the CLI and the service work for the
application named, a module in the working directory (real processes, started there)."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from app_harness import Service, app_env, cli

APP = textwrap.dedent('''
    import dataclasses

    import attrs

    import pipeline

    registry = pipeline.Registry()


    @dataclasses.dataclass
    class ResizeAvatar:
        user_id: str
        size: int = 128


    @registry.job
    async def resize_avatar(job: ResizeAvatar, ctx: pipeline.JobContext) -> None:
        pass


    registry.schedule("app-nightly", "0 3 * * *", ResizeAvatar("nightly"))


    @attrs.frozen
    class Ping:
        n: int = 0


    other = pipeline.Registry()
    other.register("ping", Ping)


    def make(config):  # a factory given the Config
        made = pipeline.Registry()
        made.register("made_with_" + type(config).__name__.lower(), Ping)
        return made


    def make_plain():
        return other


    def returns_none(config):
        return None


    def raises():
        raise RuntimeError("no registry today")


    not_a_registry = "hello"
''')


def together(*calls: Callable[[], subprocess.CompletedProcess[str]]) -> list[subprocess.CompletedProcess[str]]:
    """Independent CLI runs at once, their results in order: each is a process that keeps one
    core busy for a quarter of a second, and one after another they leave the other core idle."""
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda call: call(), calls))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """The application's folder: myapp.py in it, a job store beside it; the working directory."""
    (tmp_path / "myapp.py").write_text(APP)
    (tmp_path / "broken.py").write_text("import json\nimport no_such_dependency_xyz\n")
    (tmp_path / "crashes.py").write_text("x = 1\nraise ValueError('the module fails as it is imported')\n")
    return tmp_path


@pytest.fixture
def env(folder: Path) -> dict[str, str]:
    return app_env(folder, f"sqlite:///{folder / 'jobs.db'}")


@pytest.mark.slow
def test_the_commands_know_the_apps_job_types(folder: Path, env: dict[str, str]) -> None:
    app = ("--app", "myapp:registry")
    done = cli(folder, env, *app, "enqueue", "resize_avatar", "--payload", '{"user_id": "u42", "size": 64}', "--json")
    assert done.returncode == 0, done.stderr
    first = json.loads(done.stdout)
    assert (first["job_type"], first["status"], first["payload"]) == ("resize_avatar", "pending", {"user_id": "u42", "size": 64})

    lines = '{"job_type": "resize_avatar", "payload": {"user_id": "u1"}}\n{"job_type": "resize_avatar", "payload": {"user_id": "u2"}}\n'
    (folder / "jobs.jsonl").write_text(lines)
    done = cli(folder, env, *app, "enqueue", "--from-file", "jobs.jsonl")
    assert (done.returncode, done.stdout) == (0, "enqueued 2 jobs from jobs.jsonl\n"), done.stderr
    # a payload that does not fit the app's type, and the bundled site's type: refused, as for the site's own
    done = cli(folder, env, *app, "enqueue", "resize_avatar", "--payload", '{"user": "u42"}')
    assert done.returncode == 2 and "user_id" in done.stderr, done.stderr
    done = cli(folder, env, *app, "enqueue", "send_email", "--payload", "{}")
    assert done.returncode == 2 and "unknown job type 'send_email' (known: resize_avatar)" in done.stderr, done.stderr

    done = cli(folder, env, *app, "schedule", "add", "nightly", "0 3 * * *", "resize_avatar", "--payload", '{"user_id": "u7"}')
    assert done.returncode == 0 and done.stdout.startswith("schedule nightly: resize_avatar at"), done.stderr
    listed = json.loads(cli(folder, env, *app, "schedule", "list", "--json").stdout)["schedules"]
    assert [(s["name"], s["job_type"]) for s in listed] == [("nightly", "resize_avatar")]

    jobs = json.loads(cli(folder, env, *app, "jobs", "--json").stdout)["items"]
    assert sorted(j["payload"]["user_id"] for j in jobs) == ["u1", "u2", "u42"]
    stats = cli(folder, env, *app, "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    assert "resize_avatar" in json.dumps(json.loads(stats.stdout))

    # without --app, the bundled site: the README's type is not one of its own
    done = cli(folder, env, "enqueue", "resize_avatar", "--payload", '{"user_id": "u42"}')
    assert done.returncode == 2 and "unknown job type 'resize_avatar'" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("asked", "words"), [
    ("nosuch:registry", ["--app 'nosuch:registry': cannot import module 'nosuch': No module named 'nosuch'", "working directory"]),
    ("broken:registry", ["--app 'broken:registry': importing module 'broken' failed: ModuleNotFoundError: "
                         "No module named 'no_such_dependency_xyz'", "broken.py, line 2"]),
    ("crashes:registry", ["importing module 'crashes' failed: ValueError: the module fails as it is imported", "crashes.py, line 2"]),
    ("myapp:registy", ["--app 'myapp:registy': myapp (", "myapp.py) has no attribute 'registy'; the registries in it: other, registry"]),
    ("myapp:not_a_registry", ["--app 'myapp:not_a_registry': myapp:not_a_registry is a str ('hello'), not a pipeline.Registry"]),
    ("myapp:returns_none", ["--app 'myapp:returns_none': returns_none(config) returned None, not a pipeline.Registry"]),
    ("myapp:raises", ["--app 'myapp:raises': raises() raised RuntimeError: no registry today", "myapp.py, line"]),
    ("myapp", ["--app 'myapp': expected MODULE:ATTR"]),
])
def test_an_app_that_cannot_be_loaded_exits_2_naming_what_was_asked_and_found(
        folder: Path, env: dict[str, str], asked: str, words: list[str]) -> None:
    commands = (["jobs"], ["--help"], ["run"])
    runs = together(*(lambda argv=argv: cli(folder, env, "--app", asked, *argv) for argv in commands))
    for argv, done in zip(commands, runs):
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr, done.stderr
        for word in words:
            assert word in done.stderr, (argv, done.stderr)
    assert not (folder / "jobs.db").exists()  # refused before the store was opened


@pytest.mark.slow
def test_pipeline_app_names_the_app_and_the_option_wins(folder: Path, env: dict[str, str]) -> None:
    def job_types(*asked: tuple[dict[str, str], tuple[str, ...]]) -> list[str]:
        """The job types ``--help`` names, for each (environment, options), the runs at once."""
        found = []
        for done in together(*(lambda values=values, argv=argv: cli(folder, values, *argv, "--help") for values, argv in asked)):
            assert done.returncode == 0, done.stderr
            found.append(re.search(r"^job types: (.*)$", done.stdout, re.M).group(1))  # type: ignore[union-attr]
        return found

    assert job_types(
        ({**env, "PIPELINE_APP": "myapp:registry"}, ()),
        ({**env, "PIPELINE_APP": "myapp:make_plain"}, ()),  # a callable without arguments
        ({**env, "PIPELINE_APP": "myapp:make"}, ()),  # given the Config
        ({**env, "PIPELINE_APP": "myapp:make_plain"}, ("--app", "myapp:registry")),
        # the option wins so completely that a PIPELINE_APP which cannot load is not even tried
        ({**env, "PIPELINE_APP": "nosuch:registry"}, ("--app", "myapp:registry")),
    ) == ["resize_avatar", "ping", "made_with_config", "resize_avatar", "resize_avatar"]
    (folder / ".env").write_text("PIPELINE_APP=myapp:make_plain\n")  # read as the other settings are
    assert job_types(
        (env, ()),
        ({**env, "PIPELINE_APP": "myapp:registry"}, ()),  # the environment over .env
    ) == ["ping", "resize_avatar"]
    done = cli(folder, {**env, "PIPELINE_APP": "myapp:nothing"}, "jobs")
    assert done.returncode == 2 and "PIPELINE_APP='myapp:nothing': myapp (" in done.stderr, done.stderr

    done = cli(folder, {**env, "PIPELINE_APP": "myapp:registry"}, "enqueue", "resize_avatar", "--payload", '{"user_id": "u1"}')
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_help_names_the_app_and_its_types_and_the_sites_commands_only_for_the_site(folder: Path, env: dict[str, str]) -> None:
    def commands(text: str) -> set[str]:
        return set(re.search(r"^\s+\{([a-z,]+)\}$", text, re.M).group(1).split(","))  # type: ignore[union-attr]

    mine, enqueue_help, demo, misplaced, site, explicit = together(
        lambda: cli(folder, env, "--app", "myapp:registry", "--help"),
        lambda: cli(folder, env, "--app", "myapp:registry", "enqueue", "--help"),
        lambda: cli(folder, env, "--app", "myapp:registry", "demo"),
        lambda: cli(folder, env, "jobs", "--app", "myapp:registry"),
        lambda: cli(folder, env, "--help"),
        lambda: cli(folder, env, "--app", "pipeline.site:registry", "--help"),
    )
    assert mine.returncode == 0, mine.stderr
    assert "app: myapp:registry\njob types: resize_avatar\nschedules in its code: app-nightly\n" in mine.stdout
    assert {"search", "demo"}.isdisjoint(commands(mine.stdout)) and {"run", "enqueue", "jobs"} <= commands(mine.stdout)
    enqueue = enqueue_help.stdout
    assert "one of the app's: resize_avatar" in enqueue
    assert "python -m pipeline --app myapp:registry enqueue resize_avatar" in enqueue and "send_email" not in enqueue
    assert demo.returncode == 2 and "demo is a command of the bundled site" in demo.stderr
    assert misplaced.returncode == 2 and "--app goes before the command" in misplaced.stderr

    assert site.returncode == 0, site.stderr
    assert "app: pipeline.site:registry (the bundled blog" in site.stdout and "send_email" in site.stdout
    assert {"search", "demo"} <= commands(site.stdout)
    assert explicit.stdout == site.stdout


@pytest.mark.slow
def test_worker_processes_get_the_app_from_pipeline_app_and_a_site_service_beside_them_buries_nothing(
        folder: Path, env: dict[str, str]) -> None:
    """PIPELINE_APP reaches the worker processes of --processes 2 (they are started with the same
    environment). The bundled site run on the same store, told to bury unknown types at once,
    leaves the app's jobs alone: live workers know them."""
    quick = {**env, "WORKER_UNKNOWN_TYPE_GRACE_SECONDS": "0", "WORKER_POLL_INTERVAL_MS": "100", "ADMIN_ENABLED": "false"}
    app = Service(folder, {**quick, "PIPELINE_APP": "myapp:registry"}, "--processes", "2")
    site = None
    try:
        app.ready(2, "resize_avatar")
        site = Service(folder, quick, "--processes", "1")
        site.wait_for(lambda lines: any("pipeline running on" in line for line in lines), "the site's start")
        ids = [cli(folder, {**quick, "PIPELINE_APP": "myapp:registry"}, "enqueue", "resize_avatar", "--payload",
                   json.dumps({"user_id": f"u{i}"})).stdout.strip() for i in range(3)]
        app.wait_for(lambda lines: all(any(f"job {i} resize_avatar attempt 1/3 ok → completed" in line for line in lines)
                                       for i in ids), "the three jobs' completion")
        jobs = json.loads(cli(folder, quick, "jobs", "--json").stdout)["items"]
        assert {j["id"]: j["status"] for j in jobs} == dict.fromkeys(ids, "completed")
        assert site.stop() == 0
        assert not any("no code here knows" in line for line in site.lines)
        # nor does it retire the app's code schedule: it runs none of that type's jobs
        listed = json.loads(cli(folder, quick, "schedule", "list", "--json").stdout)["schedules"]
        assert [(s["name"], s["origin"], s["state"]) for s in listed] == [("app-nightly", "code", "active")]
        assert app.stop() == 0
    finally:
        app.kill()
        if site is not None:
            site.kill()
