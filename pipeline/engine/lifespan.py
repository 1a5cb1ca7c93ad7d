"""The registry's lifespan (``@registry.lifespan``), opened once per process that runs jobs, and the check
that a registry with asyncio handlers has an asyncio loop to run them on.

:func:`open_lifespan` is what opens it: ``open_pipeline`` enters it after the registry's resources and
before any actor starts (so before the first job), and leaves it after the last worker settled; so does
``pipeline.testing``. It runs on the registry's runtime: on trio, in the task that enters it; on asyncio
(``Registry(runtime="asyncio")``), as one asyncio task of the host's loop from its opening to its close,
so an asyncio library that ties a resource to its task (an ``async with`` around a task group) works.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any

from ..errors import PipelineError, UsageError
from .asyncio_host import AsyncioHost, current_host

if TYPE_CHECKING:
    from ..config import Config
    from ..registry import Lifespan, Registry


def require_loop(registry: Registry) -> None:
    """UsageError when the registry needs an asyncio loop (an asyncio handler, an asyncio lifespan) and
    this trio run is no guest of one: a plain ``trio.run``, where such handlers cannot run."""
    if not registry.uses_asyncio() or current_host() is not None:
        return
    names = sorted(name for name, spec in registry.handled().items() if spec.runtime == "asyncio")
    what = f"job types {', '.join(names)} have" if names else "its lifespan has"
    raise UsageError(
        f"this registry's {what} runtime='asyncio', but pipeline.open_pipeline runs in a plain trio program, where "
        "no asyncio loop runs. Run the service (python -m pipeline --app ...: its worker processes host an asyncio "
        "loop), embed the pipeline in asyncio code with pipeline.aio.open_pipeline, or declare these handlers "
        "runtime='trio'"
    )


@asynccontextmanager
async def open_lifespan(registry: Registry, config: Config) -> AsyncIterator[Any]:
    """Open ``registry``'s lifespan on its runtime and yield what it yields (``ctx.state``; None without
    one); close it on leaving. An error while it opens is raised as PipelineError naming the lifespan
    (its cause chained): the pipeline does not open. An error while it closes propagates as it is."""
    fn = registry.lifespan_function()
    if fn is None:
        yield None
        return
    manager = _manager(fn, config)
    if registry.runtime == "asyncio":
        host = current_host()
        if host is None:
            require_loop(registry)  # raises
            raise AssertionError("unreachable")
        async with _on_asyncio(host, manager, _describe(fn)) as state:
            yield state
        return
    async with AsyncExitStack() as stack:
        try:
            state = await stack.enter_async_context(manager)
        except Exception as exc:
            raise _failed(fn, exc) from exc
        yield state


def _manager(fn: Lifespan, config: Config) -> AbstractAsyncContextManager[Any]:
    """The lifespan called as it takes it (no parameter, or the Config), as an async context manager:
    an async generator function's generator, or what an ``@asynccontextmanager`` function returns."""
    takes = [p for p in inspect.signature(fn).parameters.values()
             if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    made: Any = fn(config) if takes else fn()
    if hasattr(made, "__aenter__") and hasattr(made, "__aexit__"):
        return made
    return asynccontextmanager(lambda: made)()


@asynccontextmanager
async def _on_asyncio(host: AsyncioHost, manager: AbstractAsyncContextManager[Any], name: str) -> AsyncIterator[Any]:
    """The lifespan as one asyncio task: entered, its state handed over, held until told to close."""
    loop = host.loop
    opened: asyncio.Future[Any] = loop.create_future()
    closing: asyncio.Future[None] = loop.create_future()

    async def hold() -> None:
        async with manager as state:
            opened.set_result(state)
            await closing

    async def until_open(task: asyncio.Task[None]) -> Any:
        await asyncio.wait((opened, task), return_when=asyncio.FIRST_COMPLETED)
        if opened.done():
            return opened.result()
        task.result()  # its error while opening
        raise RuntimeError("the lifespan returned without yielding")

    async def until_closed(task: asyncio.Task[None]) -> None:
        await task  # (cancelled with it when the trio side is)

    task = loop.create_task(hold(), context=contextvars.copy_context())
    try:
        state = await host.run_asyncio(until_open, task)
    except Exception as exc:
        task.cancel()
        raise _failed(name, exc) from exc
    except BaseException:
        task.cancel()
        raise
    try:
        yield state
    finally:
        if not closing.done():
            closing.set_result(None)
        await host.run_asyncio(until_closed, task)


def _failed(fn: Any, exc: BaseException) -> PipelineError:
    name = fn if isinstance(fn, str) else _describe(fn)
    return PipelineError(f"the lifespan {name} failed while opening ({type(exc).__name__}: {exc}): the pipeline does "
                         "not start, and no job runs in this process")


def _describe(fn: Any) -> str:
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    return f"{module}.{name}" if module else str(name)
