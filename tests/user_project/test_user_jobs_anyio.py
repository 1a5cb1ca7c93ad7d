"""The same, written for anyio's pytest plugin: each test runs on asyncio and on trio."""

from __future__ import annotations

import pytest
from user_jobs import Add, Double, registry

import pipeline
from pipeline.testing import open_test_pipeline

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


async def test_a_chain_answers_its_results() -> None:
    async with open_test_pipeline(registry) as p:
        first, second = await p.enqueue_many(pipeline.chain(Add(20, 1), Double()))
        assert await p.result(second) == 42
        assert (await p.get(first)).result == 21  # type: ignore[union-attr]


async def test_a_job_that_does_not_fit_is_refused_as_itself() -> None:
    with pytest.raises(pipeline.InvalidPayload):
        async with open_test_pipeline(registry) as p:
            await p.enqueue(Add("two", 3))  # type: ignore[arg-type]
