"""Attempts and backoff: what RETRY, RELEASE and the rescue of an expired lease write."""

from __future__ import annotations

import pytest

from pipeline.backends import Backend

from .kit import SHORT, add, claim_one, epoch, outlive, record, release, retry, settle_one, ts

LOW, HIGH = 0.85, 1.15  # the jitter bounds of the design (states.JITTER), stated here on purpose


@pytest.mark.parametrize("delay", [0.0, 2.5, 90.0])
async def test_a_retry_is_due_after_its_delay_with_the_error_recorded(backend: Backend, delay: float) -> None:
    (job_id,) = await add(backend)
    lease = await claim_one(backend)
    before = ts()
    assert await settle_one(backend, retry(lease, delay, error="ValueError: nope"))
    after = ts()
    got = await record(backend, job_id)
    assert (got.status, got.attempts, got.error) == ("pending", 1, "ValueError: nope")
    assert epoch(before) + delay - 1 <= epoch(got.run_after) <= epoch(after) + delay + 1
    assert epoch(before) + delay - 0.002 <= epoch(got.run_after)
    claimed = await backend.claim({"t": 1}, owner="w", lease_seconds=60)
    assert [lease.id for lease in claimed] == ([job_id] if delay == 0.0 else [])


async def test_a_release_does_not_count_the_attempt_and_is_due_at_once(backend: Backend) -> None:
    (job_id,) = await add(backend, max_attempts=2)
    first = await claim_one(backend)
    assert await settle_one(backend, retry(first, 0.0))
    second = await claim_one(backend)
    assert second.attempts == 2
    assert await settle_one(backend, release(second))
    got = await record(backend, job_id)
    assert (got.status, got.attempts, got.lease_owner) == ("pending", 1, None)
    assert got.run_after <= ts()
    third = await claim_one(backend)  # due at once
    assert third.attempts == 2  # the released attempt was not counted: this is the second again


async def test_a_release_of_a_first_attempt_goes_back_to_zero(backend: Backend) -> None:
    (job_id,) = await add(backend)
    assert await settle_one(backend, release(await claim_one(backend)))
    assert (await record(backend, job_id)).attempts == 0


@pytest.mark.parametrize("attempts", [1, 2, 3])
async def test_a_rescued_lease_backs_off_base_times_two_to_the_failed_attempts_with_jitter(
    backend: Backend, attempts: int
) -> None:
    base = 20.0
    (job_id,) = await add(backend, max_attempts=5)
    for _ in range(attempts - 1):
        assert await settle_one(backend, retry(await claim_one(backend), 0.0))
    lease = await claim_one(backend, owner="gone:1", lease_seconds=SHORT)
    assert lease.attempts == attempts
    await outlive(SHORT)
    before = ts()
    assert await backend.rescue_expired(base_seconds=base) == 1
    after = ts()
    got = await record(backend, job_id)
    assert (got.status, got.attempts, got.lease_owner) == ("pending", attempts, None)
    assert got.error is not None and "lease" in got.error
    backoff = base * 2 ** (attempts - 1)
    assert epoch(before) + backoff * LOW - 0.002 <= epoch(got.run_after) <= epoch(after) + backoff * HIGH + 0.002


async def test_rescue_jitter_spreads_the_backoff_within_its_bounds(backend: Backend) -> None:
    base, n = 100.0, 40
    ids = await add(backend, n)
    await backend.claim({"t": n}, owner="gone:1", lease_seconds=SHORT)
    await outlive(SHORT)
    before = ts()
    assert await backend.rescue_expired(base_seconds=base) == n
    after = ts()
    delays = [epoch((await record(backend, i)).run_after) for i in ids]
    assert all(epoch(before) + base * LOW - 0.002 <= d <= epoch(after) + base * HIGH + 0.002 for d in delays)
    assert max(delays) - min(delays) > base * 0.05, "no jitter: every rescued job is due at the same moment"


async def test_a_rescued_lease_out_of_attempts_goes_dead_naming_the_lease(backend: Backend) -> None:
    (job_id,) = await add(backend, max_attempts=2)
    assert await settle_one(backend, retry(await claim_one(backend), 0.0))
    await claim_one(backend, owner="gone:2", lease_seconds=SHORT)
    await outlive(SHORT)
    assert await backend.rescue_expired(base_seconds=1.0) == 1
    got = await record(backend, job_id)
    assert (got.status, got.attempts, got.lease_owner) == ("dead", 2, None)
    assert got.error is not None and "lease" in got.error
    assert await backend.claim({"t": 1}, owner="w", lease_seconds=60) == []
