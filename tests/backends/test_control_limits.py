"""Control (issue 23), second part, on every store: rate limits (no window of a rate-limited type's
length ever holds more than N of its claims, from any number of connections, and with a backlog the
claims reach the rate; ``rate_free_at`` says when the window has room), per-key limits (at most L
running jobs per ``limit_key``, due jobs taken round-robin across keys, so that one key's backlog
cannot starve another, at a cost bounded by the keys, not the backlog), and unique keys held only
while pending (``unique_while="pending"``: the claim frees the key; a job sent back to pending takes
it again only if nobody holds it, and never fails for it). Written from the protocol's contract
(pipeline/backends/base.py and the issue's notes), not from any store's code."""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
import trio

from pipeline import Config
from pipeline.backends import Backend, Lease, NewJob, open_backend
from pipeline.backends.base import Claimed, ClaimOffer, Nudge

from .kit import (
    LONG,
    SHORT,
    add,
    claim_one,
    insert,
    job,
    outlive,
    record,
    release,
    retry,
    settle_one,
    snooze,
    succeed,
)


async def claim(backend: Backend, wants: dict[str, int], *, owner: str = "w", **options: Any) -> list[Lease]:
    return await backend.claim(wants, owner=owner, lease_seconds=LONG, **options)


async def running_by_key(backend: Backend, job_type: str = "t") -> Counter[str | None]:
    """The type's running jobs (whoever holds them) by limit_key, as the store shows them."""
    rows, total = await backend.list(status="running", job_type=job_type, limit=1000)
    assert len(rows) == total
    return Counter(row.limit_key for row in rows)


def keys_of(leases: Sequence[Lease], key: dict[str, str | None]) -> Counter[str | None]:
    return Counter(key[lease.id] for lease in leases)


async def keyed(backend: Backend, job_type: str, limit_key: str | None, n: int, **fields: Any) -> list[str]:
    """``n`` due jobs of ``limit_key``, inserted in one call (in claim order: ids and due times rise)."""
    return await insert(backend, *(job(job_type, limit_key=limit_key, **fields) for _ in range(n)))


# -- rate limits ---------------------------------------------------------------------------------------


async def test_a_rate_limited_claim_takes_at_most_n_in_a_window_then_resumes(backend: Backend) -> None:
    window = 0.5
    rates = {"t": (3, window)}
    await add(backend, 10)
    assert await backend.rate_free_at("t", 3, window) == 0.0  # nothing claimed yet
    before = time.time()
    assert len(await claim(backend, {"t": 5}, rates=rates)) == 3
    after = time.time()
    assert await claim(backend, {"t": 5}, owner="w2", rates=rates) == []  # the same window, another owner

    asked = time.time()
    wait = await backend.rate_free_at("t", 3, window)
    answered = time.time()
    # the three claims leave the window together: one window after the claim's instant, which lies
    # between the call and its return (the store's clock is this machine's; its times are to the ms)
    assert before + window - answered - 0.002 <= wait <= after + window - asked + 0.002, (wait, after - before)
    assert await backend.rate_free_at("t", 4, window) == 0.0  # fewer than 4 claims in the window: room now
    assert await backend.rate_free_at("u", 1, window) == 0.0  # another type's window is its own

    await trio.sleep(wait + 0.01)
    assert await backend.rate_free_at("t", 3, window) == 0.0
    assert len(await claim(backend, {"t": 5}, rates=rates)) == 3  # a whole window's worth again
    assert await claim(backend, {"t": 5}, rates=rates) == []


