"""``python -m pipeline``: run the service, or work on the database directly.

Exit status: 0 success; 2 bad usage or configuration (the message names the problem);
1 a runtime failure (the database refused, a file is unreadable).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import sqlite3
import stat
import sys
import textwrap
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

import attrs

from .app import APP_VARIABLE, SITE_APP, App, load_app
from .backends.base import LIST_ORDERS, PRIORITY_MAX, PRIORITY_MIN
from .clock import format_ts, now_ts, to_epoch
from .config import Config
from .errors import ConfigError, PipelineError, UsageError
from .registry import Registry
from .requests import JobRequest, check_unique_key, prepare_rows
from .states import Status

if TYPE_CHECKING:
    from .backends import Backend, JobRecord

T = TypeVar("T")

log = logging.getLogger("pipeline")


class CliError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's own exit 2, with our prefix
        self.print_usage(sys.stderr)
        raise CliError(f"{self.prog}: {message}", 2)


ENQUEUE_EXAMPLES = """\
examples:
  python -m pipeline enqueue send_email --payload '{"to": "a@example.com", "subject": "Hi", "body": "Hello"}'
  python -m pipeline enqueue generate_sitemap --delay 60 --priority 1
  python -m pipeline enqueue generate_sitemap --unique-key nightly   # nothing new while one is pending or running
  python -m pipeline enqueue generate_sitemap --expires-in 600        # never started if not started within 10 min
  python -m pipeline enqueue generate_sitemap --after 01920c1e-... --after 01920c1f-...   # waits for both to complete
  python -m pipeline enqueue generate_sitemap --after 01920c1e-... --on-parent-failure run  # runs however it ends
  python -m pipeline enqueue --from-file jobs.jsonl
  python -m pipeline enqueue --from-file big.jsonl --commit-every 100000   # into a live service

a jobs.jsonl line:
  {"job_type": "invalidate_cache", "payload": {"keys": ["post:1"]}, "priority": 3}
  {"job_type": "invalidate_cache", "payload": {"keys": ["post:2"]}, "after": ["01920c1e-..."]}
"""

JOBS_EXAMPLES = """\
examples:
  python -m pipeline jobs --status dead            # the same as: jobs list --status dead
  python -m pipeline jobs --status pending --order claim   # the next jobs a worker takes, first first
  python -m pipeline jobs --priority 0             # the jobs of priority 0 only
  python -m pipeline jobs show 01920c1e-...        # payload, error, attempts, times, parents, children, batch
  python -m pipeline jobs --status waiting         # the jobs waiting for their parents
  python -m pipeline jobs retry 01920c1e-...       # dead (or cancelled) → pending, attempts reset
  python -m pipeline jobs cancel 01920c1e-... 01920c1f-...   # pending: cancelled; running: asked to stop
  python -m pipeline jobs cancel --type send_email --status pending   # every pending send_email job
  python -m pipeline jobs retry --type send_email --status dead        # every dead one back to pending
  python -m pipeline jobs delete --status cancelled                    # every cancelled job record
  python -m pipeline jobs cleanup --older-than 604800 --status completed
"""

BATCHES_EXAMPLES = """\
examples:
  python -m pipeline batches show 01920c1e-...                 # its jobs by status, its callback, its first 50 jobs
  python -m pipeline batches show 01920c1e-... --offset 50     # the next 50
  python -m pipeline batches show 01920c1e-... --json
"""

TYPES_EXAMPLES = """\
examples:
  python -m pipeline types                          # = types list: each type, paused or not, limits, counts
  python -m pipeline types pause send_email         # no new send_email job starts, in any process
  python -m pipeline types resume send_email
"""

SCHEDULE_EXAMPLES = """\
examples:
  python -m pipeline schedule add nightly-sitemap "0 3 * * *" generate_sitemap --timezone Europe/Paris
  python -m pipeline schedule add digest "*/15 * * * *" send_email --payload '{"to": "a@example.com", "subject": "Digest", "body": "..."}'
  python -m pipeline schedule list --json
  python -m pipeline schedule pause nightly-sitemap
"""

MAIN_EPILOG = """\
Settings come from the environment and a .env file (DATABASE_URL=sqlite:///pipeline.db by
default, WORKER_*, ADMIN_*, LOG_FORMAT=json, ...; see docs/configuration.md). The job commands work on
the job store through the same backend the service uses: no running service is needed.

