"""Unique jobs: while a job of a type and key is pending or running, an insert of that type and
key inserts nothing and answers the holder's id; once the holder has finished (completed, dead,
deleted) the key is free again. Enforced by the store, so callers racing each other agree."""

from __future__ import annotations

import pytest
import trio

from pipeline import Config
from pipeline.backends import Backend, open_backend
from pipeline.errors import UsageError

from .kit import LONG, SHORT, add, bury, claim_one, job, new_id, outlive, record, release, retry, settle_one, succeed


async def count(backend: Backend, job_type: str = "t", status: str | None = None) -> int:
    return (await backend.list(job_type=job_type, status=status, limit=1))[1]


async def test_a_held_key_inserts_nothing_and_answers_the_holders_id(backend: Backend) -> None:
    first = job(unique_key="user-1", payload={"n": 1})
    assert await backend.insert([first]) == [first.id]
    again = job(unique_key="user-1", payload={"n": 2})
    assert await backend.insert([again]) == [first.id]
    assert await backend.get(again.id) is None
    assert await count(backend) == 1
    held = await record(backend, first.id)
    assert (held.unique_key, held.payload) == ("user-1", '{"n":1}')
    assert held.to_json()["unique_key"] == "user-1"
    # another key, another type, no key: each inserted
    other_key, other_type, plain = job(unique_key="user-2"), job("u", unique_key="user-1"), job()
    assert await backend.insert([other_key, other_type, plain]) == [other_key.id, other_type.id, plain.id]
    assert (await record(backend, plain.id)).unique_key is None
    assert await count(backend) == 3 and await count(backend, "u") == 1


async def test_two_rows_of_one_key_in_one_call_the_first_is_inserted(backend: Backend) -> None:
    a, plain, b, c = job(unique_key="k"), job(), job(unique_key="k"), job(unique_key="k2")
    assert await backend.insert([a, plain, b, c]) == [a.id, plain.id, a.id, c.id]
    assert await backend.get(b.id) is None
    assert await count(backend) == 3


async def test_the_key_is_held_while_running_and_through_retries(backend: Backend) -> None:
    (holder,) = await add(backend, unique_key="k")
    lease = await claim_one(backend)
    assert await backend.insert([job(unique_key="k")]) == [holder]  # running
    assert await settle_one(backend, retry(lease, 0.0))
    assert await backend.insert([job(unique_key="k")]) == [holder]  # pending again, for its retry
    assert await settle_one(backend, release(await claim_one(backend)))
    assert await backend.insert([job(unique_key="k")]) == [holder]
    assert await count(backend) == 1


@pytest.mark.parametrize("end", ["succeed", "bury", "delete", "rescue to dead", "unknown type"])
async def test_the_key_is_free_once_its_job_has_finished(backend: Backend, end: str) -> None:
    (holder,) = await add(backend, unique_key="k", max_attempts=1)
    if end == "succeed":
        assert await settle_one(backend, succeed(await claim_one(backend)))
    elif end == "bury":
        assert await settle_one(backend, bury(await claim_one(backend)))
    elif end == "delete":
        await backend.delete(holder)
    elif end == "rescue to dead":
        await backend.claim({"t": 1}, owner="w", lease_seconds=SHORT)
        await outlive(SHORT)
        assert await backend.rescue_expired(base_seconds=60.0) == 1
        assert (await record(backend, holder)).status == "dead"
    else:
        assert await backend.bury_unknown_types(["other"], grace_seconds=0.0) == 1
        assert (await record(backend, holder)).status == "dead"
    successor = job(unique_key="k")
    assert await backend.insert([successor]) == [successor.id]
    assert (await record(backend, successor.id)).status == "pending"


