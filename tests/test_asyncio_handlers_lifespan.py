"""``@registry.lifespan`` (issue 33, item 3): an async generator opened once per process that runs jobs,
before its first job, on the registry's runtime (one asyncio task from open to close on asyncio), closed
after its last job; what it yields is ``ctx.state`` in every handler, sync ones too. An error while it
opens stops the pipeline, naming it. (Its worker processes, on each store and at SIGTERM:
tests/test_asyncio_handlers_app.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from app_harness import app_env
from conftest import fast_config

import pipeline
from pipeline import Config
from pipeline.engine import asyncio_host
from pipeline.engine.lifespan import open_lifespan
from pipeline.errors import PipelineError, UsageError


@dataclasses.dataclass
class Step:
    n: int


@dataclasses.dataclass
class SyncStep:
    n: int


@dataclasses.dataclass
class TrioStep:
    n: int


def registry_with_lifespan(runtime: str, events: list[Any]) -> pipeline.Registry:
    reg = pipeline.Registry(runtime=runtime)

    @reg.lifespan
    async def lifespan(config: Config) -> AsyncIterator[dict[str, Any]]:
        task = asyncio.current_task() if runtime == "asyncio" else None
        events.append(("open", config.worker.concurrency, id(task)))
        if runtime == "asyncio":
            await asyncio.sleep(0.001)  # an asyncio library's await, as a pool's opening is
        else:
            await trio.sleep(0.001)
        yield {"pool": "the pool", "jobs": 0}
        events.append(("close", id(asyncio.current_task() if runtime == "asyncio" else None)))

    @reg.job
    async def step(job: Step, ctx: pipeline.JobContext) -> str:
        if job.n == 0:  # the job the shutdown finds running: the lifespan closes after it
            events.append(("started", 0))
            await (asyncio.sleep(0.3) if runtime == "asyncio" else trio.sleep(0.3))
        ctx.state["jobs"] += 1
        events.append(("job", job.n))
        return ctx.state["pool"]

    @reg.job
    def sync_step(job: SyncStep, ctx: pipeline.JobContext) -> str:
        assert threading.current_thread() is not threading.main_thread()
        events.append(("sync job", job.n))
        return ctx.state["pool"]

    @reg.job(runtime="trio")
    async def trio_step(job: TrioStep, ctx: pipeline.JobContext) -> str:
        events.append(("trio job", job.n))
        return ctx.state["pool"]

    return reg


async def exercise(config: Config, reg: pipeline.Registry, events: list[Any]) -> None:
    async with pipeline.open_pipeline(config, reg) as p:
        assert [e[0] for e in events] == ["open"]  # before any job could run
        ids = [await p.enqueue(job) for job in (Step(1), SyncStep(2), TrioStep(3))]
        for job_id in ids:
            assert await p.result(job_id, timeout=10) == "the pool"
        await p.enqueue(Step(0))
        with trio.fail_after(10):
            while ("started", 0) not in events:
                await trio.sleep(0.01)
    assert events[-2:] == [("job", 0), events[-1]] and events[-1][0] == "close"  # closed after the last job


@pytest.mark.parametrize("runtime", ["trio", "asyncio"])
def test_the_lifespan_opens_once_before_the_first_job_and_closes_after_the_last_on_its_runtime(
        tmp_path: Path, runtime: str) -> None:
    events: list[Any] = []
    reg = registry_with_lifespan(runtime, events)
    config = fast_config(tmp_path / "jobs.db", worker_shutdown_timeout=5.0)
    asyncio_host.run(exercise, config, reg, events)
    opened, closed = events[0], events[-1]
    assert opened[:2] == ("open", 4)  # it was given the pipeline's Config
    assert sorted(e for e in events[1:-1]) == [("job", 0), ("job", 1), ("started", 0), ("sync job", 2), ("trio job", 3)]
    if runtime == "asyncio":
        assert opened[2] == closed[1] != id(None)  # one asyncio task, from its opening to its close


async def test_a_trio_lifespan_runs_in_a_plain_trio_program(tmp_path: Path) -> None:
    events: list[Any] = []
    reg = registry_with_lifespan("trio", events)
    await exercise(fast_config(tmp_path / "jobs.db", worker_shutdown_timeout=5.0), reg, events)


async def test_an_asyncio_lifespan_in_a_plain_trio_program_is_refused_naming_the_way_out(tmp_path: Path) -> None:
    reg = pipeline.Registry(runtime="asyncio")

    @reg.lifespan
    async def lifespan() -> AsyncIterator[None]:
        yield

    with pytest.raises(UsageError, match=r"its lifespan has runtime='asyncio'.*pipeline\.aio\.open_pipeline"):
        async with open_lifespan(reg, fast_config(tmp_path / "jobs.db")):
            pass


async def test_no_lifespan_runs_in_a_process_that_runs_no_job(tmp_path: Path) -> None:
    opened: list[str] = []
    reg = pipeline.Registry()

    @reg.lifespan
    async def lifespan() -> AsyncIterator[str]:
        opened.append("open")
        yield "state"

    reg.register("step", Step, _noop)
    config = fast_config(tmp_path / "jobs.db", worker_enabled=False)
    async with pipeline.open_pipeline(config, reg) as p:
        await p.enqueue(Step(1))
    assert opened == []


async def _noop(job: Any, ctx: pipeline.JobContext) -> None:
    return None


@pytest.mark.parametrize("runtime", ["trio", "asyncio"])
def test_an_error_while_the_lifespan_opens_stops_the_pipeline_naming_it(tmp_path: Path, runtime: str) -> None:
    ran: list[int] = []
    reg = pipeline.Registry(runtime=runtime)

    @reg.lifespan
    async def broken_pool() -> AsyncIterator[None]:
        raise ConnectionRefusedError("no database at 127.0.0.1:1")
        yield

    @reg.job
    async def step(job: Step, ctx: pipeline.JobContext) -> None:
        ran.append(job.n)

    async def main() -> None:
        async with pipeline.open_pipeline(fast_config(tmp_path / "jobs.db"), reg):
            raise AssertionError("the pipeline opened")

    with pytest.raises(BaseException) as caught:
        asyncio_host.run(main)
    leaves = caught.value.exceptions if isinstance(caught.value, BaseExceptionGroup) else (caught.value,)
    (error,) = [leaf for leaf in leaves if isinstance(leaf, PipelineError)]
    assert "the lifespan" in str(error) and "broken_pool failed while opening" in str(error)
    assert "ConnectionRefusedError: no database at 127.0.0.1:1" in str(error)
    assert isinstance(error.__cause__, ConnectionRefusedError)
    assert ran == []


def test_a_lifespan_that_is_no_async_generator_is_refused_at_registration() -> None:
    reg = pipeline.Registry()
    with pytest.raises(UsageError, match="must be an async generator function"):
        @reg.lifespan  # type: ignore[arg-type]
        async def not_a_generator() -> None: ...
    with pytest.raises(UsageError, match="takes at most one parameter"):
        @reg.lifespan
        async def two(config: Config, other: int) -> AsyncIterator[None]:
            yield

    @reg.lifespan
    async def first() -> AsyncIterator[None]:
        yield

    with pytest.raises(UsageError, match="already has a lifespan"):
        @reg.lifespan
        async def second() -> AsyncIterator[None]:
            yield
    assert reg.lifespan_function() is first


APP = textwrap.dedent('''
    import pipeline

    registry = pipeline.Registry(runtime="asyncio")


    @registry.lifespan
    async def lifespan(config):
        raise OSError("the pool cannot open: connection refused")
        yield
''')


def test_python_m_pipeline_exits_non_zero_with_the_lifespans_error(tmp_path: Path) -> None:
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "brokenapp.py").write_text(APP)
    env = app_env(folder, f"sqlite:///{tmp_path / 'jobs.db'}", ADMIN_ENABLED="false")
    done = subprocess.run([sys.executable, "-m", "pipeline", "--app", "brokenapp:registry", "run"], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "error: the lifespan brokenapp.lifespan failed while opening (OSError: the pool cannot open: connection " \
           "refused)" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
