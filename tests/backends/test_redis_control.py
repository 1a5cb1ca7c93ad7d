"""What only the Redis store promises about issue 23's control (scripts.py has the keys): every
script keeps the new indexes (expiring:<type> and etypes, creq:<owner>, done:cancelled) in step
with the job hashes and the claim's index; the claim and cancel_requests read nothing more while
nothing is paused, expiring or asked to stop (counted as the server's own command calls, on a
redis-server of the test's own); a claim racing cancels and expiries never returns a job either
ended; the scripts' own ISO text of expires_at is the protocol's; a store of layout 2 is upgraded
to 3, which older code refuses."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import fast_config

from pipeline.backends import Backend, open_backend
from pipeline.backends.base import CANCELLING, expired_error
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
from .test_redis_claim_index import _server_calls, assert_index_in_step

pytestmark = pytest.mark.skipif("redis" not in BACKENDS, reason="no redis entry")


def assert_control_in_step(backend: Backend) -> None:
    """The claim's index in step (test_redis_claim_index), and: expiring:<type> holds exactly the
    pending jobs with an expires_at, scored by it, etypes exactly the types that have one;
    creq:<owner> exactly the running jobs of that owner whose cancel was requested, and no other
    job has the request; done:cancelled exactly the cancelled jobs; no pending job has progress."""
    # the scripts' "now" rounds the server's microseconds to the nearest millisecond, the index
    # check's floors them: a job made due "now" may be a millisecond ahead of it within that millisecond
    time.sleep(0.001)
    assert_index_in_step(backend)
    db = backend.database  # type: ignore[attr-defined]
    client, prefix = db.client, db.prefix
    jobs = {}
    for key in client.scan_iter(match=f"{prefix}job:*", count=1000):
        fields = {k.decode(): v.decode() for k, v in client.hgetall(key).items()}
        jobs[key.decode().removeprefix(f"{prefix}job:")] = fields
    expiring: dict[str, dict[str, int]] = {}
    for key in client.scan_iter(match=f"{prefix}expiring:*", count=1000):
        t = key.decode().removeprefix(f"{prefix}expiring:")
        expiring[t] = {m.decode(): int(s) for m, s in client.zrange(key, 0, -1, withscores=True)}
    should: dict[str, dict[str, int]] = {}
    for job_id, f in jobs.items():
        if f["status"] == "pending" and "expat" in f:
            should.setdefault(f["type"], {})[job_id] = int(f["expat"])
    assert expiring == should
    assert {t.decode() for t in client.smembers(f"{prefix}etypes")} == set(should)
    requests: dict[str, set[str]] = {}
    for key in client.scan_iter(match=f"{prefix}creq:*", count=1000):
        requests[key.decode().removeprefix(f"{prefix}creq:")] = {m.decode() for m in client.smembers(key)}
    asked: dict[str, set[str]] = {}
    for job_id, f in jobs.items():
        if "creq" in f:
            assert f["status"] == "running", f"job {job_id} is {f['status']} with a cancel request"
            asked.setdefault(f["owner"], set()).add(job_id)
    assert requests == asked
    cancelled = {job_id for job_id, f in jobs.items() if f["status"] == "cancelled"}
    assert {m.decode() for m in client.zrange(f"{prefix}done:cancelled", 0, -1)} == cancelled
    assert {m.decode() for m in client.zrange(f"{prefix}status:cancelled", 0, -1)} == cancelled
    assert not [job_id for job_id, f in jobs.items() if f["status"] == "pending" and ("progress" in f or "pmsg" in f)]


async def test_every_control_script_keeps_the_indexes_in_step(tmp_path: Path) -> None:
    async with redis_store(tmp_path) as config, open_backend(config) as backend:
        check = assert_control_in_step
        # expiring jobs at three priorities, one alone at its own with a unique key; one due to expire now
        soon, later, keyed, gone = (job(priority=1, expires_at=ts(FUTURE)), job(priority=2, expires_at=ts(FUTURE)),
                                    job(priority=3, expires_at=ts(FUTURE), unique_key="k"), job(expires_at=ts(-1)))
        await insert(backend, soon, later, keyed, gone)
        check(backend)
        assert await backend.cancel([keyed.id], reason="test") == ["cancelled"]  # pending, expiring, keyed
        check(backend)
        a = await claim_one(backend)  # ends `gone` expired, then takes `soon`
        assert a.id == soon.id and (await record(backend, gone.id)).status == "cancelled"
        check(backend)
        assert await backend.cancel([a.id], reason="test") == [CANCELLING]
        check(backend)
        assert await backend.set_progress(a.id, a.token, 0.5, "half")
        assert await settle_one(backend, retry(a, delay=0.0))  # asked to stop: cancelled, never pending
        check(backend)
        b = await claim_one(backend)  # `later`
        assert await backend.set_progress(b.id, b.token, 0.5, None)
        assert await settle_one(backend, snooze(b, 0.0))  # back in expiring:t, its progress gone
        check(backend)
        b = await claim_one(backend)
        assert await settle_one(backend, release(b))
        check(backend)
        b = await claim_one(backend, lease_seconds=SHORT)
        assert await backend.cancel([b.id], reason="test") == [CANCELLING]
        await outlive(SHORT)
        assert await backend.rescue_expired(base_seconds=FUTURE) == 1  # cancelled, its request dropped
        check(backend)
        assert await backend.revive(b.id)  # back in expiring:t
        check(backend)
        for ahead in (False, True):  # rescued (back after a backoff), unclaimed (back in its place)
            (b,) = await backend.claim({"t": 1}, owner="w", lease_seconds=SHORT, start={"t": 0 if ahead else 1})
            await outlive(SHORT)
            assert await backend.rescue_expired(base_seconds=0.0) == 1
            assert (await record(backend, b.id)).status == "pending"
            check(backend)
        await backend.delete(b.id)
        check(backend)
        # the rescue's sweep of a type nobody claims, and a type of no known worker
        (nobody,) = await add(backend, 1, "nobody", expires_at=ts(-1))
        (unknown,) = await add(backend, 1, "unknown", expires_at=ts(FUTURE))
        assert await backend.rescue_expired(base_seconds=FUTURE) == 1
        assert (await record(backend, nobody)).status == "cancelled"
        check(backend)
        assert await backend.bury_unknown_types(["t", "nobody"], grace_seconds=0.0) == 1
        assert (await record(backend, unknown)).status == "dead"
        check(backend)
        # every way out of running drops a request: succeed, bury, cancel, snooze past its limit
        for end in (succeed, bury, stop, lambda lease: snooze(lease, 0.0, limit=0)):
            await add(backend, 1, "e", expires_at=ts(FUTURE))
            lease = await claim_one(backend, "e")
            assert await backend.cancel([lease.id], reason="test") == [CANCELLING]
            assert await settle_one(backend, end(lease))
            check(backend)
            assert await backend.cancel_requests("owner-a") == []
        assert await backend.cleanup(statuses=("completed", "dead", "cancelled")) == 9
        check(backend)
        db = backend.database  # type: ignore[attr-defined]
        left = {k.decode() for k in db.client.scan_iter(match=f"{db.prefix}*")}
        assert left <= {f"{db.prefix}{name}" for name in ("schema", "types", "workers")}, left


@needs_server_binary
async def test_the_claim_reads_no_more_while_nothing_is_paused_expiring_or_asked_to_stop(tmp_path: Path) -> None:
    """Counted as the server's own calls: with the features unused, a claim of 10 makes no HEXISTS
    and no ZRANGEBYSCORE beyond its own two, one HMGET per job; with a paused type and 1,000 jobs
    that expire in an hour, one HEXISTS per type asked and one ZRANGEBYSCORE of expiring:<type>,
    and not one read of those jobs; cancel_requests of an owner with none reads one empty set."""
    with own_server(tmp_path) as (port, _):
        config = fast_config(tmp_path / "unused.db").replace(
            database_url=f"redis://127.0.0.1:{port}/0", redis=RedisSettings(allow_non_durable=True))
        async with open_backend(config) as backend:
            client = backend.database.client  # type: ignore[attr-defined]

            async def calls_of(do: Any, *names: str) -> dict[str, int]:
                before = _server_calls(client)
                await do()
                after = _server_calls(client)
                return {name: after.get(name, 0) - before.get(name, 0) for name in names}

            def claim_10() -> Any:
                async def do() -> None:
                    assert len(await backend.claim({"t": 10}, owner="w", lease_seconds=LONG)) == 10
                return do

            names = ("hexists", "zrangebyscore", "hmget", "smembers")
            await add(backend, 40)
            assert await calls_of(claim_10(), *names) == {"hexists": 0, "zrangebyscore": 2, "hmget": 10, "smembers": 0}

            await backend.set_type_paused("other", True)
            await insert(backend, *(job(expires_at=ts(FUTURE), delay=FUTURE) for _ in range(1000)))
            assert await calls_of(claim_10(), *names) == {"hexists": 1, "zrangebyscore": 3, "hmget": 10, "smembers": 0}

            async def none_asked() -> None:
                assert await backend.cancel_requests("w") == []
            assert await calls_of(none_asked, *names) == {"hexists": 0, "zrangebyscore": 0, "hmget": 0, "smembers": 1}


async def test_a_claim_racing_cancels_never_returns_a_job_a_cancel_ended(tmp_path: Path) -> None:
    """Two claimers and a canceller on their own connections: each job is either claimed first
    (its cancel answers "cancelling", the request filed for its owner) or cancelled first (never
    leased), never both."""
    async with redis_store(tmp_path) as config, open_backend(config) as backend:
        ids = await add(backend, 300)
        leased: dict[str, str] = {}  # id -> owner
        answers: dict[str, str | None] = {}

        async def claimer(owner: str) -> None:
            while len(leased) + sum(a == "cancelled" for a in answers.values()) < len(ids):
                for lease in await backend.claim({"t": 3}, owner=owner, lease_seconds=LONG):
                    assert lease.id not in leased
                    leased[lease.id] = owner

        async def canceller() -> None:
            # from the last ids, which the claimers (in id order) reach last: the two meet in the middle,
            # however late a loaded machine lets this task start (from the first ids, it was sometimes
            # behind the claimers all the way)
            for i in reversed(range(0, len(ids), 7)):
                chunk = ids[i : i + 7]
                answers.update(zip(chunk, await backend.cancel(chunk, reason="race"), strict=True))

        with trio.fail_after(30):
            async with trio.open_nursery() as tn:
                tn.start_soon(claimer, "a")
                tn.start_soon(claimer, "b")
                tn.start_soon(canceller)
        assert set(answers) == set(ids)
        cancelled = {i for i, a in answers.items() if a == "cancelled"}
        assert not cancelled & set(leased)
        assert {i for i, a in answers.items() if a == CANCELLING} == set(leased)
        assert leased and cancelled  # the race ran both ways
        for owner in ("a", "b"):
            assert {i for i, _ in await backend.cancel_requests(owner)} == {i for i, o in leased.items() if o == owner}
        assert_control_in_step(backend)


async def test_a_claim_never_returns_a_job_whose_expires_at_had_passed(tmp_path: Path) -> None:
    """Jobs expiring over 300 ms, claimed a few at a time meanwhile: each lease began before its
    job's expires_at (the claim's own time: its lease's expiry less the lease), every other job
    ends cancelled as expired."""
    async with redis_store(tmp_path) as config, open_backend(config) as backend:
        rows = [job(expires_at=ts(0.05 + i * 0.001)) for i in range(300)]
        await insert(backend, *rows)
        leases = []
        with trio.fail_after(10):
            while got := await backend.claim({"t": 2}, owner="w", lease_seconds=LONG):
                leases += got
                await trio.sleep(0.002)
        assert leases
        by_id = {row.id: row for row in rows}
        for lease in leases:
            rec = await record(backend, lease.id)
            assert rec.lease_expires_at is not None and rec.expires_at == by_id[lease.id].expires_at
            claimed_at = _epoch(rec.lease_expires_at) - LONG
            assert claimed_at < _epoch(by_id[lease.id].expires_at) + 0.0005, (rec, claimed_at)
        leased = {lease.id for lease in leases}
        for row in rows:
            if row.id not in leased:
                rec = await record(backend, row.id)
                assert (rec.status, rec.error) == ("cancelled", expired_error(row.expires_at or ""))
        assert_control_in_step(backend)


def _epoch(text: str) -> float:
    from pipeline.clock import to_epoch

    return to_epoch(text)


@pytest.mark.parametrize("expires_at", ["1970-01-01T00:00:00.000Z", "1969-12-31T23:59:59.999Z",
                                        "2000-02-29T23:59:59.999Z", "2000-03-01T00:00:00.000Z",
                                        "1999-12-31T23:59:59.001Z", "2024-02-29T12:34:56.789Z",
                                        "1900-03-01T01:02:03.004Z"])
async def test_the_scripts_write_expires_at_in_the_expired_error_as_the_protocol_does(
    tmp_path: Path, expires_at: str
) -> None:
    """The expired error is made in Lua (which has no os.date): its text of the time is the
    protocol's, on leap days, at year ends and before 1970."""
    async with redis_store(tmp_path) as config, open_backend(config) as backend:
        (job_id,) = await add(backend, 1, expires_at=expires_at)
        assert await backend.claim({"t": 1}, owner="w", lease_seconds=LONG) == []
        rec = await record(backend, job_id)
        assert (rec.status, rec.expires_at, rec.error) == ("cancelled", expires_at, expired_error(expires_at))


