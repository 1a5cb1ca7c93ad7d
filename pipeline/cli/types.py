"""``types``: the app's job types as the store sees them; pause and resume one in every process."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from ..config import Config
from .application import Application, AppSummary
from .parsing import CliError, Parser
from .store import emit_json, with_backend

TYPES_EXAMPLES = """\
examples:
  python -m pipeline types                          # = types list: each type, paused or not, limits, counts
  python -m pipeline types pause send_email         # no new send_email job starts, in any process
  python -m pipeline types resume send_email
"""


def add_parsers(sub: Any, app: AppSummary, as_json: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "types", parents=[as_json], formatter_class=argparse.RawDescriptionHelpFormatter,
        help="job types: list (paused or not, limits, counts), pause, resume (bare `types` lists)",
        description="The app's job types as the job store (DATABASE_URL) sees them. A paused type is paused for every "
        "process on the store, across restarts, until resumed: no new job of it starts (within a second), running "
        "ones finish, enqueues are still accepted. Without an action, lists them.",
        epilog=app.examples(TYPES_EXAMPLES),
    )
    actions = p.add_subparsers(dest="types_command", parser_class=Parser, metavar="ACTION")
    actions.add_parser("list", parents=[as_json], help="each type: paused or not, concurrency, limits, jobs by status",
                       description="List each job type: paused or active, its workers per process, its global and rate "
                       "limits, its jobs by status.")
    for action, text in (("pause", "stop starting jobs of a type, in every process (enqueues are still accepted)"),
                         ("resume", "start jobs of a paused type again")):
        a = actions.add_parser(action, parents=[as_json], help=text, description=text[0].upper() + text[1:] + ".")
        a.add_argument("name", help=f"one of the app's: {', '.join(app.job_types) or 'none'}")


def cmd_types(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    """types list / pause NAME / resume NAME. An unknown name: exit 1, naming the app's types."""
    from .. import control
    from ..admin import console

    action = args.types_command or "list"
    if action == "list":
        # the app's registry with its handlers: a type's own concurrency is set where its handler is
        registry = app.registry(config)
        found = with_backend(config, lambda backend: control.types_summary(backend, registry, config))
        if args.json:  # the shape of GET /admin/types
            emit_json(out, {"types": [t.to_json() for t in found]})
        else:
            console.types_table(out, found)
        return 0
    paused = action == "pause"
    try:
        with_backend(config, lambda backend: control.set_paused(backend, app.types(config), args.name, paused))
    except LookupError as exc:
        raise CliError(f"error: {exc}", 1) from None
    if args.json:
        emit_json(out, {"name": args.name, "paused": paused})
    elif paused:
        print(f"type {args.name}: paused (no new job of it starts in any process; running ones finish; "
              "enqueues are still accepted)", file=out)
    else:
        print(f"type {args.name}: resumed", file=out)
    return 0