async def test_rate_free_at_is_when_the_claim_that_keeps_the_window_full_leaves_it(backend: Backend) -> None:
    """Three claims 0.15 s apart: with N claims allowed, the window has room once the (count − N + 1)-th
    oldest claim leaves it, one window after it was made."""
    window = 1.0
    await add(backend, 5)
    made: list[tuple[float, float]] = []
    for k in range(3):
        if k:
            await trio.sleep(0.15)
        before = time.time()
        assert len(await claim(backend, {"t": 1}, rates={"t": (5, window)})) == 1
        made.append((before, time.time()))
    for limit, oldest_kept in ((3, 0), (2, 1), (1, 2)):
        asked = time.time()
        wait = await backend.rate_free_at("t", limit, window)
        answered = time.time()
        before, after = made[oldest_kept]
        assert before + window - answered - 0.002 <= wait <= after + window - asked + 0.002, (limit, wait)
    assert await backend.rate_free_at("t", 4, window) == 0.0


async def test_jobs_claimed_ahead_count_against_the_rate(backend: Backend) -> None:
    await add(backend, 5)
    rates = {"t": (2, 60.0)}
    ahead = await claim(backend, {"t": 4}, start={"t": 0}, rates=rates)
    assert [lease.started for lease in ahead] == [False, False]
    assert await claim(backend, {"t": 4}, rates=rates) == []
    assert await backend.rate_free_at("t", 2, 60.0) > 59.0


async def test_a_rate_and_a_global_limit_together_take_the_smaller_room(backend: Backend) -> None:
    await add(backend, 10)
    options: dict[str, Any] = {"rates": {"t": (5, 60.0)}, "limits": {"t": 2}}
    for expected in (2, 2, 1, 0):  # the limit's room, twice; then what is left of the rate's 5
        leases = await claim(backend, {"t": 4}, **options)
        assert len(leases) == expected
        for lease in leases:
            assert await settle_one(backend, succeed(lease))


async def test_a_rate_binds_only_its_type_and_the_claims_given_it(backend: Backend) -> None:
    t_ids = await add(backend, 5, "t")
    u_ids = await add(backend, 5, "u")
    rates = {"t": (2, 60.0)}
    first = await claim(backend, {"t": 5, "u": 5}, rates=rates)
    assert Counter(lease.job_type for lease in first) == {"t": 2, "u": 5}  # the other type as asked
    assert {lease.id for lease in first if lease.job_type == "u"} == set(u_ids)
    assert await backend.rate_free_at("u", 1, 60.0) == 0.0  # nothing recorded for a type not in rates
    more_u = await add(backend, 3, "u")
    assert sorted(lease.id for lease in await claim(backend, {"u": 5}, rates=rates)) == sorted(more_u)
    # without the rate, the claim takes what it asks (the rate is the claim's, not the store's), and
    # it works exactly as before: it records nothing, so the window still holds the two claims only
    rest = await claim(backend, {"t": 5})
    assert sorted(lease.id for lease in rest) == sorted(t_ids[2:])
    assert await backend.rate_free_at("t", 3, 60.0) == 0.0


def first_excess(claims: Sequence[tuple[float, float]], limit: int, window: float) -> list[tuple[float, float]] | None:
    """``limit`` + 1 claims that certainly fell within less than ``window`` (None if there are none).

    Each claim is known by the interval (call, return) that holds its instant in the store. The
    return alone is not enough: it comes after the store's instant by the call's latency, which
    varies from call to call (a thread, a pool, the scheduler), so return times alone would show a
    correct store over its rate whenever one claim's return lagged more than the next window's first
    claim did. A set whose last return is less than ``window`` after its first call is over the rate
    wherever each claim fell in its interval: no tolerance is needed, and none is allowed."""
    by_call = sorted(claims)
    for i, (first_call, _) in enumerate(by_call):
        later = sorted(by_call[i + 1 :], key=lambda interval: interval[1])[:limit]
        if len(later) == limit and max(by_call[i][1], later[-1][1]) - first_call < window:
            return [by_call[i], *later]
    return None


