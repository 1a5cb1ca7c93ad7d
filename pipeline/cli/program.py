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
from .application import APP_HELP, Application, AppSummary, choose_application
from .batches import BATCHES_EXAMPLES, cmd_batches
from .enqueue import ENQUEUE_EXAMPLES, cmd_emit, cmd_enqueue
from .jobs import JOBS_EXAMPLES, _bulk_flags, _list_flags, cmd_jobs
from .parsing import CliError, _check_text, _global_options, _Parser
from .run import cmd_run
from .schedules import SCHEDULE_EXAMPLES, cmd_schedule
from .site import _site_commands, cmd_demo, cmd_search
from .stats import cmd_stats
from .store import _leaves
from .tools import OWN_TOOLS, _own_tools, cmd_bench, cmd_diagrams
from .types import TYPES_EXAMPLES, cmd_types

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

        site = types_registry()
        app = AppSummary(SITE_APP, "", True, site.job_types(), site.event_names(), [])
    parser = _Parser(
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
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    parser.add_argument("--processes", type=int, metavar="N", default=None,
                        help="run: worker processes under one supervisor (default WORKER_PROCESSES, else one per core)")
    run = sub.add_parser("run", help="run the workers and the admin API until SIGINT/SIGTERM (the default)",
                         description="Run the service: the workers (WORKER_ENABLED) and the admin API and dashboard on "
                         "ADMIN_HOST:ADMIN_PORT (ADMIN_ENABLED), until SIGINT/SIGTERM; then stop gracefully. With "
                         "--processes N (default: one per core), a supervisor runs N worker processes and the admin API.")
    run.add_argument("--processes", type=int, metavar="N", default=argparse.SUPPRESS,
                     help="worker processes under one supervisor (default WORKER_PROCESSES, else one per core)")

    as_json = _Parser(add_help=False)  # --json after any command; it is also accepted before the command
    as_json.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON instead of text for people")

    p = sub.add_parser(
        "enqueue", parents=[as_json], formatter_class=argparse.RawDescriptionHelpFormatter,
        help="insert a job (prints its id), or many from a JSON-lines file",
        description="Insert one job from flags, or every job of a JSON-lines file in one transaction.",
        epilog=app.examples(ENQUEUE_EXAMPLES),
    )
    p.add_argument("job_type", nargs="?", help=f"one of the app's: {', '.join(app.job_types) or 'none'} (omit with --from-file)")
    p.add_argument("--payload", help="the job's fields as a JSON object (default {})")
    p.add_argument("--from-file", metavar="FILE",
                   help='one job per line: {"job_type": ..., "payload": {...}} with optional priority, max_attempts, '
                   "run_after, unique_key, unique_while, expires_at, after, on_parent_failure, idempotency_key; all or "
                   "nothing; - reads "
                   "standard input")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--delay", type=float, metavar="SECONDS", help="run no sooner than this many seconds from now")
    when.add_argument("--run-after", metavar="ISO8601", help="run no sooner than this time, with its offset (2030-01-02T03:04:05Z)")
    p.add_argument("--max-attempts", type=int, metavar="N", help="default: the type's own, else WORKER_DEFAULT_MAX_ATTEMPTS")
    p.add_argument("--priority", type=int, metavar="N", help="lower runs first (default 5)")
    p.add_argument("--unique-key", metavar="KEY",
                   help="while a job of this type and key is pending or running, insert nothing and print that job's id")
    p.add_argument("--idempotency-key", metavar="KEY",
                   help="a second enqueue of this type and key within JOB_IDEMPOTENCY_SECONDS (a day) inserts nothing "
                   "and prints the first one's job id, whatever its status: a command whose answer was lost can be "
                   "run again safely")
    p.add_argument("--unique-while", choices=["pending_or_running", "pending"],
                   help="how long --unique-key is held: until the job finishes (the default), or only while it is "
                   "pending (an enqueue made while it runs inserts a new job)")
    p.add_argument("--expires-in", type=float, metavar="SECONDS",
                   help="if it has not started this many seconds from now, it never starts: it ends cancelled "
                   "(expired); counted from now, not from --delay")
    p.add_argument("--after", action="append", metavar="ID",
                   help="wait for this job (an existing one) to complete first: stored waiting, pending once every "
                   "--after job has completed (repeat for more)")
    p.add_argument("--on-parent-failure", choices=["cancel", "run"],
                   help="with --after: what a parent that ends dead or cancelled (or is deleted) does to this job: "
                   "cancel it (the default; and the jobs waiting for it), or run it once every parent has ended")
    p.add_argument("--commit-every", type=int, metavar="JOBS",
                   help="with --from-file: commit every JOBS jobs instead of once, so that a running service's writes "
                   "wait for one part, not the whole file; a bad line then keeps the parts committed before it")

    p = sub.add_parser("emit", parents=[as_json], help="emit an event: insert the jobs it routes to; prints their ids",
                       description="Emit a domain event: the jobs its route gives are inserted in one transaction.")
    p.add_argument("event", help=f"one of the app's: {', '.join(app.events) or 'none'}")
    p.add_argument("--data", default="{}", help="the event's fields as a JSON object")

    p = sub.add_parser(
        "jobs", parents=[as_json], formatter_class=argparse.RawDescriptionHelpFormatter,
        help="list, show, retry, delete and clean up jobs (bare `jobs` lists)",
        description="Work on the job store (DATABASE_URL) directly; no running service is needed. "
        "Without an action, lists jobs (same as `jobs list`).",
        epilog=JOBS_EXAMPLES,
    )
    _list_flags(p, suppress=False)
    actions = p.add_subparsers(dest="jobs_command", parser_class=_Parser, metavar="ACTION")
    a = actions.add_parser("list", parents=[as_json], help="list jobs, newest first (the default)",
                           description="List jobs, newest first or in claim order, filtered by status, type and priority.")
    _list_flags(a, suppress=True)
    a = actions.add_parser("show", parents=[as_json], help="one job with its payload and error",
                           description="Show one job: its fields, payload and last error, and for a job of a workflow "
                           "its parents and children (with their statuses) and its batch.")
    a.add_argument("id")
    a = actions.add_parser("retry", parents=[as_json],
                           help="a dead job back to pending (or a cancelled one; attempts reset, due now); "
                           "bulk with --type/--status",
                           description="Put a dead job back to pending (or a cancelled one), attempts reset, due now; or "
                           "every dead or cancelled job matching --type and --status, in batches.")
    a.add_argument("id", nargs="?", help="the job (or none, with --type and/or --status)")
    _bulk_flags(a, "retry")
    a = actions.add_parser("delete", parents=[as_json], help="delete a job record (not while it runs); bulk with --status",
                           description="Delete one job record (a running job cannot be deleted); or every job of "
                           "--status (and --type), in batches.")
    a.add_argument("id", nargs="?", help="the job (or none, with --status and maybe --type)")
    _bulk_flags(a, "delete")
    a = actions.add_parser("cancel", parents=[as_json],
                           help="cancel jobs: a pending or waiting one at once, a running one is asked to stop; bulk with "
                           "--type/--status",
                           description="Cancel jobs by id: a pending or waiting job is cancelled at once (final, never "
                           "run; the jobs waiting for it are cancelled too, unless enqueued with --on-parent-failure run); "
                           "a running job's worker is asked to cancel its handler, and ends it cancelled, never retried. "
                           "Or every waiting, pending and/or running job matching --type and --status, in batches. Prints "
                           "per id: cancelled, running: cancel requested, already <status>, or no such job (exit 1 if any).")
    a.add_argument("ids", nargs="*", metavar="ID", help="the jobs (or none, with --type and/or --status)")
    _bulk_flags(a, "cancel")
    a = actions.add_parser("cleanup", parents=[as_json], help="delete completed and dead job records",
                           description="Delete finished job records: completed and dead (or only --status: "
                           "completed, dead or cancelled).")
    a.add_argument("--older-than", type=float, metavar="SECONDS", help="only records last updated more than this long ago")
    a.add_argument("--status", dest="statuses", action="append", choices=["completed", "dead", "cancelled"],
                   help="only this status (repeat for more; default completed and dead)")

    p = sub.add_parser(
        "batches", parents=[as_json], formatter_class=argparse.RawDescriptionHelpFormatter,
        help="batches of jobs with a callback (enqueue_batch, POST /admin/batches): show one's progress",
        description="A batch (enqueue_batch, POST /admin/batches): its jobs and the callback that runs once every one "
        "of them has ended.",
        epilog=BATCHES_EXAMPLES,
    )
    actions = p.add_subparsers(dest="batches_command", parser_class=_Parser, metavar="ACTION", required=True)
    a = actions.add_parser("show", parents=[as_json], help="a batch's jobs counted by status, its callback, a page of its jobs",
                           description="Show a batch: its jobs counted by status, how many have finished, its callback "
                           "and the callback's status, and a page of its jobs in the order they were enqueued "
                           "(exit 1 if there is no such batch).")
    a.add_argument("id")
    a.add_argument("--limit", type=int, default=50, metavar="N", help="jobs per page (default 50)")
    a.add_argument("--offset", type=int, default=0, metavar="N", help="jobs to skip (default 0)")

    p = sub.add_parser(
        "types", parents=[as_json], formatter_class=argparse.RawDescriptionHelpFormatter,
        help="job types: list (paused or not, limits, counts), pause, resume (bare `types` lists)",
        description="The app's job types as the job store (DATABASE_URL) sees them. A paused type is paused for every "
        "process on the store, across restarts, until resumed: no new job of it starts (within a second), running "
        "ones finish, enqueues are still accepted. Without an action, lists them.",
        epilog=app.examples(TYPES_EXAMPLES),
    )
    actions = p.add_subparsers(dest="types_command", parser_class=_Parser, metavar="ACTION")
    actions.add_parser("list", parents=[as_json], help="each type: paused or not, concurrency, limits, jobs by status",
                       description="List each job type: paused or active, its workers per process, its global and rate "
                       "limits, its jobs by status.")
    for action, text in (("pause", "stop starting jobs of a type, in every process (enqueues are still accepted)"),
                         ("resume", "start jobs of a paused type again")):
        a = actions.add_parser(action, parents=[as_json], help=text, description=text[0].upper() + text[1:] + ".")
        a.add_argument("name", help=f"one of the app's: {', '.join(app.job_types) or 'none'}")

    p = sub.add_parser(
        "schedule", aliases=["schedules"], parents=[as_json], formatter_class=argparse.RawDescriptionHelpFormatter,
        help="cron schedules: add, list, remove, pause, resume (bare `schedule` lists)",
        description="Cron schedules in the job store (DATABASE_URL): each tick of a running service enqueues the "
        "schedule's job once, however many processes run. Without an action, lists them.",
        epilog=app.examples(SCHEDULE_EXAMPLES),
    )
    actions = p.add_subparsers(dest="schedule_command", parser_class=_Parser, metavar="ACTION")
    a = actions.add_parser("add", parents=[as_json], help="add a schedule (a name not in use)",
                           description="Add a cron schedule: JOB_TYPE with --payload at each tick of CRON in --timezone.")
    a.add_argument("name", help="unique: letters, digits, _.:-")
    a.add_argument("cron", help='5 fields (minute hour day month weekday: "0 3 * * *"), or 6 with seconds first')
    a.add_argument("job_type", help=f"one of the app's: {', '.join(app.job_types) or 'none'}")
    a.add_argument("--payload", help="the job's fields as a JSON object (default {})")
    a.add_argument("--timezone", default="UTC", metavar="TZ", help="IANA time zone the expression is read in (default UTC)")
    actions.add_parser("list", parents=[as_json], help="every schedule with its next run (the default)",
                       description="List every schedule, by name, with its state and next run.")
    for action, text in (("remove", "delete a schedule"), ("pause", "stop a schedule firing (kept, with its history)"),
                         ("resume", "fire a paused schedule again, from its next tick after now")):
        a = actions.add_parser(action, parents=[as_json], help=text, description=text[0].upper() + text[1:] + ".")
        a.add_argument("name")

    p = sub.add_parser("stats", parents=[as_json], help="counts by status and type, throughput, queue lag",
                       description="Counts by status and type, jobs finished per minute over the last hour, "
                       "and how long the oldest due pending job has waited.")

    if app.site:
        _site_commands(sub)
        _own_tools(sub)
    return parser


def main(argv: Sequence[str] | None = None, *, registry: Registry | None = None, stdout: TextIO | None = None) -> int:
    """``python -m pipeline``. ``registry``: an application's own entry point gives its registry
    here (instead of --app); its worker processes under --processes run the same script."""
    out = stdout or sys.stdout
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        for position, arg in enumerate(argv, start=1):
            _check_text(arg, position)
        options = _global_options(argv)
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
        if command in OWN_TOOLS and not app.is_site:
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
        leaves = list(_leaves(group))
        if not all(isinstance(e, (PipelineError, sqlite3.Error, OSError)) for e in leaves):
            raise
        for leaf in leaves:
            print(f"error: {leaf}", file=sys.stderr)
        return 2 if all(isinstance(e, (ConfigError, UsageError)) for e in leaves) else 1


COMMANDS: dict[str, Callable[[argparse.Namespace, Config, Application, TextIO], int]] = {
    "run": cmd_run,
    "enqueue": cmd_enqueue,
    "emit": cmd_emit,
    "jobs": cmd_jobs,
    "batches": cmd_batches,
    "types": cmd_types,
    "stats": cmd_stats,
    "schedule": cmd_schedule,
    "schedules": cmd_schedule,  # (the alias: as jobs, types and batches are plural)
    "diagrams": cmd_diagrams,
    "search": cmd_search,
    "demo": cmd_demo,
    "bench": cmd_bench,
}
