"""What only the Redis store promises about issue 23's limits (the keys: lua/prelude.lua and
scripts.py): every script keeps the keyed jobs' sets (kpend, kwait, kready, kheads, ktypes, krun)
in step with the job hashes, and a unique key held while pending is held by a pending job only;
a type name and a key that share a ':' never meet in one set; a claim takes keyed jobs exactly
as a model of the contract says (round-robin across keys under a key limit, claim order without
one), reading what the keys it visits hold, not their backlog, and a claim with none of the
features reads what it read before them (both counted as the server's own command calls, on a
redis-server of the test's own); the rate window holds for claims from many connections at once,
and rate_free_at answers when the oldest claim that keeps it full leaves it; a store of layout 3
is upgraded to 4, which older code refuses."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import fast_config

from pipeline.backends import Backend, Lease, NewJob, open_backend
from pipeline.backends.redis.db import SCHEMA_VERSION, run_script
from pipeline.backends.redis.scripts import ALL
from pipeline.config import RedisSettings
from pipeline.errors import SchemaTooNew

from .kit import (
    FUTURE,
    LONG,
    SHORT,
    add,
    bury,
    claim_one,
    epoch,
    insert,
    job,
    outlive,
    record,
    release,
    retry,
    settle_one,
    snooze,
    stop,
    succeed,
    ts,
)
from .stores import BACKENDS, redis_store
from .test_redis import needs_server_binary, own_server
from .test_redis_claim_index import _server_calls
from .test_redis_control import assert_control_in_step

pytestmark = pytest.mark.skipif("redis" not in BACKENDS, reason="no redis entry")


def _pair(rest: str) -> tuple[str, str]:
    """'<n>:<type>:<key>' (a kready or krun name after its kind) as (type, key)."""
    n, _, tail = rest.partition(":")
    return tail[: int(n)], tail[int(n) + 1 :]


def _member(run: int, job_id: str) -> str:
    return f"{run + 10**15:016d}{job_id}"


def assert_limits_in_step(backend: Backend) -> None:
    """Issue 23's control indexes in step (test_redis_control), and: kpend:<t> holds exactly the
    pending jobs with a limit key, scored by run; each is in exactly one of kwait:<t> (scored by
    run) and kready:<n>:<t>:<key> (scored by priority, member run then id), and in no ready set;
    kheads:<t> holds each kready set's first member with its score, ktypes the types with a kpend
    set, krun:<n>:<t>:<key> exactly the running jobs of that key. uniq:<t> names only pending or
    running jobs; a running job of unique_while "pending" holds no key, and a pending one's key is
    held (by it or by another)."""
    assert_control_in_step(backend)
    db = backend.database  # type: ignore[attr-defined]
    client, prefix = db.client, db.prefix

    def zsets(kind: str) -> dict[str, dict[str, float]]:
        found = {}
        for key in client.scan_iter(match=f"{prefix}{kind}:*", count=1000):
            rest = key.decode().removeprefix(f"{prefix}{kind}:")
            found[rest] = {m.decode(): s for m, s in client.zrange(key, 0, -1, withscores=True)}
        return found

    jobs = {}
    for key in client.scan_iter(match=f"{prefix}job:*", count=1000):
        jobs[key.decode().removeprefix(f"{prefix}job:")] = {k.decode(): v.decode() for k, v in client.hgetall(key).items()}
    keyed = {i: f for i, f in jobs.items() if f["status"] == "pending" and "lkey" in f}
    kpend, kwait, kheads = zsets("kpend"), zsets("kwait"), zsets("kheads")
    kready = {_pair(rest): members for rest, members in zsets("kready").items()}
    should_pend: dict[str, dict[str, float]] = {}
    for i, f in keyed.items():
        should_pend.setdefault(f["type"], {})[i] = float(f["run"])
    assert kpend == should_pend
    assert {t.decode() for t in client.smembers(f"{prefix}ktypes")} == set(should_pend)
    placed = {i for members in kwait.values() for i in members}
    for (t, key), members in kready.items():
        for m, score in members.items():
            i = m[16:]
            assert i in keyed and (keyed[i]["type"], keyed[i]["lkey"]) == (t, key), (t, key, m)
            assert m == _member(int(keyed[i]["run"]), i) and score == float(keyed[i]["prio"]), (m, score, keyed[i])
            assert i not in placed, f"job {i} is in kwait and kready"
            placed.add(i)
    assert placed == set(keyed)
    for t, members in kwait.items():
        assert all(keyed[i]["type"] == t and score == float(keyed[i]["run"]) for i, score in members.items())
    heads: dict[str, dict[str, float]] = {}
    for (t, _), members in kready.items():
        first = min(members, key=lambda m: (members[m], m.encode()))
        heads.setdefault(t, {})[first] = members[first]
    assert kheads == heads
    for key in client.scan_iter(match=f"{prefix}ready:*", count=1000):
        assert not {m.decode() for m in client.zrange(key, 0, -1)} & set(keyed), f"a keyed job in {key!r}"
    running: dict[tuple[str, str], set[str]] = {}
    for i, f in jobs.items():
        if f["status"] == "running" and "lkey" in f:
            running.setdefault((f["type"], f["lkey"]), set()).add(i)
    krun = {}
    for key in client.scan_iter(match=f"{prefix}krun:*", count=1000):
        krun[_pair(key.decode().removeprefix(f"{prefix}krun:"))] = {m.decode() for m in client.smembers(key)}
    assert krun == running
    held: dict[tuple[str, str], str] = {}
    for key in client.scan_iter(match=f"{prefix}uniq:*", count=1000):
        t = key.decode().removeprefix(f"{prefix}uniq:")
        for k, holder in client.hgetall(key).items():
            held[(t, k.decode())] = holder.decode()
            assert jobs[holder.decode()]["status"] in ("pending", "running"), (t, k, jobs[holder.decode()])
            assert jobs[holder.decode()].get("ukey") == k.decode()
    for i, f in jobs.items():
        if "uwhile" in f and "ukey" in f:
            if f["status"] == "running":
                assert held.get((f["type"], f["ukey"])) != i, f"running job {i} holds its key, held only while pending"
            elif f["status"] == "pending":
                assert (f["type"], f["ukey"]) in held, f"pending job {i}'s key is held by nobody"


def _ids(leases: Sequence[Lease]) -> list[str]:
    return [lease.id for lease in leases]


async def test_every_script_keeps_the_keyed_sets_in_step(tmp_path: Path) -> None:
    async with redis_store(tmp_path) as config, open_backend(config) as backend:
        check = assert_limits_in_step
        # keyed jobs of two keys at two priorities, one due later, one expiring, unkeyed ones beside
        a1, a2, b1 = job(limit_key="a", priority=1), job(limit_key="a", priority=3), job(limit_key="b")
        later, gone = job(limit_key="b", delay=FUTURE), job(limit_key="b", expires_at=ts(-1))
        plain, soon = job(), job(limit_key="a", delay=0.05)
        await insert(backend, a1, a2, b1, later, gone, plain, soon)
        check(backend)
        (held_a,) = await backend.claim({"t": 1}, owner="w", lease_seconds=LONG, key_limits={"t": 1})
        assert held_a.id == a1.id
        assert (await record(backend, gone.id)).status == "cancelled"  # expired at the claim
        check(backend)
        await trio.sleep(0.06)  # `soon` comes due: moved from kwait by the next claim
        claimed = await backend.claim({"t": 5}, owner="w", lease_seconds=LONG, key_limits={"t": 1})
        assert _ids(claimed) == [b1.id, plain.id]  # key a is full
        check(backend)
        assert await settle_one(backend, retry(claimed[0], delay=0.0))  # b1 back, due now
        check(backend)
        assert await settle_one(backend, succeed(claimed[1]))
        (b,) = await backend.claim({"t": 1}, owner="w", lease_seconds=LONG)  # claim order, no key limit
        assert b.id == a2.id  # the lowest priority
        check(backend)
        assert await settle_one(backend, snooze(b, FUTURE))  # back, due later: kwait
        check(backend)
        leases = await backend.claim({"t": 5}, owner="w", lease_seconds=LONG, start={"t": 0})
        check(backend)
        assert await settle_one(backend, release(leases[0]))
        for lease in leases[1:]:
            assert await backend.cancel([lease.id], reason="test") == ["cancelling"]
            assert await settle_one(backend, stop(lease))
        check(backend)
        await add(backend, 4, limit_key="c")
        c = await claim_one(backend, lease_seconds=SHORT)
        d = await claim_one(backend, lease_seconds=SHORT)
        await backend.claim({"t": 1}, owner="w", lease_seconds=SHORT, start={"t": 0})  # never started
        await outlive(SHORT)
        assert await backend.rescue_expired(base_seconds=0.0) >= 2  # back to pending, or in their place
        check(backend)
        assert await backend.cancel([c.id, later.id], reason="test") == ["cancelled", "cancelled"]
        check(backend)
        assert (await backend.revive(later.id)).limit_key == "b"
        check(backend)
        await backend.delete(d.id)
        check(backend)
        assert await settle_one(backend, bury(await claim_one(backend)))
        check(backend)
        # a type of no known worker; jobs held only while pending, keyed too
        await add(backend, 2, "unknown", limit_key="x")
        assert await backend.bury_unknown_types(["t", "u"], grace_seconds=0.0) == 2
        check(backend)
        first = job("u", unique_key="k", unique_while="pending", limit_key="x")
        await insert(backend, first)
        (lease,) = await backend.claim({"u": 1}, owner="w", lease_seconds=LONG, key_limits={"u": 5})
        check(backend)
        for back in (lambda x: retry(x, delay=0.0), release, lambda x: snooze(x, 0.0)):  # the key is free: held again
            assert await settle_one(backend, back(lease))
            check(backend)
            (lease,) = await backend.claim({"u": 1}, owner="w", lease_seconds=LONG)
        assert await settle_one(backend, release(lease))

        async def claim_u(lease_seconds: float, start: int) -> Lease:
            with trio.fail_after(5):  # (a rescued job waits for its backoff)
                while not (got := await backend.claim({"u": 1}, owner="w", lease_seconds=lease_seconds,
                                                      start={"u": start})):
                    await trio.sleep(0.01)
            return got[0]

        for start in (1, 0):  # rescued: back after a backoff, or (never started) in its place
            await claim_u(SHORT, start)
            await outlive(SHORT)
            assert await backend.rescue_expired(base_seconds=0.0) == 1
            check(backend)
        lease = await claim_u(LONG, 1)
        second = job("u", unique_key="k", unique_while="pending")
        assert await backend.insert([second]) == [second.id]
        assert await settle_one(backend, retry(lease, delay=0.0))  # pending, not holding: `second` does
        check(backend)
        for _ in range(2):
            assert all(await backend.settle([succeed(x) for x in await backend.claim({"u": 5}, owner="w", lease_seconds=LONG)]))
        check(backend)
        assert await backend.cancel([a2.id], reason="test") == ["cancelled"]  # snoozed for an hour: in kwait
        assert await settle_one(backend, succeed(held_a))  # key a has room again
        check(backend)
        with trio.fail_after(5):
            while (await backend.list(status="pending"))[1]:  # (a rescued job may wait for its backoff)
                leases = await backend.claim({"t": 10}, owner="w", lease_seconds=LONG, key_limits={"t": 1})
                assert all(await backend.settle([succeed(x) for x in leases]))
                check(backend)
                await trio.sleep(0.01)
        await backend.cleanup(statuses=("completed", "dead", "cancelled"))
        check(backend)
        db = backend.database  # type: ignore[attr-defined]
        left = {k.decode() for k in db.client.scan_iter(match=f"{db.prefix}*")}
        assert left <= {f"{db.prefix}{name}" for name in ("schema", "types", "workers")}, left


async def test_a_type_and_a_key_that_share_a_colon_are_counted_apart(tmp_path: Path) -> None:
    """Type "a:b" key "c" and type "a" key "b:c" would make one name "a:b:c": each keyed set names
    the type's length, so each pair has a limit of its own."""
    async with redis_store(tmp_path) as config, open_backend(config) as backend:
        await add(backend, 2, "a:b", limit_key="c")
        await add(backend, 2, "a", limit_key="b:c")
        first = await backend.claim({"a:b": 1, "a": 1}, owner="w", lease_seconds=LONG, key_limits={"a:b": 1, "a": 1})
        assert sorted(lease.job_type for lease in first) == ["a", "a:b"]
        assert await backend.claim({"a:b": 5, "a": 5}, owner="w", lease_seconds=LONG, key_limits={"a:b": 1, "a": 1}) == []
        assert_limits_in_step(backend)


