"""pipeline.testing from any loop (issue 33, item 6): ``open_test_pipeline`` as ``async with`` under
trio and under asyncio (the engine a guest of the test's loop), and as a plain ``with``; ``enqueue``,
``drain``, ``get`` and ``result`` in each; results decoded; the API's errors out as themselves, not
inside the engine's exception groups. And a user's test file, run by pytest-asyncio, pytest-trio,
anyio and no plugin at all, in processes of their own."""

from __future__ import annotations

import asyncio
import contextvars
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
import sniffio
import trio
import trio.lowlevel

import pipeline
from pipeline.testing import TestJobRecord, open_test_pipeline, run

USER_PROJECT = Path(__file__).parent / "user_project"
DOCS = Path(__file__).parent.parent / "docs" / "testing.md"


@attrs.frozen
class Add:
    a: int
    b: int


@attrs.frozen
class Hang:
    pass


@attrs.frozen
class Broken:
    pass


@attrs.frozen
class Stray:
    pass


seen: dict[str, Any] = {}
trace_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("trace_var", default=None)
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def make_registry() -> pipeline.Registry:
    reg = pipeline.Registry()

    @reg.job
    async def add(job: Add, ctx: pipeline.JobContext) -> int:
        seen["thread"] = threading.get_ident()
        seen["trace"] = ctx.trace
        return job.a + job.b

    @reg.job
    async def hang(job: Hang, ctx: pipeline.JobContext) -> None:
        seen["hanging"] = True
        await trio.sleep_forever()

    @reg.job(max_attempts=2)
    async def broken(job: Broken, ctx: pipeline.JobContext) -> None:
        raise RuntimeError(f"broken on attempt {ctx.attempt}")

    reg.register("stray", Stray)  # a type with no handler here
    reg.trace_context = trace_var.get  # as pipeline.otel's hook: the caller's trace context
    return reg


@pytest.fixture(autouse=True)
def _clear() -> None:
    seen.clear()


# -- the same promises in the three styles ----------------------------------------------------------------


async def test_under_trio_results_are_decoded_and_errors_leave_as_themselves() -> None:
    reg = make_registry()
    async with open_test_pipeline(reg) as p:
        job_id = await p.enqueue(Add(2, 3))
        assert await p.result(job_id) == 5
        record = await p.get(job_id)
        assert isinstance(record, TestJobRecord) and isinstance(record, pipeline.JobRecord)
        assert record.result == 5 and record.to_json()["result"] == 5
        stored = await p.backend.get(job_id)  # the store's own record (the admin API's, the CLI's): JSON text
        assert stored is not None and stored.result == "5" and stored.to_json()["result"] == 5
        dead = await p.enqueue(Broken())
        with pytest.raises(pipeline.JobFailed, match="broken on attempt 2"):
            await p.result(dead)
        assert [(r.status, r.result) for r in await p.drain()] == [("completed", 5), ("dead", None)]
    with pytest.raises(pipeline.InvalidPayload) as refused:
        async with open_test_pipeline(reg) as p:
            await p.enqueue(Add("two", 3))  # type: ignore[arg-type]
    assert type(refused.value) is pipeline.InvalidPayload  # not inside an ExceptionGroup
    with pytest.raises(pipeline.UsageError) as unrun:
        async with open_test_pipeline(reg) as p:
            await p.enqueue(Stray())
            await p.drain()
    assert type(unrun.value) is pipeline.UsageError and "stray" in str(unrun.value)


def test_under_asyncio_the_engine_is_a_guest_of_the_tests_loop() -> None:
    reg = make_registry()

    async def main() -> None:
        assert sniffio.current_async_library() == "asyncio"
        async with open_test_pipeline(reg) as p:
            job_id = await p.enqueue(Add(2, 3))
            assert await p.result(job_id) == 5
            assert seen["thread"] == threading.get_ident()  # a guest: its handlers ran in this loop's thread
            record = await p.get(job_id)
            assert record is not None and record.result == 5
            dead = await p.enqueue(Broken())
            with pytest.raises(pipeline.JobFailed):
                await p.result(dead)
            assert [(r.status, r.result) for r in await p.drain()] == [("completed", 5), ("dead", None)]
            assert await p.get("0" * 32) is None
        with pytest.raises(pipeline.InvalidPayload) as refused:
            async with open_test_pipeline(reg) as p:
                await p.enqueue(Add("two", 3))  # type: ignore[arg-type]
        assert type(refused.value) is pipeline.InvalidPayload
        with pytest.raises(pipeline.UsageError) as unrun:
            async with open_test_pipeline(reg) as p:
                await p.enqueue(Stray())
                await p.drain()
        assert type(unrun.value) is pipeline.UsageError and "stray" in str(unrun.value)

    asyncio.run(main())


