"""``stats``: counts by status and type, throughput, queue lag."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from ..config import Config
from .application import Application, AppSummary
from .store import emit_json, with_backend


def add_parsers(sub: Any, app: AppSummary, as_json: argparse.ArgumentParser) -> None:
    sub.add_parser("stats", parents=[as_json], help="counts by status and type, throughput, queue lag",
                   description="Counts by status and type, jobs finished per minute over the last hour, "
                   "and how long the oldest due pending job has waited.")


def cmd_stats(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    from ..admin import console

    stats = with_backend(config, lambda backend: backend.stats())
    if args.json:
        emit_json(out, stats)
    else:
        console.stats_view(out, stats)
    return 0
