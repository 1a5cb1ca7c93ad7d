"""``types``: the app's job types as the store sees them; pause and resume one in every process."""

from __future__ import annotations

import argparse
from typing import TextIO

from ..config import Config
from .application import Application
from .parsing import CliError
from .store import _emit_json, _with_backend

TYPES_EXAMPLES = """\
examples:
  python -m pipeline types                          # = types list: each type, paused or not, limits, counts
  python -m pipeline types pause send_email         # no new send_email job starts, in any process
  python -m pipeline types resume send_email
"""


def cmd_types(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    """types list / pause NAME / resume NAME. An unknown name: exit 1, naming the app's types."""
    from .. import control
    from ..admin import console

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
