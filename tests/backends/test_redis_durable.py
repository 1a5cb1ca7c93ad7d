"""What only the Redis store promises about issue 35's durable functions (the keys: lua/prelude.lua and
scripts.py; the conformance suite, tests/backends/test_durable_store.py, checks the behaviour on every
store): a suspended job is in the suspended set, scored by when it is due, and in none of the pending
sets (ready, the claim's index, the keyed sets, expiring, leases) until it is woken, and every script
keeps that so; its steps and signals go with it, leaving no key behind. wake_suspended reads a range of
the suspended set, so that it costs what it wakes, not what waits; a step and a take_signal cost the
same however many steps and signals the job has; a plain outcome runs the commands it ran before
durable functions (counted as the server's own calls, on a redis-server of the test's own). A job
woken (by its signal, its time, or a signal sent before its SUSPEND) PUBLISHes wake as an insert does;
one that only suspends does not. Names, values and payloads of any text survive the scripts' packing.
A store of layout 5 is upgraded to 6, which older code refuses."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import trio
from conftest import fast_config

from pipeline.backends import Backend, Lease, Settlement, open_backend
from pipeline.backends.base import FOREVER, StepRecord
from pipeline.backends.redis.db import SCHEMA_VERSION, run_script
from pipeline.backends.redis.scripts import ALL
from pipeline.config import RedisSettings
from pipeline.errors import SchemaTooNew, UsageError
from pipeline.states import Transition

from .kit import (
    FUTURE,
    LONG,
    add,
    bury,
    claim_one,
    flow_job,
    insert,
    job,
    record,
    release,
    retry,
    settle_one,
    snooze,
    statuses,
    succeed,
    ts,
)
from .stores import BACKENDS, redis_store
from .test_redis import needs_server_binary, own_server
from .test_redis_claim_index import _server_calls
from .test_redis_control import assert_control_in_step
from .test_redis_limits import _pair

pytestmark = pytest.mark.skipif("redis" not in BACKENDS, reason="no redis entry")

FOREVER_MS = 253402300799999  # base.FOREVER in ms: the suspended set's score of a job without a deadline


def done_step(name: str, value: str | None = '"v"') -> StepRecord:
    at = ts()
    return StepRecord(name, "completed", value, at, at)


def put(lease: Lease, step: StepRecord) -> Settlement:
    return Settlement(lease.id, lease.token, Transition.STEP, step=step)


def suspend(lease: Lease, delay: float, *, awaiting: str | None = None, step: StepRecord | None = None) -> Settlement:
    return Settlement(lease.id, lease.token, Transition.SUSPEND, delay=delay, awaiting=awaiting, step=step)


def assert_durable_in_step(backend: Backend) -> None:
    """The claim's index, expiring:<type>, the cancel requests and done:cancelled in step
    (test_redis_control), and: suspended holds exactly the suspended jobs, scored by their run
    (FOREVER_MS at most), status:suspended and st:suspended:<t> the same jobs; no suspended job is in
    a ready set, kpend, kwait, kready, krun, leases or expiring, or has an expires_at, a lease or
    started; only a suspended job has the await field; each ready set holds exactly the pending jobs
    without a limit key of its type and priority, kpend exactly the pending keyed ones, krun the
    running keyed ones, leases the running ones; uniq:<t> names only waiting, pending, running or
    suspended jobs that have that key, and a suspended job's key (not held only while pending) is
    held by it; steps:<id> and sig:<id> exist only for jobs that exist, and a job's steps have the
    places 1..n."""
    assert_control_in_step(backend)
    db = backend.database  # type: ignore[attr-defined]
    client, prefix = db.client, db.prefix

    def rest(key: bytes, kind: str) -> str:
        return key.decode().removeprefix(f"{prefix}{kind}:")

    def members(key: str | bytes) -> dict[str, float]:
        return {m.decode(): s for m, s in client.zrange(key, 0, -1, withscores=True)}

    jobs = {rest(key, "job"): {k.decode(): v.decode() for k, v in client.hgetall(key).items()}
            for key in client.scan_iter(match=f"{prefix}job:*", count=1000)}
    asleep = {i: f for i, f in jobs.items() if f["status"] == "suspended"}
    assert members(f"{prefix}suspended") == {i: float(f["run"]) for i, f in asleep.items()}
    assert all(int(f["run"]) <= FOREVER_MS for f in asleep.values())
    assert set(members(f"{prefix}status:suspended")) == set(asleep)
    for key in client.scan_iter(match=f"{prefix}st:suspended:*", count=1000):
        t = rest(key, "st:suspended")
        assert set(members(key)) == {i for i, f in asleep.items() if f["type"] == t}
    for i, f in asleep.items():
        assert not {"expat", "owner", "expires", "started", "creq"} & set(f), (i, f)
    assert {i for i, f in jobs.items() if "await" in f} <= set(asleep)

    ready = {m: rest(key, "ready") for key in client.scan_iter(match=f"{prefix}ready:*", count=1000) for m in members(key)}
    assert ready == {i: f"{f['type']}:{f['prio']}" for i, f in jobs.items() if f["status"] == "pending" and "lkey" not in f}
    kpend = {m: rest(key, "kpend") for key in client.scan_iter(match=f"{prefix}kpend:*", count=1000) for m in members(key)}
    assert kpend == {i: f["type"] for i, f in jobs.items() if f["status"] == "pending" and "lkey" in f}
    kwait = {m for key in client.scan_iter(match=f"{prefix}kwait:*", count=1000) for m in members(key)}
    kready = {m[16:] for key in client.scan_iter(match=f"{prefix}kready:*", count=1000) for m in members(key)}
    assert (kwait | kready) == set(kpend) and not kwait & kready
    krun = {m.decode(): _pair(rest(key, "krun")) for key in client.scan_iter(match=f"{prefix}krun:*", count=1000)
            for m in client.smembers(key)}
    assert krun == {i: (f["type"], f["lkey"]) for i, f in jobs.items() if f["status"] == "running" and "lkey" in f}
    assert set(members(f"{prefix}leases")) == {i for i, f in jobs.items() if f["status"] == "running"}

    held: dict[tuple[str, str], str] = {}
    for key in client.scan_iter(match=f"{prefix}uniq:*", count=1000):
        for k, holder in client.hgetall(key).items():
            f = jobs[holder.decode()]
            assert f["status"] in ("waiting", "pending", "running", "suspended") and f.get("ukey") == k.decode(), f
            held[(rest(key, "uniq"), k.decode())] = holder.decode()
    for i, f in asleep.items():
        if "ukey" in f and "uwhile" not in f:
            assert held.get((f["type"], f["ukey"])) == i, f"suspended job {i} does not hold its key"

    for kind in ("steps", "sig"):
        for key in client.scan_iter(match=f"{prefix}{kind}:*", count=1000):
            assert rest(key, kind) in jobs, f"{key!r} outlived its job"
    for key in client.scan_iter(match=f"{prefix}steps:*", count=1000):
        places = sorted(int(v.split(b" ", 1)[0]) for v in client.hvals(key))
        assert places == list(range(1, len(places) + 1)), (key, places)


async def test_every_durable_script_keeps_a_suspended_job_out_of_the_pending_sets(tmp_path: Path) -> None:
    async with redis_store(tmp_path) as config, open_backend(config) as backend:
        check = lambda: assert_durable_in_step(backend)  # noqa: E731
        db = backend.database  # type: ignore[attr-defined]
        plain, keyed, unique, loose, expiring, parent = (
            job("a"), job("k", limit_key="acct"), job("u", unique_key="x"), job("l", unique_key="y", unique_while="pending"),
            job("e", expires_at=ts(FUTURE)), job("p"))
        child = flow_job("c", after=[parent.id])
        await insert(backend, plain, keyed, unique, loose, expiring, parent, child)
        leases = {lease.id: lease for lease in await backend.claim(
            {"a": 1, "k": 1, "u": 1, "l": 1, "e": 1, "p": 1}, owner="w", lease_seconds=LONG)}
        assert len(leases) == 6
        assert all(await backend.settle([put(lease, done_step(f"step-{lease.job_type}")) for lease in leases.values()]))
        check()

        # each kind of job suspends: for a while, for ever awaiting a signal, or due now
        assert await backend.settle([
            suspend(leases[plain.id], FUTURE, step=done_step("sleep")),
            suspend(leases[keyed.id], math.inf, awaiting="go"),
            suspend(leases[unique.id], 0.0),
            suspend(leases[loose.id], FUTURE, awaiting="go"),
            suspend(leases[expiring.id], math.inf, awaiting="go"),
            suspend(leases[parent.id], FUTURE),
        ]) == [True] * 6
        assert await statuses(backend, list(leases)) == ["suspended"] * 6
        assert db.client.zscore(f"{db.prefix}suspended", keyed.id) == FOREVER_MS
        assert (await record(backend, keyed.id)).run_after == FOREVER
        check()
        assert await backend.claim({"a": 5, "k": 5, "u": 5, "l": 5, "e": 5, "p": 5}, owner="w", lease_seconds=LONG,
                                   key_limits={"k": 1}) == []
        assert await backend.insert([job("l", unique_key="y")]) == [loose.id]  # held again as it suspended
        await trio.sleep(0.002)

        # woken: by its time (wake_suspended), by a signal; a signal kept; a suspend that finds its signal
        woken, next_due = await backend.wake_suspended()
        assert woken == 1 and next_due == pytest.approx(FUTURE, abs=5.0)  # `unique`, due now; the next in an hour
        assert await backend.signal(keyed.id, "go", '"k"') == "woken"
        assert await backend.signal(plain.id, "go", None) == "kept"
        check()
        assert await settle_one(backend, succeed(await claim_one(backend, "u")))
        k = await claim_one(backend, "k")
        assert await backend.signal(keyed.id, "again", None) == "kept"
        assert await settle_one(backend, suspend(k, math.inf, awaiting="again"))  # found: pending at once
        assert (await record(backend, keyed.id)).status == "pending"
        check()

        # cancelled, deleted, revived from a step, replayed; the rest cleaned up: no key left behind
        assert await backend.cancel([loose.id, parent.id], reason="test") == ["cancelled", "cancelled"]
        assert await statuses(backend, [child.id]) == ["cancelled"]
        await backend.delete(expiring.id)
        check()
        revived = await backend.revive(parent.id, from_step="step-p")
        assert revived.status == "pending" and revived.steps == ()
        await backend.revive(loose.id)
        check()
        while leases_ := await backend.claim({"a": 5, "k": 5, "u": 5, "l": 5, "e": 5, "p": 5}, owner="w", lease_seconds=LONG):
            assert all(await backend.settle([succeed(lease) for lease in leases_]))
        assert await backend.signal(plain.id, "late", '"l"', key="once") == "kept"
        assert await backend.cancel([plain.id], reason="test") == ["cancelled"]
        check()
        await backend.cleanup(statuses=("completed", "dead", "cancelled"))
        assert (await backend.stats())["total"] == 0
        left = {k.decode() for k in db.client.scan_iter(match=f"{db.prefix}*")}
        assert left <= {f"{db.prefix}{name}" for name in ("schema", "types", "workers")}, left


async def test_a_suspend_of_a_job_asked_to_stop_ends_it_cancelled_and_keeps_its_step(tmp_path: Path) -> None:
    """A job whose cancel was requested never goes back to waiting for its time (as a retry, release or
    snooze of it ends it cancelled): its SUSPEND ends it cancelled, the step it carried written."""
    async with redis_store(tmp_path) as config, open_backend(config) as backend:
        await add(backend, 1, "w", unique_key="k")
        lease = await claim_one(backend, "w")
        assert await backend.cancel([lease.id], reason="test") == ["cancelling"]
        assert await settle_one(backend, suspend(lease, math.inf, awaiting="go", step=done_step("before")))
        got = await record(backend, lease.id)
        assert (got.status, got.awaiting_signal, [s.name for s in got.steps]) == ("cancelled", None, ["before"])
        assert got.error == "cancelled while running (cancel requested); its attempt ended: suspended"
        assert await backend.cancel_requests("owner-a") == []
        assert_durable_in_step(backend)


async def test_names_values_and_payloads_of_any_text_survive_the_scripts(tmp_path: Path) -> None:
    """Step and signal names with spaces, colons, digits, NULs and other scripts; values and payloads
    that are empty text, start with the packing's own markers, or hold escapes: each read back as written.
    Signal names that one field name could confuse ("a", "a:1", "1:a") are kept apart."""
    async with redis_store(tmp_path) as config, open_backend(config) as backend:
        await add(backend, 1, "t")
        lease = await claim_one(backend, "t")
        written = [
            StepRecord("charge card", "completed", '""', ts(), ts()),
            StepRecord("a:1 2", "completed", '"v\\u0000 é 🙂"', ts(), None),
            StepRecord("", "completed", None, ts(), ts()),
            StepRecord("név\x00x", "waiting", 'v', ts()),
            StepRecord("3", "timed_out", "[1, {\"a\": null}]", ts(), ts()),
        ]
        assert all(await backend.settle([put(lease, step) for step in written]))
        assert await backend.steps(lease.id) == written
        assert (await record(backend, lease.id)).steps == tuple(written)

        sent = [("a", '"first a"'), ("a:1", None), ("1:a", '"1:a"'), ("a", '"v"'), ("é 🙂", '"é"'), ("t:a", "0")]
        for n, (name, payload) in enumerate(sent):  # (keys that look like the hash's own fields)
            assert await backend.signal(lease.id, name, payload, key=f"t:{name}:{n}") == "kept"
        got = [await backend.take_signal(lease.id, lease.token, name, done_step(f"got {n}")) for n, (name, _) in enumerate(sent)]
        assert got == [(True, payload) for _, payload in sent]
        assert [step.value for step in (await backend.steps(lease.id))[len(written):]] == [payload for _, payload in sent]
        assert await backend.take_signal(lease.id, lease.token, "a", done_step("none")) == (False, None)
        assert await settle_one(backend, suspend(lease, math.inf, awaiting="a:1 2"))
        assert (await record(backend, lease.id)).awaiting_signal == "a:1 2"
        assert await backend.signal(lease.id, "a:1", None) == "kept"  # not the name it awaits
        assert await backend.signal(lease.id, "a:1 2", None) == "woken"


@needs_server_binary
async def test_wake_suspended_reads_the_due_jobs_not_those_that_wait(tmp_path: Path) -> None:
    """3,000 suspended jobs (half due in an hour, half without a deadline): a wake with nothing due
    runs one range read and one read of the set's head (no job read); with 3 due it reads those 3 jobs,
    whatever waits beside them. Counted as the server's own calls."""
    with own_server(tmp_path) as (port, _):
        config = fast_config(tmp_path / "unused.db").replace(
            database_url=f"redis://127.0.0.1:{port}/0", redis=RedisSettings(allow_non_durable=True))
        async with open_backend(config) as backend:
            client = backend.database.client  # type: ignore[attr-defined]
            await insert(backend, *(job("s") for _ in range(3000)))
            leases = await backend.claim({"s": 3000}, owner="w", lease_seconds=LONG)
            assert all(await backend.settle([suspend(lease, FUTURE if n % 2 else math.inf, awaiting=None if n % 2 else "go")
                                             for n, lease in enumerate(leases)]))
            woken, next_due = await backend.wake_suspended()  # (the server loads the script)
            assert woken == 0 and next_due == pytest.approx(FUTURE, abs=60.0)

            def cost(call: Callable[[], Any]) -> tuple[Any, dict[str, int]]:
                before = _server_calls(client)
                answer = call()
                calls = _server_calls(client)
                return answer, {name: n - before.get(name, 0) for name, n in calls.items()
                                if n != before.get(name, 0) and name != "info"}

            def wake() -> tuple[int, float | None]:
                return trio.from_thread.run(backend.wake_suspended)

            answer, ran = await trio.to_thread.run_sync(cost, wake)
            assert answer[0] == 0 and ran == {"evalsha": 1, "time": 1, "zrangebyscore": 1, "zrange": 1}, ran

            due = [await claim_one(backend, "d") for _ in await add(backend, 3, "d")]
            assert all(await backend.settle([suspend(lease, 0.0) for lease in due]))
            time.sleep(0.002)
            answer, ran = await trio.to_thread.run_sync(cost, wake)
            assert answer[0] == 3
            # per woken job: its status and run, then its type, priority and limit key (resume)
            assert ran["hmget"] == 6 and ran["zrangebyscore"] == 1 and ran["publish"] == 1, ran
            assert await statuses(backend, [lease.id for lease in due]) == ["pending"] * 3