async def test_claims_from_several_processes_never_exceed_the_rate_and_reach_it(
    backend: Backend, store_config: Config
) -> None:
    """Three backends (three processes' worth of connections), two claimers on each, claim jobs of
    one type limited to 10 in 0.5 s (20/s) as fast as they can for 2 s, with a backlog. From the time
    of every claim: no 0.5 s ever holds more than 10, and the four windows from the first claim
    hold at least 90 % of their 40 (the rate is reached, not merely respected)."""
    limit, window, windows = 10, 0.5, 4
    rates = {"t": (limit, window)}
    await backend.bulk_insert(job() for _ in range(300))
    claims: list[tuple[float, float]] = []  # (call, return), one per job claimed
    async with open_backend(store_config) as second, open_backend(store_config) as third:
        stop_at = time.time() + windows * window + 0.1

        async def claimer(b: Backend, name: str) -> None:
            while time.time() < stop_at:
                called = time.time()
                leases = await b.claim({"t": 4}, owner=name, lease_seconds=LONG, rates=rates)
                returned = time.time()
                claims.extend((called, returned) for _ in leases)
                if leases:
                    await trio.lowlevel.checkpoint()
                else:
                    await trio.sleep(0.005)  # a short poll: the claimers find the window's room themselves

        async with trio.open_nursery() as nursery:
            for k, b in enumerate((backend, second, third, backend, second, third)):
                nursery.start_soon(claimer, b, f"w{k}")

    assert first_excess(claims, limit, window) is None, f"over {limit} in {window} s: {first_excess(claims, limit, window)}"
    start = min(called for called, _ in claims)
    reached = sum(1 for _, returned in claims if returned < start + windows * window)
    assert reached >= 0.9 * windows * limit, f"{reached} claims in {windows} windows of {limit}"
    assert (await backend.list(status="running", job_type="t", limit=0))[1] == len(claims)


# -- per-key limits and round-robin across keys ---------------------------------------------------------


async def test_one_keys_backlog_does_not_starve_another_key(backend: Backend) -> None:
    """10,000 due jobs of key A, then 10 of key B; claims of 4 with 2 allowed per key: every claim
    takes from both keys while B has jobs, no key ever runs more than 2, and a job settled gives
    its key's room back. The claim's cost follows the keys it visits, not A's backlog: its median
    time stays under a loose bound, and near that of the same claim over a backlog of 60 jobs."""
    await backend.bulk_insert(job(limit_key="A") for _ in range(10_000))
    b_ids = await keyed(backend, "t", "B", 10)
    small = {job_id: "A" for job_id in await keyed(backend, "small", "A", 30)}
    small |= {job_id: "B" for job_id in await keyed(backend, "small", "B", 30)}
    key_limits = {"t": 2, "small": 2}

    def key(lease: Lease) -> str:
        return "B" if lease.id in b_ids else "A"

    started = time.perf_counter()
    first = await claim(backend, {"t": 4}, key_limits=key_limits)
    big_times = [time.perf_counter() - started]
    assert Counter(map(key, first)) == {"A": 2, "B": 2}
    assert (await record(backend, next(lease.id for lease in first if key(lease) == "B"))).limit_key == "B"
    assert await claim(backend, {"t": 4}, owner="w2", key_limits=key_limits) == []  # both keys full, whoever asks
    assert await running_by_key(backend) == {"A": 2, "B": 2}

    done = next(lease for lease in first if key(lease) == "A")
    assert await settle_one(backend, succeed(done))  # a settled job gives its key's room back
    again = await claim(backend, {"t": 4}, owner="w2", key_limits=key_limits)
    assert Counter(map(key, again)) == {"A": 1}
    held = [lease for lease in first if lease is not done] + again

    small_times: list[float] = []
    small_held: list[Lease] = []
    b_left = 10 - 2
    for _ in range(12):
        for lease in held + small_held:
            assert await settle_one(backend, succeed(lease))
        started = time.perf_counter()
        held = await claim(backend, {"t": 4}, key_limits=key_limits)
        big_times.append(time.perf_counter() - started)
        assert Counter(map(key, held)) == Counter({"A": 2, "B": min(2, b_left)})  # (a zero count: none)
        b_left -= min(2, b_left)
        assert max((await running_by_key(backend)).values()) <= 2
        started = time.perf_counter()
        small_held = await claim(backend, {"small": 4}, key_limits=key_limits)
        small_times.append(time.perf_counter() - started)
        assert Counter(small[lease.id] for lease in small_held) == {"A": 2, "B": 2}
    assert b_left == 0

    big = statistics.median(big_times)
    # (a loose bound against a claim that reads the backlog many times over; the comparison below is the check)
    assert big < 0.5, f"a keyed claim over 10,000 jobs of one key took {big * 1000:.1f} ms (median)"
    # a claim that read A's whole backlog would take many times the small one (a scan of 10,000 rows
    # is several ms on the server stores; ~2 ms on SQLite, whose claims here also wait ~2 ms for their
    # fsync). Compared by their fastest runs, what a claim costs when nothing else took the CPU:
    # medians differed 5x on a loaded CI machine (4.8 ms against 0.9)
    big, baseline = min(big_times), min(small_times)
    assert big < 3 * baseline + 0.002, f"{big * 1000:.1f} ms over 10,000 jobs, {baseline * 1000:.1f} ms over 60 (fastest of each)"
    # (Jobs without a key behind a backlog this long are not promised a turn at once: to keep plain
    # inserts free of a keyed index, the SQL stores look for the keyless group among the first few
    # hundred due jobs in claim order only; docs/jobs.md says so, and the next test covers the group.)


