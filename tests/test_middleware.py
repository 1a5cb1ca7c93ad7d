"""``registry.middleware(fn)`` (issue 22, item 7): ``fn(ctx)`` returns an async context manager
entered around every handler call, sync or async, the first registered outermost. It sees the
job's context and the handler's exception; an exception it raises fails the attempt as a
handler's would."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from jobkit import wait_status

import pipeline
from pipeline import Config
from pipeline.testing import open_test_pipeline

job_tag: contextvars.ContextVar[str] = contextvars.ContextVar("job_tag", default="-")


@dataclasses.dataclass
class SyncWork:
    text: str
    fail_times: int = 0


@dataclasses.dataclass
class AsyncWork:
    text: str


def _registry(calls: list[str]) -> pipeline.Registry:
    """Two middleware around a sync and an async type, each writing down what it sees."""
    reg = pipeline.Registry()

    @reg.middleware
    @contextlib.asynccontextmanager
    async def outer(ctx: pipeline.JobContext) -> AsyncIterator[None]:
        calls.append(f"outer enters {ctx.job_type} attempt {ctx.attempt}/{ctx.max_attempts}")
        token = job_tag.set(ctx.id)  # a logging context, as structlog's contextvars keep one
        try:
            yield
        except Exception as exc:  # what the handler raised passes through here on its way out
            calls.append(f"outer saw {type(exc).__name__}: {exc}")
            raise
        finally:
            job_tag.reset(token)
            calls.append(f"outer exits {ctx.job_type}")

    @contextlib.asynccontextmanager
    async def inner(ctx: pipeline.JobContext) -> AsyncIterator[None]:
        calls.append(f"inner enters {ctx.job_type}")
        yield
        calls.append(f"inner exits {ctx.job_type}")

    assert reg.middleware(inner) is inner

    @reg.job
    def sync_work(job: SyncWork, ctx: pipeline.JobContext) -> None:
        assert job_tag.get() == ctx.id  # the middleware's context reaches the handler, in its thread too
        calls.append(f"handler {ctx.job_type} {job.text}")
        if ctx.attempt <= job.fail_times:
            raise RuntimeError(f"failing on purpose, attempt {ctx.attempt}")

    @reg.job
    async def async_work(job: AsyncWork, ctx: pipeline.JobContext) -> None:
        assert job_tag.get() == ctx.id
        calls.append(f"handler {ctx.job_type} {job.text}")

    return reg


@pytest.mark.parametrize("job", [SyncWork("hi"), AsyncWork("hi")], ids=["sync", "async"])
async def test_middleware_runs_around_the_handler_first_registered_outermost(job: Any) -> None:
    calls: list[str] = []
    reg = _registry(calls)
    name = reg.name_of(job)
    async with open_test_pipeline(reg) as p:  # pipeline.testing: the real engine, retries not waited out
        await p.enqueue(job)
        (record,) = await p.drain()
    assert record.status == "completed"
    assert calls == [
        f"outer enters {name} attempt 1/3", f"inner enters {name}", f"handler {name} hi",
        f"inner exits {name}", f"outer exits {name}",
    ]


async def test_a_middleware_sees_the_handlers_exception_and_the_job_fails_as_usual() -> None:
    calls: list[str] = []
    reg = _registry(calls)
    async with open_test_pipeline(reg) as p:
        await p.enqueue(SyncWork("x", fail_times=1))
        (job,) = await p.drain()
    assert (job.status, job.attempts) == ("completed", 2)
    assert calls == [
        "outer enters sync_work attempt 1/3", "inner enters sync_work", "handler sync_work x",
        # inner has no try around its yield: the exception leaves through it, skipping the rest
        "outer saw RuntimeError: failing on purpose, attempt 1", "outer exits sync_work",
        "outer enters sync_work attempt 2/3", "inner enters sync_work", "handler sync_work x",
        "inner exits sync_work", "outer exits sync_work",
    ]


async def test_an_exception_raised_by_a_middleware_fails_the_attempt(config: Config) -> None:
    ran: list[int] = []
    reg = pipeline.Registry()

    @reg.middleware
    @contextlib.asynccontextmanager
    async def flaky(ctx: pipeline.JobContext) -> AsyncIterator[None]:
        if ctx.attempt == 1:
            raise ConnectionError("metrics server unreachable")
        yield

    @reg.job
    async def work(job: AsyncWork, ctx: pipeline.JobContext) -> None:
        ran.append(ctx.attempt)

    records: list[dict[str, Any]] = []
    async with pipeline.open_pipeline(config, reg) as p:
        p.add_observer(records.append)
        job = await wait_status(p, await p.enqueue(AsyncWork("x")), "completed", "dead")
    assert (job.status, job.attempts, ran) == ("completed", 2, [2])  # attempt 1 never reached the handler
    assert [(r["attempt"], r["outcome"], r["error"]) for r in records] == [
        (1, "error", "ConnectionError: metrics server unreachable"), (2, "ok", None)]


async def test_a_middleware_that_returns_no_async_context_manager_fails_the_attempt_naming_it() -> None:
    ran: list[str] = []
    reg = pipeline.Registry()

    @contextlib.contextmanager
    def sync_context(ctx: pipeline.JobContext) -> Iterator[None]:
        yield

    @reg.middleware
    def sync_manager(ctx: pipeline.JobContext) -> Any:
        return sync_context(ctx)  # a context manager, but not an async one

    @reg.job
    def work(job: SyncWork, ctx: pipeline.JobContext) -> None:
        ran.append(ctx.id)

    async with open_test_pipeline(reg) as p:
        await p.enqueue(SyncWork("x"), max_attempts=1)
        (job,) = await p.drain()
    assert ran == [] and job.status == "dead"
    assert job.error is not None and job.error.startswith(
        "TypeError: middleware test_a_middleware_that_returns_no_async_context_manager_fails_the_attempt_naming_it."
        "<locals>.sync_manager returned _GeneratorContextManager, not an async context manager"), job.error


def test_what_cannot_be_a_middleware_is_refused_at_registration() -> None:
    reg = pipeline.Registry()

    async def coroutine(ctx: pipeline.JobContext) -> None:
        pass

    async def undecorated(ctx: pipeline.JobContext) -> AsyncIterator[None]:
        yield

    with pytest.raises(TypeError, match="middleware .*coroutine is an async def function: it must return an async context manager"):
        reg.middleware(coroutine)
    with pytest.raises(TypeError, match="undecorated is a generator function.*@contextlib.asynccontextmanager"):
        reg.middleware(undecorated)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a function"):
        reg.middleware("log")  # type: ignore[arg-type]
    assert reg._middleware == []
