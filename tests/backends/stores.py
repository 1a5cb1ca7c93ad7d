"""The backends the conformance suite runs against, by name.

An entry is an async context manager that, given a directory of its own (pytest's tmp_path),
prepares a fresh, empty store and yields the Config that names it (its DATABASE_URL), and
removes the store afterwards. Adding a backend to the suite is adding an entry here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from conftest import fast_config

from pipeline import Config


@asynccontextmanager
async def sqlite_store(tmp_path: Path) -> AsyncIterator[Config]:
    """A new file in tmp_path (whoever made the directory removes it)."""
    yield fast_config(tmp_path / "conformance.db")


StoreFactory = Callable[[Path], AbstractAsyncContextManager[Config]]

BACKENDS: dict[str, StoreFactory] = {
    "sqlite": sqlite_store,
    # next: "postgres": postgres_store (a fresh database per test), "redis": redis_store (a fresh key prefix/db)
}
