"""Layout 7 of the Redis store (issue 36: what a job costs the shared server): the statuses every job
passes through, pending, running and completed, have no set across types (status:<s>), only each
type's (st:<s>:<t>). A job's way from insert to completed writes none of those three keys, and a
claim runs 3 sorted-set commands per job where layout 6 ran 5 (counted as the server's own calls).
Lists and counts of those statuses across types are the union of the types' sets: newest first,
paged, with their total, as the conformance suite checks on every store. A store of layout 6 is
upgraded: the three sets are unlinked, nothing else changes, and code of layout 6 refuses it."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import fast_config
from pipeline.backends import open_backend
from pipeline.backends.redis.db import SCHEMA_VERSION, run_script
from pipeline.backends.redis.scripts import ALL
from pipeline.config import RedisSettings

from .kit import add, bury, claim_one, settle_one, succeed
from .stores import BACKENDS, redis_store
from .test_redis import needs_server_binary, own_server
from .test_redis_claim_index import _server_calls

pytestmark = pytest.mark.skipif("redis" not in BACKENDS, reason="no redis entry")

HOT = ("pending", "running", "completed")


@needs_server_binary
async def test_a_job_writes_no_set_across_types_of_the_statuses_it_passes_and_a_claim_runs_fewer_commands(
        tmp_path: Path) -> None:
    with own_server(tmp_path) as (port, _):
        config = fast_config(tmp_path / "unused.db").replace(
            database_url=f"redis://127.0.0.1:{port}/0", redis=RedisSettings(allow_non_durable=True))
        async with open_backend(config) as backend:
            client = backend.database.client  # type: ignore[attr-defined]
            prefix = backend.database.prefix  # type: ignore[attr-defined]
            await add(backend, 4, "t")
            assert await settle_one(backend, succeed(await claim_one(backend)))  # (the server loads the scripts)
            before = _server_calls(client)
            lease = await claim_one(backend)
            calls = _server_calls(client)
            ran = {name: n - before.get(name, 0) for name, n in calls.items()
                   if n != before.get(name, 0) and name in ("zadd", "zrem")}
            # per job, ZADD leases and st:running:t, ZREM st:pending:t; per claim, the ready set and
            # the claim's index of priorities one of each (layout 6: 4 and 3, with status:pending and
            # status:running)
            assert ran == {"zadd": 3, "zrem": 2}, ran
            assert await settle_one(backend, succeed(lease))
            assert await settle_one(backend, bury(await claim_one(backend)))
            assert client.exists(*(f"{prefix}status:{s}" for s in HOT)) == 0
            assert client.zcard(f"{prefix}status:dead") == 1  # the other statuses keep theirs
            assert client.zcard(f"{prefix}st:completed:t") == 2 and client.zcard(f"{prefix}st:pending:t") == 1


async def test_lists_and_counts_across_types_are_the_union_of_the_types_sets(tmp_path: Path) -> None:
    async with redis_store(tmp_path) as config, open_backend(config) as backend:
        ids = {t: await add(backend, 5, t) for t in ("a", "b", "c")}
        for t in ("a", "b"):
            for _ in range(3):
                assert await settle_one(backend, succeed(await claim_one(backend, t)))
        running = [await claim_one(backend, "c") for _ in range(2)]
        pending = sorted([*ids["a"][3:], *ids["b"][3:], *ids["c"][2:]], reverse=True)
        completed = sorted([*ids["a"][:3], *ids["b"][:3]], reverse=True)

        for status, expected in (("pending", pending), ("completed", completed),
                                 ("running", sorted((r.id for r in running), reverse=True))):
            records, total = await backend.list(status=status, limit=100)
            assert [r.id for r in records] == expected and total == len(expected), status
            for offset in range(len(expected) + 1):  # every page of 2, newest first
                records, total = await backend.list(status=status, limit=2, offset=offset)
                assert [r.id for r in records] == expected[offset:offset + 2] and total == len(expected)
        records, total = await backend.list(status="pending", order="claim", limit=100)
        assert sorted(r.id for r in records) == sorted(pending) and total == len(pending)
        records, total = await backend.list(status="pending", priority=5, limit=3, offset=1)
        assert [r.id for r in records] == pending[1:4] and total == len(pending)

        stats = await backend.stats()
        assert {s: stats["by_status"][s] for s in HOT} == {"pending": 7, "running": 2, "completed": 6}
        assert stats["by_type"]["a"]["completed"] == 3 and stats["total"] == 15


async def test_a_store_of_layout_6_is_upgraded_and_older_code_refuses_it(tmp_path: Path) -> None:
    """Layout 6 kept status:pending, status:running and status:completed besides the types' sets:
    a store that has them (written here as layout 6's scripts wrote them) is of layout 7 once opened,
    without them, its jobs listed, counted, claimed and settled; layout 6's schema script leaves it
    at 7, which that code refuses."""
    async with redis_store(tmp_path) as config:
        async with open_backend(config) as backend:
            db = backend.database  # type: ignore[attr-defined]
            ids = await add(backend, 3, "t")
            assert await settle_one(backend, succeed(await claim_one(backend)))
            held = await claim_one(backend)
            for status, members in (("completed", ids[:1]), ("running", ids[1:2]), ("pending", ids[2:])):
                db.client.zadd(f"{db.prefix}status:{status}", {i: 0 for i in members})
            db.client.set(f"{db.prefix}schema", "6")
        async with open_backend(config) as backend:
            db = backend.database  # type: ignore[attr-defined]
            assert db.client.get(f"{db.prefix}schema") == SCHEMA_VERSION.encode() == b"7"
            assert db.client.exists(*(f"{db.prefix}status:{s}" for s in HOT)) == 0
            stats = await backend.stats()
            assert {s: stats["by_status"][s] for s in HOT} == {"pending": 1, "running": 1, "completed": 1}
            assert [r.id for r in (await backend.list(status="running"))[0]] == [held.id]
            assert await settle_one(backend, succeed(held))
            assert await settle_one(backend, succeed(await claim_one(backend)))
            records, total = await backend.list(status="completed")
            assert sorted(r.id for r in records) == sorted(ids) and total == 3
            assert run_script(db.client, ALL["schema"], [db.prefix, "6"]) == b"7"  # layout 6's start: refused


async def test_a_deep_page_across_types_is_the_same_slice_of_the_union(tmp_path: Path) -> None:
    """Pages found by list.lua's search for the id with ``offset`` ids above it (a bulk action's walk
    pages deep), against the union sorted here: every offset around the types' borders and the end."""
    async with redis_store(tmp_path) as config, open_backend(config) as backend:
        ids: list[str] = []
        for _ in range(40):  # interleaved: each type's ids between the others'
            for t, n in (("a", 3), ("b", 1), ("c", 2)):
                ids += await add(backend, n, t)
        newest = sorted(ids, reverse=True)
        for offset in (0, 1, 2, 5, 59, 60, 61, 119, 150, 199, 238, 239, 240, 500):
            for limit in (1, 7, 50):
                records, total = await backend.list(status="pending", limit=limit, offset=offset)
                assert [r.id for r in records] == newest[offset:offset + limit] and total == 240, (offset, limit)
