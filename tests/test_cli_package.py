"""pipeline/cli/ is a package by noun (issue 34, item 7): what imported a name from the old pipeline/cli.py
still finds it, each command lives in its noun's module, and the modules stay a few hundred lines.

That the commands print what they printed is the other CLI tests' business (tests/test_cli*.py,
test_round4_cli.py, tests/backends/test_unique_cli.py, test_app_option.py): they run unchanged."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pipeline.cli
from pipeline.cli import program

PACKAGE = Path(pipeline.cli.__file__).parent

# every public name the module pipeline/cli.py had (before 40e0f56), which programs may have imported
OLD_NAMES = [
    "APP_HELP", "BATCHES_EXAMPLES", "CANCEL_REASON", "COMMANDS", "ENQUEUE_EXAMPLES", "JOBS_EXAMPLES", "JOB_ACTIONS",
    "MAIN_EPILOG", "OWN_TOOLS", "SCHEDULE_EXAMPLES", "TYPES_EXAMPLES", "AppSummary", "Application", "CliError",
    "build_parser", "choose_application", "cmd_batches", "cmd_bench", "cmd_demo", "cmd_diagrams", "cmd_emit",
    "cmd_enqueue", "cmd_jobs", "cmd_run", "cmd_schedule", "cmd_search", "cmd_stats", "cmd_types", "main",
]

# which module of the package holds each command (the noun it works on)
HOMES = {
    "run": "run", "enqueue": "enqueue", "emit": "enqueue", "jobs": "jobs", "batches": "batches", "types": "types",
    "schedule": "schedules", "schedules": "schedules", "stats": "stats", "search": "site", "demo": "site",
    "diagrams": "tools", "bench": "tools",
}


def test_the_old_modules_public_names_import_from_the_package() -> None:
    missing = [name for name in OLD_NAMES if not hasattr(pipeline.cli, name)]
    assert missing == []
    assert sorted(pipeline.cli.__all__) == sorted(OLD_NAMES)
    assert pipeline.cli.main is program.main and callable(pipeline.cli.main)  # not the submodule of a like name


def test_the_console_script_and_python_m_reach_main() -> None:
    (script,) = [e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "pipeline"]
    assert script.value == "pipeline.cli:main" and script.load() is pipeline.cli.main
    result = subprocess.run([sys.executable, "-m", "pipeline", "--env-file", "/nonexistent", "stats", "--help"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0 and result.stdout.startswith("usage: python -m pipeline stats"), result.stderr


def test_each_command_lives_in_its_nouns_module() -> None:
    assert set(HOMES) == set(pipeline.cli.COMMANDS)
    for command, home in HOMES.items():
        assert pipeline.cli.COMMANDS[command].__module__ == f"pipeline.cli.{home}", command


def test_each_module_is_a_few_hundred_lines_at_most() -> None:
    sizes = {path.name: len(path.read_text().splitlines()) for path in PACKAGE.glob("*.py")}
    assert len(sizes) >= 10
    assert {name: n for name, n in sizes.items() if n > 400} == {}
