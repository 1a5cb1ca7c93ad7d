"""What operators do and see: revive, delete, cleanup, stats, ping, and the burial of jobs
whose type nobody knows."""

from __future__ import annotations

import pytest
import trio

from pipeline.backends import Backend
from pipeline.errors import UsageError

from .kit import FUTURE, LONG, add, bury, claim_one, epoch, forget, new_id, record, renew, settle_one, succeed, ts


async def dead_job(backend: Backend, **fields: object) -> str:
    (job_id,) = await add(backend, **fields)  # type: ignore[arg-type]
    assert await settle_one(backend, bury(await claim_one(backend), "fatal"))
    return job_id


async def test_revive_makes_a_dead_job_pending_with_its_attempts_reset_and_due_now(backend: Backend) -> None:
    job_id = await dead_job(backend, max_attempts=4)
    before = ts()
    revived = await backend.revive(job_id)
    assert revived == await record(backend, job_id)
    assert (revived.id, revived.status, revived.attempts, revived.max_attempts) == (job_id, "pending", 0, 4)
    assert before <= revived.run_after <= ts()
    lease = await claim_one(backend)
    assert (lease.id, lease.attempts) == (job_id, 1)


async def test_revive_refuses_an_unknown_job_and_one_that_is_not_dead(backend: Backend) -> None:
    with pytest.raises(LookupError):
        await backend.revive(new_id())
    (pending,) = await add(backend)
    (running,) = await add(backend, job_type="r")
    await claim_one(backend, "r")
    (done,) = await add(backend, job_type="d")
    assert await settle_one(backend, succeed(await claim_one(backend, "d")))
    for job_id in (pending, running, done):
        before = await record(backend, job_id)
        with pytest.raises(UsageError):
            await backend.revive(job_id)
        assert await record(backend, job_id) == before


async def test_delete_removes_a_job_that_is_not_running(backend: Backend) -> None:
    (pending,) = await add(backend)
    dead = await dead_job(backend)
    for job_id in (pending, dead):
        await backend.delete(job_id)
        assert await backend.get(job_id) is None
    with pytest.raises(LookupError):
        await backend.delete(pending)  # gone now


async def test_delete_refuses_a_running_job(backend: Backend) -> None:
    (job_id,) = await add(backend)
    lease = await claim_one(backend)
    with pytest.raises(UsageError):
        await backend.delete(job_id)
    assert await settle_one(backend, succeed(lease))  # still there, and its lease still holds


async def test_cleanup_deletes_finished_jobs_of_the_statuses_asked(backend: Backend) -> None:
    await add(backend, 3)  # pending
    running = await backend.claim({"t": 1}, owner="w", lease_seconds=LONG)
    await add(backend, 4, "done")
    leases = await backend.claim({"done": 4}, owner="w", lease_seconds=LONG)
    await backend.settle([succeed(leases[0]), succeed(leases[1]), bury(leases[2]), bury(leases[3])])

    assert await backend.cleanup(statuses=["dead"]) == 2
    assert (await backend.list(status="dead"))[1] == 0
    assert (await backend.list(status="completed"))[1] == 2
    assert await backend.cleanup() == 2  # completed and dead by default
    _, total = await backend.list()
    assert total == 3
    assert (await record(backend, running[0].id)).status == "running"


async def test_cleanup_refuses_unfinished_statuses(backend: Backend) -> None:
    await add(backend, 2)
    for statuses in (["pending"], ["running"], ["completed", "pending"], []):
        with pytest.raises(UsageError):
            await backend.cleanup(statuses=statuses)
    assert (await backend.list())[1] == 2


async def test_cleanup_older_than_keeps_what_finished_recently(backend: Backend) -> None:
    await add(backend, 2, "old")
    await backend.settle([succeed(lease) for lease in await backend.claim({"old": 2}, owner="w", lease_seconds=LONG)])
    await trio.sleep(0.6)
    await add(backend, 2, "new")
    await backend.settle([bury(lease) for lease in await backend.claim({"new": 2}, owner="w", lease_seconds=LONG)])
    assert await backend.cleanup(older_than_seconds=3600) == 0
    assert await backend.cleanup(older_than_seconds=0.3) == 2
    records, total = await backend.list()
    assert total == 2 and {r.job_type for r in records} == {"new"}
    assert await backend.cleanup(older_than_seconds=0) == 2