# -- claims against a model of the contract ----------------------------------------------------


def _expected(pending: list[NewJob], running: dict[str | None, int], want: int, limit: int | None, now: float) -> list[str]:
    """What a claim of ``want`` takes, by the contract: due jobs in claim order (priority, run,
    id); with a key limit, round-robin across the groups (each key with room, the unkeyed jobs
    one group of no limit) in the claim order of their first due job."""
    due = sorted((j for j in pending if epoch(j.run_after) <= now), key=lambda j: (j.priority, j.run_after, j.id))
    if limit is None:
        return [j.id for j in due[:want]]
    groups: dict[str | None, list[NewJob]] = {}
    for j in due:
        groups.setdefault(j.limit_key, []).append(j)
    caps = {key: len(jobs) if key is None else max(0, min(len(jobs), limit - running.get(key, 0)))
            for key, jobs in groups.items()}
    order = [key for key in groups if caps[key] > 0]  # by first due job: dicts keep insertion order
    taken: list[str] = []
    r = 0
    while len(taken) < want and any(caps[key] > r for key in order):
        for key in order:
            if len(taken) < want and caps[key] > r:
                taken.append(groups[key][r].id)
        r += 1
    return taken


@pytest.mark.parametrize("limit", [None, 1, 3])
async def test_claims_take_what_the_model_of_the_contract_takes(tmp_path: Path, limit: int | None) -> None:
    """Random jobs of 6 keys and none, at 3 priorities, some sharing a millisecond, some due
    later; random claims and outcomes: every claim takes exactly the model's jobs, in its order
    (round-robin with a key limit, claim order without), and the sets stay in step."""
    rng = random.Random(limit)
    async with redis_store(tmp_path) as config, open_backend(config) as backend:
        base = time.time()
        pending: dict[str, NewJob] = {}
        running: dict[str, NewJob] = {}
        leases: dict[str, Lease] = {}
        for step in range(12):
            rows = []
            for _ in range(rng.randrange(5, 40)):
                offset = rng.choice([-5.0, -4.0, -3.0, -2.0, 0.3 * (1 + step % 3)])  # shared ms, or due soon
                rows.append(job(limit_key=rng.choice([None, "a", "b", "c", "d", "e", "f:1"]), priority=rng.randrange(3),
                                run_after=ts(offset - (time.time() - base))))
            await insert(backend, *rows)
            pending.update((r.id, r) for r in rows)
            await trio.sleep(rng.choice([0.0, 0.15]))
            want = rng.randrange(1, 12)
            by_key: dict[str | None, int] = {}
            for r in running.values():
                by_key[r.limit_key] = by_key.get(r.limit_key, 0) + 1
            db = backend.database  # type: ignore[attr-defined]
            seconds, micros = db.client.time()
            before_claim = int(seconds) + int(micros) / 1e6
            got = await backend.claim({"t": want}, owner="w", lease_seconds=LONG,
                                      key_limits=None if limit is None else {"t": limit})
            after = time.time()
            expected = _expected(list(pending.values()), by_key, want, limit, before_claim)
            if _ids(got) != expected:  # a job due between the clock read and the claim: once more, by the claim's time
                claimed_at = epoch((await record(backend, got[0].id)).lease_expires_at or "") - LONG if got else after
                expected = _expected(list(pending.values()), by_key, want, limit, claimed_at)
            assert _ids(got) == expected, step
            for lease in got:
                running[lease.id] = pending.pop(lease.id)
                leases[lease.id] = lease
            ending = rng.sample(sorted(running), k=len(running) // 2)
            outcomes = [rng.choice([succeed, lambda x: retry(x, delay=0.0), release])(leases[i]) for i in ending]
            assert all(await backend.settle(outcomes))
            for i, outcome in zip(ending, outcomes, strict=True):
                row = running.pop(i)
                if outcome.transition.name in ("RETRY", "RELEASE"):
                    rec = await record(backend, i)
                    pending[i] = row._replace(run_after=rec.run_after)
            assert_limits_in_step(backend)


# -- reads --------------------------------------------------------------------------------------


def _counted(client: Any, before: dict[str, int], *names: str) -> dict[str, int]:
    after = _server_calls(client)
    return {name: after.get(name, 0) - before.get(name, 0) for name in names}


@needs_server_binary
async def test_a_keyed_claim_reads_the_keys_it_visits_not_their_backlog(tmp_path: Path) -> None:
    """A claim of a type with none of the features makes the calls it made before them, but one
    EXISTS less (paused, expiring and keyed types asked at once). 10,000 due jobs of key A, then
    10 of key B; claims of 4 under a key limit of 2: the first takes two of each key, one HMGET
    per job taken and one HGET per key visited; with both keys full, a claim visits the two and
    reads no job. 3,000 keys at their limit of 1, each with a job due, and a key with room behind
    them: a claim visits 1,000 keys at most (and finds none with room)."""
    with own_server(tmp_path) as (port, _):
        config = fast_config(tmp_path / "unused.db").replace(
            database_url=f"redis://127.0.0.1:{port}/0", redis=RedisSettings(allow_non_durable=True))
        async with open_backend(config) as backend:
            client = backend.database.client  # type: ignore[attr-defined]
            names = ("hmget", "hget", "scard", "zrange", "zrangebyscore", "zcard", "exists", "sismember", "zcount")
            await add(backend, 20, "plain")
            before = _server_calls(client)
            assert len(await backend.claim({"plain": 10}, owner="w", lease_seconds=LONG)) == 10
            # (as before the limits, in a5727fe's claim, but for its two EXISTS)
            assert _counted(client, before, *names) == {"hmget": 10, "hget": 0, "scard": 0, "zrange": 2,
                                                        "zrangebyscore": 2, "zcard": 3, "exists": 1, "sismember": 0,
                                                        "zcount": 0}

            a = await insert(backend, *(job(limit_key="A") for _ in range(10_000)))
            b = await insert(backend, *(job(limit_key="B") for _ in range(10)))
            before = _server_calls(client)
            first = await backend.claim({"t": 4}, owner="w", lease_seconds=LONG, key_limits={"t": 2})
            assert _ids(first) == [a[0], b[0], a[1], b[1]]
            reads = _counted(client, before, *names)
            assert reads["hmget"] == 4 and reads["hget"] == 2 and reads["scard"] == 2, reads
            assert reads["zrange"] <= 8 and reads["zrangebyscore"] <= 4 and reads["zcard"] <= 6, reads
            before = _server_calls(client)
            assert await backend.claim({"t": 4}, owner="w", lease_seconds=LONG, key_limits={"t": 2}) == []
            reads = _counted(client, before, *names)
            assert reads["hmget"] == 0 and reads["hget"] == 2 and reads["scard"] == 2 and reads["zrange"] <= 3, reads
            assert all(await backend.settle([succeed(x) for x in first[1::2]]))  # B's two end
            assert _ids(await backend.claim({"t": 4}, owner="w", lease_seconds=LONG, key_limits={"t": 2})) == b[2:4]

            await insert(backend, *(job("many", limit_key=f"k{i}", delay=-100 + i * 0.001) for i in range(3000)))
            for _ in range(6):  # every key at its limit of 1
                assert len(await backend.claim({"many": 500}, owner="w", lease_seconds=LONG, key_limits={"many": 1})) == 500
            await insert(backend, *(job("many", limit_key=f"k{i}", delay=-100 + i * 0.001) for i in range(3000)))
            await insert(backend, job("many", limit_key="last", delay=-10))
            before = _server_calls(client)
            assert await backend.claim({"many": 2}, owner="w", lease_seconds=LONG, key_limits={"many": 1}) == []
            reads = _counted(client, before, *names)
            assert reads["hget"] == 1000 and reads["scard"] == 1000 and reads["hmget"] == 0, reads


# -- rates ----------------------------------------------------------------------------------------


def _ms(text: str | None) -> int:
    assert text is not None
    return round(epoch(text) * 1000)


async def test_the_rate_window_holds_for_claims_from_many_connections(tmp_path: Path) -> None:
    """Four backends (each its own pool of connections) claim one type limited to 10 per 0.5 s,
    3 at a time, for 2 s, each waiting what rate_free_at says when a claim comes back short (as
    the Poller does): no 0.5 s holds more than 10 claims (the claims' own times, in ms: their
    lease's expiry less the lease), and waiting what rate_free_at says keeps the claims near the
    limit: at least 75 % of 10 per 0.5 s over the time they spanned (an answer late by half a
    window or more falls below; test_control_limits holds every store to 90 % polling every 5 ms,
    and the waits here run late on a loaded machine)."""
    n, window, span = 10, 0.5, 2.0
    async with redis_store(tmp_path) as config:
        async with open_backend(config) as backend:
            await add(backend, 300)

        async def claimer(name: str) -> None:
            async with open_backend(config) as own:
                deadline = trio.current_time() + span
                while trio.current_time() < deadline:
                    got = await own.claim({"t": 3}, owner=name, lease_seconds=LONG, rates={"t": (n, window)})
                    if len(got) < 3:
                        await trio.sleep(min(await own.rate_free_at("t", n, window), 1.0))

        with trio.fail_after(10):
            async with trio.open_nursery() as tn:
                for i in range(4):
                    tn.start_soon(claimer, f"w{i}")
        async with open_backend(config) as backend:
            running, total = await backend.list(status="running", limit=1000)
            times = sorted(_ms(r.lease_expires_at) - round(LONG * 1000) for r in running)
            assert total == len(times) > n
            crowded = [(times[i], times[i + n]) for i in range(len(times) - n) if times[i + n] - times[i] < window * 1000]
            assert not crowded, f"{n + 1} claims within {window} s: {crowded}"
            spanned = (times[-1] - times[0]) / 1000 + window
            assert len(times) >= 0.75 * n * spanned / window, (len(times), spanned)


async def test_rate_free_at_answers_when_the_oldest_claim_keeping_the_window_full_leaves_it(tmp_path: Path) -> None:
    """Claims logged 10, 6, 4 and 2 s ago, a window of 10 s: the first is out of it. With room for 4:
    0; for 2 (3 within): until the 2nd oldest within leaves (6 s less the time since); for 3: until the
    oldest within leaves. Each answer is checked against the server's clock read before and after it
    (a window of seconds, so that a loaded machine's pause cannot move a record out of it meanwhile).
    The claim reads the same window: none taken under a limit of 3, one under 4, and it drops the
    record a whole window old as it goes."""
    async with redis_store(tmp_path) as config, open_backend(config) as backend:
        db = backend.database  # type: ignore[attr-defined]

        def server_ms() -> int:
            seconds, micros = db.client.time()
            return int(seconds) * 1000 + int(micros) // 1000

        now = server_ms()
        key = f"{db.prefix}rate:t"
        db.client.zadd(key, {"x:1": now - 10_000, "a:1": now - 6000, "b:1": now - 4000, "c:1": now - 2000})
        assert await backend.rate_free_at("t", 4, 10.0) == 0.0
        for limit, leaves_in in ((2, 6.0), (3, 4.0)):
            before = (server_ms() - now) / 1000
            answer = await backend.rate_free_at("t", limit, 10.0)
            after = (server_ms() - now) / 1000
            # 2 ms: each clock read is cut to its millisecond, and the answer is in milliseconds too
            assert leaves_in - after - 0.002 <= answer <= leaves_in - before + 0.002, (limit, before, answer, after)
        await add(backend, 3)
        assert await backend.claim({"t": 3}, owner="w", lease_seconds=LONG, rates={"t": (3, 10.0)}) == []
        (lease,) = await backend.claim({"t": 3}, owner="w", lease_seconds=LONG, rates={"t": (4, 10.0)})
        logged = {m.decode(): int(s) for m, s in db.client.zrange(key, 0, -1, withscores=True)}
        claimed_at = _ms((await record(backend, lease.id)).lease_expires_at) - round(LONG * 1000)
        assert logged == {"a:1": now - 6000, "b:1": now - 4000, "c:1": now - 2000, f"{lease.id}:{lease.token}": claimed_at}
        assert 0 < db.client.pttl(key) <= 10_000  # the log of a type no longer claimed goes by itself


# -- the layout -------------------------------------------------------------------------------------


async def test_a_store_of_layout_3_is_upgraded_and_older_code_refuses_it(tmp_path: Path) -> None:
    """A store of layout 3 (jobs of every status, before the limits) opened by this code is of
    layout 4 and takes keyed jobs at once; the schema script of code that knows only 3 leaves it
    at 4, which that code refuses (SchemaTooNew)."""
    async with redis_store(tmp_path) as config:
        async with open_backend(config) as backend:
            db = backend.database  # type: ignore[attr-defined]
            await add(backend, 3)  # one completed, one running, one pending
            assert await settle_one(backend, succeed(await claim_one(backend)))
            held = await claim_one(backend)
            extra = [k for k in db.client.scan_iter(match=f"{db.prefix}*")
                     if k.decode().removeprefix(db.prefix).startswith(("kpend", "kwait", "kready", "kheads", "ktypes",
                                                                       "krun", "rate:"))]
            assert not extra  # nothing a layout-3 store would lack
            db.client.set(f"{db.prefix}schema", "3")
        async with open_backend(config) as backend:
            db = backend.database  # type: ignore[attr-defined]
            assert db.client.get(f"{db.prefix}schema") == SCHEMA_VERSION.encode()
            keyed = await add(backend, 2, limit_key="a")
            got = await backend.claim({"t": 5}, owner="w", lease_seconds=LONG, key_limits={"t": 1})
            assert len(got) == 2 and got[0].id != held.id and keyed[0] in _ids(got)  # the old pending one and one of a
            assert await settle_one(backend, succeed(held))
            assert_limits_in_step(backend)
            assert run_script(db.client, ALL["schema"], [db.prefix, "3"]) == SCHEMA_VERSION.encode()  # older code's start
    async with redis_store(tmp_path) as config:
        async with open_backend(config) as backend:
            db = backend.database  # type: ignore[attr-defined]
            db.client.set(f"{db.prefix}schema", str(int(SCHEMA_VERSION) + 1))
        with pytest.raises(SchemaTooNew, match=f"layout version {int(SCHEMA_VERSION) + 1}; this pipeline knows version {SCHEMA_VERSION}"):
            async with open_backend(config):
                pass
