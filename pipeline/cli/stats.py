"""``stats``: counts by status and type, throughput, queue lag."""

from __future__ import annotations

import argparse
from typing import TextIO

from ..config import Config
from .application import Application
from .store import _emit_json, _with_backend


def cmd_stats(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    from ..admin import console

    stats = _with_backend(config, lambda backend: backend.stats())
    if args.json:
        _emit_json(out, stats)
    else:
        console.stats_view(out, stats)
    return 0
