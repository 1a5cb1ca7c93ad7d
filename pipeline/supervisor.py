"""``python -m pipeline --processes N``: one supervisor, N worker processes, one admin API.

A pipeline process runs its handlers on one core (trio, one thread). The supervisor starts N
copies of the same command as worker processes on the same backend (``sys.orig_argv``: the
same script, the same registry) and serves the admin API itself, once, with a pipeline of its
own that runs no jobs (the API's reads and writes go through the backend, where every
process's jobs are). Each worker process:

* runs with ``ADMIN_ENABLED=false`` and knows it is supervised (PIPELINE_SUPERVISOR_PID), so it
  stops gracefully if its supervisor is gone;
* writes a report to a pipe every second (PIPELINE_METRICS_FD): its job counters
  (``admin.metrics.Metrics``), which the supervisor adds up for ``/metrics``, and what it
  cannot do right now (its ``/healthz`` reasons), which the supervisor's ``/healthz`` names.

A worker process that exits while the supervisor runs is started again after a back-off (1 s,
doubling up to 30 s, back to 1 s once one has lived a minute); the jobs it held come back
through their leases. One whose reports stop for SILENCE_LIMIT (hung: stopped, or its event
loop blocked) is ended with SIGKILL and started again the same way.

SIGTERM or SIGINT stops every worker gracefully (each drains as a single process does), also
one being started as the signal came, and then the admin API, exit 0; a worker process still
running WORKER_SHUTDOWN_TIMEOUT + STOP_MARGIN after the signal is ended with SIGKILL. A second
signal is passed on, so that each worker process exits at once after writing out its log; one
still running EXIT_AT_ONCE_GRACE later is ended with SIGKILL.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
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
# seconds without a report (ten missed) after which a worker process that had reported is taken
# for hung and ended; /healthz names it from half of that. Read when a Supervisor is made (tests
# shorten them, as tests/supervised_service.py does)
SILENCE_LIMIT = 10.0
# seconds past WORKER_SHUTDOWN_TIMEOUT a worker process gets to finish its stop (the Ledger's
# last batch, the store closing) before the supervisor ends it
STOP_MARGIN = 5.0
# at a second signal: seconds the worker processes get to write out their log and exit
EXIT_AT_ONCE_GRACE = 1.0
# the same signal sent to the process and to its group (timeout, some supervisors) arrives twice
# at once: only a later one is a second signal
SIGNAL_ECHO_SECONDS = 0.2


def supervised() -> bool:
    """Whether this process is a worker process some supervisor started."""
    return SUPERVISOR_PID in os.environ


@attrs.define(eq=False)
class Child:
    """One worker process slot: the process in it now, and what it last reported."""

    number: int
    process: trio.Process | None = None
    starting: bool = False  # a process is being started in this slot (not in ``process`` yet)
    snapshot: dict[str, Any] | None = None  # the latest report of the process in the slot now
    reported_at: float | None = None  # trio time of that report; None: none yet from this process
    starts: int = 0
    ready: bool = False  # a process in this slot reported once: its pipeline ran (a start that fails is not retried)

    def running(self) -> trio.Process | None:
        """The process in this slot if it runs and has reported (its pipeline is open)."""
        process = self.process
        if process is None or process.returncode is not None or self.reported_at is None:
            return None
        return process


class Supervisor:
    def __init__(self, config: Config, count: int, command: Sequence[str]) -> None:
        from .admin.metrics import Metrics

        self.config = config
        self.children = [Child(n) for n in range(count)]
        self.command = list(command)
        self.silence_limit = SILENCE_LIMIT
        self.stop_margin = STOP_MARGIN
        self.stopped = trio.Event()  # the first signal came: no more starts
        self.stop_deadline = float("inf")  # trio time after which a worker process still running is ended
        self.signalled_at = float("-inf")  # trio time the first signal was passed on to the worker processes
        self.ending = False  # the second signal came: every worker process exits at once
        self.retired = Metrics()  # the counters of every process that ended, added up

    @property
    def stopping(self) -> bool:
        return self.stopped.is_set()

    def snapshots(self) -> list[dict[str, Any]]:
        """Every worker process's job counters, for ``/metrics``: the living ones' latest, and
        the sum of those that ended (counters never go back when a process is replaced)."""
        return [self.retired.snapshot(), *(child.snapshot for child in self.children if child.snapshot is not None)]

    def alive(self) -> int:
        return sum(1 for child in self.children if child.process is not None and child.process.returncode is None)

    def running(self) -> int:
        """Worker processes that run and report (``/healthz``'s ``workers``, ``/metrics``)."""
        return sum(1 for child in self.children if child.running() is not None)

    def health(self) -> list[str]:
        """What the worker processes cannot do right now, each named, for ``/healthz``: the
        reasons each reported, one silent for half the hang limit, or none running at all."""
        now = trio.current_time()
        reasons: list[str] = []
        for child in self.children:
            process = child.running()
            if process is None or child.reported_at is None:
                continue
            name = f"worker process {child.number} (pid {process.pid})"
            silent = now - child.reported_at
            if silent > self.silence_limit / 2:
                reasons.append(f"{name} has sent no report for {silent:.0f} s (hung?)")
            reasons.extend(f"{name}: {reason}" for reason in (child.snapshot or {}).get("health", ()))
        if not self.running():
            reasons.insert(0, "no worker process is running" + (" yet" if not self.stopping else ""))
        return reasons

    def stop(self) -> None:
        """The first signal: no more starts; every worker process stops gracefully."""
        now = trio.current_time()
        self.stop_deadline = now + self.config.worker.shutdown_timeout + self.stop_margin
        self.signalled_at = now
        self.stopped.set()
        self.signal_all(signal.SIGTERM)

    async def end_at_once(self, signum: int) -> None:
        """The second signal: pass it on, so each worker process writes out its log lines and
        exits at once (service.py); end those still running after EXIT_AT_ONCE_GRACE; exit."""
        self.ending = True
        with trio.CancelScope(shield=True):  # the last worker process exiting ends supervise(): not with status 0
            # a worker process takes two signals closer together than this for one
            await trio.sleep_until(self.signalled_at + SIGNAL_ECHO_SECONDS)
            self.signal_all(signal.SIGTERM)
            with trio.move_on_after(EXIT_AT_ONCE_GRACE):
                # (polled: a process being started is not one to wait on yet)
                while self.alive() or any(child.starting for child in self.children):  # noqa: ASYNC110
                    await trio.sleep(0.01)
        self.signal_all(signal.SIGKILL)
        os._exit(128 + signum)

    async def run_child(self, child: Child) -> None:
        """Keep a worker process in this slot until the supervisor stops."""
        backoff = BACKOFF_FIRST
        while not self.stopping:
            read_fd, write_fd = os.pipe()
            env = {**os.environ, SUPERVISOR_PID: str(os.getpid()), METRICS_FD: str(write_fd), "ADMIN_ENABLED": "false"}
            started = trio.current_time()
            child.starting = True
            try:
                # a session of its own: a terminal's Ctrl-C reaches the supervisor alone, which passes
                # one SIGTERM on (two, close together, would end a worker process at once)
                process = await trio.lowlevel.open_process(self.command, env=env, pass_fds=(write_fd,), start_new_session=True)
            except OSError as exc:
                os.close(read_fd)
                log.error("could not start worker process %d: %s; trying again in %.0f s", child.number, exc, backoff)
            else:
                os.close(write_fd)  # the worker process's copy is the only one: its exit ends the stream
                write_fd = -1
                await self._watch(child, process, read_fd, backoff)
            finally:
                child.starting = False
                if write_fd >= 0:
                    os.close(write_fd)
            if self.stopping:
                return
            if trio.current_time() - started >= STEADY_SECONDS:
                backoff = BACKOFF_FIRST
            with trio.move_on_after(backoff):
                await self.stopped.wait()
            backoff = min(backoff * 2, BACKOFF_MAX)

    async def _watch(self, child: Child, process: trio.Process, read_fd: int, backoff: float) -> None:
        child.process, child.starting, child.starts = process, False, child.starts + 1
        child.snapshot = child.reported_at = None
        log.info("worker process %d started (pid %d)", child.number, process.pid)
        if self.stopping:  # the signal came while it was being started: it stops too
            _send(process, signal.SIGKILL if self.ending else signal.SIGTERM)
        async with trio.open_nursery() as tn:
            tn.start_soon(self._read_reports, child, read_fd)
            watchdog = trio.CancelScope()
            tn.start_soon(self._watchdog, child, process, watchdog)
            code = await process.wait()
            watchdog.cancel()
            tn.cancel_scope.deadline = trio.current_time() + 1.0  # its last report, then the end of the stream
        if child.snapshot is not None:
            self.retired.add(child.snapshot)
        child.snapshot = child.reported_at = None
        name = f"worker process {child.number} (pid {process.pid})"
        ended = (f"was ended by {signal.Signals(-code).name} (status {code})" if code < 0 and -code in signal.valid_signals()
                 else f"exited with status {code}")
        if self.stopping:
            log.info("%s stopped (%s)", name, "status 0" if code == 0 else ended)
        elif not child.ready:
            reason = f"{name} {ended} before it was ready; see its messages above"
            raise ConfigError(reason) if code == 2 else SupervisorError(reason)  # 2: its settings were refused
        elif code == 0:
            log.warning("%s stopped by itself with status 0 (a SIGTERM or SIGINT sent to it directly?); starting it again "
                        "in %.0f s", name, backoff)
        else:
            log.error("%s %s; its jobs come back when their leases expire; starting it again in %.0f s", name, ended, backoff)

    async def _watchdog(self, child: Child, process: trio.Process, scope: trio.CancelScope) -> None:
        """End the process once its reports have stopped for ``silence_limit`` (not before its
        first: its start may wait for the store), or once a stop has taken longer than its grace."""
        with scope:
            while True:
                await trio.sleep(min(0.2, self.silence_limit / 4))
                now = trio.current_time()
                if self.stopping:
                    if now >= self.stop_deadline:
                        log.error("worker process %d (pid %d) has not stopped within WORKER_SHUTDOWN_TIMEOUT (%.0f s) + "
                                  "%.0f s: ending it (SIGKILL); its leases will return its jobs", child.number, process.pid,
                                  self.config.worker.shutdown_timeout, self.stop_margin)
                        _send(process, signal.SIGKILL)
                        return
                elif child.reported_at is not None and now - child.reported_at > self.silence_limit:
                    log.error("worker process %d (pid %d) has sent no report for %.1f s (stopped, or its event loop "
                              "blocked): ending it (SIGKILL); its leases will return its jobs", child.number, process.pid,
                              now - child.reported_at)
                    _send(process, signal.SIGKILL)
                    return

    async def _read_reports(self, child: Child, fd: int) -> None:
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
                    except ValueError:
                        log.warning("worker process %d sent a report that is not JSON; ignored", child.number)
                    else:
                        child.reported_at = trio.current_time()
                        child.ready = True

    def signal_all(self, signum: int) -> None:
        for child in self.children:
            if child.process is not None and child.process.returncode is None:
                _send(child.process, signum)


def _send(process: trio.Process, signum: int) -> None:
    try:
        process.send_signal(signum)
    except ProcessLookupError:
        pass


async def supervise(config: Config, registry: Registry, count: int, *, command: Sequence[str] | None = None,
                    ready: Callable[[Supervisor], None] | None = None) -> None:
    """Run ``count`` worker processes and the admin API until SIGINT/SIGTERM (see the module
    docstring). ``registry`` is what the admin API validates jobs and events against (the
    application's, as the CLI loaded it: a worker process loads it again from the same command
    line, or from PIPELINE_APP in the same environment). The store is opened here first, so a bad DATABASE_URL or a corrupt file fails
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
                    pipeline.worker_processes = supervisor.running
                    pipeline.health.others = supervisor.health
                    admin = await tn.start(run_admin_server, pipeline, listener, children_done.wait)
                watching = trio.CancelScope()
                tn.start_soon(_watch_signals, supervisor, signals, watching)
                try:
                    async with trio.open_nursery() as children:
                        for child in supervisor.children:
                            children.start_soon(supervisor.run_child, child)
                        log.info("pipeline running on %s: %d worker processes × %d workers per job type (WORKER_CONCURRENCY "
                                 "is per process) under this supervisor (pid %d); admin API %s", masked_url(config.database_url),
                                 count, config.worker.concurrency, os.getpid(), admin)
                        if ready is not None:
                            ready(supervisor)
                finally:
                    watching.cancel()
                    children_done.set()  # the admin API stops taking requests and drains
            log.info("pipeline stopped")
    finally:
        supervisor.signal_all(signal.SIGKILL)  # only after an error: a graceful stop has none left
        # and reaped before this process exits: a killed child is not gone until then (a zombie answers kill -0)
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            for child in supervisor.children:
                if child.process is not None:
                    await child.process.wait()
        if listener is not None:
            listener.close()


@asynccontextmanager
async def _supervisor_pipeline(config: Config, registry: Registry) -> AsyncIterator[Any]:
    """The supervisor's own pipeline: no workers; the admin API's reads and writes."""
    from .engine.wiring import open_pipeline

    async with open_pipeline(config.replace(worker=attrs.evolve(config.worker, enabled=False)), registry,
                             role="supervisor") as pipeline:
        yield pipeline


async def _watch_signals(supervisor: Supervisor, signals: Any, scope: trio.CancelScope) -> None:
    with scope:
        first_at = None
        async for signum in signals:
            name = signal.Signals(signum).name
            if first_at is not None:
                if trio.current_time() - first_at < SIGNAL_ECHO_SECONDS:
                    continue
                log.warning("second %s: every worker process exits at once, its log written out (SIGKILL after %.0f s); "
                            "leases will return running jobs", name, EXIT_AT_ONCE_GRACE)
                await supervisor.end_at_once(signum)
            first_at = trio.current_time()
            log.info("%s: stopping %d worker processes gracefully (again to end them at once)", name, supervisor.alive())
            supervisor.stop()


async def report_metrics(pipeline: Any, fd: int) -> None:
    """In a worker process: every second, this process's report to the supervisor: its job
    counters, and what it cannot do right now (the reasons its own ``/healthz`` would give)."""
    from .admin.metrics import Metrics

    metrics = Metrics(pruned=pipeline.pruned)
    pipeline.add_observer(metrics.observe)

    def report() -> bytes:
        reasons = pipeline.health.reasons(trio.current_time())
        trouble = pipeline.backend.trouble()
        if trouble:
            reasons.insert(0, trouble)
        if pipeline.closed:
            reasons.append("it is shutting down")
        return json.dumps({**metrics.snapshot(), "health": reasons}).encode() + b"\n"

    async with trio.lowlevel.FdStream(fd) as stream:

        async def send() -> bool:
            try:
                await stream.send_all(report())
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