@needs_server_binary
async def test_a_plain_outcome_runs_the_commands_it_ran_and_a_step_costs_the_same_at_any_count(tmp_path: Path) -> None:
    """Each plain outcome runs exactly what it ran before durable functions (measured on 5ff324f's parent,
    layout 5), less the ZREM from status:running and the ZADD to status:pending or status:completed that
    layout 7 no longer keeps (a move to dead keeps its ZADD); a STEP runs 4 commands beside the script's
    TIME whether the job has 1 step or 300, and a take_signal 5, with 1 signal kept or 300 of its name."""
    before_durable = {
        "succeed": {"hmget": 1, "hdel": 1, "hset": 1, "time": 1, "zadd": 2, "zrem": 2},
        "result": {"hmget": 1, "hdel": 1, "hset": 1, "time": 1, "zadd": 2, "zrem": 2},
        "bury": {"hmget": 1, "hdel": 1, "hset": 2, "time": 1, "zadd": 3, "zrem": 2},
        "retry": {"hmget": 1, "hdel": 2, "hset": 2, "sadd": 1, "time": 1, "zadd": 3, "zrem": 2, "zscore": 1},
        "release": {"hmget": 1, "hdel": 2, "hset": 1, "publish": 1, "sadd": 1, "time": 1, "zadd": 3, "zrem": 2, "zscore": 1},
        "snooze": {"hmget": 1, "hdel": 2, "hget": 1, "hset": 1, "sadd": 1, "time": 1, "zadd": 3, "zrem": 2, "zscore": 1},
    }
    outcomes: dict[str, Callable[[Lease], Settlement]] = {
        "succeed": succeed, "result": lambda lease: succeed(lease, '{"a": 1}'), "bury": bury,
        "retry": lambda lease: retry(lease, 10.0), "release": release, "snooze": lambda lease: snooze(lease, 10.0)}
    with own_server(tmp_path) as (port, _):
        config = fast_config(tmp_path / "unused.db").replace(
            database_url=f"redis://127.0.0.1:{port}/0", redis=RedisSettings(allow_non_durable=True))
        async with open_backend(config) as backend:
            client = backend.database.client  # type: ignore[attr-defined]

            async def cost(call: Callable[[], Any]) -> tuple[Any, dict[str, int]]:
                before = _server_calls(client)
                answer = await call()
                calls = _server_calls(client)
                return answer, {name: n - before.get(name, 0) for name, n in calls.items()
                                if n != before.get(name, 0) and name not in ("info", "evalsha")}

            await add(backend, 10, "t")
            assert await settle_one(backend, succeed(await claim_one(backend)))  # (the server loads the script)
            for kind, make in outcomes.items():
                lease = await claim_one(backend)
                assert await cost(lambda: settle_one(backend, make(lease))) == (True, before_durable[kind]), kind

            lease = await claim_one(backend)
            first = await cost(lambda: settle_one(backend, put(lease, done_step("s0"))))
            assert first == (True, {"hmget": 1, "hget": 1, "hlen": 1, "hset": 1, "time": 1}), first
            assert all(await backend.settle([put(lease, done_step(f"s{n}")) for n in range(1, 300)]))
            assert await cost(lambda: settle_one(backend, put(lease, done_step("s300")))) == first
            again = await cost(lambda: settle_one(backend, put(lease, done_step("s7", '"again"'))))
            assert again == (True, {"hmget": 1, "hget": 1, "hset": 1, "time": 1}), again  # its place kept: no HLEN

            assert await backend.signal(lease.id, "warm", None) == "kept"
            assert await backend.take_signal(lease.id, lease.token, "warm", done_step("warm")) == (True, None)  # (loaded)
            assert await backend.signal(lease.id, "one", '"1"') == "kept"
            took = await cost(lambda: backend.take_signal(lease.id, lease.token, "one", done_step("w0")))
            assert took == ((True, '"1"'), {"hmget": 2, "hget": 2, "hdel": 1, "hset": 2, "hlen": 1}), took
            for n in range(300):
                assert await backend.signal(lease.id, "many", f"{n}") == "kept"
            for n in range(2):
                assert await cost(lambda: backend.take_signal(lease.id, lease.token, "many", done_step(f"m{n}"))) == (
                    (True, f"{n}"), took[1])
            expected = [f"s{n}" for n in range(301)] + ["warm", "w0", "m0", "m1"]
            assert [step.name for step in await backend.steps(lease.id)] == expected


