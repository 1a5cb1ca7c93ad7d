"""SQLITE_SYNCHRONOUS as the connections run it: FULL (2) unless the config says normal.

Read back with ``PRAGMA synchronous`` on each kind of connection the SQLite backend opens:
the Ledger's, the readers', the lease heartbeat's."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from conftest import config_of

from pipeline import Config
from pipeline.backends import open_backend

FULL, NORMAL = 2, 1  # what PRAGMA synchronous answers


def synchronous(conn) -> int:
    (value,) = conn.execute("PRAGMA synchronous").fetchone()
    return value


async def connections_synchronous(config: Config) -> dict[str, int]:
    async with open_backend(config) as backend:
        renewer = backend.lease_renewer()
        try:
            heartbeat = await trio.to_thread.run_sync(lambda: synchronous(renewer._connection()))  # the thread's own
        finally:
            renewer.close()
        return {
            "ledger": await backend.database.write(synchronous),
            "reader": await backend.database.read(synchronous),
            "heartbeat": heartbeat,
        }


async def test_full_is_the_default_on_every_connection(tmp_path: Path) -> None:
    config = config_of(database_url=f"sqlite:///{tmp_path / 'jobs.db'}")  # nothing else set
    assert config.sqlite.synchronous == "full"
    assert await connections_synchronous(config) == {"ledger": FULL, "reader": FULL, "heartbeat": FULL}


@pytest.mark.parametrize(("setting", "expected"), [("normal", NORMAL), ("full", FULL)])
async def test_the_setting_reaches_every_connection(tmp_path: Path, setting: str, expected: int) -> None:
    config = config_of(database_url=f"sqlite:///{tmp_path / 'jobs.db'}", sqlite_synchronous=setting)
    assert set((await connections_synchronous(config)).values()) == {expected}
