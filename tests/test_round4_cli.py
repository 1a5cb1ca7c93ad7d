"""Issue 32, the CLI as a new user meets it: the README's first enqueue completes, `schedules` is
`schedule`, every `--json` listing has the admin API's shape, hints carry the `--app` in use, the
repository's own tools stay out of an app's CLI, metrics name every outcome, a payload class a worker
cannot import is refused. In-process through ``pipeline.cli.main(argv)``, on real SQLite files."""

from __future__ import annotations

import io
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import trio

from pipeline import Config, open_pipeline
from pipeline.cli import main
from pipeline.site import default_registry

ROOT = Path(__file__).resolve().parent.parent


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), stdout=out)
    return code, out.getvalue()


# -- the README's first enqueue -----------------------------------------------------------------------


def readme_enqueue() -> list[str]:
    """The enqueue line of the README's "A minute of operating it", as argv after `python -m pipeline`."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## A minute of operating it"):]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]
    line = next(line for line in block.splitlines() if " enqueue " in line)
    argv = shlex.split(line, comments=True)
    assert argv[:3] == ["python", "-m", "pipeline"], line
    return argv[3:]


def test_the_readmes_enqueue_runs_to_completed_on_the_bundled_demo(db: Path) -> None:
    """It was `enqueue send_email ...`, which a fresh service (no SMTP_HOST) ended dead: "SMTP is not
    configured". The README's line, as written, enqueued through the CLI and run by the demo's
    handlers with the settings a new user has (none), ends completed."""
    code, out = run(*readme_enqueue())
    assert code == 0, out
    job_id = out.strip()

    async def until_ended() -> str:
        config = Config.from_env(env_file=None)
        async with open_pipeline(config, default_registry(config)) as p:
            with trio.fail_after(30):
                while (job := await p.backend.get(job_id)) is None or job.status in ("pending", "running"):
                    await trio.sleep(0.02)
            return f"{job.status} {job.error or ''}"

    assert trio.run(until_ended).strip() == "completed"


# -- metrics name every outcome ----------------------------------------------------------------------


def outcome_kinds_made_by_the_pools() -> set[str]:
    """The kinds of every ``Outcome`` the handler pools construct (``Outcome("x", ...)``, and
    ``cls("x", ...)`` in its named constructors), read from their source."""
    import ast

    from pipeline.engine.actors import pools

    tree = ast.parse(Path(pools.__file__).read_text())
    kinds = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("Outcome", "cls") \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            kinds.add(node.args[0].value)
    return kinds


def test_processed_totals_help_and_the_docs_list_every_outcome_the_pools_make() -> None:
    """`cancelled` and `snoozed` were counted but neither the HELP text nor docs/operating.md listed them."""
    from pipeline.admin.metrics import OUTCOMES, Metrics

    made = outcome_kinds_made_by_the_pools()
    assert {"ok", "cancelled", "snoozed", "lost"} <= made  # the scan finds them
    assert made == set(OUTCOMES)
    text = Metrics().render({"by_status": {}, "by_type": {}})
    (help_line,) = [line for line in text.splitlines() if line.startswith("# HELP pipeline_jobs_processed_total ")]
    listed = re.search(r"\(([a-z_, ]+)\)\.$", help_line).group(1).split(", ")  # type: ignore[union-attr]
    assert sorted(listed) == sorted(made), help_line
    docs = (ROOT / "docs" / "operating.md").read_text()
    (row,) = [line for line in docs.splitlines() if line.startswith("| `pipeline_jobs_processed_total`")]
    assert sorted(re.findall(r"`([a-z_]+)`", row.split("`outcome`", 1)[1].split(":")[0])) == sorted(made), row


# -- an app's CLI ------------------------------------------------------------------------------------

APP = '''
import attrs
import pipeline

registry = pipeline.Registry()


@attrs.frozen
class Ping:
    n: int = 0


@registry.job()
async def ping(job: Ping, ctx: pipeline.JobContext) -> None:
    return None
'''


@pytest.fixture
def app(db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An application of its own, importable as e6app:registry, on the test's SQLite file."""
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "e6app.py").write_text(APP)
    monkeypatch.syspath_prepend(str(folder))
    return "e6app:registry"


def test_schedules_is_schedule(db: Path) -> None:
    """`jobs`, `types` and `batches` are plural; `schedules` was "invalid choice"."""
    code, out = run("schedules")
    assert (code, out) == run("schedule") and code == 0
    assert run("schedules", "add", "nightly", "0 3 * * *", "generate_sitemap")[0] == 0
    code, out = run("schedules", "list", "--json")
    assert code == 0 and [s["name"] for s in json_of(out)["schedules"]] == ["nightly"]
    assert run("schedules", "pause", "nightly")[0] == 0 and run("schedule", "remove", "nightly")[0] == 0


def json_of(text: str) -> dict[str, Any]:
    import json

    value = json.loads(text)
    assert isinstance(value, dict), f"a bare {type(value).__name__}, not the API's object"
    return value


