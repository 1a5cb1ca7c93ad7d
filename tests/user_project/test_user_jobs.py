"""The user's own tests of their handlers, with pipeline.testing. The async tests run under
pytest-asyncio (asyncio_mode = "auto") or under pytest-trio (trio_mode = true), unchanged; the
plain ones under any runner."""

from __future__ import annotations

import pytest
from user_jobs import Add, Charge, Double, Total, registry

import pipeline
from pipeline.testing import open_test_pipeline, run

# -- async: awaited, on whichever loop runs the test ------------------------------------------------------


async def test_a_job_answers_its_result() -> None:
    async with open_test_pipeline(registry) as p:
        job_id = await p.enqueue(Add(2, 3))
        assert await p.result(job_id) == 5
        record = await p.get(job_id)
    assert record is not None and (record.status, record.result) == ("completed", 5)


async def test_a_flaky_provider_is_retried_without_waiting_out_the_backoff() -> None:
    async with open_test_pipeline(registry) as p:
        job_id = await p.enqueue(Charge("o-1", fails=2))
        (record,) = await p.drain()
    assert (record.id, record.status, record.attempts) == (job_id, "completed", 3)
    assert record.result == {"order": "o-1", "status": "paid"}


async def test_a_chain_and_a_batch() -> None:
    async with open_test_pipeline(registry) as p:
        first, second = await p.enqueue_many(pipeline.chain(Add(1, 2), Double()))
        batch = await p.enqueue_batch([Add(1, 1), Add(2, 2), Add(3, 3)], then=Total())
        assert await p.result(second) == 6
        assert await p.result(batch.callback_id) == 12
        records = await p.drain()
    assert [r.result for r in records] == [3, 6, 2, 4, 6, 12]  # oldest first


async def test_a_job_that_does_not_fit_is_refused_as_itself() -> None:
    with pytest.raises(pipeline.InvalidPayload, match="expected an integer"):
        async with open_test_pipeline(registry) as p:
            await p.enqueue(Add("two", 3))  # type: ignore[arg-type]


async def test_a_dead_job_raises_job_failed() -> None:
    async with open_test_pipeline(registry) as p:
        job_id = await p.enqueue(Charge("o-2", fails=5))
        with pytest.raises(pipeline.JobFailed, match="hung up on attempt 3"):
            await p.result(job_id)


# -- plain: no event loop in the test at all --------------------------------------------------------------


def test_plain_a_job_answers_its_result() -> None:
    with open_test_pipeline(registry) as p:
        job_id = p.enqueue(Add(2, 3))
        assert p.result(job_id) == 5
        record = p.get(job_id)
    assert record is not None and record.result == 5


def test_plain_a_chain_and_a_batch() -> None:
    with open_test_pipeline(registry) as p:
        first, second = p.enqueue_many(pipeline.chain(Add(1, 2), Double()))
        batch = p.enqueue_batch([Add(1, 1), Add(2, 2)], then=Total())
        assert [r.result for r in p.drain()] == [3, 6, 2, 4, 6]
        assert p.batch(batch.id).counts == {"completed": 2}


def test_plain_run_one_job() -> None:
    record = run(registry, Charge("o-3", fails=1))
    assert (record.status, record.attempts, record.result) == ("completed", 2, {"order": "o-3", "status": "paid"})
    with pytest.raises(pipeline.InvalidPayload):
        run(registry, Add("two", 3))  # type: ignore[arg-type]
