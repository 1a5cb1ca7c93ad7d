"""Job types, handlers and waits shared by the core tests and the worker subprocess."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import attrs
import trio

import pipeline
from pipeline import Registry, site


@attrs.frozen
class Echo:
    """An application-defined job type: one attrs class..."""

    text: str
    sleep: float = 0.0
    fail_times: int = 0  # raise on the first N attempts
    mode: str = "ok"  # ok | permanent | retry_later | hang | kill | record | block (the loop, for `sleep` s, on attempt 1)


async def echo(job: Echo, ctx: pipeline.JobContext) -> None:
    """...plus one handler."""
    log = os.environ.get("PIPELINE_TEST_LOG")
    if log:
        with open(log, "a") as f:  # O_APPEND: whole lines, even from several processes
            f.write(f"start {ctx.id} {ctx.attempt} {os.getpid()} {time.time():.6f}\n")
    if job.mode == "block":
        if ctx.attempt == 1:
            time.sleep(job.sleep)  # a handler that wedges its event loop by mistake
    elif job.sleep:
        await trio.sleep(job.sleep)
    if job.mode == "hang":
        await trio.sleep_forever()
    if job.mode == "kill":  # a poison job: takes its whole process down, as an OOM kill would
        os.kill(os.getpid(), signal.SIGKILL)
    if ctx.attempt <= job.fail_times:
        raise RuntimeError(f"failing on purpose, attempt {ctx.attempt}")
    if job.mode == "permanent":
        raise pipeline.PermanentError("this can never work")
    if job.mode == "retry_later":
        raise pipeline.RetryLater("come back later", delay=60)
    if log:
        with open(log, "a") as f:
            f.write(f"end {ctx.id} {ctx.attempt} {os.getpid()} {time.time():.6f}\n")


@attrs.frozen
class Tick:
    """A second test type: quick, so its throughput shows whether another type holds it back."""

    n: int = 0


async def tick(job: Tick, ctx: pipeline.JobContext) -> None:
    await trio.lowlevel.checkpoint()


@attrs.frozen
class KeyedWork:
    """An event that routes to one Tick under a unique key, due in a minute (so its holder stays pending)."""

    key: str


def keyed_tick(event: KeyedWork, config: Any) -> list[pipeline.Routed]:
    return [pipeline.Routed(Tick(), run_after=time.time() + 60, unique_key=event.key)]


@attrs.frozen
class Fanout:
    """A job whose handler emits KeyedWork(key), after ``sleep`` s, and logs the id the emit answered."""

    key: str
    sleep: float = 0.0


async def fanout(job: Fanout, ctx: pipeline.JobContext) -> None:
    await trio.sleep(job.sleep)
    (stored,) = await ctx.emit(KeyedWork(job.key))
    log = os.environ.get("PIPELINE_TEST_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"emitted {ctx.id} {os.getpid()} {stored}\n")


def registry(**options: Any) -> Registry:
    reg = site.types_registry()
    reg.register("echo", Echo, echo, **options)
    reg.register("tick", Tick, tick)
    reg.register("fanout", Fanout, fanout)
    reg.add_event("KeyedWork", KeyedWork, keyed_tick)
    return reg


async def wait_status(p: pipeline.Pipeline, job_id: str, *statuses: str, timeout: float = 10.0) -> Any:
    with trio.fail_after(timeout):
        while True:
            job = await p.backend.get(job_id)
            if job is not None and job.status in statuses:
                return job
            await trio.sleep(0.01)


def wait_file_line(path: Path, prefix: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text().splitlines():
                if line.startswith(prefix):
                    return line
        time.sleep(0.02)
    raise TimeoutError(f"no line starting {prefix!r} in {path}")
