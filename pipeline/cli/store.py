"""Commands on the job store: the work runs on the backend DATABASE_URL names (no running service
is needed), and its answer is printed as JSON for --json."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from ..config import Config

if TYPE_CHECKING:
    from ..backends import Backend

T = TypeVar("T")


def with_backend(config: Config, work: Callable[[Backend], Awaitable[T]]) -> T:
    """Open the backend DATABASE_URL names, run ``work`` on it, close it. The commands need
    no running service: they write through the same backend the service uses."""
    import trio

    from ..backends import open_backend

    async def main() -> T:
        async with open_backend(config, role="cli") as backend:
            return await work(backend)

    try:
        return trio.run(main)
    except BaseExceptionGroup as group:  # the backend's nursery wraps what the work raised
        found = list(leaves(group))
        if len(found) == 1:
            raise found[0] from None
        raise


def leaves(exc: BaseException) -> Any:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from leaves(inner)
    else:
        yield exc


def emit_json(out: TextIO, value: Any) -> None:
    json.dump(value, out, indent=2, ensure_ascii=False)
    out.write("\n")
