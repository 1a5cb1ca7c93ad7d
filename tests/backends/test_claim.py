"""claim: per-type limits, only due jobs, claim order, attempts, tokens and owners."""

from __future__ import annotations

import random

from pipeline.backends import Backend, NewJob

from .kit import FUTURE, LONG, add, claim_one, epoch, insert, job, new_id, record, release, retry, settle_one, ts


async def test_claim_takes_up_to_the_limit_of_each_type(backend: Backend) -> None:
    a = await add(backend, 4, "a")
    b = await add(backend, 3, "b")
    c = await add(backend, 2, "c")
    leases = await backend.claim({"a": 2, "b": 1}, owner="w1", lease_seconds=LONG)
    by_type = {t: [lease.id for lease in leases if lease.job_type == t] for t in ("a", "b", "c")}
    assert len(by_type["a"]) == 2 and set(by_type["a"]) <= set(a)
    assert len(by_type["b"]) == 1 and set(by_type["b"]) <= set(b)
    assert by_type["c"] == []
    assert [(await record(backend, i)).status for i in c] == ["pending", "pending"]


async def test_a_limit_of_zero_claims_nothing(backend: Backend) -> None:
    await add(backend, 2, "a")
    assert await backend.claim({"a": 0}, owner="w1", lease_seconds=LONG) == []
    assert await backend.claim({}, owner="w1", lease_seconds=LONG) == []
    assert await backend.claim({"nobody": 5}, owner="w1", lease_seconds=LONG) == []


async def test_only_due_jobs_are_claimed(backend: Backend) -> None:
    due = await add(backend, 2)
    later = await add(backend, 2, delay=FUTURE)
    just_due = await insert(backend, job(run_after=ts(-0.001)))
    leases = await backend.claim({"t": 10}, owner="w1", lease_seconds=LONG)
    assert {lease.id for lease in leases} == set(due + just_due)
    for job_id in later:
        got = await record(backend, job_id)
        assert (got.status, got.attempts) == ("pending", 0)
    assert await backend.claim({"t": 10}, owner="w1", lease_seconds=LONG) == []


async def test_claiming_more_than_there_is_returns_what_there_is(backend: Backend) -> None:
    ids = await add(backend, 3)
    leases = await backend.claim({"t": 100}, owner="w1", lease_seconds=LONG)
    assert sorted(lease.id for lease in leases) == sorted(ids)
    assert await backend.claim({"t": 100}, owner="w1", lease_seconds=LONG) == []


def shuffled_rows(seed: int) -> tuple[list[NewJob], list[str]]:
    """Jobs of distinct (priority, run_after), inserted in a shuffled order; their ids in claim order."""
    rows = [job(priority=p, run_after=ts(-100 + 7 * k)) for p in (9, 1, 5) for k in range(4)]
    expected = [r.id for r in sorted(rows, key=lambda r: (r.priority, r.run_after, r.id))]
    random.Random(seed).shuffle(rows)
    return rows, expected


async def test_claim_order_is_priority_then_run_after(backend: Backend) -> None:
    rows, expected = shuffled_rows(1)
    await insert(backend, *rows)
    one_at_a_time = [(await claim_one(backend)).id for _ in range(5)]  # each claim picks the first due
    rest = await backend.claim({"t": 100}, owner="w1", lease_seconds=LONG)
    assert one_at_a_time + [lease.id for lease in rest] == expected  # and a batch comes back in claim order


async def test_claim_order_breaks_ties_by_id_in_one_batch(backend: Backend) -> None:
    when = ts(-10)
    ids = sorted(new_id() for _ in range(6))
    await insert(backend, *(job(job_id=i, run_after=when) for i in reversed(ids)))
    leases = await backend.claim({"t": 100}, owner="w1", lease_seconds=LONG)
    assert [lease.id for lease in leases] == ids


async def test_claim_breaks_ties_by_id_when_it_takes_fewer_than_are_due(backend: Backend) -> None:
    when = ts(-10)
    ids = sorted(new_id() for _ in range(4))
    await insert(backend, *(job(job_id=i, run_after=when) for i in reversed(ids)))  # inserted newest id first
    assert [(await claim_one(backend)).id for _ in range(4)] == ids


async def test_a_claim_counts_the_attempt_records_the_owner_and_hands_out_a_new_token(backend: Backend) -> None:
    (job_id,) = await add(backend, max_attempts=5, payload={"x": 1})
    before = ts()
    lease = await claim_one(backend, owner="host:1", lease_seconds=30)
    got = await record(backend, job_id)
    assert (lease.id, lease.job_type, lease.payload, lease.attempts, lease.max_attempts) == (job_id, "t", '{"x":1}', 1, 5)
    assert (lease.created_at, lease.run_after) == (got.created_at, got.run_after)
    assert (got.status, got.attempts, got.lease_owner) == ("running", 1, "host:1")
    assert got.lease_expires_at is not None
    assert epoch(before) + 29 <= epoch(got.lease_expires_at) <= epoch(ts()) + 31

    tokens = [lease.token]
    for attempt in (2, 3):
        assert await settle_one(backend, release(lease))  # not counted ...
        lease = await claim_one(backend, owner=f"host:{attempt}")
        assert lease.attempts == 1  # ... so this is attempt 1 again
        tokens.append(lease.token)
        assert (await record(backend, job_id)).lease_owner == f"host:{attempt}"
    assert len(set(tokens)) == 3, f"a claim reused a token: {tokens}"


async def test_each_claim_of_a_job_counts_an_attempt(backend: Backend) -> None:
    (job_id,) = await add(backend, max_attempts=5)
    for attempt in (1, 2, 3):
        lease = await claim_one(backend)
        assert lease.attempts == attempt
        assert (await record(backend, job_id)).attempts == attempt
        assert await settle_one(backend, retry(lease, delay=0.0))


async def test_a_running_job_is_not_claimed_again(backend: Backend) -> None:
    await add(backend, 3)
    first = await backend.claim({"t": 2}, owner="w1", lease_seconds=LONG)
    second = await backend.claim({"t": 2}, owner="w2", lease_seconds=LONG)
    assert len(first) == 2 and len(second) == 1
    assert not {lease.id for lease in first} & {lease.id for lease in second}
