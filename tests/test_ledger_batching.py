"""The Ledger's grouping: many callers' inserts and outcomes in one transaction, one
executemany each, and a caller whose part does not fit hears so alone."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from conftest import fast_config
from jobkit import Echo, registry, wait_status

import pipeline
from pipeline.backends import NewJob


async def test_inserts_of_many_callers_share_a_transaction_and_a_bad_one_fails_alone(db_path) -> None:
    config = fast_config(db_path, worker_enabled=False)
    async with pipeline.open_pipeline(config, registry()) as p:
        (taken,) = await p.enqueue_many([Echo("first")])
        backend = p.backend
        good = [[p.new_job(Echo(f"good-{k}-{i}")) for i in range(3)] for k in range(5)]
        bad = p.new_job(Echo("bad"))
        bad = bad._replace(id=taken)  # a duplicate primary key: this caller's insert cannot commit
        results: dict[Any, Any] = {}

        async def put(name: Any, rows: list[NewJob]) -> None:
            try:
                await backend.insert(rows)
                results[name] = [r.id for r in rows]
            except pipeline.StoreError as exc:
                results[name] = exc

        before = p.backend.ledger_stats.batches
        async with trio.open_nursery() as tn:  # all six wait in the Ledger's inbox together
            for k, rows in enumerate(good):
                tn.start_soon(put, k, rows)
            tn.start_soon(put, "bad", [bad])
        assert p.backend.ledger_stats.batches == before + 1, "one transaction for all six callers"
        assert isinstance(results["bad"], pipeline.StoreError) and "UNIQUE" in str(results["bad"])
        for k, rows in enumerate(good):
            assert results[k] == [r.id for r in rows]
            for r in rows:
                assert (await backend.get(r.id)).status == "pending"
        assert (await backend.get(taken)).payload == '{"text":"first","sleep":0.0,"fail_times":0,"mode":"ok"}'


async def test_outcomes_of_a_burst_ride_on_few_trays(db_path) -> None:
    config = fast_config(db_path, worker_concurrency=50)
    async with pipeline.open_pipeline(config, registry()) as p:
        done = trio.Event()
        seen: list[str] = []

        def observe(fields: dict[str, Any]) -> None:  # called once the outcome committed
            seen.append(fields["status"])
            if len(seen) == 500:
                done.set()

        p.add_observer(observe)
        await p.enqueue_many([Echo(str(i)) for i in range(500)])
        with trio.fail_after(20):
            await done.wait()
        assert seen == ["completed"] * 500
        # each outcome still counts as a command; the transactions are far fewer
        assert p.backend.ledger_stats.commands >= 500
        assert p.backend.ledger_stats.batches < 60, p.backend.ledger_stats


async def test_each_waiter_of_a_failed_batch_raises_its_own_error() -> None:
    """One error answers every caller of a failed batch; raised as one shared object, each
    raise added its traceback to it (1,000 callers: tracebacks 1,000 raises deep)."""
    import traceback

    from pipeline.replies import Reply

    reply = Reply()
    cause = OSError(28, "No space left on device")
    try:
        raise pipeline.StoreError("database x is full") from cause
    except pipeline.StoreError as exc:
        reply.fail(exc)
    seen: list[BaseException] = []
    for _ in range(50):
        try:
            await reply.wait()
        except pipeline.StoreError as exc:
            seen.append(exc)
    assert len({id(e) for e in seen}) == 50
    assert {str(e) for e in seen} == {"database x is full"} and all(e.__cause__ is cause for e in seen)
    depths = {len(traceback.extract_tb(e.__traceback__)) for e in seen}
    assert len(depths) == 1, depths

    class Refused(pipeline.PipelineError):  # an error that formats its own message
        def __init__(self, post_id: str) -> None:
            super().__init__(f"post {post_id} is not published")
            self.post_id = post_id

    reply = Reply()
    reply.fail(Refused("p1"))
    with pytest.raises(Refused, match="^post p1 is not published$") as info:
        await reply.wait()
    assert info.value.post_id == "p1"

    reply = Reply()
    reply.fail(FileNotFoundError(2, "No such file", "/f"))  # fields outside __dict__ survive too
    with pytest.raises(FileNotFoundError) as lost:
        await reply.wait()
    assert (lost.value.errno, lost.value.filename, str(lost.value)) == (2, "/f", "[Errno 2] No such file: '/f'")


async def test_a_job_at_a_time_costs_two_transactions(db_path) -> None:
    """Its insert, which also claims it for the Poller's standing offer, and its outcome: a
    worker freeing room the offer holds does not send the Poller to claim for nothing."""
    # no poll in the way; and the lease keeper's rescue and bury (two batches every third of the lease)
    # once in 20 s, not every 0.67 s of a run that a loaded machine stretches to seconds
    config = fast_config(db_path, worker_poll_interval_ms=10_000, worker_lease_seconds=60.0)
    async with pipeline.open_pipeline(config, registry()) as p:
        await trio.sleep(0.1)  # the Poller's first (empty) claim, then its offer
        before = p.backend.ledger_stats.batches
        for i in range(20):
            job_id = await p.enqueue(Echo(str(i)))
            await wait_status(p, job_id, "completed")
            await trio.sleep(0.01)  # let every nudge be heard
        assert p.backend.ledger_stats.batches - before <= 2 * 20 + 2, p.backend.ledger_stats