async def test_a_woken_job_publishes_wake_as_an_insert_does_and_a_suspend_does_not(tmp_path: Path) -> None:
    async with redis_store(tmp_path) as config, open_backend(config) as backend:
        db = backend.database  # type: ignore[attr-defined]
        listener = redis.Redis.from_url(config.database_url.partition("?")[0])
        pubsub = listener.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(f"{db.prefix}wake")
            pubsub.get_message(timeout=1.0)  # the subscription's confirmation (read, not returned)

            def heard() -> bool:  # a message within 0.2 s (the ones behind it read too)
                if pubsub.get_message(timeout=0.2) is None:
                    return False
                while pubsub.get_message(timeout=0.0) is not None:
                    pass
                return True

            await add(backend, 3, "w")
            assert await trio.to_thread.run_sync(heard)  # the insert
            a, b, c = await claim_one(backend, "w"), await claim_one(backend, "w"), await claim_one(backend, "w")
            assert await backend.settle([suspend(a, math.inf, awaiting="go"), suspend(b, 0.0)]) == [True, True]
            assert not await trio.to_thread.run_sync(heard)  # suspended: nothing became due
            assert await backend.signal(a.id, "other", None) == "kept"
            assert not await trio.to_thread.run_sync(heard)
            assert await backend.signal(a.id, "go", None) == "woken"
            assert await trio.to_thread.run_sync(heard)
            await trio.sleep(0.002)
            assert await backend.wake_suspended() == (1, None)
            assert await trio.to_thread.run_sync(heard)
            assert await backend.wake_suspended() == (0, None)
            assert not await trio.to_thread.run_sync(heard)
            assert await backend.signal(c.id, "go", None) == "kept"
            assert await settle_one(backend, suspend(c, math.inf, awaiting="go"))  # its signal came first: due now
            assert await trio.to_thread.run_sync(heard)
            assert await statuses(backend, [a.id, b.id, c.id]) == ["pending"] * 3
        finally:
            pubsub.close()
            listener.close()


