"""``python -m pipeline``: run the service, or work on the database directly.

Exit status: 0 success; 2 bad usage or configuration (the message names the problem);
1 a runtime failure (the database refused, a file is unreadable).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sqlite3
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import trio

from . import diagrams, migrations, store
from .clock import format_ts, now_ts, to_epoch
from .config import Config
from .errors import ConfigError, PipelineError, StoreError, UsageError
from .outbox import JobRequest, prepare_rows
from .registry import Registry
from .states import Status

log = logging.getLogger("pipeline")


class CliError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's own exit 2, with our prefix
        self.print_usage(sys.stderr)
        raise CliError(f"{self.prog}: {message}", 2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m pipeline",
        description="Durable background jobs for trio applications, on SQLite. "
        "With no command, runs the service (same as `run`).",
    )
    parser.add_argument("--env-file", default=".env", help="read settings from this file too (default: .env)")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    sub.add_parser("run", help="run every actor until SIGINT/SIGTERM (the default)")

    p = sub.add_parser("enqueue", help="insert one job; prints its id")
    p.add_argument("job_type")
    p.add_argument("--payload", default="{}", help="the job's fields as a JSON object (default {})")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--delay", type=float, metavar="SECONDS", help="run no sooner than this many seconds from now")
    when.add_argument("--run-after", metavar="ISO8601", help="run no sooner than this time (UTC if no offset)")
    p.add_argument("--max-attempts", type=int, metavar="N")
    p.add_argument("--priority", type=int, default=5, metavar="N", help="lower runs first (default 5)")

    p = sub.add_parser("emit", help="emit an event: insert the jobs it routes to; prints their ids")
    p.add_argument("event", help="e.g. UserRegistered")
    p.add_argument("--data", default="{}", help="the event's fields as a JSON object")

    p = sub.add_parser("jobs", help="list jobs, newest first")
    p.add_argument("--status", choices=[s.value for s in Status])
    p.add_argument("--type", dest="job_type", metavar="JOB_TYPE")
    p.add_argument("--limit", type=int, default=50, metavar="N")
    p.add_argument("--json", action="store_true", help="one JSON array of job objects")

    p = sub.add_parser("stats", help="counts by status and by type")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("search", help="full-text search of the published posts (the index rebuild_search_index keeps)")
    p.add_argument("query", help='FTS5 query: words (all must match), "a phrase", prefix*, a OR b, NOT c')
    p.add_argument("--limit", type=int, default=20, metavar="N", help="show at most N hits (default 20)")

    p = sub.add_parser("demo", help="seed demo content in a folder of its own, run every handler on it, print a report")
    p.add_argument("--dir", default="pipeline-demo", help="where the demo's database, media and sitemap go (default ./pipeline-demo)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS", help="give up waiting for the jobs after this long")
    p.add_argument("--verbose", action="store_true", help="also print the pipeline's log (stderr)")

    p = sub.add_parser("diagrams", help="redraw diagrams/*.mmd and the README's copies from the code")
    p.add_argument("--out", default="diagrams")
    p.add_argument("--readme", default="README.md")
    return parser


def main(argv: Sequence[str] | None = None, *, registry: Registry | None = None, stdout: TextIO | None = None) -> int:
    out = stdout or sys.stdout
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        config = Config.from_env(env_file=args.env_file)
        command = args.command or "run"
        return COMMANDS[command](args, config, registry, out)
    except CliError as exc:
        print(exc, file=sys.stderr)
        return exc.code
    except (ConfigError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (PipelineError, sqlite3.Error, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except BaseExceptionGroup as group:
        # errors raised inside the service's nurseries arrive grouped; show the leaves
        # that we expect (a refused database, a bad setting) as messages, not tracebacks
        leaves = list(_leaves(group))
        if not all(isinstance(e, (PipelineError, sqlite3.Error, OSError)) for e in leaves):
            raise
        for exc in leaves:
            print(f"error: {exc}", file=sys.stderr)
        return 2 if all(isinstance(e, (ConfigError, UsageError)) for e in leaves) else 1


def _leaves(exc: BaseException) -> Any:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


# -- the service ------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace, config: Config, registry: Registry | None, out: TextIO) -> int:
    from .logs import configure

    configure(config)
    trio.run(serve, config, registry)
    return 0


async def serve(config: Config, registry: Registry | None = None, *, ready: Callable[[Any], None] | None = None) -> None:
    """Run until SIGINT/SIGTERM, then shut down gracefully; a second signal exits at once."""
    from .app import open_pipeline

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        stop = trio.Event()

        async def watch() -> None:
            async for signum in signals:
                if stop.is_set():
                    log.warning("second %s: exiting at once; leases will return running jobs", signal.Signals(signum).name)
                    os._exit(128 + signum)
                log.info("%s: shutting down gracefully (again to exit at once)", signal.Signals(signum).name)
                stop.set()

        async with trio.open_nursery() as tn:
            tn.start_soon(watch)
            async with open_pipeline(config, registry) as pipeline:
                handled = sorted(pipeline.registry.handled()) if config.worker_enabled else []
                log.info(
                    "pipeline running on %s (owner %s); workers %s; handling: %s",
                    config.database_url, pipeline.queue.owner,
                    "on" if config.worker_enabled else "off", ", ".join(handled) or "no job types",
                )
                if ready is not None:
                    ready(pipeline)
                await stop.wait()
            log.info("pipeline stopped")
            tn.cancel_scope.cancel()


# -- commands on the database file ------------------------------------------------------------


def _open(config: Config) -> sqlite3.Connection:
    conn = store.connect(config.database_path, busy_timeout_ms=config.sqlite_busy_timeout_ms, synchronous=config.sqlite_synchronous)
    try:
        migrations.migrate(conn, config.database_path)
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise StoreError(f"database {config.database_path} is unreadable or corrupt: {exc}") from None
    except BaseException:
        conn.close()
        raise
    return conn


def _registry(config: Config, registry: Registry | None) -> Registry:
    if registry is not None:
        return registry
    from .handlers import default_registry

    return default_registry(config)


def _json_object(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def cmd_enqueue(args: argparse.Namespace, config: Config, registry: Registry | None, out: TextIO) -> int:
    reg = _registry(config, registry)
    payload = _json_object(args.payload, "--payload")
    if args.delay is not None and not (0 <= args.delay < 10**9):
        raise UsageError(f"--delay must be a number of seconds >= 0, got {args.delay}")
    run_after = format_ts(to_epoch(now_ts()) + args.delay) if args.delay is not None else args.run_after
    request = JobRequest(args.job_type, payload, args.max_attempts, run_after, args.priority)
    (row,) = prepare_rows(reg, [request], default_max_attempts=config.worker_default_max_attempts)  # validates before opening
    conn = _open(config)
    try:
        with store.write_transaction(conn):
            store.insert_jobs(conn, [row])
    finally:
        conn.close()
    print(row.id, file=out)
    return 0


def cmd_emit(args: argparse.Namespace, config: Config, registry: Registry | None, out: TextIO) -> int:
    reg = _registry(config, registry)
    event = reg.decode_event(args.event, _json_object(args.data, "--data"))
    requests = []
    for routed in reg.route(event, config):
        job_type, payload = reg.encode(routed.job)
        requests.append(JobRequest(job_type, payload, None, routed.run_after))
    rows = prepare_rows(reg, requests, default_max_attempts=config.worker_default_max_attempts)
    conn = _open(config)
    try:
        with store.write_transaction(conn):
            store.insert_jobs(conn, rows)
    finally:
        conn.close()
    for row in rows:
        print(row.id, file=out)
    return 0


def cmd_jobs(args: argparse.Namespace, config: Config, registry: Registry | None, out: TextIO) -> int:
    if args.limit < 1:
        raise UsageError(f"--limit must be >= 1, got {args.limit}")
    conn = _open(config)
    try:
        jobs, total = store.list_jobs(conn, status=args.status, job_type=args.job_type, limit=args.limit)
    finally:
        conn.close()
    if args.json:
        json.dump([j.to_json() for j in jobs], out, indent=2, ensure_ascii=False)
        out.write("\n")
        return 0
    header = ("ID", "TYPE", "STATUS", "ATTEMPTS", "PRIORITY", "RUN AFTER", "ERROR")
    rows = [
        (j.id, j.job_type, j.status, f"{j.attempts}/{j.max_attempts}", str(j.priority), j.run_after,
         (j.error or "").splitlines()[0][:60] if j.error else "")
        for j in jobs
    ]
    _table(out, header, rows)
    print(f"{len(jobs)} of {total} jobs", file=out)
    return 0


def cmd_stats(args: argparse.Namespace, config: Config, registry: Registry | None, out: TextIO) -> int:
    conn = _open(config)
    try:
        stats = store.stats(conn)
    finally:
        conn.close()
    if args.json:
        json.dump(stats, out, indent=2)
        out.write("\n")
        return 0
    statuses = [s.value for s in Status]
    _table(out, ("STATUS", "JOBS"), [(s, str(stats["by_status"][s])) for s in statuses])
    print(file=out)
    _table(out, ("TYPE", *(s.upper() for s in statuses)),
           [(t, *(str(c[s]) for s in statuses)) for t, c in sorted(stats["by_type"].items())])
    return 0


def cmd_diagrams(args: argparse.Namespace, config: Config, registry: Registry | None, out: TextIO) -> int:
    wiring = trio.run(_record_wiring, registry)
    for path in diagrams.write(Path(args.out), wiring, Path(args.readme)):
        print(path, file=out)
    return 0


async def _record_wiring(registry: Registry | None) -> diagrams.Wiring:
    """Open a throw-away pipeline on a temporary file to record the channels it creates."""
    import tempfile

    from .app import open_pipeline
    from .jobs import GenerateSitemap

    reg = registry or Registry.with_builtins()
    if not reg.handled():
        reg.register("generate_sitemap", GenerateSitemap, _noop)
    with tempfile.TemporaryDirectory() as tmp:
        config = Config(database_url=f"sqlite:///{tmp}/wiring.db")
        async with open_pipeline(config, reg) as pipeline:
            return pipeline.wiring


async def _noop(job: Any, ctx: Any) -> None:
    return None


def cmd_search(args: argparse.Namespace, config: Config, registry: Registry | None, out: TextIO) -> int:
    from .handlers.search import print_search

    if args.limit < 1:
        raise UsageError(f"--limit must be >= 1, got {args.limit}")
    conn = _open(config)
    try:
        return print_search(conn, args.query, limit=args.limit, out=out)
    finally:
        conn.close()


def cmd_demo(args: argparse.Namespace, config: Config, registry: Registry | None, out: TextIO) -> int:
    from .demo import run_demo

    return run_demo(config, Path(args.dir), registry=registry, timeout=args.timeout, verbose=args.verbose, out=out)


def _table(out: TextIO, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(), file=out)
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip(), file=out)


COMMANDS: dict[str, Callable[[argparse.Namespace, Config, Registry | None, TextIO], int]] = {
    "run": cmd_run,
    "enqueue": cmd_enqueue,
    "emit": cmd_emit,
    "jobs": cmd_jobs,
    "stats": cmd_stats,
    "diagrams": cmd_diagrams,
    "search": cmd_search,
    "demo": cmd_demo,
}
