"""asyncio handlers on the engine, on each store (issue 33, item 2): the same job types written once for
trio and once for asyncio, run side by side by one pipeline that is the guest of an asyncio loop
(asyncio_host.run), must end the same way: results, progress, Snooze, RetryLater, PermanentError, emit,
parent_results, batch, the timeout and ``jobs cancel`` (as asyncio.CancelledError inside an asyncio
handler), global and per-key limits. Also, on one store: the middleware's context variables and the
OpenTelemetry span inside an asyncio handler, and a handler that swallows its cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from backends.stores import on_each_store
from conftest import fast_config
from jobkit import wait_status

import pipeline
from pipeline import Config
from pipeline.engine import asyncio_host
from pipeline.engine.actors import pools

RUNTIMES = ("trio", "asyncio")
TIMEOUT = 0.6


@dataclasses.dataclass
class Work:
    mode: str
    n: int = 0


@dataclasses.dataclass
class AioWork:
    mode: str
    n: int = 0


@dataclasses.dataclass
class Hold:
    n: int = 0


@dataclasses.dataclass
class AioHold:
    n: int = 0


@dataclasses.dataclass
class Limited:
    key: str


@dataclasses.dataclass
class AioLimited:
    key: str


@dataclasses.dataclass
class Keyed:
    key: str


@dataclasses.dataclass
class AioKeyed:
    key: str


@dataclasses.dataclass
class Done:
    n: int


@dataclasses.dataclass
class Routed:
    n: int


Sleep = Callable[[float], Awaitable[Any]]


class Seen:
    """What the handlers saw, by job id (written on the loop's thread, by either runtime)."""

    def __init__(self) -> None:
        self.by_id: dict[str, list[str]] = {}
        self.running: dict[str, int] = {}
        self.most: dict[str, int] = {}

    def add(self, job_id: str, what: str) -> None:
        self.by_id.setdefault(job_id, []).append(what)


async def behave(job: Any, ctx: pipeline.JobContext, sleep: Sleep, cancelled: type[BaseException], seen: Seen) -> Any:
    """One handler's body for both runtimes: only the sleep and the cancellation differ."""
    mode = job.mode
    if mode == "result":
        return {"n": job.n, "left": 0 < ctx.time_left() <= TIMEOUT}
    if mode == "progress":
        await ctx.progress(0.25, "a quarter")
        await sleep(0.001)
        await ctx.progress(1.0, "all of it")
        return None
    if mode == "snooze":
        if ctx.attempt == 1 and "snoozed" not in seen.by_id.get(ctx.id, []):
            seen.add(ctx.id, "snoozed")
            raise pipeline.Snooze(0.05)
        return "after the snooze"
    if mode == "retry":
        if ctx.attempt == 1:
            raise pipeline.RetryLater("not yet", delay=0.02)
        return ctx.attempt
    if mode == "permanent":
        raise pipeline.PermanentError("never")
    if mode == "error":
        raise ValueError(f"failing, attempt {ctx.attempt}")
    if mode == "emit":
        return await ctx.emit(Done(job.n))
    if mode == "parents":
        return await ctx.parent_results()
    if mode == "batch":
        outcome = await ctx.batch()
        return {"counts": dict(outcome.counts), "members": sorted([m.result async for m in outcome.members(page_size=2)],
                                                                    key=repr)}
    if mode == "timeout":
        try:
            await sleep(30)
        except cancelled:
            seen.add(ctx.id, cancelled.__name__)
            raise
    raise AssertionError(f"unknown mode {mode}")


async def hold(ctx: pipeline.JobContext, sleep: Sleep, cancelled: type[BaseException], seen: Seen) -> None:
    seen.add(ctx.id, "started")
    try:
        await sleep(30)
    except cancelled:
        seen.add(ctx.id, cancelled.__name__)
        raise


async def limited(job: Any, ctx: pipeline.JobContext, sleep: Sleep, seen: Seen) -> None:
    kind = ctx.job_type if ctx.job_type.startswith("limited") else f"{ctx.job_type}:{job.key}"
    seen.running[kind] = seen.running.get(kind, 0) + 1
    seen.most[kind] = max(seen.most.get(kind, 0), seen.running[kind])
    try:
        await sleep(0.03)
    finally:
        seen.running[kind] -= 1


def make_registry(seen: Seen) -> pipeline.Registry:
    reg = pipeline.Registry()
    reg.add_event("done", Done, lambda event, config: [pipeline.Routed(Routed(event.n))])

    @reg.job(timeout=TIMEOUT)
    async def work(job: Work, ctx: pipeline.JobContext) -> Any:
        return await behave(job, ctx, trio.sleep, trio.Cancelled, seen)

    @reg.job(timeout=TIMEOUT, runtime="asyncio")
    async def aio_work(job: AioWork, ctx: pipeline.JobContext) -> Any:
        assert asyncio.current_task() is not None
        return await behave(job, ctx, asyncio.sleep, asyncio.CancelledError, seen)

    @reg.job(timeout=30)
    async def hold_trio(job: Hold, ctx: pipeline.JobContext) -> None:
        await hold(ctx, trio.sleep, trio.Cancelled, seen)

    @reg.job(timeout=30, runtime="asyncio")
    async def hold_aio(job: AioHold, ctx: pipeline.JobContext) -> None:
        await hold(ctx, asyncio.sleep, asyncio.CancelledError, seen)

    @reg.job(concurrency=4, global_limit=1)
    async def limited_trio(job: Limited, ctx: pipeline.JobContext) -> None:
        await limited(job, ctx, trio.sleep, seen)

    @reg.job(concurrency=4, global_limit=1, runtime="asyncio")
    async def limited_aio(job: AioLimited, ctx: pipeline.JobContext) -> None:
        await limited(job, ctx, asyncio.sleep, seen)

    @reg.job(concurrency=4, limit_key=lambda job: job.key, key_limit=1)
    async def keyed_trio(job: Keyed, ctx: pipeline.JobContext) -> None:
        await limited(job, ctx, trio.sleep, seen)

    @reg.job(concurrency=4, limit_key=lambda job: job.key, key_limit=1, runtime="asyncio")
    async def keyed_aio(job: AioKeyed, ctx: pipeline.JobContext) -> None:
        await limited(job, ctx, asyncio.sleep, seen)

    @reg.job
    async def routed(job: Routed, ctx: pipeline.JobContext) -> int:
        return job.n

    return reg


def on_stores(tmp_path: Path, scenario: Callable[[str, Config, Path], Awaitable[None]]) -> None:
    """``scenario`` on each store, the test's trio code a guest of a real asyncio loop."""
    asyncio_host.run(on_each_store, tmp_path, scenario)


async def run_both(p: pipeline.Pipeline, mode: str, n: int = 0, **options: Any) -> dict[str, str]:
    """Enqueue the trio and the asyncio job of ``mode``; their ids by runtime."""
    return {"trio": await p.enqueue(Work(mode, n), **options), "asyncio": await p.enqueue(AioWork(mode, n), **options)}


def test_outcomes_match_between_trio_and_asyncio_handlers_on_each_store(tmp_path: Path) -> None:
    async def scenario(name: str, config: Config, folder: Path) -> None:
        seen = Seen()
        async with pipeline.open_pipeline(config, make_registry(seen)) as p:
            ids = {mode: await run_both(p, mode, 7, **({"max_attempts": 2} if mode == "error" else {}))
                   for mode in ("result", "progress", "snooze", "retry", "permanent", "error", "emit")}
            jobs: dict[str, dict[str, Any]] = {}
            for mode, by_runtime in ids.items():
                for runtime, job_id in by_runtime.items():
                    jobs.setdefault(mode, {})[runtime] = await wait_status(p, job_id, "completed", "dead", "cancelled")

            def same(mode: str, **expected: Any) -> None:
                for runtime in RUNTIMES:
                    job = jobs[mode][runtime]
                    got = {field: getattr(job, field) for field in expected}
                    assert got == expected, (mode, runtime, job.error)

            assert await p.result(ids["result"]["trio"]) == await p.result(ids["result"]["asyncio"]) == {"n": 7, "left": True}
            same("result", status="completed", attempts=1)
            same("progress", status="completed", progress=1.0, progress_message="all of it")
            same("snooze", status="completed", attempts=1, snoozes=1, result='"after the snooze"')
            same("retry", status="completed", attempts=2, result="2")
            same("permanent", status="dead", attempts=1, error="permanent error: never")
            same("error", status="dead", attempts=2)
            for runtime in RUNTIMES:
                (routed,) = await p.result(ids["emit"][runtime])
                assert await p.result(routed, timeout=10) == 7
                assert "ValueError: failing, attempt 2" in jobs["error"][runtime].error

            # parent_results and a batch's callback read the store from either runtime
            parent = await p.enqueue(Work("result", 1))
            for runtime, cls in (("trio", Work), ("asyncio", AioWork)):
                child = await p.enqueue(cls("parents"), after=[parent])
                assert await p.result(child, timeout=10) == {parent: {"n": 1, "left": True}}, runtime
                batch = await p.enqueue_batch([Work("result", 2), AioWork("result", 3), Work("result", 4)], then=cls("batch"))
                assert batch.callback_id is not None
                assert await p.result(batch.callback_id, timeout=10) == {
                    "counts": {"completed": 3}, "members": [{"left": True, "n": n} for n in (2, 3, 4)]}, runtime

    on_stores(tmp_path, scenario)


def test_the_timeout_and_a_cancel_reach_both_runtimes_as_their_own_cancellation_on_each_store(tmp_path: Path) -> None:
    async def scenario(name: str, config: Config, folder: Path) -> None:
        seen = Seen()
        async with pipeline.open_pipeline(config, make_registry(seen)) as p:
            timed = await run_both(p, "timeout", max_attempts=1)
            held = {"trio": await p.enqueue(Hold()), "asyncio": await p.enqueue(AioHold())}
            with trio.fail_after(10):
                while not all(seen.by_id.get(job_id) == ["started"] for job_id in held.values()):
                    await trio.sleep(0.01)
            for job_id in held.values():
                assert await p.cancel(job_id) in ("cancelling", "cancelled")
            for runtime in RUNTIMES:
                cancelled = await wait_status(p, held[runtime], "cancelled", "completed", "dead", "pending")
                assert (cancelled.status, cancelled.attempts) == ("cancelled", 1), cancelled.error
                assert "cancelled while running" in (cancelled.error or "")
                timed_out = await wait_status(p, timed[runtime], "dead", "completed", "pending")
                assert timed_out.status == "dead" and f"timed out after {TIMEOUT:g} s (attempt 1)" in (timed_out.error or "")
        own = {"trio": "Cancelled", "asyncio": "CancelledError"}
        for runtime in RUNTIMES:
            assert seen.by_id[held[runtime]] == ["started", own[runtime]]
            assert seen.by_id[timed[runtime]] == [own[runtime]]

    on_stores(tmp_path, scenario)


def test_global_and_key_limits_hold_for_asyncio_handlers_as_for_trio_ones_on_each_store(tmp_path: Path) -> None:
    async def scenario(name: str, config: Config, folder: Path) -> None:
        seen = Seen()
        async with pipeline.open_pipeline(config, make_registry(seen)) as p:
            ids = await p.enqueue_many([Limited(str(n)) for n in range(5)] + [AioLimited(str(n)) for n in range(5)]
                                       + [Keyed(k) for k in "aabbaabb"] + [AioKeyed(k) for k in "aabbaabb"])
            for job_id in ids:
                await wait_status(p, job_id, "completed", timeout=20)
        assert seen.most == {"limited_trio": 1, "limited_aio": 1, "keyed_trio:a": 1, "keyed_trio:b": 1,
                             "keyed_aio:a": 1, "keyed_aio:b": 1}

    on_stores(tmp_path, scenario)


# -- on one store: what does not depend on it ---------------------------------------------------------

REQUEST: contextvars.ContextVar[str | None] = contextvars.ContextVar("REQUEST", default=None)


@dataclasses.dataclass
class Traced:
    n: int


def test_the_middlewares_context_and_span_are_current_inside_an_asyncio_handler(tmp_path: Path) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    import pipeline.otel

    provider = TracerProvider()
    reg = pipeline.Registry(runtime="asyncio")
    pipeline.otel.instrument(reg, tracer_provider=provider)
    entered: list[str] = []

    @reg.middleware
    @contextlib.asynccontextmanager
    async def request_id(ctx: pipeline.JobContext) -> AsyncIterator[None]:
        token = REQUEST.set(f"req-{ctx.id}")
        entered.append(ctx.id)
        try:
            yield
        finally:
            REQUEST.reset(token)

    @reg.job
    async def traced(job: Traced, ctx: pipeline.JobContext) -> dict[str, Any]:
        await asyncio.sleep(0)
        span = trace.get_current_span()
        in_thread = await asyncio.to_thread(REQUEST.get)  # asyncio.to_thread copies the task's context too
        return {"request": REQUEST.get(), "thread": in_thread, "span": getattr(span, "name", None),
                "recording": span.is_recording()}

    async def main() -> None:
        async with pipeline.open_pipeline(fast_config(tmp_path / "jobs.db"), reg) as p:
            job_id = await p.enqueue(Traced(1))
            got = await p.result(job_id, timeout=10)
        assert got == {"request": f"req-{job_id}", "thread": f"req-{job_id}", "span": "process traced", "recording": True}
        assert entered == [job_id]

    asyncio_host.run(main)


@dataclasses.dataclass
class Stubborn:
    n: int


def test_an_asyncio_handler_that_swallows_its_cancellation_is_abandoned_after_the_grace_and_the_log_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pools, "ASYNCIO_GRACE", 0.6)
    loops: list[int] = []
    emitted: list[BaseException] = []
    reg = pipeline.Registry(runtime="asyncio")
    reg.add_event("done", Done, lambda event, config: [])

    @reg.job(timeout=0.2)
    async def stubborn(job: Stubborn, ctx: pipeline.JobContext) -> str:
        while True:
            try:
                await asyncio.sleep(0.02)
                loops.append(ctx.attempt)
                if len(loops) > 40:
                    try:
                        await ctx.emit(Done(1))
                    except pipeline.UsageError as exc:
                        emitted.append(exc)
                        return "late"
            except asyncio.CancelledError:
                pass

    async def main() -> None:
        async with pipeline.open_pipeline(fast_config(tmp_path / "jobs.db"), reg) as p:
            job_id = await p.enqueue(Stubborn(1), max_attempts=1)
            job = await wait_status(p, job_id, "dead", "completed")
            assert job.status == "dead" and "timed out after 0.2 s" in (job.error or "")
            assert "its asyncio handler did not end when cancelled: it caught asyncio.CancelledError" in (job.error or "")
            with trio.fail_after(10):
                while not emitted:
                    await trio.sleep(0.02)
            assert (await p.backend.get(job_id)).status == "dead"  # what it returned later changed nothing

    with caplog.at_level(logging.WARNING, logger="pipeline.jobs"):
        asyncio_host.run(main)
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "pipeline.jobs" and "abandoned" in r.getMessage()]
    assert "it timed out after 0.2 s" in warning and "did not end within 0.6 s of its cancellation" in warning
    assert "attempt 1 is over" in str(emitted[0])
