"""``pipeline.aio.open_pipeline`` from asyncio code (issue 33, item 4): the same actors as
``pipeline.open_pipeline`` in the app's own process and thread, its API awaited from asyncio tasks, its
errors as themselves, its stop graceful whoever ends the block (a cancelled task included).

Each test runs a real asyncio loop (``asyncio.run``, in a thread of the trio test) and a real store; the
uvicorn ones are tests/test_aio_embedding_uvicorn.py."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from backends.stores import on_each_store
from conftest import fast_config

import pipeline
import pipeline.aio
from pipeline import Config


@dataclasses.dataclass
class AioEcho:
    n: int


@dataclasses.dataclass
class TrioEcho:
    n: int


@dataclasses.dataclass
class SyncEcho:
    n: int


@dataclasses.dataclass
class Hold:
    name: str


@dataclasses.dataclass
class Fails:
    n: int = 0


@dataclasses.dataclass
class Sum:
    n: int = 0


@dataclasses.dataclass
class Paid:
    n: int


@dataclasses.dataclass
class NotRegistered:
    n: int


class Where:
    """Where the handlers ran, and the holds: written and read on the app's loop's thread (the sync
    handler's thread only appends)."""

    def __init__(self) -> None:
        self.threads: dict[str, int] = {}
        self.started: dict[str, asyncio.Event] = {}
        self.release: dict[str, asyncio.Event] = {}
        self.cancelled: list[str] = []

    def hold(self, name: str) -> tuple[asyncio.Event, asyncio.Event]:
        return self.started.setdefault(name, asyncio.Event()), self.release.setdefault(name, asyncio.Event())


def make_registry(where: Where) -> pipeline.Registry:
    reg = pipeline.Registry()
    reg.add_event("paid", Paid, lambda event, config: [pipeline.Routed(AioEcho(event.n))])

    @reg.job(runtime="asyncio")
    async def aio_echo(job: AioEcho, ctx: pipeline.JobContext) -> dict[str, Any]:
        where.threads["asyncio"] = threading.get_ident()
        await asyncio.sleep(0.001)
        return {"n": job.n, "pid": os.getpid(), "loop": id(asyncio.get_running_loop())}

    @reg.job
    async def trio_echo(job: TrioEcho, ctx: pipeline.JobContext) -> dict[str, Any]:
        where.threads["trio"] = threading.get_ident()
        await trio.sleep(0.001)
        return {"n": job.n, "pid": os.getpid()}

    @reg.job
    def sync_echo(job: SyncEcho, ctx: pipeline.JobContext) -> dict[str, Any]:
        where.threads["sync"] = threading.get_ident()
        return {"n": job.n, "pid": os.getpid()}

    @reg.job(runtime="asyncio", timeout=60)
    async def hold(job: Hold, ctx: pipeline.JobContext) -> str:
        started, release = where.hold(job.name)
        started.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            where.cancelled.append(job.name)
            raise
        return job.name

    @reg.job(runtime="asyncio")
    async def fails(job: Fails, ctx: pipeline.JobContext) -> None:
        raise pipeline.PermanentError("no")

    @reg.job(runtime="asyncio")
    async def sums(job: Sum, ctx: pipeline.JobContext) -> Any:
        if job.n:
            return job.n
        outcome = await ctx.batch()
        return sorted([member.result async for member in outcome.members()])

    return reg


def in_asyncio(scenario: Callable[[Config, Path], Awaitable[None]]) -> Callable[[str, Config, Path], Awaitable[None]]:
    """A store scenario whose body is asyncio code: run by ``asyncio.run`` in a thread of its own (the
    test is trio; the pipeline's trio run is a guest of that thread's loop)."""

    async def on(name: str, config: Config, folder: Path) -> None:
        await trio.to_thread.run_sync(lambda: asyncio.run(scenario(config, folder)))

    return on


async def test_the_pipelines_calls_from_asyncio_tasks_run_every_runtimes_jobs_in_this_process_on_each_store(
    tmp_path: Path,
) -> None:
    async def scenario(config: Config, folder: Path) -> None:
        where = Where()
        async with pipeline.aio.open_pipeline(config, make_registry(where)) as p:
            # one job of each runtime: each ran here; the asyncio one on this very loop and thread
            ids = [await p.enqueue(AioEcho(1)), await p.enqueue(TrioEcho(2)), await p.enqueue(SyncEcho(3))]
            answers = [await p.result(job_id, timeout=30) for job_id in ids]
            assert [a["n"] for a in answers] == [1, 2, 3] and {a["pid"] for a in answers} == {os.getpid()}
            assert answers[0]["loop"] == id(asyncio.get_running_loop())
            assert where.threads["asyncio"] == where.threads["trio"] == threading.get_ident() != where.threads["sync"]
            job = await p.get(ids[0])
            assert job is not None and job.status == "completed" and job.attempts == 1
            assert await p.get("01234567-89ab-7cde-8f01-23456789abcd") is None

            # many at once, a chain among them; a batch and its callback; an event's routes
            many = await p.enqueue_many([AioEcho(4), pipeline.chain(TrioEcho(5), SyncEcho(6))])
            assert [(await p.result(job_id, timeout=30))["n"] for job_id in many] == [4, 5, 6]
            batch = await p.enqueue_batch([Sum(1), Sum(2), Sum(3)], then=Sum(0))
            assert batch.callback_id is not None
            assert await p.result(batch.callback_id, timeout=30) == [1, 2, 3]
            record = await p.batch(batch.id)
            assert record is not None and record.counts == {"completed": 3}
            (routed,) = await p.emit(Paid(7))
            assert (await p.result(routed, timeout=30))["n"] == 7
            first = await p.enqueue_unique(AioEcho(8), unique_key="k", run_after=9e9)
            again = await p.enqueue_unique(AioEcho(8), unique_key="k")
            assert again.duplicate and again.id == first.id

            # cancel: a pending job at once, a running one (here) through the canceller
            assert await p.cancel(first.id) == "cancelled"
            with pytest.raises(pipeline.JobCancelled):
                await p.result(first.id, timeout=30)
            running = await p.enqueue(Hold("running"))
            await where.hold("running")[0].wait()
            assert await p.cancel(running) == "cancelling"
            with pytest.raises(pipeline.JobCancelled):
                await p.result(running, timeout=30)
            assert where.cancelled == ["running"]  # as asyncio.CancelledError inside the handler

            # a paused type starts nothing until resumed
            await p.pause_type("trio_echo")
            paused = await p.enqueue(TrioEcho(9))
            with pytest.raises(TimeoutError):
                await p.result(paused, timeout=0.5)
            await p.resume_type("trio_echo")
            assert (await p.result(paused, timeout=30))["n"] == 9

    await on_each_store(tmp_path, in_asyncio(scenario))


async def test_errors_come_as_themselves(tmp_path: Path) -> None:
    async def scenario(config: Config, folder: Path) -> None:
        async with pipeline.aio.open_pipeline(config, make_registry(Where())) as p:
            with pytest.raises(pipeline.InvalidPayload, match="expected an integer"):
                await p.enqueue(AioEcho("x"))  # type: ignore[arg-type]
            with pytest.raises(pipeline.UnknownJobType):
                await p.enqueue(NotRegistered(1))
            with pytest.raises(pipeline.UsageError, match="priority"):
                await p.enqueue(AioEcho(1), priority=2**40)
            with pytest.raises(pipeline.UnknownEvent):
                await p.emit(NotRegistered(1))
            with pytest.raises(LookupError):
                await p.result("01234567-89ab-7cde-8f01-23456789abcd")
            with pytest.raises(pipeline.JobFailed, match="no"):
                await p.result(await p.enqueue(Fails()), timeout=30)
            with pytest.raises(pipeline.UsageError, match="unknown job type"):
                await p.pause_type("nope")

        # an error while it opens: the registry's lifespan fails
        broken = make_registry(Where())

        @broken.lifespan
        async def lifespan() -> Any:
            raise OSError("no database today")
            yield

        with pytest.raises(pipeline.PipelineError, match="no database today"):
            async with pipeline.aio.open_pipeline(config, broken):
                raise AssertionError("opened")

    await trio.to_thread.run_sync(lambda: asyncio.run(scenario(fast_config(tmp_path / "p.db"), tmp_path)))


async def test_a_pipeline_that_fails_while_open_cancels_the_task_that_opened_it_and_raises_its_error(tmp_path: Path) -> None:
    class Broken(Exception):
        pass

    def boom(fields: dict[str, Any]) -> None:  # an observer that raises: a defect inside the pipeline
        raise Broken("an observer failed")

    async def scenario(config: Config, folder: Path) -> None:
        reached_end = False
        with pytest.raises(Broken, match="an observer failed"):
            async with pipeline.aio.open_pipeline(config, make_registry(Where())) as p:
                p.trio_pipeline.add_observer(boom)
                await p.enqueue(AioEcho(1))
                await asyncio.sleep(30)  # cancelled when the pipeline fails
                reached_end = True
        assert not reached_end
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]  # our cancel was taken back
        with pytest.raises(pipeline.PipelineClosed):
            await p.enqueue(AioEcho(2))

    await trio.to_thread.run_sync(lambda: asyncio.run(scenario(fast_config(tmp_path / "p.db"), tmp_path)))


