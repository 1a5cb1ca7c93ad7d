"""The cache stores and ``invalidate_cache``: in memory, and against the real Redis on 127.0.0.1:6379.

Redis tests use database 15 and a random key prefix (or random post ids), and delete
what they wrote.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
import trio
from conftest import fast_config, require_service, service_available
from jobkit import wait_status

import pipeline
from pipeline import site
from pipeline.site import InvalidateCache, PostCreated, cache, default_registry

REDIS_DB = 15
REDIS_URL = f"redis://127.0.0.1:6379/{REDIS_DB}"


def delete_matching(client: redis.Redis, patterns: list[str]) -> None:
    for pattern in patterns:
        keys = list(client.scan_iter(match=pattern))
        if keys:
            client.delete(*keys)


@pytest.fixture
def redis_client() -> Iterator[redis.Redis]:
    """An independent client to look at what the store did; deletes the test's keys afterwards."""
    require_service("Redis", "127.0.0.1", 6379)
    client = redis.Redis(host="127.0.0.1", port=6379, db=REDIS_DB, decode_responses=True)
    client.test_keys = []  # type: ignore[attr-defined]  # key patterns to delete at the end
    yield client
    delete_matching(client, client.test_keys)  # type: ignore[attr-defined]
    client.close()


@asynccontextmanager
async def scratch_redis_store(redis_client: redis.Redis) -> AsyncIterator[cache.RedisCacheStore]:
    """A Redis store under a random prefix, which the redis_client fixture cleans up."""
    prefix = f"pipeline-test:{uuid.uuid4().hex}:"
    redis_client.test_keys.append(prefix + "*")  # type: ignore[attr-defined]
    async with cache.open_redis_store(REDIS_URL, prefix=prefix) as store:
        yield store


@pytest.fixture
async def redis_store(redis_client: redis.Redis) -> AsyncIterator[cache.RedisCacheStore]:
    async with scratch_redis_store(redis_client) as store:
        yield store


async def settled(p: pipeline.Pipeline, job_id: str) -> Any:
    return await wait_status(p, job_id, "completed", "dead", timeout=15)


# -- the stores: one contract, two implementations -------------------------------------------


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[cache.CacheStore]:
    if request.param == "memory":
        yield cache.MemoryCacheStore()
        return
    require_service("Redis", "127.0.0.1", 6379)
    client = redis.Redis(host="127.0.0.1", port=6379, db=REDIS_DB, decode_responses=True)
    client.test_keys = []  # type: ignore[attr-defined]
    try:
        async with scratch_redis_store(client) as store:
            yield store
    finally:
        delete_matching(client, client.test_keys)  # type: ignore[attr-defined]
        client.close()


async def test_store_set_get_delete(store: cache.CacheStore) -> None:
    assert isinstance(store, cache.CacheStore)
    await store.set_many({"post:1": "<h1>One</h1>", "post:2": "two", "posts:index": "[1, 2]"})
    assert await store.get_many(["post:1", "post:2", "post:3"]) == {"post:1": "<h1>One</h1>", "post:2": "two"}

    assert await store.delete_many(["post:1", "post:3", "post:1"]) == 1  # only what existed, once
    assert await store.get_many(["post:1", "post:2", "posts:index"]) == {"post:2": "two", "posts:index": "[1, 2]"}

    assert await store.delete_many([]) == 0
    assert await store.get_many([]) == {}
    await store.set_many({})


async def test_store_values_are_text_round_trip(store: cache.CacheStore) -> None:
    value = "héllo ✓ \n\x00 end"
    await store.set_many({"k": value})
    assert await store.get_many(["k"]) == {"k": value}


@pytest.mark.parametrize("ttl", [0, -1.0])
async def test_store_refuses_a_ttl_that_is_not_positive(store: cache.CacheStore, ttl: float) -> None:
    with pytest.raises(ValueError, match="ttl must be a number of seconds > 0"):
        await store.set_many({"k": "v"}, ttl=ttl)


async def test_memory_store_expires_on_trio_clock(autojump_clock: trio.testing.MockClock) -> None:
    store = cache.MemoryCacheStore()
    await store.set_many({"short": "a"}, ttl=10)
    await store.set_many({"forever": "b"})
    await trio.sleep(9)
    assert await store.get_many(["short", "forever"]) == {"short": "a", "forever": "b"}
    await trio.sleep(2)
    assert await store.get_many(["short", "forever"]) == {"forever": "b"}
    assert await store.delete_many(["short"]) == 0  # expired keys do not count as deleted


async def test_redis_store_writes_prefixed_keys_with_ttl(redis_store: cache.RedisCacheStore, redis_client: redis.Redis) -> None:
    await redis_store.set_many({"a": "1"}, ttl=30)
    await redis_store.set_many({"b": "2"})
    prefix = redis_store.prefix
    assert redis_client.get(prefix + "a") == "1"
    assert 0 < redis_client.pttl(prefix + "a") <= 30_000
    assert redis_client.pttl(prefix + "b") == -1  # no expiry
    assert redis_client.get("a") is None  # nothing outside the prefix


