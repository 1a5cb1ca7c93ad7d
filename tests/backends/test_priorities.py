"""Priorities: lower runs first, whatever waits ahead; every priority in range is kept exactly;
operators list by priority and in claim order."""

from __future__ import annotations

import pytest

from pipeline.backends import Backend
from pipeline.backends.base import PRIORITY_MAX, PRIORITY_MIN
from pipeline.errors import UsageError

from .kit import LONG, claim_one, insert, job, record, ts


async def test_a_priority_0_job_behind_10000_pending_priority_5_jobs_is_the_next_claimed(backend: Backend) -> None:
    rows = [job(priority=5) for _ in range(10_000)]
    for k in range(0, len(rows), 1000):
        await insert(backend, *rows[k : k + 1000])
    (urgent,) = await insert(backend, job(priority=0, delay=-0.001))  # inserted last, due last
    lease = await claim_one(backend)
    assert (lease.id, lease.attempts) == (urgent, 1)
    # and the rest keep their order behind it
    following = await backend.claim({"t": 3}, owner="w1", lease_seconds=LONG)
    first = sorted(rows, key=lambda r: (r.run_after, r.id))[:3]
    assert [lease.id for lease in following] == [r.id for r in first]


async def test_every_priority_in_range_is_kept_exactly_and_claimed_in_order(backend: Backend) -> None:
    # the extremes and their neighbours: a store that rounded them (a double, a 32-bit
    # overflow) would read them back changed, or claim two of them in the wrong order
    priorities = [PRIORITY_MAX, PRIORITY_MIN + 1, 0, PRIORITY_MAX - 1, -1, PRIORITY_MIN, 1]
    when = ts(-10)
    ids = await insert(backend, *(job(priority=p, run_after=when) for p in priorities))
    for job_id, p in zip(ids, priorities):
        assert (await record(backend, job_id)).priority == p
    claimed = [(await claim_one(backend)).id for _ in priorities]
    assert claimed == [i for _, i in sorted(zip(priorities, ids))]


async def test_list_filters_by_priority_and_sorts_in_claim_order(backend: Backend) -> None:
    rows = [job(priority=p, run_after=ts(offset)) for p, offset in ((3, -5), (1, -1), (3, -9), (1, -7), (2, -3))]
    await insert(backend, *rows)
    other = await insert(backend, job("other", priority=1))
    claim_order = [r.id for r in sorted(rows, key=lambda r: (r.priority, r.run_after, r.id))]

    got, total = await backend.list(job_type="t", order="claim")
    assert ([j.id for j in got], total) == (claim_order, 5)
    got, total = await backend.list(job_type="t", order="claim", limit=2, offset=1)
    assert ([j.id for j in got], total) == (claim_order[1:3], 5)

    got, total = await backend.list(priority=1)
    assert total == 3
    assert [j.id for j in got] == sorted([rows[1].id, rows[3].id, *other], reverse=True)  # newest first, as ever
    got, total = await backend.list(priority=3, job_type="t", order="claim")
    assert ([j.id for j in got], total) == ([rows[2].id, rows[0].id], 2)
    got, total = await backend.list(priority=3, status="pending", job_type="t")
    assert ([j.id for j in got], total) == (sorted([rows[2].id, rows[0].id], reverse=True), 2)
    assert await backend.list(priority=4) == ([], 0)

    (lease,) = await backend.claim({"t": 1}, owner="w1", lease_seconds=LONG)
    assert lease.id == claim_order[0]
    got, total = await backend.list(status="pending", priority=1, order="claim")
    assert ([j.id for j in got], total) == ([*other, rows[1].id], 2)  # due a minute ago, then a second ago
    got, total = await backend.list(status="running", priority=1, order="claim")
    assert ([j.id for j in got], total) == ([lease.id], 1)


async def test_list_refuses_an_unknown_order(backend: Backend) -> None:
    with pytest.raises(UsageError, match="unknown order 'oldest'; expected one of newest, claim"):
        await backend.list(order="oldest")
