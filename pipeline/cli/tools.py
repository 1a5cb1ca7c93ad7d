"""This repository's own tools, with the bundled demo only: ``diagrams`` and ``bench``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

from ..config import Config
from .application import Application
from .parsing import CliError


def add_parsers(sub: Any) -> None:
    """This repository's tools, for its own drawings and figures: with the bundled demo only, not in an
    application's CLI (whose operators have no use for them)."""
    p = sub.add_parser("diagrams", help="redraw diagrams/*.mmd and docs/architecture.md's copies from the code")
    p.add_argument("--out", default="diagrams")
    p.add_argument("--readme", default="docs/architecture.md", help="the Markdown page that holds copies of the drawings")

    # every flag after `bench` is benchmarks/bench.py's own (`python -m pipeline bench --help`)
    sub.add_parser("bench", add_help=False, help="measure throughput and latency against Huey's SQLite backend "
                   "(benchmarks/bench.py of a source checkout; --quick: under a minute)")


OWN_TOOLS = ("diagrams", "bench")  # commands of this repository's checkout, shown with the bundled demo only


def cmd_diagrams(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    import trio

    from ..engine import diagrams
    from ..service import record_wiring

    wiring = trio.run(record_wiring, None if app.is_site else app.registry(config))
    for path in diagrams.write(Path(args.out), wiring, Path(args.readme)):
        print(path, file=out)
    return 0


def cmd_bench(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    """Run benchmarks/bench.py with the arguments given after `bench`."""
    import subprocess

    script = Path(__file__).resolve().parent.parent.parent / "benchmarks" / "bench.py"
    if not script.is_file():
        raise CliError(f"error: {script} is not here: the benchmark comes with a source checkout of the project "
                       "(git clone, then pip install -e '.[bench]')", 2)
    return subprocess.run([sys.executable, str(script), *args.bench_args], check=False).returncode
