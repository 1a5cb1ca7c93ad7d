"""Producing and reading: insert, bulk_insert, get, list."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio

from pipeline.backends import Backend, NewJob
from pipeline.errors import UsageError

from .kit import FUTURE, epoch, insert, job, new_id, record, ts


async def test_an_inserted_job_reads_back_with_every_field_and_the_defaults(backend: Backend) -> None:
    row = job("mail", delay=FUTURE, priority=2, max_attempts=7, payload={"to": "a@example.org", "n": [1, 2]})
    await insert(backend, row)
    got = await record(backend, row.id)
    assert (got.id, got.job_type, got.payload, got.max_attempts, got.run_after, got.priority, got.created_at) == (
        row.id, row.job_type, row.payload, row.max_attempts, row.run_after, row.priority, row.created_at,
    )
    assert (got.status, got.attempts, got.error) == ("pending", 0, None)
    assert (got.lease_owner, got.lease_expires_at) == (None, None)
    assert epoch(got.updated_at) >= epoch(got.created_at)
    assert got.to_json()["payload"] == {"to": "a@example.org", "n": [1, 2]}


async def test_get_of_an_unknown_id_is_none(backend: Backend) -> None:
    assert await backend.get(new_id()) is None
    await insert(backend, job())
    assert await backend.get(new_id()) is None


async def test_list_is_newest_first_with_the_total_that_matches(backend: Backend) -> None:
    ids = await insert(backend, *(job("a" if i % 3 else "b") for i in range(10)))  # ids grow: the last is newest
    await backend.claim({"a": 2}, owner="w", lease_seconds=60)

    records, total = await backend.list()
    assert total == 10
    assert [r.id for r in records] == ids[::-1]

    records, total = await backend.list(limit=3, offset=2)
    assert total == 10
    assert [r.id for r in records] == ids[::-1][2:5]

    a_ids = [i for n, i in enumerate(ids) if n % 3]
    records, total = await backend.list(job_type="a")
    assert total == len(a_ids) == 6
    assert [r.id for r in records] == a_ids[::-1]

    records, total = await backend.list(status="running")
    assert total == 2
    assert {r.id for r in records} <= set(a_ids)
    assert all(r.status == "running" for r in records)

    records, total = await backend.list(status="pending", job_type="b", limit=2)
    assert total == 4
    assert [r.id for r in records] == [i for n, i in enumerate(ids) if not n % 3][::-1][:2]

    records, total = await backend.list(status="dead")
    assert (records, total) == ([], 0)


async def test_list_refuses_an_unknown_status(backend: Backend) -> None:
    with pytest.raises(UsageError):
        await backend.list(status="finished")


async def test_a_batch_with_one_duplicate_id_writes_nothing(backend: Backend) -> None:
    (existing,) = await insert(backend, job())
    batch = [job(), job(), job(job_id=existing), job()]
    with pytest.raises(Exception):  # noqa: B017 - the backend's own error; what matters is what was stored
        await backend.insert(batch)
    for row in batch[:2] + batch[3:]:
        assert await backend.get(row.id) is None
    assert (await backend.list())[1] == 1
    assert (await record(backend, existing)).status == "pending"


async def test_a_batch_that_repeats_an_id_writes_nothing(backend: Backend) -> None:
    twin = job()
    batch = [job(), twin, job(), twin._replace(job_type="other")]
    with pytest.raises(Exception):  # noqa: B017
        await backend.insert(batch)
    assert (await backend.list())[1] == 0


async def test_a_bad_batch_does_not_sink_a_good_one_written_at_the_same_time(backend: Backend) -> None:
    (existing,) = await insert(backend, job())
    good = [job() for _ in range(5)]
    bad = [job(), job(job_id=existing)]
    failures: list[BaseException] = []

    async def insert_bad() -> None:
        try:
            await backend.insert(bad)
        except Exception as exc:  # noqa: BLE001 - checked below
            failures.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(insert_bad)
        nursery.start_soon(backend.insert, good)
    assert len(failures) == 1
    assert await backend.get(bad[0].id) is None
    for row in good:
        assert (await record(backend, row.id)).status == "pending"


def rows(n: int, *, fail_at: int | None = None) -> Iterator[NewJob]:
    for i in range(n):
        if i == fail_at:
            raise UsageError(f"line {i + 1}: not a job")
        yield job("bulk", payload={"i": i})


async def test_bulk_insert_commits_everything_in_one_go(backend: Backend) -> None:
    assert await backend.bulk_insert(rows(500)) == 500
    records, total = await backend.list(job_type="bulk", limit=1)
    assert total == 500
    assert records[0].status == "pending"


async def test_bulk_insert_keeps_nothing_of_the_transaction_a_bad_line_breaks(backend: Backend) -> None:
    with pytest.raises(UsageError):
        await backend.bulk_insert(rows(500, fail_at=250))
    assert (await backend.list())[1] == 0

    with pytest.raises(UsageError):
        await backend.bulk_insert(rows(500, fail_at=250), commit_every=100)
    assert (await backend.list())[1] == 200  # the parts committed before the bad line


async def test_bulk_insert_stores_each_field_as_insert_does(backend: Backend) -> None:
    payloads = [{"text": "h\u00e9llo \"quoted\" \\ back\nslash", "n": 2**62}, {"emoji": "\U0001f600", "nested": {"a": [1, None]}}, {}]
    rows = [job(f"bulk-\u00e9{i}", priority=-3 + i, max_attempts=9, payload=p) for i, p in enumerate(payloads)]
    rows.append(job("bulk", delay=3600.0, payload={"nul": "a\u0000b"}))
    assert await backend.bulk_insert(iter(rows)) == len(rows)
    for row in rows:
        got = await record(backend, row.id)
        assert (got.id, got.job_type, got.payload, got.max_attempts, got.run_after, got.priority, got.created_at) == (
            row.id, row.job_type, row.payload, row.max_attempts, row.run_after, row.priority, row.created_at,
        )
        assert (got.status, got.attempts, got.error) == ("pending", 0, None)


async def test_bulk_insert_of_a_duplicate_id_keeps_nothing(backend: Backend) -> None:
    (existing,) = await insert(backend, job())
    with pytest.raises(Exception):  # noqa: B017 - the backend's own error
        await backend.bulk_insert(iter([job(), job(job_id=existing), job()]))
    assert (await backend.list())[1] == 1


async def test_times_are_iso_utc_text_with_milliseconds(backend: Backend) -> None:
    row = job()
    await insert(backend, row)
    got = await record(backend, row.id)
    for text in (got.created_at, got.updated_at, got.run_after):
        assert len(text) == len("2026-01-01T00:00:00.000Z") and text.endswith("Z") and text[19] == "."
    assert ts(-5) < got.updated_at <= ts(1)