async def test_keys_take_turns_in_the_claim_order_of_their_first_due_job(backend: Backend) -> None:
    ids = {name: await keyed(backend, "t", name, 3, priority=priority)  # C's jobs inserted last, but run first
           for name, priority in (("A", 5), ("B", 5), ("C", 1))}
    key: dict[str, str | None] = {job_id: name for name, of_key in ids.items() for job_id in of_key}
    options: dict[str, Any] = {"key_limits": {"t": 10}}
    first = await claim(backend, {"t": 4}, **options)
    assert keys_of(first, key) == {"C": 2, "A": 1, "B": 1}  # a turn each, then C's second: C comes first
    assert {lease.id for lease in first} == {*ids["C"][:2], ids["A"][0], ids["B"][0]}  # each key's in claim order
    second = await claim(backend, {"t": 4}, **options)
    assert keys_of(second, key) == {"C": 1, "A": 2, "B": 1}  # C, A, B, then A: A's first due job is before B's


async def test_jobs_without_a_key_are_one_group_of_their_own_with_no_limit(backend: Backend) -> None:
    key: dict[str, str | None] = {}
    key |= {job_id: None for job_id in await keyed(backend, "t", None, 5)}
    key |= {job_id: "A" for job_id in await keyed(backend, "t", "A", 5)}
    options: dict[str, Any] = {"key_limits": {"t": 1}}
    first = await claim(backend, {"t": 4}, **options)
    assert keys_of(first, key) == {None: 3, "A": 1}  # A has its turn though the keyless jobs come first
    second = await claim(backend, {"t": 4}, owner="w2", **options)
    assert keys_of(second, key) == {None: 2}  # A is full; the keyless jobs are not limited
    assert await running_by_key(backend) == {None: 5, "A": 1}


async def test_jobs_claimed_ahead_hold_their_keys_room(backend: Backend) -> None:
    await keyed(backend, "t", "A", 3)
    options: dict[str, Any] = {"key_limits": {"t": 1}}
    (ahead,) = await claim(backend, {"t": 3}, start={"t": 0}, **options)
    assert not ahead.started
    assert await claim(backend, {"t": 3}, owner="w2", **options) == []
    assert await settle_one(backend, release(ahead))
    assert len(await claim(backend, {"t": 3}, owner="w2", **options)) == 1


