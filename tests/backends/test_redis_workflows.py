"""What only the Redis store promises about issue 24's workflows (scripts.py has the keys; the
conformance suite, tests/backends/test_workflows.py, checks the behaviour on every store): every
script keeps the edges (after:, children:, down:, the fields wfor and kids), status:waiting and the
batches in step with the job hashes, and a woken job enters its ready set (or its key's sets), the
claim's index and expiring:<type> as any pending job; a cancel runs down a chain of 300 in one
script; rescue_waiting repairs what a defect left (a parent ended or gone without its edges
counting); nothing is left once every job is removed. A plain job's settle runs the same commands
as before workflows, none on a workflow key, and an empty sweep two reads (counted as the server's
own calls, on a redis-server of the test's own). A WAKE of a due job PUBLISHes wake; of a job not due,
nothing. A bulk load stages the edges of every chunk and part. A store of layout 4 is upgraded to the current layout,
which older code refuses."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis
import trio
from conftest import fast_config

from pipeline.backends import Backend, open_backend
from pipeline.backends.base import parent_failed
from pipeline.backends.redis.db import SCHEMA_VERSION, run_script
from pipeline.backends.redis.scripts import ALL
from pipeline.config import RedisSettings
from pipeline.errors import SchemaTooNew

from .kit import (
    FUTURE,
    LONG,
    batch_rows,
    bury,
    claim_one,
    drain_chain,
    flow_job,
    insert,
    job,
    record,
    settle_one,
    statuses,
    succeed,
    ts,
)
from .stores import BACKENDS, REDIS_URL, redis_store
from .test_redis import needs_server_binary, own_server
from .test_redis_claim_index import _server_calls
from .test_redis_control import assert_control_in_step
from .test_redis_limits import assert_limits_in_step

pytestmark = pytest.mark.skipif("redis" not in BACKENDS, reason="no redis entry")

FINAL = ("completed", "dead", "cancelled")


def assert_workflows_in_step(backend: Backend) -> None:
    """The claim's index, expiring:<type> and the keyed sets in step (test_redis_limits, or only
    test_redis_control's part while a waiting job holds a unique key: that checker knows pending and
    running holders only), and: every pending job without a limit key is in its ready set, no other
    job is in one; status:waiting holds exactly the waiting jobs; down:<p> holds only children of p
    (p in their after set) and p has not ended; a job's wfor is the number of its parents whose
    down set holds it, and a waiting job's is above 0; children:<p> holds exactly the jobs whose
    after set names p (scored by their created), and p has the kids flag exactly then; a waiting
    job holds its unique key; a batch record is there while one of its jobs is, bjobs:<b> holds its
    members (the callback not among them)."""
    db = backend.database  # type: ignore[attr-defined]
    client, prefix = db.client, db.prefix

    def rest(key: bytes, kind: str) -> str:
        return key.decode().removeprefix(f"{prefix}{kind}:")

    jobs = {rest(key, "job"): {k.decode(): v.decode() for k, v in client.hgetall(key).items()}
            for key in client.scan_iter(match=f"{prefix}job:*", count=1000)}
    if any(f["status"] == "waiting" and "ukey" in f for f in jobs.values()):
        assert_control_in_step(backend)
    else:
        assert_limits_in_step(backend)
    ready = {m.decode(): key.decode() for key in client.scan_iter(match=f"{prefix}ready:*", count=1000)
             for m in client.zrange(key, 0, -1)}
    for i, f in jobs.items():
        if f["status"] == "pending" and "lkey" not in f:
            assert ready.get(i) == f"{prefix}ready:{f['type']}:{f['prio']}", (i, f)
        else:
            assert i not in ready, (i, f)
    assert {m.decode() for m in client.zrange(f"{prefix}status:waiting", 0, -1)} == {
        i for i, f in jobs.items() if f["status"] == "waiting"}
    after = {rest(key, "after"): [m.decode() for m in client.zrange(key, 0, -1)]
             for key in client.scan_iter(match=f"{prefix}after:*", count=1000)}
    children = {rest(key, "children"): {m.decode(): int(s) for m, s in client.zrange(key, 0, -1, withscores=True)}
                for key in client.scan_iter(match=f"{prefix}children:*", count=1000)}
    down = {rest(key, "down"): {m.decode() for m in client.smembers(key)}
            for key in client.scan_iter(match=f"{prefix}down:*", count=1000)}
    for p, kids in down.items():
        assert p in jobs and jobs[p]["status"] not in FINAL, f"ended job {p} has edges that have not counted: {kids}"
        assert all(p in after.get(c, []) for c in kids), (p, kids)
    for c, parents in after.items():
        f = jobs[c]
        assert int(f["wfor"]) == sum(c in down.get(p, ()) for p in parents), (c, f, parents)
        assert f["status"] != "waiting" or int(f["wfor"]) > 0, f"waiting job {c} waits for nothing"
    should: dict[str, dict[str, int]] = {}
    for c, parents in after.items():
        for p in parents:
            if p in jobs:
                should.setdefault(p, {})[c] = int(jobs[c]["created"])
    assert children == should
    assert {i for i, f in jobs.items() if "kids" in f} == set(children)
    for i, f in jobs.items():
        if f["status"] == "waiting" and "ukey" in f:
            assert client.hget(f"{prefix}uniq:{f['type']}", f["ukey"]) == i.encode()
    batches = {rest(key, "batch"): client.hgetall(key) for key in client.scan_iter(match=f"{prefix}batch:*", count=1000)}
    assert set(batches) == {f["batch"] for f in jobs.values() if "batch" in f}
    for b, record_ in batches.items():
        members = {m.decode() for m in client.zrange(f"{prefix}bjobs:{b}", 0, -1)}
        callback = record_.get(b"cb", b"").decode()
        assert members == {i for i, f in jobs.items() if f.get("batch") == b and i != callback}


async def test_every_script_keeps_the_edges_in_step_and_a_woken_job_in_its_indexes(tmp_path: Path) -> None:
    async with redis_store(tmp_path) as config, open_backend(config) as backend:
        check = lambda: assert_workflows_in_step(backend)  # noqa: E731
        a, b = job("t"), job("t")
        c = flow_job("w", after=[a.id], priority=1)  # due: pdue:w once woken
        d = flow_job("w", after=[a.id, b.id], priority=2)
        e = flow_job("k", after=[a.id], limit_key="x")  # kready:1:k:x once woken
        f = flow_job("w", after=[a.id], priority=3, delay=FUTURE, expires_at=ts(2 * FUTURE))  # pwait:w, expiring:w
        g = flow_job("u", after=[a.id], unique_key="g")
        h = flow_job("w", after=[b.id], on_parent_failure="run", priority=4)
        await insert(backend, a, b, c, d, e, f, g, h)
        check()
        assert await backend.insert([job("u", unique_key="g")]) == [g.id]  # a waiting job holds its key
        lease = await claim_one(backend)
        assert lease.id == a.id and await settle_one(backend, succeed(lease))
        assert await statuses(backend, [c.id, d.id, e.id, f.id, g.id]) == ["pending", "waiting", "pending", "pending", "pending"]
        check()
        lease = await claim_one(backend)
        assert lease.id == b.id and await settle_one(backend, bury(lease))
        assert await statuses(backend, [d.id, h.id]) == ["cancelled", "pending"]
        assert (await record(backend, d.id)).error == parent_failed(b.id, "dead")
        check()
        claimed = await backend.claim({"w": 10, "k": 10, "u": 10}, owner="w", lease_seconds=LONG, key_limits={"k": 1})
        assert sorted(lease.id for lease in claimed) == sorted([c.id, h.id, e.id, g.id])  # f is due in an hour
        assert all(await backend.settle([succeed(lease) for lease in claimed]))
        check()

        # a cancel runs down a chain of 300 (and a fan-out at its end) in one script, not by recursion
        head = job("c")
        chain = [head]
        for _ in range(300):
            chain.append(flow_job("c", after=[chain[-1].id]))
        fan = [flow_job("c", after=[chain[-1].id]) for _ in range(20)]
        await insert(backend, *chain, *fan)
        assert await backend.cancel([head.id], reason="test") == ["cancelled"]
        assert (await backend.stats())["by_type"]["c"]["cancelled"] == 321
        assert (await record(backend, fan[0].id)).error == parent_failed(chain[-1].id, "cancelled")
        check()
        assert await backend.cleanup(statuses=("cancelled",)) == 322  # (and d)

        # the repair: a parent that ended, and one that is gone, without their edges counting (their
        # kids flag dropped by hand: the defect), found by the sweep; then it has nothing to do
        db = backend.database  # type: ignore[attr-defined]
        p, q = job("r"), job("r")
        p_child, q_child = flow_job("s", after=[p.id]), flow_job("s", after=[q.id])
        await insert(backend, p, q, p_child, q_child)
        db.client.hdel(f"{db.prefix}job:{p.id}", "kids")
        db.client.hdel(f"{db.prefix}job:{q.id}", "kids")
        lease = await claim_one(backend, "r")
        assert await settle_one(backend, succeed(lease))
        await backend.delete(q.id)
        assert await statuses(backend, [p_child.id, q_child.id]) == ["waiting", "waiting"]
        assert await backend.rescue_waiting() == 2
        assert await statuses(backend, [p_child.id, q_child.id]) == ["pending", "cancelled"]
        assert (await record(backend, q_child.id)).error == parent_failed(q.id, "deleted")
        assert await backend.rescue_waiting() == 0
        db.client.hset(f"{db.prefix}job:{p.id}", "kids", "1")  # (its edges counted: in step again)
        check()

        # a batch, a waiting job deleted (its edges as "deleted"); then every job removed: no key left
        rows, new_batch = batch_rows([job("m"), job("m")])
        await backend.insert(rows, batch=new_batch)
        parent = job("t", delay=FUTURE)
        waiting, grandchild = flow_job("t", after=[parent.id]), flow_job("t", after=[parent.id], on_parent_failure="run")
        await insert(backend, parent, waiting, grandchild)
        await backend.delete(waiting.id)
        await backend.delete(parent.id)
        assert await statuses(backend, [grandchild.id]) == ["pending"]
        check()
        while leases := await backend.claim({"m": 10, "callback": 10, "t": 10, "s": 10}, owner="w", lease_seconds=LONG):
            assert all(await backend.settle([succeed(lease) for lease in leases]))
        assert (await backend.batch(new_batch.id)).callback_status == "completed"  # type: ignore[union-attr]
        check()
        await backend.cleanup(statuses=FINAL)
        assert await backend.batch(new_batch.id) is None
        await backend.delete(f.id)
        left = {k.decode() for k in db.client.scan_iter(match=f"{db.prefix}*")}
        assert left <= {f"{db.prefix}{name}" for name in ("schema", "types", "workers")}, left


async def test_a_bulk_load_stages_the_edges_of_every_chunk_and_part(tmp_path: Path) -> None:
    """A load stages its rows 1,000 at a time (and their workflow part in a list of its own): a chain of
    1,200 in one part has its parents in both chunks; with commit_every, a parent in an earlier part."""
    async with redis_store(tmp_path) as config, open_backend(config) as backend:
        chain = [job("c")]
        for _ in range(1199):
            chain.append(flow_job("c", after=[chain[-1].id]))
        assert await backend.bulk_insert(iter(chain)) == 1200
        head, parent = job("p"), job("p")
        parts = [head, flow_job("p", after=[head.id]), parent, flow_job("p", after=[head.id, parent.id])]
        assert await backend.bulk_insert(iter(parts), commit_every=2) == 4
        assert (await backend.stats())["by_status"]["waiting"] == 1199 + 2
        got = await record(backend, parts[3].id)
        assert (got.status, got.parents, got.waiting_for) == ("waiting", (head.id, parent.id), 2)
        got = await record(backend, chain[1000].id)
        assert (got.parents, got.children) == ((chain[999].id,), (chain[1001].id,))


@needs_server_binary
async def test_a_plain_settle_runs_the_commands_it_ran_before_workflows(tmp_path: Path) -> None:
    """Counted as the server's own calls, beside jobs with parents and children: a plain job's
    SUCCEED runs what layout 4's settle ran (one HMGET, which reads the kids field too; 3 ZREM,
    1 HDEL, 1 HSET, 3 ZADD, 1 TIME), less layout 7's ZREM from status:running and ZADD to
    status:completed, and nothing on a workflow key; a parent's runs the SMEMBERS
    of its down set and more. A sweep with no waiting job reads two keys (GET, ZRANGE)."""
    with own_server(tmp_path) as (port, _):
        config = fast_config(tmp_path / "unused.db").replace(
            database_url=f"redis://127.0.0.1:{port}/0", redis=RedisSettings(allow_non_durable=True))
        async with open_backend(config) as backend:
            client = backend.database.client  # type: ignore[attr-defined]
            assert await backend.rescue_waiting() == 0  # (the server loads the script)
            before = _server_calls(client)
            assert await backend.rescue_waiting() == 0
            calls = _server_calls(client)
            assert {name: n - before.get(name, 0) for name, n in calls.items() if n != before.get(name, 0)} == {
                "evalsha": 1, "get": 1, "zrange": 1, "info": 1}

            parent = job("p")
            await insert(backend, job("t"), job("t"), parent, flow_job("w", after=[parent.id]))
            assert await settle_one(backend, succeed(await claim_one(backend)))  # (the server loads the script)
            plain = await claim_one(backend)
            before = _server_calls(client)
            assert await settle_one(backend, succeed(plain))
            calls = _server_calls(client)
            ran = {name: n - before.get(name, 0) for name, n in calls.items() if n != before.get(name, 0)}
            assert ran == {"evalsha": 1, "hmget": 1, "zrem": 2, "hdel": 1, "hset": 1, "zadd": 2, "time": 1, "info": 1}, ran

            lease = await claim_one(backend, "p")
            before = _server_calls(client)
            assert await settle_one(backend, succeed(lease))
            calls = _server_calls(client)
            assert calls["smembers"] - before.get("smembers", 0) == 1  # (the count sees a parent's edges)


async def test_a_wake_of_a_due_job_publishes_and_of_a_job_not_due_does_not(tmp_path: Path) -> None:
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

            later, now = job("p", priority=1), job("p", priority=2)
            await insert(backend, later, now, flow_job("w", after=[later.id], delay=FUTURE), flow_job("w", after=[now.id]))
            assert await trio.to_thread.run_sync(heard)  # the insert of due parents
            lease = await claim_one(backend, "p")
            assert lease.id == later.id and await settle_one(backend, succeed(lease))
            assert not await trio.to_thread.run_sync(heard)  # woken, due in an hour
            lease = await claim_one(backend, "p")
            assert lease.id == now.id and await settle_one(backend, succeed(lease))
            assert await trio.to_thread.run_sync(heard)  # woken, due now
        finally:
            pubsub.close()
            listener.close()


async def test_a_store_of_layout_4_is_upgraded_and_older_code_refuses_it(tmp_path: Path) -> None:
    """A store of layout 4 (jobs of every status, before workflows) opened by this code is of
    the current layout and takes children of its old jobs at once (a running parent's settle wakes one);
    the schema script of code that knows only 4 leaves it at the current one, which that code refuses."""
    async with redis_store(tmp_path) as config:
        async with open_backend(config) as backend:
            db = backend.database  # type: ignore[attr-defined]
            old = await insert(backend, job(), job(), job())  # one completed, one running, one pending
            assert await settle_one(backend, succeed(await claim_one(backend)))
            held = await claim_one(backend)
            extra = [k for k in db.client.scan_iter(match=f"{db.prefix}*") if k.decode().removeprefix(db.prefix).startswith(
                ("after:", "children:", "down:", "batch:", "bjobs:", "wsweep", "status:waiting"))]
            assert not extra  # nothing a layout-4 store would lack
            assert not [i for i in old if db.client.hexists(f"{db.prefix}job:{i}", "kids")]
            db.client.set(f"{db.prefix}schema", "4")
        async with open_backend(config) as backend:
            db = backend.database  # type: ignore[attr-defined]
            assert db.client.get(f"{db.prefix}schema") == SCHEMA_VERSION.encode()
            children = [flow_job("w", after=[parent]) for parent in old]
            await insert(backend, *children)
            assert await statuses(backend, [child.id for child in children]) == ["pending", "waiting", "waiting"]
            assert await settle_one(backend, succeed(held))
            assert await statuses(backend, [child.id for child in children]) == ["pending", "pending", "waiting"]
            assert_workflows_in_step(backend)
            assert _text(run_script(db.client, ALL["schema"], [db.prefix, "4"])) == SCHEMA_VERSION  # older code's start
    async with redis_store(tmp_path) as config:
        async with open_backend(config) as backend:
            db = backend.database  # type: ignore[attr-defined]
            db.client.set(f"{db.prefix}schema", str(int(SCHEMA_VERSION) + 1))
        with pytest.raises(SchemaTooNew, match=f"layout version {int(SCHEMA_VERSION) + 1}; this pipeline knows version {SCHEMA_VERSION}"):
            async with open_backend(config):
                pass


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- a chain's link: the child claimed by the process that ended its parent ------------------------------------


async def test_a_chains_child_is_claimed_after_its_parents_outcome_without_a_publish_per_link(tmp_path: Path) -> None:
    """A chain of 40 drained by one pipeline (kit.drain_chain): each link's child is woken by its
    parent's SETTLE script, which in the Ledger's quiet mode answers it instead of PUBLISHing, and the
    Ledger claims it right after with the Poller's offer (ledger._apply_batch). A subscriber hears the
    insert's wake and a few more (a link whose offer was out with the Poller's own claim, which then
    took the child: the next link's claim may race it, until the Poller waits with its offer again):
    1 to 10 in 15 runs here; without the claim riding the outcome, every link PUBLISHes: 40. Every
    job ran after its parent."""
    async with redis_store(tmp_path) as config:
        prefix = config.database_url.rsplit("prefix=", 1)[1]
        client = redis.Redis.from_url(REDIS_URL)
        listener = client.pubsub(ignore_subscribe_messages=True)
        listener.psubscribe(f"*{prefix}*wake")
        try:
            ran = await drain_chain(config, 40)
            heard = []
            quiet_until = time.monotonic() + 0.3  # (a subscribe confirmation reads as None: read until 0.3 s of silence)
            while time.monotonic() < quiet_until:
                if (message := listener.get_message(timeout=0.1)) is not None:
                    heard.append(message["channel"])
                    quiet_until = time.monotonic() + 0.3
        finally:
            listener.close()
            client.close()
    assert ran == list(range(40))
    assert len(heard) <= 30, heard  # 1 to 10 in 15 runs here; 40 without the claim after the outcome