exit status: 0 success; 2 bad usage or configuration; 1 runtime failure (the database
refused, a file is unreadable, no such job).
"""

APP_HELP = ("the application: a module and the name in it of a pipeline.Registry, or of a function returning one "
            "(given the Config if it takes an argument), e.g. myapp:registry; the working directory is importable. "
            f"Default: {APP_VARIABLE}, else {SITE_APP} (the bundled blog)")


@attrs.define
class Application:
    """The application the commands work for: the one --app or PIPELINE_APP names (the bundled
    site by default), or the registry a program gave ``main(registry=...)``."""

    name: str  # MODULE:ATTR; or what the program is, for a registry given in code
    app: App | None = None
    given: Registry | None = None
    _registry: Registry | None = attrs.field(default=None, init=False)  # the app's, once made (a factory is called once)

    @property
    def is_site(self) -> bool:
        return self.app is not None and self.app.is_site

    @property
    def command(self) -> str:
        """How a person runs these commands again, as hints print it: with the --app in use (the
        bundled site needs none), or the program that gave its registry."""
        if self.given is not None:
            program = Path(sys.argv[0]).name
            return f"python {program}" if program.endswith(".py") else "python -m pipeline"
        return "python -m pipeline" if self.is_site else f"python -m pipeline --app {self.name}"

    def registry(self, config: Config | Callable[[], Config]) -> Registry:
        """The registry with its handlers: what the service runs (the site's: every handler, its
        settings checked)."""
        if self.given is not None:
            return self.given
        if self._registry is None:
            assert self.app is not None
            self._registry = self.app.registry(config)
        return self._registry

    def types(self, config: Config | Callable[[], Config]) -> Registry:
        """What the commands check jobs and events against: they run no handler. For the bundled
        site, its types alone: importing its handlers (httpx, Pillow, redis) would only slow every
        command down. Any other application's registry is what it is."""
        if self.is_site:
            from .site import types_registry

            return types_registry()
        return self.registry(config)


def choose_application(app: str | None, env_file: str | None, registry: Registry | None) -> Application:
    """--app, else PIPELINE_APP (the environment, then the env file), else the bundled site; or
    the registry the program gave, which nothing on the command line replaces."""
    if registry is not None:
        if app is not None:
            raise UsageError("--app is not taken here: this program gives its registry to pipeline.cli.main(registry=...) "
                             "itself (python -m pipeline --app runs another)")
        return Application(f"the registry {Path(sys.argv[0]).name or 'this program'} gives pipeline.cli.main()", given=registry)
    asked = f"--app {app!r}"
    if app is None:
        app = os.environ.get(APP_VARIABLE, "").strip() or None
        asked = f"{APP_VARIABLE}={app!r}"
    if app is None and env_file is not None and Path(env_file).is_file():
        from dotenv import dotenv_values

        app = (dotenv_values(env_file).get(APP_VARIABLE) or "").strip() or None
        asked = f"{APP_VARIABLE}={app!r} (in {env_file})"
    if app is None:
        app, asked = SITE_APP, f"the default app {SITE_APP!r}"
    loaded = load_app(app, asked=asked)
    return Application(loaded.name, app=loaded)


def _global_options(argv: Sequence[str]) -> argparse.Namespace:
    """The options before the command that decide what the parser shows: --app and --env-file
    (parsed again, with everything else, by the full parser)."""
    pre = _Parser(prog="python -m pipeline", add_help=False)
    pre.add_argument("--app")
    pre.add_argument("--env-file", default=".env")
    pre.add_argument("--processes")
    pre.add_argument("--json", action="store_true")
    pre.add_argument("rest", nargs=argparse.REMAINDER)  # the command and its own arguments, untouched
    return pre.parse_known_args(argv)[0]


@attrs.frozen
class AppSummary:
    """What --help says of the application."""

    name: str
    option: str  # what the examples put before the command: " --app myapp:registry", or nothing
    site: bool
    job_types: list[str]
    events: list[str]
    schedules: list[str]

    @classmethod
    def of(cls, application: Application, registry: Registry) -> AppSummary:
        option = f" --app {application.name}" if application.app is not None and not application.is_site else ""
        return cls(application.name, option, application.is_site, registry.job_types(), registry.event_names(),
                   [s.name for s in registry.schedules()])

    def description(self) -> str:
        named = f"{self.name} (the bundled blog; --app or {APP_VARIABLE} names another)" if self.site else self.name
        lines = [f"app: {named}", f"job types: {', '.join(self.job_types) or 'none'}"]
        if self.events:
            lines.append(f"events: {', '.join(self.events)}")
        if self.schedules:
            lines.append(f"schedules in its code: {', '.join(self.schedules)}")
        return "\n".join(textwrap.fill(line, 100, subsequent_indent="  ") for line in lines)

    def examples(self, text: str) -> str:
        """The bundled site's examples, for another app written with its own first job type."""
        if self.site or not self.job_types:
            return text
        app, first = self.option, self.job_types[0]
        out = []
        for line in text.splitlines():
            if "python -m pipeline" in line and any(t in line for t in ("send_email", "generate_sitemap")):
                line = line.replace("python -m pipeline", f"python -m pipeline{app}")
                line = re.sub(r"'\{.*\}'", "'{...}'", line)
                line = line.replace("send_email", first).replace("generate_sitemap", first).replace("nightly-sitemap", "nightly")
            elif "python -m pipeline" in line:
                line = line.replace("python -m pipeline", f"python -m pipeline{app}")
            elif "invalidate_cache" in line:
                line = f'  {{"job_type": "{first}", "payload": {{...}}, "priority": 3}}'
            out.append(line)
        return "\n".join(out) + "\n"