async def test_a_type_not_in_key_limits_is_claimed_as_before(backend: Backend) -> None:
    t_a = await keyed(backend, "t", "A", 5)
    await keyed(backend, "t", "B", 2)
    u_a = await keyed(backend, "u", "A", 5)
    await keyed(backend, "u", "B", 2)
    leases = await claim(backend, {"t": 4, "u": 4}, key_limits={"t": 1})
    by_type = {name: [lease.id for lease in leases if lease.job_type == name] for name in ("t", "u")}
    assert sorted(by_type["u"]) == u_a[:4]  # claim order, A's backlog first, its key ignored
    assert len(by_type["t"]) == 2  # one of A, one of B
    # and without key_limits at all, a keyed type too
    assert sorted(lease.id for lease in await claim(backend, {"t": 3})) == sorted(set(t_a[:4]) - set(by_type["t"]))


async def test_key_limits_hold_for_claims_from_many_connections_at_once(backend: Backend, store_config: Config) -> None:
    """Six claimers on two backends claim and finish jobs of three keys, 2 allowed per key, as fast
    as they can; after every claim the running jobs of each key are counted."""
    for name in "ABC":
        await backend.bulk_insert(job(limit_key=name) for _ in range(60))
    seen: list[int] = []
    async with open_backend(store_config) as second:

        async def claimer(b: Backend, name: str) -> None:
            for _ in range(25):
                leases = await b.claim({"t": 3}, owner=name, lease_seconds=LONG, key_limits={"t": 2})
                seen.append(max((await running_by_key(b)).values(), default=0))
                await trio.lowlevel.checkpoint()
                for lease in leases:
                    await b.settle([succeed(lease)])

        async with trio.open_nursery() as nursery:
            for k in range(6):
                nursery.start_soon(claimer, backend if k % 2 else second, f"w{k}")
    assert max(seen) <= 2
    assert max(seen) == 2, "the claimers never filled a key: the test proves nothing"


# -- the claim taken with an insert (a store that takes the Poller's offers) ----------------------------


async def offered(store_config: Config, offer: ClaimOffer, rows: Sequence[NewJob], then: Any) -> None:
    """Post ``offer``, insert ``rows`` (the batch takes it), and call ``then(backend, leases)``."""
    nudge_send, nudge_recv = trio.open_memory_channel[Nudge](3)
    offers_send, offers_recv = trio.open_memory_channel[ClaimOffer](1)
    async with open_backend(store_config, nudge_send=nudge_send, offers_recv=offers_recv) as backend:
        offers_send.send_nowait(offer)
        await insert(backend, *rows)
        if store_config.backend == "redis":
            # Redis takes the offer only for jobs its outcomes wake (test_redis_workflows: a chain's
            # link), never with an insert: it claims through claim(), which the tests above cover
            assert offers_send.statistics().current_buffer_used == 1
            return
        assert not offers_send.statistics().current_buffer_used, f"{store_config.backend} took no offer with its insert"
        with trio.fail_after(5):
            while not isinstance(answer := await nudge_recv.receive(), Claimed):
                pass
        await then(backend, answer.leases)


async def test_a_claim_made_with_an_insert_keeps_the_rate(store_config: Config) -> None:
    async def then(backend: Backend, leases: list[Lease]) -> None:
        assert len(leases) == 1
        assert await backend.rate_free_at("t", 1, 60.0) > 59.0  # recorded, as claim() records
        assert await claim(backend, {"t": 3}, rates={"t": (1, 60.0)}) == []

    await offered(store_config, ClaimOffer({"t": 3}, "owner-a", LONG, rates={"t": (1, 60.0)}),
                  [job(), job(), job()], then)


async def test_a_claim_made_with_an_insert_keeps_the_key_limits(store_config: Config) -> None:
    rows = [job(limit_key="A"), job(limit_key="A"), job(limit_key="A"), job(limit_key="B")]

    async def then(backend: Backend, leases: list[Lease]) -> None:
        assert sorted(lease.id for lease in leases) == sorted([rows[0].id, rows[3].id])

    await offered(store_config, ClaimOffer({"t": 4}, "owner-a", LONG, key_limits={"t": 1}), rows, then)


# -- unique keys held only while pending ----------------------------------------------------------------


def pending_only(key: str = "K", job_type: str = "t") -> NewJob:
    return job(job_type, unique_key=key, unique_while="pending")


