"""``run`` (the default command): the service, in one process or under a supervisor."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from ..config import Config
from ..errors import UsageError
from .application import Application


def add_parsers(parser: argparse.ArgumentParser, sub: Any) -> None:
    """``run``, and its --processes, which is also taken before the command (``python -m pipeline
    --processes 4``: no command runs the service)."""
    parser.add_argument("--processes", type=int, metavar="N", default=None,
                        help="run: worker processes under one supervisor (default WORKER_PROCESSES, else one per core)")
    p = sub.add_parser("run", help="run the workers and the admin API until SIGINT/SIGTERM (the default)",
                       description="Run the service: the workers (WORKER_ENABLED) and the admin API and dashboard on "
                       "ADMIN_HOST:ADMIN_PORT (ADMIN_ENABLED), until SIGINT/SIGTERM; then stop gracefully. With "
                       "--processes N (default: one per core), a supervisor runs N worker processes and the admin API.")
    p.add_argument("--processes", type=int, metavar="N", default=argparse.SUPPRESS,
                   help="worker processes under one supervisor (default WORKER_PROCESSES, else one per core)")


def cmd_run(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    from ..logs import configure

    configure(config)
    import trio

    from ..service import serve
    from ..supervisor import supervise, supervised

    count = config.worker.process_count() if args.processes is None else args.processes
    if count < 1:
        raise UsageError(f"--processes must be 1 or more, got {count}")
    registry = app.registry(config)  # the bundled site's: every handler attached, its settings checked
    if config.worker.asyncio_loop != "asyncio":  # asked for uvloop: refused at start (exit 2) when it is missing
        from ..engine.asyncio_host import check_loop

        check_loop(config.worker.asyncio_loop)
    if count > 1 and config.worker.enabled and not supervised():
        # the supervisor runs no handler: its admin API validates jobs and events (the site's
        # types alone; the worker processes import the handlers' libraries)
        trio.run(supervise, config, app.types(config) if app.is_site else registry, count)
    elif config.worker.enabled and registry.uses_asyncio():
        # asyncio handlers: the process's trio run is the guest of an asyncio loop (WORKER_ASYNCIO_LOOP),
        # one loop shared by every asyncio handler of the process (engine/asyncio_host.py)
        from ..engine import asyncio_host

        asyncio_host.run(serve, config, registry, loop=config.worker.asyncio_loop)
    else:  # one process: everything in it, as a worker process of a supervisor is
        trio.run(serve, config, registry)
    return 0
