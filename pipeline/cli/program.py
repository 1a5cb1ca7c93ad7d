"""The program: its parser, made for the app in use, and ``main``, which runs one command."""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import TextIO

from ..app import SITE_APP
from ..config import Config
from ..errors import ConfigError, PipelineError, UsageError
from ..registry import Registry
from . import batches, enqueue, jobs, run, schedules, site, stats, tools, types
from .application import APP_HELP, Application, AppSummary, choose_application
from .parsing import CliError, Parser, check_text, global_options
from .store import leaves

MAIN_EPILOG = """\
Settings come from the environment and a .env file (DATABASE_URL=sqlite:///pipeline.db by
default, WORKER_*, ADMIN_*, LOG_FORMAT=json, ...; see docs/configuration.md). The job commands work on
the job store through the same backend the service uses: no running service is needed.

exit status: 0 success; 2 bad usage or configuration; 1 runtime failure (the database
refused, a file is unreadable, no such job).
"""


def build_parser(app: AppSummary | None = None) -> argparse.ArgumentParser:
    """The command line for ``app`` (default: the bundled site): its --help names the app and its
    job types, and the site's own commands (search, demo) are there only when it is the app."""
    if app is None:
        from ..site import types_registry

        known = types_registry()
        app = AppSummary(SITE_APP, "", True, known.job_types(), known.event_names(), [])
    parser = Parser(
        prog="python -m pipeline",
        description=textwrap.fill("Durable background jobs, on SQLite, Postgres or Redis (DATABASE_URL), for the application "
                                  "--app names. With no command, runs the service (same as `run`).", 100)
        + "\n\n" + app.description(),
        epilog=MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--app", metavar="MODULE:ATTR", help=APP_HELP)
    parser.add_argument("--env-file", default=".env", help="read settings from this file too (default: .env)")
    parser.add_argument("--json", action="store_true", default=False, help="print JSON instead of text for people")
    sub = parser.add_subparsers(dest="command", parser_class=Parser)

    run.add_parsers(parser, sub)
    as_json = Parser(add_help=False)  # --json after any command; it is also accepted before the command
    as_json.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON instead of text for people")
    for noun in (enqueue, jobs, batches, types, schedules, stats):  # the order --help lists them in
        noun.add_parsers(sub, app, as_json)
    if app.site:
        site.add_parsers(sub)
        tools.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None, *, registry: Registry | None = None, stdout: TextIO | None = None) -> int:
    """``python -m pipeline``. ``registry``: an application's own entry point gives its registry
    here (instead of --app); its worker processes under --processes run the same script."""
    out = stdout or sys.stdout
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        for position, arg in enumerate(argv, start=1):
            check_text(arg, position)
        options = global_options(argv)
        app = choose_application(options.app, options.env_file, registry)
        made: list[Config] = []

        def config() -> Config:  # read once, when first needed (--help needs it only for an app's factory)
            if not made:
                made.append(Config.from_env(env_file=options.env_file))
            return made[0]

        command = options.rest[0] if options.rest else None
        if command != "bench" and any(arg == "--app" or arg.startswith("--app=") for arg in options.rest):
            raise UsageError("--app goes before the command: python -m pipeline --app MODULE:ATTR COMMAND ...")
        if command in ("demo", "search") and not app.is_site:
            raise UsageError(f"{command} is a command of the bundled site, which is not the app here ({app.name}): "
                             f"python -m pipeline --app {SITE_APP} {command}")
        if command in tools.OWN_TOOLS and not app.is_site:
            raise UsageError(f"{command} is a tool of the pipeline project's own checkout, not of the app here "
                             f"({app.name}): run it without --app, as python -m pipeline {command}")
        parser = build_parser(AppSummary.of(app, app.types(config)))
        args, extra = parser.parse_known_args(argv)
        if extra and args.command != "bench":
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.bench_args = extra
        if getattr(args, "processes", None) is not None and (args.command or "run") != "run":
            parser.error("--processes goes with run (the service)")
        command = args.command or "run"
        return COMMANDS[command](args, config(), app, out)
    except CliError as exc:
        print(exc, file=sys.stderr)
        return exc.code
    except (ConfigError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`... | head`): not worth a message
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - so the interpreter's final flush stays quiet
        return 1
    except (PipelineError, sqlite3.Error, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except BaseExceptionGroup as group:
        # errors raised inside the service's nurseries arrive grouped; show the leaves
        # that we expect (a refused database, a bad setting) as messages, not tracebacks
        found = list(leaves(group))
        if not all(isinstance(e, (PipelineError, sqlite3.Error, OSError)) for e in found):
            raise
        for leaf in found:
            print(f"error: {leaf}", file=sys.stderr)
        return 2 if all(isinstance(e, (ConfigError, UsageError)) for e in found) else 1


COMMANDS: dict[str, Callable[[argparse.Namespace, Config, Application, TextIO], int]] = {
    "run": run.cmd_run,
    "enqueue": enqueue.cmd_enqueue,
    "emit": enqueue.cmd_emit,
    "jobs": jobs.cmd_jobs,
    "batches": batches.cmd_batches,
    "types": types.cmd_types,
    "stats": stats.cmd_stats,
    "schedule": schedules.cmd_schedule,
    "schedules": schedules.cmd_schedule,  # (the alias: as jobs, types and batches are plural)
    "diagrams": tools.cmd_diagrams,
    "search": site.cmd_search,
    "demo": site.cmd_demo,
    "bench": tools.cmd_bench,
}