async def test_a_store_of_layout_2_is_upgraded_and_older_code_refuses_it(tmp_path: Path) -> None:
    """A store of layout 2 (jobs of every status, before control) opened by this code is of
    layout 3 and takes control at once; the schema script of code that knows only 2 leaves it
    at 3, which that code refuses (SchemaTooNew)."""
    async with redis_store(tmp_path) as config:
        async with open_backend(config) as backend:
            db = backend.database  # type: ignore[attr-defined]
            await add(backend, 3)  # one completed, one running, one pending
            assert await settle_one(backend, succeed(await claim_one(backend)))
            held = await claim_one(backend)
            extra = [k for k in db.client.scan_iter(match=f"{db.prefix}*")
                     if k.decode().removeprefix(db.prefix).startswith(("expiring:", "etypes", "paused", "creq:"))]
            assert not extra  # nothing a layout-2 store would lack
            db.client.set(f"{db.prefix}schema", "2")
        async with open_backend(config) as backend:
            db = backend.database  # type: ignore[attr-defined]
            assert db.client.get(f"{db.prefix}schema") == SCHEMA_VERSION.encode()
            assert await backend.cancel([held.id], reason="upgrade") == [CANCELLING]
            assert await backend.cancel_requests("owner-a") == [(held.id, held.token)]
            assert await settle_one(backend, stop(held))
            await backend.set_type_paused("t", True)
            assert await backend.claim({"t": 5}, owner="w", lease_seconds=LONG) == []
            await backend.set_type_paused("t", False)
            assert len(await backend.claim({"t": 5}, owner="w", lease_seconds=LONG)) == 1
            assert_control_in_step(backend)
            assert _text(run_script(db.client, ALL["schema"], [db.prefix, "2"])) == SCHEMA_VERSION  # older code's start
    async with redis_store(tmp_path) as config:
        async with open_backend(config) as backend:
            db = backend.database  # type: ignore[attr-defined]
            db.client.set(f"{db.prefix}schema", str(int(SCHEMA_VERSION) + 1))
        with pytest.raises(SchemaTooNew, match=f"layout version {int(SCHEMA_VERSION) + 1}; this pipeline knows version {SCHEMA_VERSION}"):
            async with open_backend(config):
                pass


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
