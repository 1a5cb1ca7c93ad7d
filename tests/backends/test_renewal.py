"""Renewal is fenced by the lease token, not by the owner: a heartbeat that still names an
old claim of a job (rescued and claimed again since, by anyone, itself included) does not
extend the lease of the claim that holds the job now, so it cannot keep that job from
being rescued when its holder dies."""

from __future__ import annotations

import pytest

from pipeline.backends import Backend

from .kit import LONG, SHORT, add, claim_one, epoch, outlive, record, renew


@pytest.mark.parametrize("new_owner", ["owner-a", "owner-b"])
async def test_a_renewal_with_a_stale_token_does_not_extend_the_lease(backend: Backend, new_owner: str) -> None:
    await add(backend)
    old = await claim_one(backend, owner="owner-a", lease_seconds=SHORT)
    await outlive(SHORT)
    assert await backend.rescue_expired(base_seconds=0.0) == 1
    # claimed again (by the same owner too: only the token tells the two claims apart)
    new = await claim_one(backend, owner=new_owner, lease_seconds=SHORT)
    assert new.id == old.id and new.token != old.token
    expires = (await record(backend, new.id)).lease_expires_at

    assert await renew(backend, "owner-a", ["t"], [(old.id, old.token)], lease_seconds=LONG) == [old.id]
    after = await record(backend, new.id)
    assert after.lease_expires_at == expires, "a stale token extended the lease"
    assert (after.status, after.lease_owner, after.attempts) == ("running", new_owner, 2)

    # the new holder died without renewing: its job is rescued as if the stale renewal never happened
    await outlive(SHORT)
    assert await backend.rescue_expired(base_seconds=0.0) == 1
    assert (await record(backend, new.id)).status == "pending"


async def test_a_renewal_with_the_current_token_extends_the_lease(backend: Backend) -> None:
    await add(backend)
    lease = await claim_one(backend, owner="owner-a", lease_seconds=SHORT)
    assert await renew(backend, "owner-a", ["t"], [(lease.id, lease.token)], lease_seconds=LONG) == []
    renewed = await record(backend, lease.id)
    assert renewed.lease_expires_at is not None and epoch(renewed.lease_expires_at) > epoch(lease.created_at) + LONG - 60
    await outlive(SHORT)
    assert await backend.rescue_expired(base_seconds=0.0) == 0  # still held