def test_a_plain_with_answers_plain_calls() -> None:
    reg = make_registry()
    with open_test_pipeline(reg) as p:
        job_id = p.enqueue(Add(2, 3))
        assert p.result(job_id) == 5
        assert seen["thread"] != threading.get_ident()  # the engine's loop has a thread of its own
        record = p.get(job_id)
        assert record is not None and record.result == 5
        dead = p.enqueue(Broken())
        with pytest.raises(pipeline.JobFailed):
            p.result(dead)
        assert [(r.status, r.result) for r in p.drain()] == [("completed", 5), ("dead", None)]
    with pytest.raises(pipeline.PipelineClosed):
        p.enqueue(Add(1, 1))  # the block is left: closed
    with pytest.raises(pipeline.InvalidPayload) as refused:
        with open_test_pipeline(reg) as p:
            p.enqueue(Add("two", 3))  # type: ignore[arg-type]
    assert type(refused.value) is pipeline.InvalidPayload
    with pytest.raises(pipeline.UsageError) as unrun:
        with open_test_pipeline(reg) as p:
            p.enqueue(Stray())
            p.drain()
    assert type(unrun.value) is pipeline.UsageError and "stray" in str(unrun.value)
    record = run(reg, Add(20, 22))
    assert (record.status, record.result) == ("completed", 42)
    with pytest.raises(pipeline.InvalidPayload) as refused:
        run(reg, Add("two", 3))  # type: ignore[arg-type]
    assert type(refused.value) is pipeline.InvalidPayload


# -- groups: a lone error unwrapped, several kept --------------------------------------------------------


def several() -> ExceptionGroup[Exception]:
    return ExceptionGroup("two at once", [ValueError("one"), KeyError("two")])


def same_errors(found: BaseException, group: ExceptionGroup[Exception]) -> bool:
    """A group of the same two errors (trio's cancel scopes may hand on a copy of the group itself)."""
    return isinstance(found, ExceptionGroup) and list(map(id, found.exceptions)) == list(map(id, group.exceptions))


async def test_several_errors_stay_a_group_under_trio() -> None:
    group = several()
    with pytest.raises(ExceptionGroup) as caught:
        async with open_test_pipeline(make_registry()):
            raise group
    assert same_errors(caught.value, group)


def test_several_errors_stay_a_group_under_asyncio_and_plain() -> None:
    group = several()

    async def main() -> None:
        with pytest.raises(ExceptionGroup) as caught:
            async with open_test_pipeline(make_registry()):
                raise group
        assert same_errors(caught.value, group)

    asyncio.run(main())
    with pytest.raises(ExceptionGroup) as caught:
        with open_test_pipeline(make_registry()):
            raise group
    assert same_errors(caught.value, group)


# -- waits: timeouts, a caller that stops waiting, an error in the block ---------------------------------


async def test_drain_and_result_give_up_with_timeout_error_naming_what_is_left() -> None:
    async with open_test_pipeline(make_registry(), worker_shutdown_timeout=0.2) as p:
        job_id = await p.enqueue(Hang())
        with pytest.raises(TimeoutError, match="1 hang"):  # the builtin, as the docs say (not trio.TooSlowError)
            await p.drain(timeout=0.3)
        with pytest.raises(TimeoutError, match=f"job {job_id} did not finish within 0.3 s .it is running"):
            await p.result(job_id, timeout=0.3)


def test_an_asyncio_caller_that_stops_waiting_stops_the_wait_and_the_loop_is_left_clean() -> None:
    reg = make_registry()

    async def main() -> None:
        async with open_test_pipeline(reg, worker_shutdown_timeout=0.2) as p:
            job_id = await p.enqueue(Hang())
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(p.result(job_id, timeout=60), 0.3)
            left = time.monotonic()
        # a wait left running would hold the block's end for its 60 s (the calls in flight are waited for)
        assert time.monotonic() - left < 30

        async def hangs() -> None:
            async with open_test_pipeline(reg) as p:
                await p.enqueue(Hang())
                await p.drain(timeout=600)

        with pytest.raises(TimeoutError):
            await asyncio.wait_for(hangs(), 1.0)  # cancelled in the block: the guest run ends before it goes on
        async with open_test_pipeline(reg) as p:  # a guest run still running in this thread would refuse this one
            assert await p.result(await p.enqueue(Add(1, 1))) == 2

    asyncio.run(main())


