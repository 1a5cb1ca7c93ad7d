"""The service ``python -m pipeline`` runs: the pipeline and the admin API, until a signal.

Kept apart from the CLI so that the commands working on the database file directly
(``enqueue --from-file``, ``jobs``, ``stats``) start without importing trio and the actors.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any, NoReturn

import trio

from .config import Config
from .engine import diagrams
from .registry import Registry
from .supervisor import METRICS_FD, SIGNAL_ECHO_SECONDS, SUPERVISOR_PID, report_metrics, supervised

log = logging.getLogger("pipeline")

# at a second signal: the most the exit waits for the Ledger's batch in flight and its log lines
# (a supervisor ends its worker processes a second after passing the signal on)
LAST_BATCH_WAIT = 0.5


async def serve(config: Config, registry: Registry, *, ready: Callable[[Any], None] | None = None) -> None:
    """Run ``registry``'s application (``--app``; the CLI chooses it) until SIGINT/SIGTERM, then
    shut down gracefully; a second signal exits at once.

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


async def _serve(config: Config, registry: Registry, listener: Any, ready: Callable[[Any], None] | None) -> None:
    from .engine.wiring import open_pipeline

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        stop = trio.Event()
        opened: list[Any] = []  # the pipeline, once open

        async def watch() -> None:
            first_at = None
            async for signum in signals:
                if first_at is not None:
                    # the same signal sent to the process and to its group (timeout, some
                    # supervisors) arrives twice at once: only a later one is a second signal
                    if trio.current_time() - first_at < SIGNAL_ECHO_SECONDS:
                        continue
                    await _exit_at_once(signum, opened[0] if opened else None)
                first_at = trio.current_time()
                log.info("%s: shutting down gracefully (again to exit at once)", signal.Signals(signum).name)
                stop.set()

        async with trio.open_nursery() as tn:
            tn.start_soon(watch)
            # the admin server's nursery is inside the pipeline's block: it stops first
            role = "worker" if config.worker.enabled else "admin"  # its Postgres sessions' application_name
            async with open_pipeline(config, registry, role=role) as pipeline, trio.open_nursery() as admin_tn:
                opened.append(pipeline)
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


async def _exit_at_once(signum: int, pipeline: Any) -> NoReturn:
    """The second signal: exit now, without waiting for the running jobs (their leases return
    them), but with the log of every outcome already committed written out: os._exit skips
    the buffered outcome lines' flush at exit (logs.py)."""
    from .logs import flush

    log.warning("second %s: exiting at once; leases will return running jobs", signal.Signals(signum).name)
    if pipeline is not None:
        with trio.move_on_after(LAST_BATCH_WAIT):
            await _hold_the_ledger(pipeline)
    flush()
    os._exit(128 + signum)


async def _hold_the_ledger(pipeline: Any) -> None:
    """Let the Ledger's batch in flight land and its outcomes' lines be written, and let no
    other batch start: a commit that outlived the process would be an outcome without its line
    (without this, 2 runs of 6 of tests/test_supervisor_signals.py's second-signal test lost one).
    Every backend's Ledger writes through its ``database.write``, one batch at a time; this takes
    that turn after the batch in flight and keeps it until the exit. (``database`` is not part of
    the Backend protocol, which has no such turn to take: a backend without it exits without.)"""
    db = getattr(pipeline.backend, "database", None)
    if db is None:
        return
    taken, never = trio.Event(), threading.Event()

    def hold(*_: Any) -> None:
        trio.from_thread.run_sync(taken.set)
        never.wait(10 * LAST_BATCH_WAIT)  # os._exit ends it first

    async def take_turn() -> None:
        try:
            await db.write(hold)
        except Exception:  # noqa: BLE001, S110 - the store is failing: nothing waits to be written
            pass

    trio.lowlevel.spawn_system_task(take_turn)
    await taken.wait()
    # the batch's callers hear their answers, and log their outcomes (imported here: trio.testing
    # imports pytest, 80 ms at every start of a service process otherwise)
    from trio.testing import wait_all_tasks_blocked

    await wait_all_tasks_blocked(0.005)


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
