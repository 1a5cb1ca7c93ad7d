"""The fence: an outcome or renewal names (id, token) and changes the job only while it runs
under that token. Every outcome × every way a lease goes stale: the stale call says so and
changes nothing; the lease that holds the job now still works."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio

from pipeline.backends import Backend, JobRecord, Lease

from .kit import (
    LONG,
    SHORT,
    add,
    bury,
    claim_one,
    epoch,
    outlive,
    record,
    release,
    renew,
    retry,
    settle_one,
    succeed,
    ts,
)


async def do_succeed(backend: Backend, lease: Lease) -> bool:
    return await settle_one(backend, succeed(lease))


async def do_retry(backend: Backend, lease: Lease) -> bool:
    return await settle_one(backend, retry(lease, delay=30.0, error="late error"))


async def do_bury(backend: Backend, lease: Lease) -> bool:
    return await settle_one(backend, bury(lease, error="late fatal"))


async def do_release(backend: Backend, lease: Lease) -> bool:
    return await settle_one(backend, release(lease))


async def do_renew(backend: Backend, lease: Lease) -> bool:
    lost = await renew(backend, "renewer", ["t"], [(lease.id, lease.token)], lease_seconds=LONG)
    assert lost in ([], [lease.id])
    return lost == []


Outcome = Callable[[Backend, Lease], Awaitable[bool]]
OUTCOMES: dict[str, Outcome] = {
    "succeed": do_succeed, "retry": do_retry, "bury": do_bury, "release": do_release, "renew": do_renew,
}


def check_effect(name: str, before: JobRecord, after: JobRecord, *, since: str) -> None:
    """What a fresh outcome did to the job it held."""
    if name == "succeed":
        assert (after.status, after.attempts) == ("completed", before.attempts)
    elif name == "retry":
        assert (after.status, after.attempts, after.error) == ("pending", before.attempts, "late error")
        assert epoch(since) + 29 <= epoch(after.run_after) <= epoch(ts()) + 31
    elif name == "bury":
        assert (after.status, after.attempts, after.error) == ("dead", before.attempts, "late fatal")
    elif name == "release":
        assert (after.status, after.attempts) == ("pending", before.attempts - 1)
        assert after.run_after <= ts()
    else:
        assert (after.status, after.attempts, after.lease_owner) == ("running", before.attempts, before.lease_owner)
        assert after.lease_expires_at is not None and epoch(after.lease_expires_at) >= epoch(since) + LONG - 1


async def check_stale(backend: Backend, name: str, stale: Lease) -> None:
    before = await record(backend, stale.id)
    assert not await OUTCOMES[name](backend, stale), f"a stale {name} was taken"
    assert await record(backend, stale.id) == before, f"a stale {name} changed the job"


async def rescued(backend: Backend) -> Lease:
    """A lease that expired and was rescued (the job is pending again, after a backoff)."""
    await add(backend)
    lease = await claim_one(backend, owner="owner-a", lease_seconds=SHORT)
    await outlive(SHORT)
    assert await backend.rescue_expired(base_seconds=60.0) == 1
    assert (await record(backend, lease.id)).status == "pending"
    return lease


async def rescued_to_death(backend: Backend) -> Lease:
    await add(backend, max_attempts=1)
    lease = await claim_one(backend, owner="owner-a", lease_seconds=SHORT)
    await outlive(SHORT)
    assert await backend.rescue_expired(base_seconds=60.0) == 1
    assert (await record(backend, lease.id)).status == "dead"
    return lease


async def completed(backend: Backend) -> Lease:
    await add(backend)
    lease = await claim_one(backend)
    assert await settle_one(backend, succeed(lease))
    return lease


async def buried(backend: Backend) -> Lease:
    await add(backend)
    lease = await claim_one(backend)
    assert await settle_one(backend, bury(lease, "first fatal"))
    return lease


async def retried(backend: Backend) -> Lease:
    """Settled once already (and pending again, not yet due)."""
    await add(backend)
    lease = await claim_one(backend)
    assert await settle_one(backend, retry(lease, delay=600.0, error="first error"))
    return lease


async def released(backend: Backend) -> Lease:
    """Released, then due at once: the old token must not come back with it."""
    await add(backend)
    lease = await claim_one(backend)
    assert await settle_one(backend, release(lease))
    return lease


STALE: dict[str, Callable[[Backend], Awaitable[Lease]]] = {
    "rescued": rescued, "rescued-to-dead": rescued_to_death, "completed": completed, "buried": buried,
    "retried": retried, "released": released,
}


@pytest.mark.parametrize("how", sorted(STALE))
@pytest.mark.parametrize("name", sorted(OUTCOMES))
async def test_a_stale_lease_changes_nothing(backend: Backend, name: str, how: str) -> None:
    stale = await STALE[how](backend)
    await check_stale(backend, name, stale)


@pytest.mark.parametrize("name", sorted(OUTCOMES))
async def test_after_a_rescue_and_a_new_claim_the_old_token_is_stale_and_the_new_one_holds(backend: Backend, name: str) -> None:
    await add(backend)
    old = await claim_one(backend, owner="owner-a", lease_seconds=SHORT)
    await outlive(SHORT)
    assert await backend.rescue_expired(base_seconds=0.0) == 1  # no backoff: due at once
    new = await claim_one(backend, owner="owner-b", lease_seconds=LONG)
    assert new.id == old.id and new.token != old.token and new.attempts == 2
    assert (await record(backend, new.id)).lease_owner == "owner-b"

    await check_stale(backend, name, old)

    before, since = await record(backend, new.id), ts()
    assert await OUTCOMES[name](backend, new), f"the current lease's {name} was refused"
    check_effect(name, before, await record(backend, new.id), since=since)


@pytest.mark.parametrize("name", sorted(OUTCOMES))
async def test_an_expired_lease_that_nobody_rescued_still_holds(backend: Backend, name: str) -> None:
    """Expiry alone does not fence: until a rescue moves the job, its worker may still finish it."""
    await add(backend)
    lease = await claim_one(backend, lease_seconds=SHORT)
    await outlive(SHORT)
    before, since = await record(backend, lease.id), ts()
    assert await OUTCOMES[name](backend, lease)
    check_effect(name, before, await record(backend, lease.id), since=since)


async def test_one_settle_call_answers_each_outcome_for_itself(backend: Backend) -> None:
    await add(backend, 6)
    leases = await backend.claim({"t": 6}, owner="w", lease_seconds=LONG)
    for lease in leases[::2]:  # make every other lease stale
        assert await settle_one(backend, succeed(lease))
    before = {lease.id: await record(backend, lease.id) for lease in leases}
    outcomes = [bury(leases[0]), retry(leases[1], 0.0), release(leases[2]), succeed(leases[3]), retry(leases[4], 5.0),
                bury(leases[5])]
    assert await backend.settle(outcomes) == [False, True, False, True, False, True]
    for lease in leases[::2]:
        assert await record(backend, lease.id) == before[lease.id]
    assert [(await record(backend, lease.id)).status for lease in leases[1::2]] == ["pending", "completed", "dead"]


async def test_concurrent_settles_each_hear_their_own_answer(backend: Backend) -> None:
    await add(backend, 20)
    leases = await backend.claim({"t": 20}, owner="w", lease_seconds=LONG)
    stale = leases[:10]
    assert await backend.settle([succeed(lease) for lease in stale]) == [True] * 10
    answers: dict[str, bool] = {}

    async def settle(lease: Lease) -> None:
        answers[lease.id] = await settle_one(backend, bury(lease))

    async with trio.open_nursery() as nursery:
        for lease in leases:
            nursery.start_soon(settle, lease)
    assert answers == {lease.id: lease not in stale for lease in leases}
    statuses = [(await record(backend, lease.id)).status for lease in leases]
    assert statuses == ["completed"] * 10 + ["dead"] * 10


async def test_the_same_outcome_twice_in_one_call_is_taken_once(backend: Backend) -> None:
    await add(backend)
    lease = await claim_one(backend)
    assert await backend.settle([retry(lease, 0.0), retry(lease, 0.0)]) == [True, False]
    got = await record(backend, lease.id)
    assert (got.status, got.attempts) == ("pending", 1)


async def test_a_renewal_reports_only_the_lost_leases_and_pushes_the_others(backend: Backend) -> None:
    await add(backend, 3)
    a, b, c = await backend.claim({"t": 3}, owner="w", lease_seconds=SHORT)
    assert await settle_one(backend, succeed(b))
    since = ts()
    lost = await renew(backend, "w", ["t"], [(a.id, a.token), (b.id, b.token), (c.id, c.token + 1)], lease_seconds=LONG)
    assert sorted(lost) == sorted([b.id, c.id])
    pushed = await record(backend, a.id)
    assert pushed.lease_expires_at is not None and epoch(pushed.lease_expires_at) >= epoch(since) + LONG - 1
    not_pushed = await record(backend, c.id)
    assert not_pushed.lease_expires_at is not None and epoch(not_pushed.lease_expires_at) < epoch(since) + 1
