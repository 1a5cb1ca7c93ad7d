"""asyncio handlers, the host (issue 33, items 1 and 5): trio's guest mode on a real asyncio loop
(pipeline/engine/asyncio_host.py), its two bridges, ``runtime=`` on the registry, and a worker process
that hosts one loop for its asyncio handlers (``python -m pipeline --app``), on the standard library's
loop and on uvloop."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import importlib.util
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from app_harness import Service, app_env
from conftest import fast_config

import pipeline
from pipeline.engine import asyncio_host
from pipeline.engine.asyncio_host import current_host
from pipeline.errors import ConfigError, UsageError

LOOPS = ["asyncio", "uvloop"]
VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


@pytest.mark.parametrize("loop", LOOPS)
def test_the_host_runs_trio_as_a_guest_and_bridges_both_ways(loop: str) -> None:
    """A trio task runs a coroutine as a real asyncio task of the host's loop, in a copy of its context,
    and gets its value or its exception; that task awaits trio code the same way back."""
    seen: dict[str, Any] = {}

    async def on_trio(x: int) -> int:
        seen["trio_var"] = VAR.get()  # the asyncio task's context, copied
        await trio.sleep(0.001)
        if x < 0:
            raise KeyError("trio side")
        return x + 1

    async def on_asyncio(x: int) -> int:
        host = current_host()
        assert host is not None
        seen["loop"] = asyncio.get_running_loop()
        seen["task"] = asyncio.current_task() is not None
        seen["asyncio_var"] = VAR.get()  # the trio task's context, copied
        VAR.set("set in asyncio")
        await asyncio.sleep(0.001)
        if x < 0:
            with pytest.raises(KeyError, match="trio side"):
                await host.run_trio(on_trio, x)
            raise ValueError("asyncio side")
        return await host.run_trio(on_trio, x) * 10

    async def main() -> str:
        host = current_host()
        assert host is not None
        VAR.set("set in trio")
        assert await host.run_asyncio(on_asyncio, 4) == 50
        with pytest.raises(ValueError, match="asyncio side"):
            await host.run_asyncio(on_asyncio, -1)
        assert VAR.get() == "set in trio"  # the copies did not write back
        assert seen["loop"] is host.loop and seen["task"]
        return type(host.loop).__module__

    module = asyncio_host.run(main, loop=loop)
    assert seen["asyncio_var"] == "set in trio" and seen["trio_var"] == "set in asyncio"
    assert module.startswith("uvloop" if loop == "uvloop" else "asyncio")


def test_a_cancelled_trio_caller_cancels_its_asyncio_task_and_waits_for_it() -> None:
    """The trio scope's cancellation is asyncio.CancelledError inside the task; the trio caller sees its
    trio.Cancelled only once the task has ended (its clean-up included)."""
    events: list[str] = []

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            events.append("CancelledError")
            await asyncio.sleep(0.05)  # clean-up that awaits: asyncio allows it
            events.append("cleaned up")
            raise

    async def main() -> None:
        host = current_host()
        assert host is not None
        with trio.move_on_after(0.05) as scope:
            await host.run_asyncio(slow)
        events.append("trio resumed")
        assert scope.cancelled_caught

    asyncio_host.run(main)
    assert events == ["CancelledError", "cleaned up", "trio resumed"]


def test_an_asyncio_task_that_swallows_its_cancellation_is_abandoned_after_the_grace() -> None:
    abandoned: list[float] = []
    iterations: list[int] = []

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(0.01)
                iterations.append(1)
            except asyncio.CancelledError:
                pass

    async def main() -> None:
        host = current_host()
        assert host is not None
        start = trio.current_time()
        with trio.move_on_after(0.05) as scope:
            await host.run_asyncio(stubborn, grace=0.2, abandoned=lambda: abandoned.append(trio.current_time() - start))
        assert scope.cancelled_caught
        before = len(iterations)
        await trio.sleep(0.05)
        assert len(iterations) > before  # abandoned, not stopped: it runs on

    asyncio_host.run(main)
    assert len(abandoned) == 1 and 0.2 <= abandoned[0] < 5


def test_a_cancelled_asyncio_caller_cancels_its_trio_call() -> None:
    events: list[str] = []

    async def on_trio() -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            events.append("trio.Cancelled")
            raise

    async def on_asyncio() -> None:
        host = current_host()
        assert host is not None
        try:
            await asyncio.wait_for(host.run_trio(on_trio), 0.05)
        except TimeoutError:
            events.append("asyncio timed out")

    async def main() -> None:
        host = current_host()
        assert host is not None
        await host.run_asyncio(on_asyncio)
        with trio.fail_after(5):
            while "trio.Cancelled" not in events:
                await trio.sleep(0.01)

    asyncio_host.run(main)
    assert sorted(events) == ["asyncio timed out", "trio.Cancelled"]


def test_run_as_guest_runs_on_the_loop_already_running_and_its_cancellation_ends_the_guest_run() -> None:
    """What pipeline.aio builds on: trio code as a guest of the app's own running loop; cancelling the
    task that awaits it cancels the trio side and waits for it to end."""
    events: list[str] = []

    async def trio_main(ready: asyncio.Event) -> None:
        host = current_host()
        assert host is not None and host.loop is asyncio.get_running_loop()
        ready.set()  # an asyncio primitive, set from trio: same thread
        try:
            await trio.sleep_forever()
        finally:
            events.append("trio main left")

    async def app() -> None:
        ready = asyncio.Event()
        guest = asyncio.create_task(asyncio_host.run_as_guest(trio_main, ready))
        await asyncio.wait_for(ready.wait(), 5)
        guest.cancel()
        with pytest.raises(asyncio.CancelledError):
            await guest
        events.append("guest task ended")
        assert await asyncio_host.run_as_guest(trio.sleep, 0) is None  # and a new guest run may start

    asyncio.run(app())
    assert events == ["trio main left", "guest task ended"]


# -- runtime= on the registry ------------------------------------------------------------------------


@dataclasses.dataclass
class Ping:
    n: int


@dataclasses.dataclass
class Pong:
    n: int


def test_runtime_is_declared_per_job_type_or_as_the_registrys_default() -> None:
    reg = pipeline.Registry()

    @reg.job
    async def on_trio(job: Ping, ctx: pipeline.JobContext) -> None: ...

    @reg.job(runtime="asyncio")
    async def on_asyncio(job: Pong, ctx: pipeline.JobContext) -> None: ...

    assert [reg.spec("on_trio").runtime, reg.spec("on_asyncio").runtime] == ["trio", "asyncio"]
    assert reg.uses_asyncio()

    aio = pipeline.Registry(runtime="asyncio")
    aio.register("ping", Ping, on_trio)  # the registry's default
    aio.register("pong", Pong, lambda job, ctx: None)  # a plain def: a thread, whatever the runtime
    assert [aio.spec("ping").runtime, aio.spec("pong").runtime] == ["asyncio", "thread"]
    back = pipeline.Registry(runtime="asyncio")
    back.register("ping", Ping, on_trio, runtime="trio")
    assert back.spec("ping").runtime == "trio" and not back.uses_asyncio()
    assert not pipeline.Registry().uses_asyncio()


def test_a_bad_runtime_or_asyncio_on_a_plain_def_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match=r"runtime must be one of 'trio', 'asyncio'.*got 'curio'"):
        pipeline.Registry().register("ping", Ping, on_ping, runtime="curio")
    with pytest.raises(UsageError, match=r"Registry\(runtime=...\) must be one of"):
        pipeline.Registry(runtime="gevent")
    reg = pipeline.Registry()
    with pytest.raises(UsageError, match=r"runtime='asyncio' is for an `async def` handler.*plain `def`.*runs in a thread"):
        @reg.job(runtime="asyncio")
        def blocking(job: Ping, ctx: pipeline.JobContext) -> None: ...
    assert reg.job_types() == []


async def on_ping(job: Ping, ctx: pipeline.JobContext) -> None:
    return None


async def test_open_pipeline_in_a_plain_trio_program_refuses_asyncio_handlers_at_start(config: pipeline.Config) -> None:
    reg = pipeline.Registry()
    reg.register("ping", Ping, on_ping, runtime="asyncio")
    with pytest.raises(UsageError, match=r"job types ping have runtime='asyncio'.*plain trio program.*pipeline\.aio\.open_pipeline"):
        async with pipeline.open_pipeline(config, reg):
            pass
    # a process that only enqueues (WORKER_ENABLED=false) runs no handler: it opens
    async with pipeline.open_pipeline(config.replace(worker=config.worker.__class__(enabled=False)), reg) as p:
        assert await p.enqueue(Ping(1))


# -- a worker process --------------------------------------------------------------------------------

APP = textwrap.dedent('''
    """An app with asyncio handlers and a trio one; each notes where it ran."""
    import asyncio
    import dataclasses
    import json
    import os

    import trio

    import pipeline
    from pipeline.engine.asyncio_host import current_host

    registry = pipeline.Registry(runtime="asyncio")
    trio_only = pipeline.Registry()


    @dataclasses.dataclass
    class Where:
        n: int


    @dataclasses.dataclass
    class Also:
        n: int


    def note(**fields):
        with open(os.environ["NOTES"], "a") as f:
            f.write(json.dumps(fields) + "\\n")


    @registry.job
    async def where(job: Where, ctx: pipeline.JobContext) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0.001)
        note(type="where", n=job.n, pid=os.getpid(), loop=id(loop), kind=type(loop).__module__)


    @registry.job
    async def also(job: Also, ctx: pipeline.JobContext) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.to_thread(lambda: None)
        note(type="also", n=job.n, pid=os.getpid(), loop=id(loop), kind=type(loop).__module__)


    @dataclasses.dataclass
    class OnTrio:
        n: int


    @registry.job(runtime="trio")
    async def on_trio(job: OnTrio, ctx: pipeline.JobContext) -> None: ...


    @trio_only.job
    async def plain(job: Where, ctx: pipeline.JobContext) -> None:
        await trio.sleep(0.001)
        note(type="plain", n=job.n, pid=os.getpid(), host=current_host() is not None)
''')


def _app(folder: Path) -> Any:
    folder.mkdir(exist_ok=True)
    (folder / "aioapp.py").write_text(APP)
    spec = importlib.util.spec_from_file_location(f"aioapp_{id(folder)}", folder / "aioapp.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _notes(path: Path, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        found = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        if len(found) >= count:
            return found
        assert time.monotonic() < deadline, f"{len(found)} of {count} notes within {timeout} s: {found}"
        time.sleep(0.02)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_worker_process_hosts_one_asyncio_loop_for_all_its_asyncio_handlers(tmp_path: Path, loop: str) -> None:
    folder = tmp_path / "app"
    app = _app(folder)
    notes = tmp_path / "notes.jsonl"
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    env = app_env(folder, url, NOTES=str(notes), ADMIN_ENABLED="false", WORKER_ASYNCIO_LOOP=loop)
    service = Service(folder, env, "--app", "aioapp:registry")
    try:
        service.ready(1, "also, on_trio, where")
        with pipeline.Client(url, registry=app.registry) as client:
            for n in range(3):
                client.enqueue(app.Where(n))
                client.enqueue(app.Also(n))
        found = _notes(notes, 6)
        assert service.stop() == 0
    finally:
        service.kill()
    assert {(n["type"], n["n"]) for n in found} == {(t, n) for t in ("where", "also") for n in range(3)}
    assert len({(n["pid"], n["loop"]) for n in found}) == 1, found  # one process, one loop for both types
    assert {n["kind"] for n in found} == {"uvloop" if loop == "uvloop" else "asyncio.unix_events"}


def test_a_worker_process_without_asyncio_handlers_runs_plain_trio(tmp_path: Path) -> None:
    folder = tmp_path / "app"
    app = _app(folder)
    notes = tmp_path / "notes.jsonl"
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    service = Service(folder, app_env(folder, url, NOTES=str(notes), ADMIN_ENABLED="false"), "--app", "aioapp:trio_only")
    try:
        service.ready(1, "plain")
        with pipeline.Client(url, registry=app.trio_only) as client:
            client.enqueue(app.Where(1))
        (found,) = _notes(notes, 1)
        assert service.stop() == 0
    finally:
        service.kill()
    assert found["host"] is False  # no asyncio loop: trio.run, as before


def test_uvloop_asked_for_and_missing_is_refused_at_start_naming_the_variable_and_the_install(tmp_path: Path) -> None:
    folder = tmp_path / "app"
    _app(folder)
    env = app_env(folder, f"sqlite:///{tmp_path / 'jobs.db'}", ADMIN_ENABLED="false", WORKER_ASYNCIO_LOOP="uvloop")
    # uvloop is installed here: this process is made to find none (sys.modules[name] = None fails its import)
    code = "import sys; sys.modules['uvloop'] = None; from pipeline.cli import main; sys.exit(main())"
    done = subprocess.run([sys.executable, "-c", code, "--app", "aioapp:registry", "run"], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "WORKER_ASYNCIO_LOOP=uvloop" in done.stderr and "pip install 'trio-pipeline[asyncio]'" in done.stderr
    bad = subprocess.run([sys.executable, "-m", "pipeline", "--app", "aioapp:registry", "run"], cwd=folder,
                         env={**env, "WORKER_ASYNCIO_LOOP": "tokio"}, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "WORKER_ASYNCIO_LOOP" in bad.stderr and "asyncio, uvloop" in bad.stderr


def test_check_loop_names_the_variable() -> None:
    asyncio_host.check_loop("asyncio")
    asyncio_host.check_loop("uvloop")
    with pytest.raises(ConfigError, match="WORKER_ASYNCIO_LOOP='trio' is not valid"):
        asyncio_host.check_loop("trio")



# -- a handler on the wrong runtime: refused at its first attempt -------------------------------------


@dataclasses.dataclass
class Touch:
    library: str


async def touches_asyncio(job: Touch, ctx: pipeline.JobContext) -> None:
    if job.library == "asyncio.sleep":
        await asyncio.sleep(0.01)
    elif job.library == "asyncio.to_thread":
        await asyncio.to_thread(lambda: None)
    elif job.library == "redis.asyncio":
        import redis.asyncio

        client = redis.asyncio.Redis(host="127.0.0.1", port=6379)
        try:
            await client.ping()
        finally:
            await client.aclose()


async def touches_trio(job: Touch, ctx: pipeline.JobContext) -> None:
    if job.library == "trio.sleep":
        await trio.sleep(0.01)
    elif job.library == "trio.to_thread":
        await trio.to_thread.run_sync(lambda: None)


async def _refused(config: pipeline.Config, runtime: str, handler: Any, libraries: list[str]) -> dict[str, Any]:
    reg = pipeline.Registry()
    reg.register("touch", Touch, handler, runtime=runtime, max_attempts=3)
    async with pipeline.open_pipeline(config, reg) as p:
        ids = {library: await p.enqueue(Touch(library)) for library in libraries}
        ended: dict[str, Any] = {}
        with trio.fail_after(10):
            while len(ended) < len(ids):  # each once its first attempt ended (an error written, or completed)
                for library, job_id in ids.items():
                    job = await p.backend.get(job_id)
                    if job is not None and (job.error is not None or job.status == "completed"):
                        ended[library] = job
                await trio.sleep(0.01)
        return ended


ASYNCIO_LIBRARIES = ["asyncio.sleep", "asyncio.to_thread", "redis.asyncio"]


async def test_a_trio_handler_that_uses_asyncio_is_dead_at_once_saying_to_declare_runtime_asyncio(
        config: pipeline.Config) -> None:
    """Under a plain trio.run ("no running event loop")."""
    for library, job in (await _refused(config, "trio", touches_asyncio, ASYNCIO_LIBRARIES)).items():
        assert (job.status, job.attempts) == ("dead", 1), (library, job.error)
        assert "its handler runs on trio (runtime='trio') but used asyncio" in job.error, library
        assert 'declare the job type with runtime="asyncio"' in job.error
        if library.startswith("asyncio."):  # (redis.asyncio fails further in, in one of the ways listed in pools.py)
            assert "RuntimeError: no running event loop" in job.error


def test_as_a_guest_of_asyncio_too_a_trio_handler_that_uses_asyncio_is_dead_at_once(tmp_path: Path) -> None:
    """With a loop running in the thread, trio refuses the asyncio future yielded to it instead."""
    got = asyncio_host.run(_refused, fast_config(tmp_path / "jobs.db"), "trio", touches_asyncio, ASYNCIO_LIBRARIES)
    for library, job in got.items():
        assert (job.status, job.attempts) == ("dead", 1), (library, job.error)
        assert 'used asyncio (TypeError: trio.run received unrecognized yield message' in job.error, library
        assert 'declare the job type with runtime="asyncio"' in job.error


def test_an_asyncio_handler_that_uses_trio_is_dead_at_once_saying_so(tmp_path: Path) -> None:
    got = asyncio_host.run(_refused, fast_config(tmp_path / "jobs.db"), "asyncio", touches_trio, ["trio.sleep", "trio.to_thread"])
    for library, job in got.items():
        assert (job.status, job.attempts) == ("dead", 1), (library, job.error)
        assert "its handler runs on asyncio (runtime='asyncio') but used trio (RuntimeError: must be called from async " \
               "context)" in job.error and 'runtime="trio"' in job.error, library


def test_other_failures_are_retried_as_before(tmp_path: Path) -> None:
    async def fails(job: Touch, ctx: pipeline.JobContext) -> None:
        raise RuntimeError("something else went wrong")

    got = asyncio_host.run(_refused, fast_config(tmp_path / "jobs.db"), "asyncio", fails, ["none"])
    assert got["none"].status == "pending" and got["none"].attempts == 1  # retried after its backoff


def test_a_guest_run_started_by_other_code_finds_its_host_loop_too() -> None:
    """pipeline.testing or an app may call trio.lowlevel.start_guest_run itself: the pipeline still finds
    the loop it is the guest of (the one running in its thread)."""

    async def trio_main() -> bool:
        host = current_host()
        assert host is not None and host is current_host()
        return await host.run_asyncio(_loop_is, host.loop)

    async def app() -> bool:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        trio.lowlevel.start_guest_run(trio_main, run_sync_soon_threadsafe=loop.call_soon_threadsafe,
                                      run_sync_soon_not_threadsafe=loop.call_soon, done_callback=done.set_result)
        return (await done).unwrap()

    assert asyncio.run(app()) is True
    assert trio.run(_no_host) is None


async def _loop_is(loop: asyncio.AbstractEventLoop) -> bool:
    return asyncio.get_running_loop() is loop


async def _no_host() -> Any:
    return current_host()