@pytest.mark.parametrize("style", ["asyncio", "plain"])
def test_an_error_in_the_block_stops_the_pipeline_at_once_and_leaves_as_itself(style: str) -> None:
    reg = make_registry()
    error = ValueError("the test failed")
    started = time.monotonic()
    with pytest.raises(ValueError) as caught:
        if style == "asyncio":
            async def main() -> None:
                async with open_test_pipeline(reg) as p:  # WORKER_SHUTDOWN_TIMEOUT: 30 s, for a graceful stop
                    await p.enqueue(Hang())
                    while "hanging" not in seen:
                        await asyncio.sleep(0.01)
                    raise error
            asyncio.run(main())
        else:
            with open_test_pipeline(reg) as p:
                p.enqueue(Hang())
                while "hanging" not in seen:
                    time.sleep(0.01)
                raise error
    assert caught.value is error
    assert time.monotonic() - started < 20, "the hanging job was given the graceful stop's 30 s"


# -- the caller's context -----------------------------------------------------------------------------------


def test_the_callers_trace_context_goes_with_the_job_from_asyncio_and_plain_code() -> None:
    reg = make_registry()

    async def main() -> None:
        async with open_test_pipeline(reg) as p:
            trace_var.set(TRACE)  # set in the asyncio task, not in the engine's
            await p.result(await p.enqueue(Add(1, 1)))

    asyncio.run(main())
    assert seen.pop("trace") == TRACE

    def plain() -> None:
        with open_test_pipeline(reg) as p:
            trace_var.set(TRACE)  # in this thread's context, not the engine's thread's
            p.result(p.enqueue(Add(1, 1)))

    contextvars.copy_context().run(plain)
    assert seen.pop("trace") == TRACE


def test_a_plain_with_inside_a_running_loop_is_refused_naming_async_with() -> None:
    async def main() -> None:
        with pytest.raises(pipeline.UsageError, match="async with open_test_pipeline"):
            with open_test_pipeline(make_registry()):
                pass

    asyncio.run(main())
    trio.run(main)


def test_a_loop_that_hosts_a_trio_guest_already_is_told_so() -> None:
    from pipeline.engine.asyncio_host import run_as_guest

    async def inside_the_guest() -> None:
        async def from_asyncio() -> None:  # asyncio code on the loop that hosts this trio run
            with pytest.raises(pipeline.UsageError, match="already runs a trio guest"):
                async with open_test_pipeline(make_registry()):
                    pass

        host = asyncio_host_of_this_run()
        await trio.to_thread.run_sync(lambda: None)  # (a tick of the guest: the loop is running)
        await host.run_asyncio(from_asyncio)

    async def main() -> None:
        await run_as_guest(inside_the_guest)

    asyncio.run(main())


def asyncio_host_of_this_run() -> Any:
    from pipeline.engine.asyncio_host import current_host

    host = current_host()
    assert host is not None
    return host


# -- the registry's lifespan and asyncio handlers, in each style --------------------------------------------


@attrs.frozen
class Where:
    pass


def lifespan_registry(runtime: str) -> tuple[pipeline.Registry, list[str]]:
    """A registry whose handlers and lifespan run on ``runtime``; what the lifespan did, in order."""
    reg = pipeline.Registry(runtime=runtime)
    events: list[str] = []

    @reg.lifespan
    async def lifespan() -> Any:
        events.append("opened")
        loop = asyncio.get_running_loop() if runtime == "asyncio" else None
        yield {"greeting": "hello", "loop": loop}
        events.append("closed")

    @reg.job
    async def where(job: Where, ctx: pipeline.JobContext) -> str:
        if runtime == "asyncio":
            await asyncio.sleep(0)  # an asyncio library's await: a real asyncio loop runs this handler
            assert asyncio.get_running_loop() is ctx.state["loop"]  # the lifespan's loop: one per process
            seen["loop"] = asyncio.get_running_loop()
        else:
            await trio.lowlevel.checkpoint()
        return ctx.state["greeting"]

    return reg, events