async def test_redis_store_is_shared_between_stores(redis_store: cache.RedisCacheStore, redis_client: redis.Redis) -> None:
    """Two stores on one Redis (two processes, say) see each other's writes and deletes."""
    async with cache.open_redis_store(REDIS_URL, prefix=redis_store.prefix) as other:
        await redis_store.set_many({"shared": "x"})
        assert await other.get_many(["shared"]) == {"shared": "x"}
        assert await other.delete_many(["shared"]) == 1
        assert await redis_store.get_many(["shared"]) == {}


async def test_many_concurrent_calls_share_the_limited_connections(redis_store: cache.RedisCacheStore) -> None:
    async def one(i: int) -> None:
        await redis_store.set_many({f"k{i}": str(i)})
        assert await redis_store.get_many([f"k{i}"]) == {f"k{i}": str(i)}

    async with trio.open_nursery() as tn:
        for i in range(50):
            tn.start_soon(one, i)
    assert await redis_store.delete_many([f"k{i}" for i in range(50)]) == 50


# -- choosing the store from CACHE_URL -----------------------------------------------------------


@pytest.mark.parametrize("url", ["", "memory://"])
async def test_cache_url_empty_or_memory_gives_the_memory_store(url: str) -> None:
    async with cache.open_cache_store(url) as store:
        assert isinstance(store, cache.MemoryCacheStore)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://cache.example.com",
        "redis://:hunter2@127.0.0.1:6379/notanumber",  # redis-py alone would quietly use database 0
        "redis://:hunter2@127.0.0.1:6379/0?socket_timeout=soon",
    ],
)
async def test_a_bad_cache_url_is_a_config_error_naming_cache_url(url: str) -> None:
    with pytest.raises(pipeline.ConfigError, match="CACHE_URL=") as info:
        async with cache.open_cache_store(url):
            pass
    assert "hunter2" not in str(info.value)  # the password stays out of messages


def test_redacted_hides_the_password() -> None:
    assert cache.redacted("redis://user:pw@h:6380/2") == "redis://user:***@h:6380/2"
    assert cache.redacted("redis://h:6379/0") == "redis://h:6379/0"


# -- the handler, end to end ----------------------------------------------------------------------


async def test_post_created_invalidates_its_cache_keys(db_path: Path) -> None:
    """The route end to end with the default (memory) store: the host app fills the cache,
    emits PostCreated, and the post's keys are gone; other keys stay."""
    config = fast_config(db_path)
    async with pipeline.open_pipeline(config, default_registry(config)) as p:
        store = p.resources["cache"]
        assert isinstance(store, cache.MemoryCacheStore)
        await store.set_many({"post:42": "<article>", "posts:index": "[42]", "post:7": "<other>"})
        job_ids = await p.emit(PostCreated(id="42"))
        records = [await p.backend.get(job_id) for job_id in job_ids]
        (job_id,) = [r.id for r in records if r.job_type == "invalidate_cache"]
        record = await settled(p, job_id)
        assert record.status == "completed", record.error
        assert await store.get_many(["post:42", "posts:index", "post:7"]) == {"post:7": "<other>"}


async def test_post_created_invalidates_keys_in_redis(db_path: Path, redis_client: redis.Redis) -> None:
    post_id = uuid.uuid4().hex  # unique keys: post:<id>; posts:index is the route's fixed key
    redis_client.test_keys += [f"post:{post_id}", "posts:index"]  # type: ignore[attr-defined]
    redis_client.set(f"post:{post_id}", "<article>")
    redis_client.set("posts:index", "[...]")
    config = fast_config(db_path, cache_url=REDIS_URL)
    async with pipeline.open_pipeline(config, default_registry(config)) as p:
        assert isinstance(p.resources["cache"], cache.RedisCacheStore)
        job_ids = await p.emit(PostCreated(id=post_id))
        records = [await p.backend.get(job_id) for job_id in job_ids]
        (job_id,) = [r.id for r in records if r.job_type == "invalidate_cache"]
        record = await settled(p, job_id)
    assert record.status == "completed", record.error
    assert redis_client.exists(f"post:{post_id}", "posts:index") == 0


async def test_unreachable_redis_is_retried(db_path: Path) -> None:
    with trio.socket.socket() as s:  # a port nobody listens on
        await s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert not service_available("127.0.0.1", port)
    config = fast_config(db_path, cache_url=f"redis://127.0.0.1:{port}/0")
    registry = site.types_registry()
    cache.install(registry, config)
    async with pipeline.open_pipeline(config, registry) as p:  # starting does not need Redis
        job_id = await p.enqueue(InvalidateCache(keys=("post:1",)), max_attempts=2)
        record = await settled(p, job_id)
    assert (record.status, record.attempts) == ("dead", 2)  # retried, not permanent
    assert record.error.startswith("ConnectionError: ")
    assert f"127.0.0.1:{port}" in record.error
