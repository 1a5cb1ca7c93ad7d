"""The service ``python -m pipeline`` runs: the pipeline and the admin API, until a signal.

Kept apart from the CLI so that the commands working on the database file directly
(``enqueue --from-file``, ``jobs``, ``stats``) start without importing trio and the actors.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from typing import Any

import trio

from .config import Config
from .engine import diagrams
from .registry import Registry
from .supervisor import METRICS_FD, SUPERVISOR_PID, report_metrics, supervised

log = logging.getLogger("pipeline")


SIGNAL_ECHO_SECONDS = 0.2


async def serve(config: Config, registry: Registry | None = None, *, ready: Callable[[Any], None] | None = None) -> None:
    """Run until SIGINT/SIGTERM, then shut down gracefully; a second signal exits at once.

    With ADMIN_ENABLED the admin API is served next to the workers (WORKER_ENABLED=false:
    the API alone). Its socket is bound before anything starts, so a busy port or a
    token-less non-loopback ADMIN_HOST fails at once; on shutdown it stops taking
    requests first, then the pipeline drains.
    """
    listener = None
    if config.admin.enabled:
        from .admin.server import open_admin_listener

        listener = open_admin_listener(config)
    try:
        await _serve(config, registry, listener, ready)
    finally:
        if listener is not None:
            listener.close()


async def _serve(config: Config, registry: Registry | None, listener: Any, ready: Callable[[Any], None] | None) -> None:
    from .engine.wiring import open_pipeline

    if registry is None:  # the bundled site, as `python -m pipeline` runs it
        from .site import default_registry

        registry = default_registry(config)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        stop = trio.Event()

        async def watch() -> None:
            first_at = None
            async for signum in signals:
                if first_at is not None:
                    # the same signal sent to the process and to its group (timeout, some
                    # supervisors) arrives twice at once: only a later one is a second signal
                    if trio.current_time() - first_at < SIGNAL_ECHO_SECONDS:
                        continue
                    log.warning("second %s: exiting at once; leases will return running jobs", signal.Signals(signum).name)
                    os._exit(128 + signum)
                first_at = trio.current_time()
                log.info("%s: shutting down gracefully (again to exit at once)", signal.Signals(signum).name)
                stop.set()

        async with trio.open_nursery() as tn:
            tn.start_soon(watch)
            # the admin server's nursery is inside the pipeline's block: it stops first
            async with open_pipeline(config, registry) as pipeline, trio.open_nursery() as admin_tn:
                if supervised():  # a worker process of `--processes N` (both end with the outer nursery)
                    tn.start_soon(_watch_supervisor, stop)
                    fd = os.environ.get(METRICS_FD)
                    if fd is not None and fd.isdigit():
                        tn.start_soon(report_metrics, pipeline, int(fd))
                admin = "off"
                if listener is not None:
                    from .admin.server import run_admin_server

                    admin = await admin_tn.start(run_admin_server, pipeline, listener, stop.wait)
                handled = sorted(pipeline.registry.handled()) if config.worker.enabled else []
                log.info(
                    "pipeline running on %s (owner %s); workers %s; admin API %s; handling: %s",
                    pipeline.backend.url, pipeline.owner,
                    "on" if config.worker.enabled else "off", admin, ", ".join(handled) or "no job types",
                )
                if ready is not None:
                    ready(pipeline)
                await stop.wait()
            log.info("pipeline stopped")
            tn.cancel_scope.cancel()


async def _watch_supervisor(stop: trio.Event) -> None:
    """A worker process whose supervisor is gone (killed) stops gracefully rather than run on alone."""
    supervisor = int(os.environ[SUPERVISOR_PID])
    while True:
        if os.getppid() != supervisor:
            break
        await trio.sleep(1.0)
    log.warning("the supervisor (pid %d) is gone: stopping gracefully", supervisor)
    stop.set()


async def record_wiring(registry: Registry | None) -> diagrams.Wiring:
    """Open a throw-away pipeline on a temporary file to record the channels it creates."""
    import tempfile

    from .engine.wiring import open_pipeline
    from .site import GenerateSitemap, types_registry

    reg = registry or types_registry()
    if not reg.handled():
        reg.register("generate_sitemap", GenerateSitemap, _noop)
    with tempfile.TemporaryDirectory() as tmp:
        config = Config(database_url=f"sqlite:///{tmp}/wiring.db")
        async with open_pipeline(config, reg) as pipeline:
            return pipeline.wiring


async def _noop(job: Any, ctx: Any) -> None:
    return None