async def test_under_trio_the_lifespan_opens_and_asyncio_handlers_run_on_a_loop_of_their_own() -> None:
    for runtime in ("trio", "asyncio"):
        reg, events = lifespan_registry(runtime)
        async with open_test_pipeline(reg) as p:
            assert await p.result(await p.enqueue(Where())) == "hello"
            assert events == ["opened"]
        assert events == ["opened", "closed"]


def test_under_asyncio_asyncio_handlers_and_the_lifespan_run_on_the_tests_own_loop() -> None:
    for runtime in ("trio", "asyncio"):
        reg, events = lifespan_registry(runtime)

        async def main() -> None:
            async with open_test_pipeline(reg) as p:
                assert await p.result(await p.enqueue(Where())) == "hello"
                assert events == ["opened"]
            if runtime == "asyncio":
                assert seen.pop("loop") is asyncio.get_running_loop()  # the test's loop: its fixtures are usable
            assert events == ["opened", "closed"]

        asyncio.run(main())


def test_a_plain_with_runs_the_lifespan_and_asyncio_handlers() -> None:
    for runtime in ("trio", "asyncio"):
        reg, events = lifespan_registry(runtime)
        with open_test_pipeline(reg) as p:
            assert p.result(p.enqueue(Where())) == "hello"
            assert events == ["opened"]
        assert events == ["opened", "closed"]
        assert run(reg, Where()).result == "hello"


async def test_under_trio_a_cancelled_block_leaves_once_the_engines_thread_has_ended() -> None:
    reg = pipeline.Registry(runtime="asyncio")

    @reg.job
    async def hang(job: Hang, ctx: pipeline.JobContext) -> None:
        seen["hanging"] = True
        await asyncio.sleep(3600)

    with trio.move_on_after(0.5) as waited:
        async with open_test_pipeline(reg) as p:  # asyncio handlers: the engine in a thread of its own
            await p.enqueue(Hang())
            await p.drain(timeout=600)
    assert waited.cancelled_caught and seen["hanging"]
    assert [t.name for t in threading.enumerate() if t.name == "pipeline-test"] == []  # not left running


# -- a user's test file, run by each runner ----------------------------------------------------------------

RUNNERS = {
    # one plugin loaded (autoload off, as in a project that has only that one), in its auto mode
    "pytest-asyncio": (["-p", "pytest_asyncio.plugin", "-o", "asyncio_mode=auto",
                        "-o", "asyncio_default_fixture_loop_scope=function", "test_user_jobs.py"], 8),
    "pytest-trio": (["-p", "pytest_trio.plugin", "-o", "trio_mode=true", "test_user_jobs.py"], 8),
    "anyio": (["-p", "anyio.pytest_plugin", "test_user_jobs_anyio.py"], 4),  # each test on asyncio and on trio
    "plain": (["-k", "plain", "test_user_jobs.py"], 3),  # no async plugin: the plain tests alone
}


def test_the_examples_of_docs_testing_md_pass(tmp_path: Path) -> None:
    """Each of docs/testing.md's code blocks that names its file (``# test_jobs_asyncio.py``) is written as
    that file, and the lot run by pytest with pytest-asyncio, pytest-trio and anyio loaded (each in its
    default mode: a test runs under the plugin its mark names) and none of this repository's plugins."""
    blocks = re.findall(r"```python\n# ([\w/]+\.py)\n(.*?)```", DOCS.read_text(), re.S)
    assert {name for name, _ in blocks} >= {"myapp/jobs.py", "test_jobs_asyncio.py", "test_jobs_trio.py",
                                            "test_jobs_plain.py", "test_jobs_workflows.py"}
    for name, code in blocks:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(code)
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\naddopts = "-p no:cacheprovider"\n'
                                             'asyncio_default_fixture_loop_scope = "function"\n')
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "pytest_asyncio.plugin", "-p", "pytest_trio.plugin",
                           "-p", "anyio.pytest_plugin"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = done.stdout.strip().splitlines()[-1]
    assert summary.startswith("8 passed") and "warning" not in summary, done.stdout


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_a_users_test_file_passes_under_each_runner(runner: str, tmp_path: Path) -> None:
    project = tmp_path / "user_project"
    shutil.copytree(USER_PROJECT, project, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    args, passed = RUNNERS[runner]
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-W", "error::pytest.PytestUnraisableExceptionWarning",
                           *args], cwd=project, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = done.stdout.strip().splitlines()[-1]
    assert summary.startswith(f"{passed} passed"), done.stdout
    assert "skipped" not in summary and "warning" not in summary, done.stdout
