"""rescue_expired: only expired leases move, an owner can be left out, and rescuers running
at once move each job once."""

from __future__ import annotations

import pytest
import trio

from pipeline import Config
from pipeline.backends import Backend, open_backend

from .kit import LONG, SHORT, add, outlive, record, renew


async def test_only_expired_leases_are_rescued(backend: Backend) -> None:
    await add(backend, 3, "short")
    await add(backend, 2, "long")
    short = await backend.claim({"short": 3}, owner="w", lease_seconds=0.3)
    long = await backend.claim({"long": 2}, owner="w", lease_seconds=LONG)
    assert await backend.rescue_expired(base_seconds=60.0) == 0  # nothing has expired yet
    await outlive(0.3)
    assert await backend.rescue_expired(base_seconds=60.0) == 3
    assert [(await record(backend, lease.id)).status for lease in short] == ["pending"] * 3
    assert [(await record(backend, lease.id)).status for lease in long] == ["running"] * 2
    assert await backend.rescue_expired(base_seconds=60.0) == 0  # and once only


async def test_a_renewed_lease_is_not_rescued(backend: Backend) -> None:
    await add(backend, 2)
    kept, lapsed = await backend.claim({"t": 2}, owner="w", lease_seconds=0.3)
    assert await renew(backend, "w", ["t"], [(kept.id, kept.token)], lease_seconds=LONG) == []
    await outlive(0.3)
    assert await backend.rescue_expired(base_seconds=60.0) == 1
    assert (await record(backend, kept.id)).status == "running"
    assert (await record(backend, lapsed.id)).status == "pending"


async def test_the_leases_the_caller_holds_are_spared_whoever_owns_them(backend: Backend) -> None:
    await add(backend, 4)
    mine = await backend.claim({"t": 2}, owner="me:1", lease_seconds=SHORT)
    theirs = await backend.claim({"t": 2}, owner="them:2", lease_seconds=SHORT)
    await outlive(SHORT)
    # the caller still holds mine[0]; mine[1] is an orphan of its own (no worker holds it)
    assert await backend.rescue_expired(base_seconds=60.0, spare=[(mine[0].id, mine[0].token)]) == 3
    assert [(await record(backend, lease.id)).status for lease in mine] == ["running", "pending"]
    assert [(await record(backend, lease.id)).status for lease in theirs] == ["pending"] * 2
    # a spared lease is spared only under its own token
    assert await backend.rescue_expired(base_seconds=60.0, spare=[(mine[0].id, mine[0].token + 1)]) == 1
    assert (await record(backend, mine[0].id)).status == "pending"


@pytest.mark.parametrize("rescuers", [2, 6])
async def test_rescuers_running_at_once_move_each_job_once(backend: Backend, store_config: Config, rescuers: int) -> None:
    n = 40
    await add(backend, n)
    await add(backend, 5, "held")
    await backend.claim({"t": n}, owner="gone:1", lease_seconds=SHORT)
    held = await backend.claim({"held": 5}, owner="alive:1", lease_seconds=LONG)
    await outlive(SHORT)
    counts: list[int] = []

    async with open_backend(store_config) as other:  # a second process's view of the same store

        async def rescue(on: Backend) -> None:
            counts.append(await on.rescue_expired(base_seconds=60.0))

        async with trio.open_nursery() as nursery:
            for i in range(rescuers):
                nursery.start_soon(rescue, backend if i % 2 else other)
    assert len(counts) == rescuers
    assert sum(counts) == n, f"rescued {counts}: each of the {n} expired jobs must move exactly once"
    records, total = await backend.list(status="pending", limit=1000)
    assert total == n and all(r.attempts == 1 for r in records)
    assert [(await record(backend, lease.id)).status for lease in held] == ["running"] * 5
