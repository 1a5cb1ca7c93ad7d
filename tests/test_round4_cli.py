"""Issue 32, the CLI as a new user meets it: the README's first enqueue completes, `schedules` is
`schedule`, every `--json` listing has the admin API's shape, hints carry the `--app` in use, the
repository's own tools stay out of an app's CLI, metrics name every outcome, a payload class a worker
cannot import is refused. In-process through ``pipeline.cli.main(argv)``, on real SQLite files."""

from __future__ import annotations

import io
import re
import shlex
from pathlib import Path

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
