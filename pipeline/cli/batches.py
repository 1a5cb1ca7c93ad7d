"""``batches show``: a batch's jobs by status, its callback, a page of its jobs."""

from __future__ import annotations

import argparse
from typing import TextIO

from ..config import Config
from ..errors import UsageError
from .application import Application
from .parsing import CliError
from .store import _emit_json, _with_backend

BATCHES_EXAMPLES = """\
examples:
  python -m pipeline batches show 01920c1e-...                 # its jobs by status, its callback, its first 50 jobs
  python -m pipeline batches show 01920c1e-... --offset 50     # the next 50
  python -m pipeline batches show 01920c1e-... --json
"""


def cmd_batches(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    """batches show ID: exit 1 naming the id if the store has no such batch."""
    from .. import control
    from ..admin import console

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
