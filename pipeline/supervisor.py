"""``python -m pipeline --processes N``: one supervisor, N worker processes, one admin API.

A pipeline process runs its handlers on one core (trio, one thread). The supervisor starts N
copies of the same command as worker processes on the same backend (``sys.orig_argv``: the
same script, the same registry) and serves the admin API itself, once, with a pipeline of its
own that runs no jobs (the API's reads and writes go through the backend, where every
process's jobs are). Each worker process:

* runs with ``ADMIN_ENABLED=false`` and knows it is supervised (PIPELINE_SUPERVISOR_PID), so it
  stops gracefully if its supervisor is gone;
* writes a snapshot of its job counters (``admin.metrics.Metrics``) to a pipe every second
  (PIPELINE_METRICS_FD), which the supervisor adds up for ``/metrics``.

A worker process that exits while the supervisor runs is started again after a back-off (1 s,
doubling up to 30 s, back to 1 s once one has lived a minute); the jobs it held come back
through their leases. SIGTERM or SIGINT stops every worker gracefully (each drains as a single
process does) and then the admin API, exit 0; a second signal ends them all at once (SIGKILL).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from .config import Config, masked_url
from .errors import ConfigError, PipelineError
from .registry import Registry

log = logging.getLogger("pipeline.supervisor")


class SupervisorError(PipelineError):
    """A worker process could not start: the service stops (exit status 1)."""

SUPERVISOR_PID = "PIPELINE_SUPERVISOR_PID"
METRICS_FD = "PIPELINE_METRICS_FD"
BACKOFF_FIRST, BACKOFF_MAX, STEADY_SECONDS = 1.0, 30.0, 60.0
SNAPSHOT_EVERY = 1.0


def supervised() -> bool:
    """Whether this process is a worker process some supervisor started."""
    return SUPERVISOR_PID in os.environ


@attrs.define(eq=False)
class Child:
    """One worker process slot: the process in it now, and what it last reported."""

    number: int
    process: trio.Process | None = None
    snapshot: dict[str, Any] | None = None
    starts: int = 0
    ready: bool = False  # it reported once: its pipeline ran (a start that fails is not retried)


class Supervisor:
    def __init__(self, config: Config, count: int, command: Sequence[str]) -> None:
        self.config = config
        self.children = [Child(n) for n in range(count)]
        self.command = list(command)
        self.stopped = trio.Event()  # the first signal came: no more starts
        self.retired: list[dict[str, Any]] = []  # the last snapshots of processes that ended

    def snapshots(self) -> list[dict[str, Any]]:
        """Every worker process's job counters, for ``/metrics``: the living ones' latest, and
        the last of each that ended (counters never go back when a process is replaced)."""
        return [*self.retired, *(child.snapshot for child in self.children if child.snapshot is not None)]

    def alive(self) -> int:
        return sum(1 for child in self.children if child.process is not None and child.process.returncode is None)

    async def run_child(self, child: Child) -> None:
        """Keep a worker process in this slot until the supervisor stops."""
        backoff = BACKOFF_FIRST
        while not self.stopping:
            read_fd, write_fd = os.pipe()
            env = {**os.environ, SUPERVISOR_PID: str(os.getpid()), METRICS_FD: str(write_fd), "ADMIN_ENABLED": "false"}
            started = time.monotonic()
            try:
                # a session of its own: a terminal's Ctrl-C reaches the supervisor alone, which passes
                # one SIGTERM on (two, close together, would end a worker process at once)
                process = await trio.lowlevel.open_process(self.command, env=env, pass_fds=(write_fd,), start_new_session=True)
            except OSError as exc:
                os.close(read_fd)
                log.error("could not start worker process %d: %s; trying again in %.0f s", child.number, exc, backoff)
            else:
                await self._watch(child, process, read_fd, backoff)
            finally:
                os.close(write_fd)
            if self.stopping:
                return
            if time.monotonic() - started >= STEADY_SECONDS:
                backoff = BACKOFF_FIRST
            with trio.move_on_after(backoff):
                await self.stopped.wait()
            backoff = min(backoff * 2, BACKOFF_MAX)

    @property
    def stopping(self) -> bool:
        return self.stopped.is_set()

    async def _watch(self, child: Child, process: trio.Process, read_fd: int, backoff: float) -> None:
        child.process, child.starts = process, child.starts + 1
        log.info("worker process %d started (pid %d)", child.number, process.pid)
        async with trio.open_nursery() as tn:
            tn.start_soon(self._read_snapshots, child, read_fd)
            code = await process.wait()
            tn.cancel_scope.cancel()
        if child.snapshot is not None:
            self.retired.append(child.snapshot)
            child.snapshot = None
        if self.stopping:
            log.info("worker process %d (pid %d) stopped with status %d", child.number, process.pid, code)
        elif not child.ready:
            reason = (f"worker process {child.number} (pid {process.pid}) exited with status {code} before it was ready; "
                      "see its messages above")
            raise ConfigError(reason) if code == 2 else SupervisorError(reason)  # 2: its settings were refused
        else:
            log.error("worker process %d (pid %d) exited with status %d; its jobs come back when their leases expire; "
                      "starting it again in %.0f s", child.number, process.pid, code, backoff)

    async def _read_snapshots(self, child: Child, fd: int) -> None:
        stream = trio.lowlevel.FdStream(fd)
        buffer = b""
        async with stream:
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    return
                buffer += data
                *lines, buffer = buffer.split(b"\n")
                for line in lines[-1:]:  # only the latest counts: each is cumulative
                    try:
                        child.snapshot = json.loads(line)
                        child.ready = True
                    except ValueError:
                        log.warning("worker process %d sent counters that are not JSON; ignored", child.number)

    def signal_all(self, signum: int) -> None:
        for child in self.children:
            if child.process is not None and child.process.returncode is None:
                try:
                    child.process.send_signal(signum)
                except ProcessLookupError:
                    pass


async def supervise(config: Config, registry: Registry | None, count: int, *, command: Sequence[str] | None = None,
                    ready: Callable[[Supervisor], None] | None = None) -> None:
    """Run ``count`` worker processes and the admin API until SIGINT/SIGTERM (see the module
    docstring). The store is opened here first, so a bad DATABASE_URL or a corrupt file fails
    before any worker process starts; a worker process that exits before it was ever ready
    (its own start failed) stops the service with an error rather than being restarted."""
    supervisor = Supervisor(config, count, command or sys.orig_argv)
    listener = None
    if config.admin.enabled:
        from .admin.server import open_admin_listener

        listener = open_admin_listener(config)  # bound before anything starts: a busy port fails at once
    try:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with _supervisor_pipeline(config, registry) as pipeline, trio.open_nursery() as tn:
                children_done = trio.Event()
                admin = "off"
                if listener is not None:
                    from .admin.server import run_admin_server

                    pipeline.external_metrics = supervisor.snapshots
                    pipeline.worker_processes = supervisor.alive
                    admin = await tn.start(run_admin_server, pipeline, listener, children_done.wait)
                watching = trio.CancelScope()
                tn.start_soon(_watch_signals, supervisor, signals, watching)
                try:
                    async with trio.open_nursery() as children:
                        for child in supervisor.children:
                            children.start_soon(supervisor.run_child, child)
                        log.info("pipeline running on %s: %d worker processes under this supervisor (pid %d); admin API %s",
                                 masked_url(config.database_url), count, os.getpid(), admin)
                        if ready is not None:
                            ready(supervisor)
                finally:
                    watching.cancel()
                    children_done.set()  # the admin API stops taking requests and drains
            log.info("pipeline stopped")
    finally:
        supervisor.signal_all(signal.SIGKILL)  # only after an error: a graceful stop has none left
        if listener is not None:
            listener.close()


@asynccontextmanager
async def _supervisor_pipeline(config: Config, registry: Registry | None) -> AsyncIterator[Any]:
    """The supervisor's own pipeline: no workers; the admin API's reads and writes."""
    from .engine.wiring import open_pipeline

    if registry is None:
        from .site import default_registry, types_registry

        default_registry(config)  # the worker processes' own: its settings are checked here, before any starts
        registry = types_registry()  # the admin API validates jobs and events; it runs no handler
    async with open_pipeline(config.replace(worker=attrs.evolve(config.worker, enabled=False)), registry) as pipeline:
        yield pipeline


async def _watch_signals(supervisor: Supervisor, signals: Any, scope: trio.CancelScope) -> None:
    with scope:
        async for signum in signals:
            if supervisor.stopping:
                log.warning("second %s: ending every worker process at once; leases will return running jobs",
                            signal.Signals(signum).name)
                supervisor.signal_all(signal.SIGKILL)
                os._exit(128 + signum)
            log.info("%s: stopping %d worker processes gracefully (again to end them at once)",
                     signal.Signals(signum).name, supervisor.alive())
            supervisor.stopped.set()
            supervisor.signal_all(signal.SIGTERM)


async def report_metrics(pipeline: Any, fd: int) -> None:
    """In a worker process: every second, this process's job counters to the supervisor."""
    from .admin.metrics import Metrics

    metrics = Metrics(pruned=pipeline.pruned)
    pipeline.add_observer(metrics.observe)
    async with trio.lowlevel.FdStream(fd) as stream:

        async def send() -> bool:
            try:
                await stream.send_all(json.dumps(metrics.snapshot()).encode() + b"\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return False  # the supervisor is gone (service._watch_supervisor stops this process)
            return True

        try:
            while True:
                if not await send():
                    break
                await trio.sleep(SNAPSHOT_EVERY)
        finally:
            with trio.move_on_after(1.0, shield=True):  # the last counts, once the pipeline has stopped
                await send()