async def test_a_duplicate_id_still_fails_the_whole_call(backend: Backend) -> None:
    (existing,) = await add(backend)
    keyed = job(unique_key="k")
    with pytest.raises(Exception, match="(?i)duplicate|unique|exists"):
        await backend.insert([keyed, job(job_id=existing)])
    assert await backend.get(keyed.id) is None
    # the key was not taken by the call that failed
    assert await backend.insert([keyed]) == [keyed.id]


async def test_concurrent_callers_of_one_key_leave_one_job_and_all_hear_its_id(backend: Backend) -> None:
    answers: list[str] = []
    rows = [job(unique_key="race") for _ in range(20)]

    async def enqueue(i: int) -> None:
        (stored,) = await backend.insert([rows[i]])
        answers.append(stored)

    async with trio.open_nursery() as tn:  # their inserts share the Ledger's batches
        for i in range(len(rows)):
            tn.start_soon(enqueue, i)
    assert len(set(answers)) == 1 and len(answers) == 20
    assert await count(backend) == 1
    assert (await record(backend, answers[0])).unique_key == "race"


async def test_one_callers_bad_row_does_not_cost_another_its_key(backend: Backend) -> None:
    """In one Ledger batch: a caller whose insert fails (a duplicate id) and one whose keyed row goes in."""
    (existing,) = await add(backend, job_type="x")
    keyed = job(unique_key="k")
    results: dict[str, object] = {}

    async def bad() -> None:
        try:
            await backend.insert([job(unique_key="k"), job("x", job_id=existing)])
        except Exception as exc:  # noqa: BLE001 -- what it raised is checked below
            results["bad"] = exc

    async def good() -> None:
        results["good"] = await backend.insert([keyed])

    async with trio.open_nursery() as tn:
        tn.start_soon(bad)
        tn.start_soon(good)
    assert isinstance(results["bad"], Exception)
    assert results["good"] == [keyed.id]
    assert await count(backend) == 1


async def test_revive_is_refused_while_another_job_holds_the_key(backend: Backend) -> None:
    (dead,) = await add(backend, unique_key="k")
    assert await settle_one(backend, bury(await claim_one(backend)))
    (holder,) = await add(backend, unique_key="k")
    assert holder != dead
    before = await record(backend, dead)
    with pytest.raises(UsageError, match=holder):
        await backend.revive(dead)
    assert await record(backend, dead) == before
    # once the holder has finished, the dead job can be revived, and holds the key again
    assert await settle_one(backend, succeed(await claim_one(backend)))
    assert (await backend.revive(dead)).status == "pending"
    assert await backend.insert([job(unique_key="k")]) == [dead]


async def test_bulk_insert_skips_held_keys_and_says_which(backend: Backend) -> None:
    (holder,) = await add(backend, unique_key="a")
    rows = [job(unique_key="a"), job(), job(unique_key="b"), job(unique_key="b"), job()]
    duplicates: list[tuple[str, str]] = []
    assert await backend.bulk_insert(iter(rows), duplicates=duplicates) == 3
    assert sorted(duplicates) == sorted([(rows[0].id, holder), (rows[3].id, rows[2].id)])
    assert await count(backend) == 4
    # in parts too: a key taken by an earlier part is held for the later ones
    more = [job(unique_key="c"), job(), job(unique_key="c"), job(unique_key="a")]
    duplicates.clear()
    assert await backend.bulk_insert(iter(more), commit_every=2, duplicates=duplicates) == 2
    assert sorted(duplicates) == sorted([(more[2].id, more[0].id), (more[3].id, holder)])


async def test_a_second_backend_on_the_same_store_sees_the_key(backend: Backend, store_config: Config) -> None:
    (holder,) = await add(backend, unique_key="k")
    async with open_backend(store_config) as other:
        assert await other.insert([job(unique_key="k")]) == [holder]
        lease = await claim_one(other, lease_seconds=LONG)
        assert await settle_one(other, succeed(lease))
    fresh = job(unique_key="k")
    assert await backend.insert([fresh]) == [fresh.id]
    assert new_id() != fresh.id