async def test_a_cancelled_enclosing_task_still_stops_the_pipeline_gracefully_on_each_store(tmp_path: Path) -> None:
    """The task inside the block is cancelled while two jobs run: the block still stops gracefully (a job
    released during the grace completes, one that outlasts it goes back to pending, nothing is left
    running), then the CancelledError goes on. Without the graceful stop the guest run's cancellation
    would leave both ``running`` until their leases expired."""

    async def scenario(config: Config, folder: Path) -> None:
        where = Where()
        registry = make_registry(where)
        ids: dict[str, str] = {}

        async def app() -> None:
            async with pipeline.aio.open_pipeline(config, registry) as p:
                ids["released"] = await p.enqueue(Hold("released"))
                ids["held"] = await p.enqueue(Hold("held"))
                await asyncio.sleep(3600)

        task = asyncio.create_task(app())
        await asyncio.wait_for(asyncio.gather(where.hold("released")[0].wait(), where.hold("held")[0].wait()), 30)
        task.cancel()
        await asyncio.sleep(0.1)
        assert not task.done()  # it stops gracefully: the grace is running
        task.cancel()  # cancelled again during the stop (asyncio.timeout, a TaskGroup): held until the stop is done
        await asyncio.sleep(0.1)
        assert not task.done()
        where.release["released"].set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert where.cancelled == ["held"]  # at the end of the grace

        # read by a pipeline that only enqueues (a second one in this loop's thread: the first one ended)
        async with pipeline.aio.open_pipeline(config.replace(worker=attrs.evolve(config.worker, enabled=False)),
                                              registry) as p:
            released, held = await p.get(ids["released"]), await p.get(ids["held"])
        assert released is not None and released.status == "completed" and released.result == '"released"', released
        assert held is not None and held.status == "pending" and held.attempts == 0, held

    await on_each_store(tmp_path, in_asyncio(scenario))