def test_every_json_listing_has_the_admin_apis_shape(db: Path) -> None:
    """`jobs --json` printed a bare list where GET /admin/jobs answers {"items", "total", "page", "per_page"};
    `types --json` and `schedule list --json` bare lists where the API answers {"types"} and {"schedules"}."""
    ids = [run("enqueue", "generate_sitemap")[1].strip() for _ in range(3)]
    listed = json_of(run("jobs", "--json", "--limit", "2", "--page", "2")[1])
    assert set(listed) == {"items", "total", "page", "per_page"}
    assert (listed["total"], listed["page"], listed["per_page"]) == (3, 2, 2)
    assert [j["id"] for j in listed["items"]] == ids[:1]  # newest first: the oldest is on page 2
    assert "generate_sitemap" in [t["name"] for t in json_of(run("types", "--json")[1])["types"]]
    assert json_of(run("schedule", "list", "--json")[1]) == {"schedules": []}


def test_hints_carry_the_app_in_use(app: str, db: Path) -> None:
    """`jobs show` of a batch's job said "python -m pipeline batches show ID", which, run as printed,
    looks the batch up for the bundled demo, not for the app the operator was working on."""
    import pipeline

    e6app = __import__("e6app")
    client = pipeline.Client(registry=e6app.registry)
    try:
        batch = client.enqueue_batch([e6app.Ping(1), e6app.Ping(2)])
    finally:
        client.close()
    code, out = run("--app", app, "jobs", "show", batch.job_ids[0])
    assert code == 0, out
    assert f"(python -m pipeline --app {app} batches show {batch.id})" in out
    code, again = run("--app", app, "batches", "show", batch.id)  # the hint, run as printed, finds it
    assert code == 0 and batch.job_ids[1] in again


def test_the_projects_own_tools_stay_out_of_an_apps_cli(app: str, db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`diagrams` and `bench` redraw this repository's drawings and measure it: they are listed with the
    bundled demo only, and an app's CLI says where they belong."""
    with pytest.raises(SystemExit):
        main(["--app", app, "--help"])
    shown = capsys.readouterr().out
    assert "diagrams" not in shown and "bench" not in shown and "ping" in shown
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "diagrams" in capsys.readouterr().out  # the bundled demo keeps them
    for tool in ("diagrams", "bench"):
        assert run("--app", app, tool)[0] == 2
        assert f"run it without --app, as python -m pipeline {tool}" in capsys.readouterr().err


# -- a payload class defined in a function ------------------------------------------------------------

FACTORY = '''
import attrs
import pipeline


def make_registry():
    """A registry factory (--app e6factory:make_registry): each process that calls it gets a class
    object of its own, defined here, inside the function."""
    registry = pipeline.Registry()

    @attrs.frozen
    class Greet:
        name: str

    @registry.job()
    async def greet(job: Greet, ctx: pipeline.JobContext) -> str:
        return f"hello {job.name}"

    return registry
'''

STRINGLY = '''
from __future__ import annotations

import attrs
import pipeline


def make_registry():
    registry = pipeline.Registry()

    @attrs.frozen
    class Greet:
        name: str

    @registry.job()
    async def greet(job: Greet, ctx: pipeline.JobContext) -> None:
        return None

    return registry
'''


def test_a_payload_class_defined_in_a_function_runs_across_registries(db: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/jobs.md said such a class is refused (a worker process could not import it); it was accepted,
    and rightly: no process imports a payload class by name, each builds its registry again (the CLI and
    the runner below each call the factory: two class objects) and the job travels as JSON by type name.
    The docs now say so; what is refused is a string annotation the handler's module cannot resolve."""
    import json

    from pipeline.app import AppError, load_app

    folder = tmp_path / "factory"
    folder.mkdir()
    (folder / "e6factory.py").write_text(FACTORY)
    (folder / "e6stringly.py").write_text(STRINGLY)
    monkeypatch.syspath_prepend(str(folder))
    code, out = run("--app", "e6factory:make_registry", "enqueue", "greet", "--payload", '{"name": "ann"}')
    assert code == 0, out
    job_id = out.strip()

    async def until_ended() -> tuple[str, str | None]:
        config = Config.from_env(env_file=None)
        registry = load_app("e6factory:make_registry", asked="the test").registry(config)
        async with open_pipeline(config, registry) as p:
            with trio.fail_after(30):
                while (job := await p.backend.get(job_id)) is None or job.status in ("pending", "running"):
                    await trio.sleep(0.02)
            return job.status, job.result

    status, result = trio.run(until_ended)
    assert (status, json.loads(result or "null")) == ("completed", "hello ann")

    with pytest.raises(AppError, match="cannot be resolved.*define the payload class at module level"):
        load_app("e6stringly:make_registry", asked="the test").registry(Config.from_env(env_file=None))
    docs = " ".join((ROOT / "docs" / "jobs.md").read_text().split())
    assert "a class defined inside a function), is refused" not in docs  # what it said
    assert "A class defined inside a function (a registry factory, `--app myapp:make_registry`) works too" in docs
