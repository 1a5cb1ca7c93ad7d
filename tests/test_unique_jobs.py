"""Unique jobs through the embedded engine, with workers running, on every backend: enqueue and
emit answer the holder's id while it is pending or running, a new job once it has finished;
enqueue_unique says which; a bad key is refused before anything is stored."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import trio
from backends.stores import BACKENDS
from jobkit import wait_status

import pipeline
from pipeline import Enqueued, UsageError

GATES: dict[str, trio.Event] = {}  # a running Gate job finishes once its gate is set


@attrs.frozen
class Gate:
    name: str


async def gate(job: Gate, ctx: pipeline.JobContext) -> None:
    await GATES[job.name].wait()


@attrs.frozen
class Ordered:
    order_id: str


def on_ordered(event: Ordered, config: pipeline.Config) -> list[pipeline.Routed]:
    return [pipeline.Routed(Gate(f"order-{event.order_id}"), unique_key=f"order:{event.order_id}")]


def registry() -> pipeline.Registry:
    reg = pipeline.Registry()
    reg.register("gate", Gate, gate, concurrency=2)
    reg.add_event("Ordered", Ordered, on_ordered)
    return reg


@pytest.mark.parametrize("backend", sorted(BACKENDS))
async def test_a_key_is_held_while_its_job_waits_or_runs_and_free_once_it_finished(backend: str, tmp_path: Path) -> None:
    GATES.clear()
    GATES["a"] = trio.Event()
    async with BACKENDS[backend](tmp_path) as config, pipeline.open_pipeline(config, registry()) as p:
        first = await p.enqueue_unique(Gate("a"), unique_key="k")
        assert first == Enqueued(first.id, False)
        await wait_status(p, first.id, "running")
        again = await p.enqueue_unique(Gate("a"), unique_key="k", priority=0)
        assert again == Enqueued(first.id, True)
        assert await p.enqueue(Gate("a"), unique_key="k") == first.id
        # many at once, keyed and not, in one call: per job, the id stored for it
        many = await p.enqueue_many([Gate("a"), Gate("a"), Gate("a")], unique_keys=["k", None, "k2"])
        assert many[0] == first.id and len(set(many)) == 3
        _, total = await p.backend.list(job_type="gate")
        assert total == 3

        GATES["a"].set()
        await wait_status(p, first.id, "completed")
        fresh = await p.enqueue_unique(Gate("a"), unique_key="k")
        assert not fresh.duplicate and fresh.id != first.id
        await wait_status(p, fresh.id, "completed")


@pytest.mark.parametrize("backend", sorted(BACKENDS))
async def test_routed_jobs_with_a_key_are_enqueued_once_per_key(backend: str, tmp_path: Path) -> None:
    GATES.clear()
    GATES["order-7"] = trio.Event()
    async with BACKENDS[backend](tmp_path) as config, pipeline.open_pipeline(config, registry()) as p:
        (job_id,) = await p.emit(Ordered("7"))
        async with trio.open_nursery() as tn:  # the same event from many callers at once: one job
            answers: list[list[str]] = []

            async def emit() -> None:
                answers.append(await p.emit(Ordered("7")))

            for _ in range(10):
                tn.start_soon(emit)
        assert answers == [[job_id]] * 10
        assert (await p.backend.get(job_id)).unique_key == "order:7"  # type: ignore[union-attr]
        assert (await p.backend.list(job_type="gate"))[1] == 1
        GATES["order-7"].set()
        await wait_status(p, job_id, "completed")


async def test_a_bad_key_is_refused_before_anything_is_stored(tmp_path: Path) -> None:
    async with BACKENDS["sqlite"](tmp_path) as config, pipeline.open_pipeline(config, registry()) as p:
        for bad, words in (("", "must not be empty"), ("x" * 201, "at most 200"), ("a\x00b", "NUL"), (7, "string")):
            with pytest.raises(UsageError, match=words):
                await p.enqueue(Gate("a"), unique_key=bad)  # type: ignore[arg-type]
        with pytest.raises(UsageError, match="one key"):
            await p.enqueue_many([Gate("a"), Gate("b")], unique_keys=["k"])
        assert (await p.backend.list())[1] == 0
