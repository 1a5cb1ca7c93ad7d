"""``batches show``: a batch's jobs by status, its callback, a page of its jobs."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from ..config import Config
from ..errors import UsageError
from .application import Application, AppSummary
from .parsing import CliError, Parser
from .store import emit_json, with_backend

BATCHES_EXAMPLES = """\
examples:
  python -m pipeline batches show 01920c1e-...                 # its jobs by status, its callback, its first 50 jobs
  python -m pipeline batches show 01920c1e-... --offset 50     # the next 50
  python -m pipeline batches show 01920c1e-... --json
"""


def add_parsers(sub: Any, app: AppSummary, as_json: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "batches", parents=[as_json], formatter_class=argparse.RawDescriptionHelpFormatter,
        help="batches of jobs with a callback (enqueue_batch, POST /admin/batches): show one's progress",
        description="A batch (enqueue_batch, POST /admin/batches): its jobs and the callback that runs once every one "
        "of them has ended.",
        epilog=BATCHES_EXAMPLES,
    )
    actions = p.add_subparsers(dest="batches_command", parser_class=Parser, metavar="ACTION", required=True)
    a = actions.add_parser("show", parents=[as_json], help="a batch's jobs counted by status, its callback, a page of its jobs",
                           description="Show a batch: its jobs counted by status, how many have finished, its callback "
                           "and the callback's status, and a page of its jobs in the order they were enqueued "
                           "(exit 1 if there is no such batch).")
    a.add_argument("id")
    a.add_argument("--limit", type=int, default=50, metavar="N", help="jobs per page (default 50)")
    a.add_argument("--offset", type=int, default=0, metavar="N", help="jobs to skip (default 0)")


def cmd_batches(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    """batches show ID: exit 1 naming the id if the store has no such batch."""
    from .. import control
    from ..admin import console

    if not 1 <= args.limit <= 10_000:
        raise UsageError(f"--limit must be from 1 to 10000, got {args.limit}")
    if not 0 <= args.offset <= 10**12:
        raise UsageError(f"--offset must be from 0 to {10**12}, got {args.offset}")
    view = with_backend(config, lambda backend: control.batch_view(backend, args.id, limit=args.limit, offset=args.offset))
    if view is None:
        raise CliError(f"error: no batch with id {args.id!r}", 1)
    if args.json:
        emit_json(out, view.to_json())
    else:
        console.batch_detail(out, view)
    return 0
