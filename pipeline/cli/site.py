"""The bundled site's own commands, there only when it is the app: ``search`` and ``demo``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, TextIO

from ..config import Config
from ..errors import UsageError
from .application import Application


def add_parsers(sub: Any) -> None:
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


def cmd_search(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    from ..site import schema
    from ..site.search import print_search
    from ..sqlite_files import connect

    if args.limit < 1:
        raise UsageError(f"--limit must be >= 1, got {args.limit}")
    from ..site.settings import SiteSettings

    path = config.section(SiteSettings).database_path(config)
    conn = connect(path, busy_timeout_ms=config.sqlite.busy_timeout_ms, synchronous=config.sqlite.synchronous)
    try:
        schema.migrate(conn, path)
        return print_search(conn, args.query, limit=args.limit, out=out)
    finally:
        conn.close()


def cmd_demo(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    from ..site.demo import run_demo

    return run_demo(config, Path(args.dir), timeout=args.timeout, verbose=args.verbose, out=out)