def build_parser(app: AppSummary | None = None) -> argparse.ArgumentParser:
    """The command line for ``app`` (default: the bundled site): its --help names the app and its
    job types, and the site's own commands (search, demo) are there only when it is the app."""
    if app is None:
        from .site import types_registry

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


def _bulk_flags(p: argparse.ArgumentParser, action: str) -> None:
    """--type and --status of a bulk action (dests of their own: `jobs --status` is the list's filter)."""
    from .control import ACTIONS

    p.add_argument("--type", dest="bulk_type", metavar="JOB_TYPE", help="every matching job of this type")
    p.add_argument("--status", dest="bulk_status", choices=ACTIONS[action],
                   help="every matching job of this status" + ("" if action == "delete" else
                                                              f" (default: {' and '.join(ACTIONS[action])})"))


def _site_commands(sub: Any) -> None:
    """The bundled site's own commands: there when it is the app."""
    # the site's content stays in SQLite (FTS5) whatever DATABASE_URL names: SITE_DATABASE_URL, docs/configuration.md
    p = sub.add_parser("search", help="full-text search of the published posts (the index rebuild_search_index keeps, "
                       "in the site's SQLite database: SITE_DATABASE_URL)")
    p.add_argument("query", help='FTS5 query: words (all must match), "a phrase", prefix*, a OR b, NOT c')
    p.add_argument("--limit", type=int, default=20, metavar="N", help="show at most N hits (default 20)")

    p = sub.add_parser("demo", help="seed demo content in a folder of its own, run every handler on it, print a report")
    p.add_argument("--dir", default="pipeline-demo", help="where the demo's database, media and sitemap go (default ./pipeline-demo)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS", help="give up waiting for the jobs after this long")
    p.add_argument("--verbose", action="store_true", help="also print the pipeline's log (stderr)")


def _own_tools(sub: Any) -> None:
    """This repository's tools, for its own drawings and figures: with the bundled demo only, not in an
    application's CLI (whose operators have no use for them)."""
    p = sub.add_parser("diagrams", help="redraw diagrams/*.mmd and docs/architecture.md's copies from the code")
    p.add_argument("--out", default="diagrams")
    p.add_argument("--readme", default="docs/architecture.md", help="the Markdown page that holds copies of the drawings")

    # every flag after `bench` is benchmarks/bench.py's own (`python -m pipeline bench --help`)
    sub.add_parser("bench", add_help=False, help="measure throughput and latency against Huey's SQLite backend "
                   "(benchmarks/bench.py of a source checkout; --quick: under a minute)")


OWN_TOOLS = ("diagrams", "bench")  # commands of this repository's checkout, shown with the bundled demo only


def _check_text(arg: str, position: int) -> None:
    """Arguments that are not UTF-8 (Python keeps their bytes as lone surrogates) can be
    neither stored nor looked up: refuse them here, naming which one, not deep in sqlite3."""
    try:
        arg.encode("utf-8")
    except UnicodeEncodeError:
        shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")[:80]
        raise UsageError(f"argument {position} ({shown!r}) is not valid UTF-8 text") from None


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


def _leaves(exc: BaseException) -> Any:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


# -- the service ------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    from .logs import configure

    configure(config)
    import trio

    from .service import serve
    from .supervisor import supervise, supervised

    count = config.worker.process_count() if args.processes is None else args.processes
    if count < 1:
        raise UsageError(f"--processes must be 1 or more, got {count}")
    registry = app.registry(config)  # the bundled site's: every handler attached, its settings checked
    if config.worker.asyncio_loop != "asyncio":  # asked for uvloop: refused at start (exit 2) when it is missing
        from .engine.asyncio_host import check_loop

        check_loop(config.worker.asyncio_loop)
    if count > 1 and config.worker.enabled and not supervised():
        # the supervisor runs no handler: its admin API validates jobs and events (the site's
        # types alone; the worker processes import the handlers' libraries)
        trio.run(supervise, config, app.types(config) if app.is_site else registry, count)
    elif config.worker.enabled and registry.uses_asyncio():
        # asyncio handlers: the process's trio run is the guest of an asyncio loop (WORKER_ASYNCIO_LOOP),
        # one loop shared by every asyncio handler of the process (engine/asyncio_host.py)
        from .engine import asyncio_host

        asyncio_host.run(serve, config, registry, loop=config.worker.asyncio_loop)
    else:  # one process: everything in it, as a worker process of a supervisor is
        trio.run(serve, config, registry)
    return 0


