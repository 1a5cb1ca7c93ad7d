"""Global per-type limits in the claim: a limited type's running jobs, whoever holds them,
never exceed its limit through claims; slots come back when jobs finish or leases are rescued;
other types are claimed as without limits."""

from __future__ import annotations

import trio

from pipeline import Config
from pipeline.backends import Backend, open_backend

from .kit import LONG, SHORT, add, outlive, release, settle_one, succeed


async def running(backend: Backend, job_type: str = "t") -> int:
    return (await backend.list(status="running", job_type=job_type, limit=0))[1]


async def test_a_limited_type_is_claimed_up_to_its_limit_across_owners(backend: Backend) -> None:
    await add(backend, 6, "t")
    others = await add(backend, 4, "other")
    limits = {"t": 3}
    first = await backend.claim({"t": 2, "other": 4}, owner="w1", lease_seconds=LONG, limits=limits)
    assert sorted(lease.job_type for lease in first) == ["other"] * 4 + ["t"] * 2  # the other type as asked
    assert {lease.id for lease in first if lease.job_type == "other"} == set(others)
    second = await backend.claim({"t": 5}, owner="w2", lease_seconds=LONG, limits=limits)
    assert len(second) == 1  # 3 less the 2 that w1 runs
    assert await backend.claim({"t": 5}, owner="w3", lease_seconds=LONG, limits=limits) == []
    assert await running(backend) == 3

    # a slot comes back when a job finishes, or goes back to pending
    assert await settle_one(backend, succeed(first[0]))
    assert await settle_one(backend, release(second[0]))
    third = await backend.claim({"t": 5}, owner="w3", lease_seconds=LONG, limits=limits)
    assert len(third) == 2
    assert await running(backend) == 3
    # without the limit the claim takes what it asks (the limit is the claim's, not the store's)
    assert len(await backend.claim({"t": 5}, owner="w4", lease_seconds=LONG)) == 2


async def test_jobs_claimed_ahead_hold_slots_of_the_limit(backend: Backend) -> None:
    await add(backend, 5, "t")
    ahead = await backend.claim({"t": 2}, owner="w1", lease_seconds=LONG, start={"t": 0}, limits={"t": 3})
    assert [lease.started for lease in ahead] == [False, False]
    started = await backend.claim({"t": 5}, owner="w2", lease_seconds=LONG, limits={"t": 3})
    assert [lease.started for lease in started] == [True]


async def test_a_limit_already_exceeded_claims_nothing(backend: Backend) -> None:
    await add(backend, 5, "t")
    await backend.claim({"t": 4}, owner="w1", lease_seconds=LONG)  # a process without the limit
    assert await backend.claim({"t": 5}, owner="w2", lease_seconds=LONG, limits={"t": 2}) == []


async def test_a_dead_workers_slots_come_back_when_its_leases_are_rescued(backend: Backend) -> None:
    await add(backend, 4, "t")
    held = await backend.claim({"t": 4}, owner="dies", lease_seconds=SHORT, limits={"t": 2})
    assert len(held) == 2
    assert await backend.claim({"t": 4}, owner="w2", lease_seconds=LONG, limits={"t": 2}) == []
    await outlive(SHORT)
    assert await backend.rescue_expired(base_seconds=0.0) == 2
    # rescued after a backoff of 0: due again at once, and the slots are free
    after = await backend.claim({"t": 4}, owner="w2", lease_seconds=LONG, limits={"t": 2})
    assert len(after) == 2


async def test_claims_from_many_connections_at_once_never_exceed_the_limit(backend: Backend, store_config: Config) -> None:
    """Eight claimers on two backends (two connection pools) claim and finish jobs of one
    limited type as fast as they can; after every claim, the running count is checked."""
    limit = 3
    await add(backend, 200, "t")
    seen: list[int] = []
    async with open_backend(store_config) as second:

        async def claimer(b: Backend, name: str) -> None:
            for _ in range(60):
                leases = await b.claim({"t": 2}, owner=name, lease_seconds=LONG, limits={"t": limit})
                seen.append(await running(b))
                await trio.lowlevel.checkpoint()
                for lease in leases:
                    await b.settle([succeed(lease)])

        async with trio.open_nursery() as nursery:
            for k in range(8):
                nursery.start_soon(claimer, backend if k % 2 else second, f"w{k}")
    assert max(seen) <= limit
    assert max(seen) == limit, "the claimers never filled the limit: the test proves nothing"