@pytest.mark.parametrize("ahead", [False, True], ids=["started", "claimed ahead"])
async def test_a_pending_only_key_is_freed_by_the_claim(backend: Backend, ahead: bool) -> None:
    first = pending_only()
    assert await backend.insert([first]) == [first.id]
    assert await backend.insert([pending_only()]) == [first.id]  # held while pending
    (lease,) = await claim(backend, {"t": 1}, start={"t": 0} if ahead else None)
    assert (lease.id, lease.started) == (first.id, not ahead)
    second = pending_only()
    assert await backend.insert([second]) == [second.id]  # the first runs: the key is free
    assert await backend.insert([pending_only(), job(unique_key="K")]) == [second.id, second.id]  # the new one holds it
    assert (await record(backend, first.id)).unique_key == "K"  # still shows the key it was given
    assert await settle_one(backend, succeed(lease))
    assert await backend.insert([pending_only()]) == [second.id]


async def test_a_pending_only_key_is_freed_by_a_claim_of_a_bulk_loaded_job(backend: Backend) -> None:
    first = pending_only()
    assert await backend.bulk_insert(iter([first])) == 1
    assert (await claim_one(backend)).id == first.id
    duplicates: list[tuple[str, str]] = []
    second = pending_only()
    assert await backend.bulk_insert(iter([second, pending_only()]), duplicates=duplicates) == 1
    assert [holder for _, holder in duplicates] == [second.id]


async def back_to_pending(backend: Backend, how: str, lease: Lease) -> None:
    if how == "rescue":
        await outlive(SHORT)
        assert await backend.rescue_expired(base_seconds=0.0) == 1
        return
    outcome = {"retry": retry(lease, 0.0), "release": release(lease), "snooze": snooze(lease, 0.0)}[how]
    assert await settle_one(backend, outcome)


WAYS_BACK = ["retry", "release", "snooze", "rescue"]


@pytest.mark.parametrize("how", WAYS_BACK)
async def test_a_pending_only_job_back_to_pending_leaves_a_key_taken_meanwhile(backend: Backend, how: str) -> None:
    first = pending_only()
    await insert(backend, first)
    lease = await claim_one(backend, lease_seconds=SHORT if how == "rescue" else LONG)
    second = pending_only()
    assert await backend.insert([second]) == [second.id]
    await back_to_pending(backend, how, lease)  # never a constraint error
    again = await record(backend, first.id)
    assert (again.status, again.unique_key) == ("pending", "K")
    assert await backend.insert([pending_only()]) == [second.id]  # the second still holds it
    # once the second runs, nobody holds the key: the first went on without it
    assert (await claim_one(backend, owner="w2")).id == second.id  # due before the first's new run
    third = pending_only()
    assert await backend.insert([third]) == [third.id]
    assert await backend.insert([pending_only()]) == [third.id]
    assert first.id in {lease.id for lease in await claim(backend, {"t": 2}, owner="w3")}  # and the first runs on


@pytest.mark.parametrize("how", WAYS_BACK)
async def test_a_pending_only_job_back_to_pending_holds_its_key_again_if_free(backend: Backend, how: str) -> None:
    first = pending_only()
    await insert(backend, first)
    lease = await claim_one(backend, lease_seconds=SHORT if how == "rescue" else LONG)
    await back_to_pending(backend, how, lease)
    assert await backend.insert([pending_only()]) == [first.id]


async def test_a_default_job_holds_its_key_while_it_runs(backend: Backend) -> None:
    first = job(unique_key="K")  # unique_while None: pending or running, as before
    await insert(backend, first)
    lease = await claim_one(backend)
    assert await backend.insert([job(unique_key="K"), pending_only()]) == [first.id, first.id]
    assert await settle_one(backend, retry(lease, 0.0))
    assert await backend.insert([pending_only()]) == [first.id]
    assert await settle_one(backend, succeed(await claim_one(backend)))
    later = pending_only()
    assert await backend.insert([later]) == [later.id]