async def test_a_cancellation_while_it_opens_stops_what_opened(tmp_path: Path) -> None:
    async def scenario(config: Config, folder: Path) -> None:
        for ticks in range(6):  # cancelled at different points of the opening
            opened = asyncio.Event()

            async def app() -> None:
                async with pipeline.aio.open_pipeline(config, make_registry(Where())):
                    opened.set()
                    await asyncio.sleep(3600)

            task = asyncio.create_task(app())
            for _ in range(ticks):
                await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not opened.is_set()
        # every guest run ended: one more opens in this thread and runs a job
        async with pipeline.aio.open_pipeline(config, make_registry(Where())) as p:
            assert (await p.result(await p.enqueue(TrioEcho(1)), timeout=30))["n"] == 1

    await trio.to_thread.run_sync(lambda: asyncio.run(scenario(fast_config(tmp_path / "p.db"), tmp_path)))


async def test_a_write_whose_caller_stopped_waiting_still_commits_and_a_wait_stops_at_once_on_each_store(
    tmp_path: Path,
) -> None:
    async def scenario(config: Config, folder: Path) -> None:
        where = Where()
        async with pipeline.aio.open_pipeline(config, make_registry(where)) as p:
            await p.pause_type("sync_echo")  # the jobs stay pending, so their unique keys stay held
            writes = [asyncio.create_task(p.enqueue(SyncEcho(n), unique_key=f"k{n}")) for n in range(20)]
            await asyncio.sleep(0)  # each reached the bridge: its trio task is spawned, not yet run
            for write in writes:
                write.cancel()
            done = await asyncio.gather(*writes, return_exceptions=True)
            assert all(isinstance(d, asyncio.CancelledError) for d in done), done
            # each is committed all the same, as a reader of the store of its own sees. (Its trio task is
            # shielded; it also hands its rows to the Ledger before its first wait, so a cancel seldom lands
            # before that.)
            assert await asyncio.to_thread(trio.run, count_jobs, config, "sync_echo", 20) == 20

            held = await p.enqueue(Hold("held"))
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(p.result(held), 0.2)  # the wait stops at once: asyncio's timeout
            where.hold("held")[1].set()
            assert await p.result(held, timeout=30) == "held"

    await on_each_store(tmp_path, in_asyncio(scenario))