async def test_stats_counts_by_status_and_type_and_says_how_late_the_queue_is(backend: Backend) -> None:
    empty = await backend.stats()
    assert empty["total"] == 0
    assert empty["oldest_due_pending_age_seconds"] is None

    await add(backend, 3, "a", delay=-30.0)
    await add(backend, 2, "b", delay=FUTURE)
    await add(backend, 2, "c")
    leases = await backend.claim({"c": 2}, owner="w", lease_seconds=LONG)
    await backend.settle([succeed(leases[0]), bury(leases[1])])
    await add(backend, 1, "c")
    await claim_one(backend, "c")

    stats = await backend.stats()
    assert {"by_status", "by_type", "total", "finished_per_minute", "oldest_due_pending_age_seconds"} <= set(stats)
    assert stats["total"] == 8
    assert stats["by_status"] == {"waiting": 0, "pending": 5, "running": 1, "completed": 1, "dead": 1, "cancelled": 0,
                                  "suspended": 0}
    assert stats["by_type"]["a"]["pending"] == 3
    assert stats["by_type"]["b"]["pending"] == 2
    assert {k: v for k, v in stats["by_type"]["c"].items() if v} == {"running": 1, "completed": 1, "dead": 1}
    assert 29 <= stats["oldest_due_pending_age_seconds"] <= 40  # the "a" jobs, due 30 s ago; not the future ones

    minutes = stats["finished_per_minute"]
    assert len(minutes) == 60
    assert [m["minute"] for m in minutes] == sorted(m["minute"] for m in minutes)
    assert sum(m["completed"] for m in minutes) == 1 and sum(m["dead"] for m in minutes) == 1
    assert minutes[-1]["minute"][:16] <= ts()[:16]


async def test_ping_answers(backend: Backend) -> None:
    assert await backend.ping() is None
    assert isinstance(backend.url, str) and backend.url


async def test_a_pending_job_of_a_type_nobody_knows_goes_dead_after_the_grace(backend: Backend) -> None:
    (old_unknown,) = await add(backend, job_type="ghost_type", delay=-120.0)
    (recent_unknown,) = await add(backend, job_type="ghost_type", delay=-1.0)
    (future_unknown,) = await add(backend, job_type="ghost_type", delay=FUTURE)
    (known,) = await add(backend, job_type="mail", delay=-120.0)

    assert await backend.bury_unknown_types({"mail"}, grace_seconds=60.0) == 1
    got = await record(backend, old_unknown)
    assert got.status == "dead"
    assert got.error is not None and "ghost_type" in got.error
    for job_id in (recent_unknown, future_unknown, known):
        assert (await record(backend, job_id)).status == "pending"
    assert await backend.bury_unknown_types({"mail"}, grace_seconds=60.0) == 0


async def test_a_type_a_live_worker_knows_is_not_buried(backend: Backend) -> None:
    (theirs,) = await add(backend, job_type="thumbnail_v2", delay=-120.0)
    (nobodys,) = await add(backend, job_type="legacy_export", delay=-120.0)
    # another process, alive, knows "thumbnail_v2"
    assert await renew(backend, "other:7", ["thumbnail_v2"], [], lease_seconds=LONG) == []

    assert await backend.bury_unknown_types(["mail"], grace_seconds=60.0) == 1
    assert (await record(backend, theirs)).status == "pending"
    assert (await record(backend, nobodys)).status == "dead"

    await forget(backend, "other:7")  # it stopped: nobody knows the type now
    assert await backend.bury_unknown_types(["mail"], grace_seconds=60.0) == 1
    got = await record(backend, theirs)
    assert got.status == "dead" and got.error is not None and "thumbnail_v2" in got.error
    assert epoch(got.updated_at) <= epoch(ts()) + 1


async def test_a_live_worker_keeps_its_types_even_when_the_grace_is_shorter_than_its_heartbeat(backend: Backend) -> None:
    (theirs,) = await add(backend, job_type="thumbnail_v2", delay=-120.0)  # due long before the grace
    assert await renew(backend, "other:7", ["thumbnail_v2"], [], lease_seconds=LONG) == []
    await trio.sleep(0.5)  # between two of its beats (every lease_seconds / 3: 10 s by default)
    await backend.bury_unknown_types(["mail"], grace_seconds=0.2)
    assert (await record(backend, theirs)).status == "pending"