# -- commands on the job store -------------------------------------------------------------------


def _with_backend(config: Config, work: Callable[[Backend], Awaitable[T]]) -> T:
    """Open the backend DATABASE_URL names, run ``work`` on it, close it. The commands need
    no running service: they write through the same backend the service uses."""
    import trio

    from .backends import open_backend

    async def main() -> T:
        async with open_backend(config, role="cli") as backend:
            return await work(backend)

    try:
        return trio.run(main)
    except BaseExceptionGroup as group:  # the backend's nursery wraps what the work raised
        leaves = list(_leaves(group))
        if len(leaves) == 1:
            raise leaves[0] from None
        raise


def _json_object(text: str, what: str) -> dict[str, Any]:
    from .admin import inputs

    return inputs.object_of(inputs.loads(text, what), what)


def _emit_json(out: TextIO, value: Any) -> None:
    json.dump(value, out, indent=2, ensure_ascii=False)
    out.write("\n")


def cmd_enqueue(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    if args.from_file is not None:
        return _enqueue_file(args, config, app, out)
    from .admin import inputs

    if args.job_type is None:
        raise UsageError("enqueue needs a JOB_TYPE (or --from-file FILE)")
    if args.commit_every is not None:
        raise UsageError("--commit-every goes with --from-file")
    reg = app.types(config)
    payload = _json_object("{}" if args.payload is None else args.payload, "--payload")
    if args.delay is not None and not (0 <= args.delay < 10**9):
        raise UsageError(f"--delay must be a number of seconds >= 0, got {args.delay}")
    now = to_epoch(now_ts())
    run_after = format_ts(now + args.delay) if args.delay is not None else args.run_after
    unique_key = check_unique_key(args.unique_key, "--unique-key")
    expires_at = None
    if args.expires_in is not None:
        if not (0 < args.expires_in < 10**9):
            raise UsageError(f"--expires-in must be a number of seconds > 0, got {args.expires_in}")
        if args.delay is not None and args.expires_in <= args.delay:
            raise UsageError(f"--expires-in {args.expires_in:g} is not after --delay {args.delay:g}: the job would expire "
                             "before it is due and never run (both count from now)")
        expires_at = format_ts(now + args.expires_in)
    request = JobRequest(args.job_type, payload, args.max_attempts, run_after, 5 if args.priority is None else args.priority,
                         unique_key, expires_at, args.unique_while, args.after, args.on_parent_failure,
                         check_unique_key(args.idempotency_key, "--idempotency-key"))
    inputs.with_bounds(request, "the job")
    (row,) = prepare_rows(reg, [request], default_max_attempts=config.worker.default_max_attempts)  # validates before opening
    row = row._replace(idempotency_seconds=config.retention.idempotency_seconds)

    async def work(backend: Backend) -> tuple[str, JobRecord | None]:
        (stored,) = await backend.insert([row])  # a duplicate: the id of the job holding the key
        return stored, await backend.get(stored)

    stored, record = _with_backend(config, work)
    duplicate = stored != row.id
    if args.json:
        _emit_json(out, {**(record.to_json() if record else {"id": stored}), "duplicate": duplicate})
    else:
        print(stored, file=out)
        if duplicate:
            status = f"is {record.status}" if record else "was pending or running"
            if unique_key is None:  # (so the idempotency key answered)
                print(f"duplicate: job {stored} of type {row.job_type} was enqueued with idempotency key "
                      f"{row.idempotency_key!r} less than JOB_IDEMPOTENCY_SECONDS ago; nothing was inserted", file=sys.stderr)
            else:
                print(f"duplicate: job {stored} of type {row.job_type} with unique key {unique_key!r} {status}; "
                      "nothing was inserted", file=sys.stderr)
    return 0


def _enqueue_file(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    """All or nothing, in one transaction: each chunk of checked lines is inserted while the
    next is checked; a bad line rolls everything back."""
    import tempfile

    from .admin import console, inputs

    extra = [flag for flag, value in (("JOB_TYPE", args.job_type), ("--payload", args.payload), ("--delay", args.delay),
                                      ("--run-after", args.run_after), ("--max-attempts", args.max_attempts),
                                      ("--priority", args.priority), ("--unique-key", args.unique_key),
                                      ("--expires-in", args.expires_in), ("--unique-while", args.unique_while),
                                      ("--after", args.after), ("--on-parent-failure", args.on_parent_failure),
                                      ("--idempotency-key", args.idempotency_key))
             if value is not None]
    if extra:
        raise UsageError(f"--from-file takes each job's fields from the file; drop {', '.join(extra)}")
    every = args.commit_every
    if every is not None and every < 1:
        raise UsageError(f"--commit-every must be a number of jobs >= 1, got {every}")
    reg = app.types(config)
    name = "standard input" if args.from_file == "-" else args.from_file
    # a line holds one job: its payload (at most the registry's limit, up to 6 bytes a character
    # when written as \\u escapes of four hex digits) and a few fields; longer is not a job
    # (/dev/zero has no end)
    max_line = 6 * reg.max_payload_bytes + 64 * 1024
    if args.from_file == "-":
        opened: Any = sys.stdin.buffer
    else:
        opened = open(args.from_file, "rb")  # noqa: SIM115 -- closed below (a missing file: OSError, exit 1)
    ids: list[str] = []
    duplicates: list[tuple[str, str]] = []  # (a line's id, the id of the job holding its unique key)
    with opened, console.progress_bar(sys.stderr) as bar:
        if _is_regular(opened):  # read twice in place: once to count and check the lines, once to insert
            source, lines = opened, _count_lines(opened, None, name, max_line)
            source.seek(0)
        else:
            # a pipe, a FIFO, a device: read it all first, as it comes (a slow writer must not hold
            # the database's write lock, and it cannot be read twice)
            source = tempfile.TemporaryFile()  # noqa: SIM115 -- closed with `opened`'s block below
            lines = _count_lines(opened, source, name, max_line)
            source.seek(0)
        task = bar.task(f"enqueueing lines of {Path(name).name}", lines)  # the bar has one line: no folders
        rows = inputs.read_jobs(source, name, reg, default_max_attempts=config.worker.default_max_attempts,
                                on_lines=lambda n: bar.advance(task, n))
        window = config.retention.idempotency_seconds  # a line's "idempotency_key" holds for JOB_IDEMPOTENCY_SECONDS
        keyed = False  # a line has an idempotency key: the summary's duplicates name both kinds of key

        def windowed(rows: Any) -> Any:
            nonlocal keyed
            for row in rows:
                if row.idempotency_key is not None:
                    keyed = True
                    row = row._replace(idempotency_seconds=window)
                yield row

        rows = windowed(rows)
        if args.json:
            rows = _keeping_ids(rows, ids)

        async def work(backend: Backend) -> int:
            return await backend.bulk_insert(rows, commit_every=every, duplicates=duplicates)

        try:
            committed = _with_backend(config, work)
        finally:
            if source is not opened:
                source.close()
        read = committed + len(duplicates)
        parts = 0 if not read else (1 if every is None else -(-read // every))
        bar.finish(task, lines)
    if args.json:
        held = dict(duplicates)
        _emit_json(out, {"enqueued": committed, "duplicates": len(duplicates), "transactions": parts,
                         "job_ids": [held.get(job_id, job_id) for job_id in ids]})
    else:
        n = len(duplicates)
        if keyed:  # (which key answered a line is not told apart: a line may have both)
            skipped = (f"; {n} duplicate{'' if n == 1 else 's'} not inserted (each answered by a pending or running job "
                       "of the same type and unique key, or by the job of an idempotency key used within "
                       "JOB_IDEMPOTENCY_SECONDS)" if duplicates else "")
        else:
            skipped = (f"; {n} duplicate{'' if n == 1 else 's'} of pending or running jobs (same type and unique key) "
                       "not inserted" if duplicates else "")
        print(f"enqueued {committed} jobs from {name}" + (f" in {parts} transactions" if every else "") + skipped, file=out)
    return 0


def _is_regular(stream: Any) -> bool:
    try:
        return stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
    except (OSError, ValueError, io.UnsupportedOperation):
        return False


def _count_lines(stream: Any, copy: Any, name: str, max_line: int) -> int:
    """The number of lines in ``stream`` (read to its end, copied to ``copy`` if given);
    UsageError naming the line once one is longer than ``max_line`` bytes."""
    lines, current = 0, 0  # lines ended so far, bytes of the line being read
    for chunk in iter(lambda: stream.read(1 << 20), b""):
        if copy is not None:
            copy.write(chunk)
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            current += end - start
            if current > max_line:
                break
            lines, current, start = lines + 1, 0, end + 1
        else:
            current += len(chunk) - start
        if current > max_line:
            raise UsageError(f"{name} line {lines + 1} is longer than {max_line:,} bytes: not a job (one JSON object per line)")
    return lines


def _keeping_ids(rows: Any, ids: list[str]) -> Any:
    for row in rows:
        ids.append(row.id)
        yield row


def cmd_emit(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    reg = app.types(config)
    event = reg.decode_event(args.event, _json_object(args.data, "--data"))
    requests = []
    for routed in reg.route(event, config):
        job_type, payload = reg.encode(routed.job)
        requests.append(JobRequest(job_type, payload, None, routed.run_after, unique_key=routed.unique_key))
    rows = prepare_rows(reg, requests, default_max_attempts=config.worker.default_max_attempts)
    ids = _with_backend(config, lambda backend: backend.insert(rows))  # a duplicate's: its holder's
    if args.json:
        _emit_json(out, {"job_ids": ids})
    else:
        for job_id in ids:
            print(job_id, file=out)
    return 0


def _list_flags(p: argparse.ArgumentParser, *, suppress: bool) -> None:
    """`jobs` and `jobs list` take the same flags; on `list` they must not overwrite what
    was given before it (argparse copies a sub-parser's defaults over the parent's)."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    p.add_argument("--status", choices=[s.value for s in Status], default=default(None))
    p.add_argument("--type", dest="job_type", metavar="JOB_TYPE", default=default(None))
    p.add_argument("--limit", type=int, default=default(50), metavar="N", help="jobs per page (default 50)")
    p.add_argument("--page", type=int, default=default(1), metavar="N", help="page number, from 1 (newest first)")
    p.add_argument("--priority", type=int, default=default(None), metavar="N", help="only jobs of this priority")
    p.add_argument("--order", choices=LIST_ORDERS, default=default("newest"),
                   help="newest first (the default), or claim: the order workers take pending jobs in "
                        "(priority, then due time, then insertion)")


def cmd_jobs(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    action = args.jobs_command or "list"
    args.again = app.command  # what its hints print to run a command again (with the --app in use)
    return JOB_ACTIONS[action](args, config, out)


def _jobs_list(args: argparse.Namespace, config: Config, out: TextIO) -> int:
    from .admin import console

    if not 1 <= args.limit <= 10_000:
        raise UsageError(f"--limit must be from 1 to 10000, got {args.limit}")
    if not 1 <= args.page <= 10_000_000:
        raise UsageError(f"--page must be from 1 to 10000000, got {args.page}")
    if args.status is not None and args.status not in set(Status):
        raise UsageError(f"unknown status {args.status!r}; expected one of {', '.join(Status)}")
    if args.priority is not None and not PRIORITY_MIN <= args.priority <= PRIORITY_MAX:
        raise UsageError(f"--priority must be from {PRIORITY_MIN} to {PRIORITY_MAX}, got {args.priority}")
    offset = (args.page - 1) * args.limit
    jobs, total = _with_backend(config, lambda backend: backend.list(
        status=args.status, job_type=args.job_type, limit=args.limit, offset=offset, priority=args.priority,
        order=args.order))
    if args.json:  # the shape of GET /admin/jobs
        _emit_json(out, {"items": [j.to_json() for j in jobs], "total": total, "page": args.page, "per_page": args.limit})
    else:
        console.jobs_table(out, jobs, total, offset=offset)
    return 0


def _no_job(job_id: str) -> CliError:
    return CliError(f"error: no job with id {job_id!r}", 1)


def _jobs_show(args: argparse.Namespace, config: Config, out: TextIO) -> int:
    from .admin import console

    async def work(backend: Backend) -> tuple[JobRecord | None, dict[str, str | None]]:
        job = await backend.get(args.id)
        statuses: dict[str, str | None] = {}  # of the parents and children it lists (None: gone)
        if job is not None and not args.json:
            for relative in dict.fromkeys((*job.parents, *job.children)):
                found = await backend.get(relative)
                statuses[relative] = None if found is None else found.status
        return job, statuses

    job, statuses = _with_backend(config, work)
    if job is None:
        raise _no_job(args.id)
    if args.json:
        _emit_json(out, job.to_json())
    else:
        console.job_detail(out, job, statuses, command=args.again)
    return 0


def _jobs_retry(args: argparse.Namespace, config: Config, out: TextIO) -> int:
    if _bulk_filter(args, "retry", [args.id] if args.id else []) is not None:
        return _jobs_bulk(args, config, out, "retry")

    async def work(backend: Backend) -> tuple[str, JobRecord]:
        was = await backend.get(args.id)
        return ("dead" if was is None else was.status), await backend.revive(args.id)

    try:
        was, job = _with_backend(config, work)
    except LookupError:
        raise _no_job(args.id) from None
    if args.json:
        _emit_json(out, job.to_json())
    else:
        print(f"job {job.id}: {was} → pending (attempts reset, due now)", file=out)
    return 0


def _jobs_delete(args: argparse.Namespace, config: Config, out: TextIO) -> int:
    if _bulk_filter(args, "delete", [args.id] if args.id else []) is not None:
        return _jobs_bulk(args, config, out, "delete")
    try:
        _with_backend(config, lambda backend: backend.delete(args.id))
    except LookupError:
        raise _no_job(args.id) from None
    if args.json:
        _emit_json(out, {"deleted": args.id})
    else:
        print(f"deleted job {args.id}", file=out)
    return 0


CANCEL_REASON = "by an operator (python -m pipeline jobs cancel)"  # in the error of a job cancelled here


def _jobs_cancel(args: argparse.Namespace, config: Config, out: TextIO) -> int:
    """Per id: cancelled, running: cancel requested, already <status>, no such job (exit 1 if any is
    unknown); or, with --type/--status, every matching job in batches."""
    from . import control

    if _bulk_filter(args, "cancel", args.ids) is not None:
        return _jobs_bulk(args, config, out, "cancel")
    ids = list(args.ids)
    answers = _with_backend(config, lambda backend: control.cancel_jobs(backend, ids, reason=CANCEL_REASON))
    if args.json:
        _emit_json(out, {"jobs": [a.to_json() for a in answers]})
    else:
        for answer in answers:
            print(f"{answer.id}: {answer.text()}", file=out)
    unknown = [a.id for a in answers if a.outcome == "unknown"]
    if unknown:
        print(f"error: no job with id {', '.join(repr(i) for i in unknown)}", file=sys.stderr)
        return 1
    return 0


def _bulk_filter(args: argparse.Namespace, action: str, ids: Sequence[str]) -> Any:
    """The bulk filter --type/--status give (None: the action is by id); UsageError for both or neither."""
    from .control import JobFilter

    given = args.bulk_type is not None or args.bulk_status is not None
    if given and ids:
        raise UsageError(f"jobs {action} takes ids or --type/--status, not both")
    if not given:
        if not ids:
            needs = "--status (and maybe --type)" if action == "delete" else "--type and/or --status"
            raise UsageError(f"jobs {action} needs {'a job id' if action != 'cancel' else 'job ids'}, or {needs} "
                             "for every matching job")
        return None
    return JobFilter.checked(action, args.bulk_status, args.bulk_type, status_name="--status", type_name="--type")


def _jobs_bulk(args: argparse.Namespace, config: Config, out: TextIO, action: str) -> int:
    from . import control

    job_filter = _bulk_filter(args, action, [])
    outcome = _with_backend(config, lambda backend: control.bulk(backend, job_filter, reason=CANCEL_REASON))
    if args.json:
        _emit_json(out, outcome.to_json())
    else:
        print(outcome.text(), file=out)
    return 0


def _jobs_cleanup(args: argparse.Namespace, config: Config, out: TextIO) -> int:
    from .admin import inputs

    statuses = tuple(dict.fromkeys(args.statuses or ("completed", "dead")))
    older = None if args.older_than is None else inputs.seconds(args.older_than, "--older-than")
    deleted = _with_backend(config, lambda backend: backend.cleanup(statuses=statuses, older_than_seconds=older))
    if args.json:
        _emit_json(out, {"deleted": deleted})
    else:
        age = "" if args.older_than is None else f" last updated more than {args.older_than:g} s ago"
        print(f"deleted {deleted} {' and '.join(statuses)} jobs{age}", file=out)
    return 0


JOB_ACTIONS: dict[str, Callable[[argparse.Namespace, Config, TextIO], int]] = {
    "list": _jobs_list,
    "show": _jobs_show,
    "retry": _jobs_retry,
    "delete": _jobs_delete,
    "cancel": _jobs_cancel,
    "cleanup": _jobs_cleanup,
}


def cmd_batches(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    """batches show ID: exit 1 naming the id if the store has no such batch."""
    from . import control
    from .admin import console

    if not 1 <= args.limit <= 10_000:
        raise UsageError(f"--limit must be from 1 to 10000, got {args.limit}")
    if not 0 <= args.offset <= 10**12:
        raise UsageError(f"--offset must be from 0 to {10**12}, got {args.offset}")
    view = _with_backend(config, lambda backend: control.batch_view(backend, args.id, limit=args.limit, offset=args.offset))
    if view is None:
        raise CliError(f"error: no batch with id {args.id!r}", 1)
    if args.json:
        _emit_json(out, view.to_json())
    else:
        console.batch_detail(out, view)
    return 0


def cmd_types(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    """types list / pause NAME / resume NAME. An unknown name: exit 1, naming the app's types."""
    from . import control
    from .admin import console

    action = args.types_command or "list"
    if action == "list":
        # the app's registry with its handlers: a type's own concurrency is set where its handler is
        registry = app.registry(config)
        found = _with_backend(config, lambda backend: control.types_summary(backend, registry, config))
        if args.json:  # the shape of GET /admin/types
            _emit_json(out, {"types": [t.to_json() for t in found]})
        else:
            console.types_table(out, found)
        return 0
    paused = action == "pause"
    try:
        _with_backend(config, lambda backend: control.set_paused(backend, app.types(config), args.name, paused))
    except LookupError as exc:
        raise CliError(f"error: {exc}", 1) from None
    if args.json:
        _emit_json(out, {"name": args.name, "paused": paused})
    elif paused:
        print(f"type {args.name}: paused (no new job of it starts in any process; running ones finish; "
              "enqueues are still accepted)", file=out)
    else:
        print(f"type {args.name}: resumed", file=out)
    return 0


def cmd_schedule(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    action = args.schedule_command or "list"
    if action == "add":
        return _schedule_add(args, config, app, out)
    if action == "list":
        return _schedule_list(args, config, out)
    return _schedule_change(args, config, out, action)


def _schedule_add(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    from .backends.base import ScheduleRecord
    from .schedules import make_schedule

    reg = app.types(config)
    payload = _json_object("{}" if args.payload is None else args.payload, "--payload")
    record = ScheduleRecord.of(make_schedule(reg, args.name, args.cron, args.job_type, payload, args.timezone), origin="operator")
    added = _with_backend(config, lambda backend: backend.put_schedule(record))  # checked before opening
    if args.json:
        _emit_json(out, added.to_json())
    else:
        print(f"schedule {added.name}: {added.job_type} at \"{added.cron}\" ({added.timezone}); next run {added.next_run}",
              file=out)
    return 0


def _schedule_list(args: argparse.Namespace, config: Config, out: TextIO) -> int:
    from .admin import console

    found = _with_backend(config, lambda backend: backend.schedules())
    if args.json:  # the shape of GET /admin/schedules
        _emit_json(out, {"schedules": [s.to_json() for s in found]})
    else:
        console.schedules_table(out, found)
    return 0


def _schedule_change(args: argparse.Namespace, config: Config, out: TextIO, action: str) -> int:
    from .schedules import check_name

    name = check_name(args.name)

    async def work(backend: Backend) -> Any:
        if action == "remove":
            return await backend.remove_schedule(name)
        return await backend.set_schedule_enabled(name, action == "resume")

    try:
        changed = _with_backend(config, work)
    except LookupError:
        raise CliError(f"error: no schedule named {name!r}", 1) from None
    if args.json:
        _emit_json(out, {"removed": name} if changed is None else changed.to_json())
    elif changed is None:
        print(f"removed schedule {name}", file=out)
    else:
        state = f"next run {changed.next_run}" if changed.enabled else "paused"
        print(f"schedule {name}: {state}", file=out)
    return 0


def cmd_stats(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    from .admin import console

    stats = _with_backend(config, lambda backend: backend.stats())
    if args.json:
        _emit_json(out, stats)
    else:
        console.stats_view(out, stats)
    return 0


def cmd_diagrams(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    import trio

    from .engine import diagrams
    from .service import record_wiring

    wiring = trio.run(record_wiring, None if app.is_site else app.registry(config))
    for path in diagrams.write(Path(args.out), wiring, Path(args.readme)):
        print(path, file=out)
    return 0


def cmd_search(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    from .site import schema
    from .site.search import print_search
    from .sqlite_files import connect

    if args.limit < 1:
        raise UsageError(f"--limit must be >= 1, got {args.limit}")
    from .site.settings import SiteSettings

    path = config.section(SiteSettings).database_path(config)
    conn = connect(path, busy_timeout_ms=config.sqlite.busy_timeout_ms, synchronous=config.sqlite.synchronous)
    try:
        schema.migrate(conn, path)
        return print_search(conn, args.query, limit=args.limit, out=out)
    finally:
        conn.close()


def cmd_demo(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    from .site.demo import run_demo

    return run_demo(config, Path(args.dir), timeout=args.timeout, verbose=args.verbose, out=out)


def cmd_bench(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    """Run benchmarks/bench.py with the arguments given after `bench`."""
    import subprocess

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "bench.py"
    if not script.is_file():
        raise CliError(f"error: {script} is not here: the benchmark comes with a source checkout of the project "
                       "(git clone, then pip install -e '.[bench]')", 2)
    return subprocess.run([sys.executable, str(script), *args.bench_args], check=False).returncode


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