async def count_jobs(config: Config, job_type: str, expected: int, timeout: float = 30.0) -> int:
    """How many jobs of ``job_type`` the store holds, once it is ``expected`` (or at the timeout), read by a
    trio pipeline of its own that only enqueues (run in a thread of its own: trio.run)."""
    reader = config.replace(worker=attrs.evolve(config.worker, enabled=False))
    async with pipeline.open_pipeline(reader, pipeline.Registry()) as p:
        with trio.move_on_after(timeout):
            while sum((await p.backend.stats())["by_type"].get(job_type, {}).values()) != expected:
                await trio.sleep(0.02)
        return sum((await p.backend.stats())["by_type"].get(job_type, {}).values())


async def test_calls_from_another_loop_or_from_trio_are_refused_with_the_way_out(tmp_path: Path) -> None:
    async def scenario(config: Config, folder: Path) -> None:
        async with pipeline.aio.open_pipeline(config, make_registry(Where())) as p:
            def elsewhere() -> BaseException | None:
                try:
                    asyncio.run(p.enqueue(AioEcho(1)))
                except BaseException as exc:  # noqa: BLE001 - returned to be checked
                    return exc
                return None

            refused = await asyncio.to_thread(elsewhere)
            assert isinstance(refused, pipeline.UsageError) and "pipeline.AsyncClient" in str(refused), refused
            # a second pipeline on the same loop while one runs: one trio run per thread
            with pytest.raises(pipeline.UsageError, match="already hosts a pipeline"):
                async with pipeline.aio.open_pipeline(config, make_registry(Where())):
                    pass
            assert (await p.result(await p.enqueue(TrioEcho(1)), timeout=30))["n"] == 1

    await trio.to_thread.run_sync(lambda: asyncio.run(scenario(fast_config(tmp_path / "p.db"), tmp_path)))
    with pytest.raises(pipeline.UsageError, match="pipeline.open_pipeline"):
        async with pipeline.aio.open_pipeline(fast_config(tmp_path / "q.db"), pipeline.Registry()):
            pass
