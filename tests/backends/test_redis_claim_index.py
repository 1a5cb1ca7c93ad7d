"""The Redis claim's index of priorities (pdue:<type>, pwait:<type>; scripts.py): a claim visits
only the priorities with due jobs, every script keeps the index in step with the ready sets,
and a store written before the index (layout 1) is upgraded when a pipeline opens it.

The claim's cost is asserted as work the server did (its own command counters, on a
redis-server of this test's own), never as a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import fast_config

from pipeline.backends import Backend, open_backend
from pipeline.backends.redis.db import SCHEMA_VERSION
from pipeline.config import RedisSettings

from .kit import FUTURE, LONG, SHORT, bury, claim_one, insert, job, outlive, release, retry, settle_one, succeed
from .stores import BACKENDS, redis_store
from .test_redis import needs_server_binary, own_server

pytestmark = pytest.mark.skipif("redis" not in BACKENDS, reason="no redis entry")


def _server_calls(client: Any) -> dict[str, int]:
    """INFO commandstats: calls per command, those run inside scripts included."""
    return {name.removeprefix("cmdstat_"): int(stats["calls"]) for name, stats in client.info("commandstats").items()}


@needs_server_binary
async def test_an_empty_claim_visits_none_of_5000_priorities_that_wait(tmp_path: Path) -> None:
    """5,000 priorities of jobs due in an hour: an empty claim reads the index, not a priority
    (9b02048's claim ran ZRANGEBYSCORE once per priority: 5,000 reads, 29 ms at 10,000); and a
    job that is due at the last priority is found with as few reads."""
    with own_server(tmp_path) as (port, _):
        config = fast_config(tmp_path / "unused.db").replace(
            database_url=f"redis://127.0.0.1:{port}/0", redis=RedisSettings(allow_non_durable=True))
        async with open_backend(config) as backend:
            client = backend.database.client  # type: ignore[attr-defined]
            await insert(backend, *(job(delay=FUTURE, priority=p) for p in range(5000)))
            before = _server_calls(client)
            assert await backend.claim({"t": 32}, owner="w", lease_seconds=LONG) == []
            calls = _server_calls(client)
            reads = {name: calls.get(name, 0) - before.get(name, 0) for name in ("zrangebyscore", "zrange", "hmget")}
            assert reads["zrangebyscore"] <= 2 and reads["zrange"] <= 2 and reads["hmget"] == 0, reads

            (due,) = await insert(backend, job(priority=4999))  # behind 4,999 priorities that wait
            before = _server_calls(client)
            assert [lease.id for lease in await backend.claim({"t": 32}, owner="w", lease_seconds=LONG)] == [due]
            calls = _server_calls(client)
            reads = {name: calls.get(name, 0) - before.get(name, 0) for name in ("zrangebyscore", "zrange")}
            assert reads["zrangebyscore"] <= 3 and reads["zrange"] <= 4, reads


def _index_of(client: Any, prefix: str) -> dict[str, Any]:
    """Per type with pending jobs: the priorities filed due, those filed waiting (with their
    score), and from the ready sets themselves, each priority's first run."""
    found = {}
    types = {t.decode() for t in client.smembers(f"{prefix}ptypes")}
    keys = {k.decode() for k in client.scan_iter(match=f"{prefix}p*", count=1000)}
    types |= {k.removeprefix(f"{prefix}pdue:").removeprefix(f"{prefix}pwait:") for k in keys
              if k.startswith((f"{prefix}pdue:", f"{prefix}pwait:"))}
    for t in sorted(types):
        heads = {}
        for raw in client.zrange(f"{prefix}prios:{t}", 0, -1):
            ((_, run),) = client.zrange(f"{prefix}ready:{t}:{raw.decode()}", 0, 0, withscores=True)
            heads[raw.decode()] = int(run)
        found[t] = {
            "heads": heads,
            "due": {p.decode() for p in client.zrange(f"{prefix}pdue:{t}", 0, -1)},
            "wait": {p.decode(): int(s) for p, s in client.zrange(f"{prefix}pwait:{t}", 0, -1, withscores=True)},
        }
    return found


def assert_index_in_step(backend: Backend) -> None:
    """Every priority with a ready set is filed once: in pdue if its first job was due when filed
    (so it is now), else in pwait scored by that job's run; no other priority is filed."""
    db = backend.database  # type: ignore[attr-defined]
    seconds, micros = db.client.time()
    now = (int(seconds) * 1_000_000 + int(micros) + 999) // 1000  # ceil: the scripts round the server's time to the ms
    for t, index in _index_of(db.client, db.prefix).items():
        heads, due, wait = index["heads"], index["due"], index["wait"]
        assert not due & set(wait), f"type {t}: filed twice: {due & set(wait)}"
        assert due | set(wait) == set(heads), f"type {t}: filed {sorted(due | set(wait))}, with jobs {sorted(heads)}"
        assert all(heads[p] <= now for p in due), f"type {t}: filed due with nothing due: {index}"
        assert all(wait[p] == heads[p] for p in wait), f"type {t}: a waiting priority's score is not its first run: {index}"


async def test_every_script_keeps_the_index_in_step_with_the_ready_sets(tmp_path: Path) -> None:
    async with redis_store(tmp_path) as config, open_backend(config) as backend:
        check = lambda: assert_index_in_step(backend)  # noqa: E731
        later = job(delay=FUTURE, priority=1)
        await insert(backend, later, job(delay=FUTURE, priority=2), job(delay=FUTURE / 2, priority=2), job(priority=3),
                     job(priority=3), job("u", priority=0), job("k", unique_key="x", priority=7))
        check()
        await insert(backend, job(priority=1))  # a due job where only a later one waited
        check()
        a = await claim_one(backend)  # priority 1's due job: priority 1 waits again, for `later`
        check()
        assert await settle_one(backend, retry(a, delay=FUTURE / 4))  # back in, due later than priority 1's first
        check()
        b = await claim_one(backend)
        assert await settle_one(backend, release(b))  # back in, due now
        check()
        c = await claim_one(backend, lease_seconds=SHORT)
        await outlive(SHORT)
        assert await backend.rescue_expired(base_seconds=FUTURE) == 1  # back in, due in the backoff
        check()
        d = await claim_one(backend)
        assert await settle_one(backend, bury(d))
        check()
        await backend.revive(d.id)  # back in, due now
        check()
        await backend.delete(later.id)  # priority 1's last waiting job
        check()
        assert await backend.bury_unknown_types(["t", "k"], grace_seconds=0.0) == 1  # type u's only job
        check()
        while leases := await backend.claim({"t": 10, "k": 10}, owner="w", lease_seconds=LONG):
            assert all(await backend.settle([succeed(lease) for lease in leases]))
            check()
        assert await backend.cleanup() >= 1
        check()
        assert c.id  # (rescued above; it waits in its backoff)


async def test_a_store_of_layout_1_is_upgraded_and_claims_in_order(tmp_path: Path) -> None:
    """A store 9b02048's code wrote: the same keys, without pdue/pwait, schema 1. Opening it
    files every priority; claims take the due jobs in priority order and leave the others."""
    async with redis_store(tmp_path) as config:
        async with open_backend(config) as backend:
            db = backend.database  # type: ignore[attr-defined]
            rows = [job(priority=9), job(priority=2), job(delay=FUTURE, priority=1), job("other", priority=4)]
            await insert(backend, *rows)
            index = [k for k in db.client.scan_iter(match=f"{db.prefix}p[dw]*")]
            assert index, "no index was written"
            db.client.delete(*index)
            db.client.set(f"{db.prefix}schema", "1")
        async with open_backend(config) as backend:
            assert backend.database.client.get(f"{backend.database.prefix}schema") == SCHEMA_VERSION.encode()  # type: ignore[attr-defined]
            assert_index_in_step(backend)
            leases = await backend.claim({"t": 10, "other": 10}, owner="w", lease_seconds=LONG)
            assert [lease.id for lease in leases] == [rows[1].id, rows[0].id, rows[3].id]
            assert_index_in_step(backend)


async def test_a_priority_filed_by_a_process_of_layout_1_is_still_claimed(tmp_path: Path) -> None:
    """A process of 9b02048's code still running after the upgrade writes ready sets without
    the index; a claim that finds the index short of prios:<type> files the type again."""
    async with redis_store(tmp_path) as config, open_backend(config) as backend:
        db = backend.database  # type: ignore[attr-defined]
        waiting, due = job(delay=FUTURE, priority=1), job(priority=3)
        await insert(backend, waiting, due)
        db.client.zrem(f"{db.prefix}pdue:t", "3")  # as if an old process had written priority 3
        assert (await claim_one(backend)).id == due.id
        assert_index_in_step(backend)