async def test_a_store_of_layout_5_is_upgraded_and_older_code_refuses_it(tmp_path: Path) -> None:
    """A store of layout 5 (jobs of every status, before durable functions) opened by this code is of
    its layout (7), and its jobs take steps, suspend and are woken at once; the schema script of code
    that knows only 5 leaves it at 7, which that code refuses."""
    async with redis_store(tmp_path) as config:
        async with open_backend(config) as backend:
            db = backend.database  # type: ignore[attr-defined]
            old = await insert(backend, job(unique_key="k"), job(), job())  # one completed, one running, one pending
            assert await settle_one(backend, succeed(await claim_one(backend)))
            held = await claim_one(backend)
            extra = [k for k in db.client.scan_iter(match=f"{db.prefix}*")
                     if k.decode().removeprefix(db.prefix).startswith(("suspended", "steps:", "sig:", "status:suspended"))]
            assert not extra  # nothing a layout-5 store would lack
            db.client.set(f"{db.prefix}schema", "5")
        async with open_backend(config) as backend:
            db = backend.database  # type: ignore[attr-defined]
            assert db.client.get(f"{db.prefix}schema") == SCHEMA_VERSION.encode()
            assert await settle_one(backend, put(held, done_step("a")))
            assert await settle_one(backend, suspend(held, math.inf, awaiting="go"))
            assert await backend.signal(held.id, "go", '"p"') == "woken"
            assert await backend.signal(old[2], "go", None) == "kept"
            again = await claim_one(backend)  # the old pending job (due a minute ago), then the woken one
            assert again.id == old[2] and await backend.take_signal(again.id, again.token, "go", done_step("w")) == (True, None)
            with pytest.raises(UsageError, match="has no steps"):  # a job of layout 5 has none to replay from
                await backend.revive(old[0], from_step="a")
            assert await backend.insert([job(unique_key="k")]) != [old[0]]  # (it ended: its key is free)
            assert_durable_in_step(backend)
            assert _text(run_script(db.client, ALL["schema"], [db.prefix, "5"])) == SCHEMA_VERSION  # older code's start
    async with redis_store(tmp_path) as config:
        async with open_backend(config) as backend:
            db = backend.database  # type: ignore[attr-defined]
            db.client.set(f"{db.prefix}schema", "99")
        with pytest.raises(SchemaTooNew, match=f"layout version 99; this pipeline knows version {SCHEMA_VERSION}"):
            async with open_backend(config):
                pass


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
