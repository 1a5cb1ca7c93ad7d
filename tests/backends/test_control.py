"""Control (issue 23) on every store: cancelling a pending job (at once) or a running one (asked
of its worker, fenced like any outcome), a cancel racing the job's own outcome (exactly one final
state, never retried after a cancel), the rescue of a run whose cancel was requested, jobs that
expire before they start, paused job types, a handler's progress and result, snoozes, and the
cancelled status in what operators see and remove. Written from the protocol's contract
(pipeline/backends/base.py), not from any store's code."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest
import trio

from pipeline import Config
from pipeline.backends import Backend, Lease, NewJob, Settlement, open_backend
from pipeline.backends.base import (
    CANCELLING,
    Claimed,
    ClaimOffer,
    Nudge,
    ScheduleRecord,
    cancelled_error,
    cancelled_running_error,
    expired_error,
)
from pipeline.errors import UsageError
from pipeline.schedules import Schedule
from pipeline.states import Transition

from .kit import (
    FUTURE,
    LONG,
    SHORT,
    add,
    bury,
    claim_one,
    epoch,
    insert,
    job,
    new_id,
    outlive,
    record,
    release,
    retry,
    settle_one,
    snooze,
    stop,
    succeed,
    ts,
)

REASON = "by an operator, from the test"
# a cancel requested before an outcome that would run the job again: the error it ends with
REQUESTED = "cancelled while running (cancel requested); its attempt ended: "
RESCUED = cancelled_running_error("its cancel was requested")
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def running(backend: Backend, job_type: str = "t", *, owner: str = "owner-a", **fields: Any) -> Lease:
    """A new job of its own type, claimed (started) by ``owner``."""
    (job_id,) = await add(backend, job_type=job_type, **fields)
    lease = await claim_one(backend, job_type, owner=owner)
    assert lease.id == job_id
    return lease


async def claimed_ids(backend: Backend, wants: dict[str, int], **options: Any) -> list[str]:
    leases = await backend.claim(wants, owner="w", lease_seconds=LONG, **options)
    return sorted(lease.id for lease in leases)


def old(row: NewJob) -> NewJob:
    """The row as inserted a minute ago (its updated_at too): a write that forgets updated_at shows."""
    return row._replace(created_at=ts(-60.0))


def near(text: str, before: str, after: str, *, plus: float = 0.0) -> bool:
    """``text`` is a time between ``before`` and ``after`` (+ ``plus`` seconds), to the millisecond."""
    return epoch(before) + plus - 0.002 <= epoch(text) <= epoch(after) + plus + 0.002


async def free_key(backend: Backend, key: str, job_type: str = "t") -> str:
    """The unique key is held by no job: an insert with it inserts (the new job's id)."""
    successor = job(job_type, unique_key=key)
    assert await backend.insert([successor]) == [successor.id], f"key {key!r} still held"
    return successor.id


# -- cancel, per state -------------------------------------------------------------------------------


@pytest.mark.parametrize("due", [True, False], ids=["due", "delayed"])
async def test_a_pending_job_is_cancelled_at_once_and_its_unique_key_is_freed(backend: Backend, due: bool) -> None:
    # the delayed one would also expire before it is due: its cancel must take it out of that index too
    row = job(unique_key="k") if due else job(unique_key="k", delay=0.08, expires_at=ts(0.05))
    (job_id,) = await insert(backend, old(row))
    before = ts()
    assert await backend.cancel([job_id], reason=REASON) == ["cancelled"]
    after = ts()
    got = await record(backend, job_id)
    assert (got.status, got.error, got.attempts, got.lease_owner, got.cancel_requested) == (
        "cancelled", cancelled_error(REASON), 0, None, False)
    assert near(got.updated_at, before, after)
    successor = await free_key(backend, "k")
    if not due:
        await trio.sleep(0.1)  # past its run_after and expiry: no index of delayed, due or expiring jobs holds it
    assert await claimed_ids(backend, {"t": 5}) == [successor]
    assert await backend.rescue_expired(base_seconds=1.0) == 0
    assert await record(backend, job_id) == got
    assert (await backend.list(status="pending"))[1] == 0
    assert (await backend.stats())["by_status"].get("pending", 0) == 0


async def test_a_running_job_is_asked_to_stop_and_only_its_owner_hears_it(backend: Backend) -> None:
    a = await running(backend, "a", owner="owner-a")
    other = await running(backend, "a2", owner="owner-a")  # the same owner's, not asked
    b = await running(backend, "b", owner="owner-b")
    assert await backend.cancel_requests("owner-a") == []
    assert await backend.cancel([a.id], reason=REASON) == [CANCELLING]
    got = await record(backend, a.id)
    assert (got.status, got.cancel_requested, got.lease_owner, got.error) == ("running", True, "owner-a", None)
    assert got.to_json()["cancel_requested"] is True
    assert (await record(backend, other.id)).cancel_requested is False
    assert await backend.cancel_requests("owner-a") == [(a.id, a.token)]
    assert await backend.cancel_requests("owner-b") == []
    # asking twice is harmless; each owner hears only its own
    assert await backend.cancel([a.id, b.id], reason=REASON) == [CANCELLING, CANCELLING]
    assert await backend.cancel_requests("owner-a") == [(a.id, a.token)]
    assert await backend.cancel_requests("owner-b") == [(b.id, b.token)]
    assert await backend.cancel_requests("nobody") == []
    # it still runs under its lease: its worker writes how it ended
    assert await settle_one(backend, stop(a))
    assert await settle_one(backend, succeed(other))


async def test_a_finished_job_answers_its_status_and_is_left_as_it_was(backend: Backend) -> None:
    done = await running(backend, "d")
    assert await settle_one(backend, succeed(done))
    dead = await running(backend, "x")
    assert await settle_one(backend, bury(dead))
    (cancelled,) = await add(backend, job_type="c")
    assert await backend.cancel([cancelled], reason="first") == ["cancelled"]
    for job_id, status in ((done.id, "completed"), (dead.id, "dead"), (cancelled, "cancelled")):
        before = await record(backend, job_id)
        assert await backend.cancel([job_id], reason="again") == [status]
        assert await record(backend, job_id) == before


async def test_an_unknown_id_answers_none(backend: Backend) -> None:
    (pending,) = await add(backend)
    assert await backend.cancel([new_id()], reason=REASON) == [None]
    assert await backend.cancel([], reason=REASON) == []
    assert (await record(backend, pending)).status == "pending"


async def test_one_call_answers_each_id_in_order_duplicates_included(backend: Backend) -> None:
    (pending,) = await add(backend, job_type="p")
    run = await running(backend, "r")
    done = await running(backend, "d")
    assert await settle_one(backend, succeed(done))
    dead = await running(backend, "x")
    assert await settle_one(backend, bury(dead))
    ids = [pending, new_id(), run.id, done.id, pending, dead.id, run.id]
    assert await backend.cancel(ids, reason=REASON) == [
        "cancelled", None, CANCELLING, "completed", "cancelled", "dead", CANCELLING]
    assert (await record(backend, pending)).error == cancelled_error(REASON)
    assert await backend.cancel_requests("owner-a") == [(run.id, run.token)]


# -- a running job's end -----------------------------------------------------------------------------


async def test_a_cancel_outcome_is_fenced_by_the_lease_and_ends_the_job_cancelled(backend: Backend) -> None:
    (job_id,) = await add(backend, unique_key="k")
    stale = await claim_one(backend)
    assert await settle_one(backend, retry(stale, 0.0))
    lease = await claim_one(backend)
    assert lease.token != stale.token
    assert await backend.cancel([job_id], reason=REASON) == [CANCELLING]
    assert await backend.set_progress(job_id, lease.token, 0.25, "a quarter")
    before = await record(backend, job_id)
    assert not await settle_one(backend, stop(stale))
    assert not await settle_one(backend, Settlement(job_id, lease.token + 1, Transition.CANCEL, error="never issued"))
    assert await record(backend, job_id) == before

    start = ts()
    assert await settle_one(backend, stop(lease, "cancelled while running: the handler stopped"))
    end = ts()
    got = await record(backend, job_id)
    assert (got.status, got.error, got.lease_owner, got.lease_expires_at, got.cancel_requested) == (
        "cancelled", "cancelled while running: the handler stopped", None, None, False)
    assert near(got.updated_at, start, end)
    assert (got.progress, got.progress_message) == (0.25, "a quarter")  # kept on a final status
    assert not await settle_one(backend, stop(lease))  # once only
    assert await record(backend, job_id) == got
    assert await backend.cancel_requests("owner-a") == []
    assert await backend.claim({"t": 1}, owner="w", lease_seconds=LONG) == []
    await free_key(backend, "k")


@pytest.mark.parametrize("outcome", ["succeed", "bury"])
async def test_a_cancel_requested_as_the_job_ends_leaves_its_own_final_status(backend: Backend, outcome: str) -> None:
    lease = await running(backend)
    assert await backend.cancel([lease.id], reason=REASON) == [CANCELLING]
    if outcome == "succeed":
        assert await settle_one(backend, succeed(lease, '{"sent":3}'))
        expected = ("completed", None, '{"sent":3}')
    else:
        assert await settle_one(backend, bury(lease, "fatal: bad address"))
        expected = ("dead", "fatal: bad address", None)
    got = await record(backend, lease.id)
    assert (got.status, got.error, got.result) == expected
    assert (got.cancel_requested, got.lease_owner) == (False, None)
    assert await backend.cancel_requests("owner-a") == []
    assert not await settle_one(backend, stop(lease))  # the worker's CANCEL, written after: nothing changes
    assert await record(backend, lease.id) == got


@pytest.mark.parametrize("outcome", ["retry", "release", "snooze"])
async def test_a_cancel_requested_before_an_outcome_that_would_run_it_again_ends_it_cancelled(
    backend: Backend, outcome: str
) -> None:
    (job_id,) = await add(backend, max_attempts=5, unique_key="k")
    lease = await claim_one(backend)
    sibling = await running(backend, "s", max_attempts=5)  # the same outcome in the same call, no cancel asked
    assert await backend.cancel([job_id], reason=REASON) == [CANCELLING]

    def outcome_of(lease: Lease) -> tuple[Settlement, str]:
        return {
            "retry": (retry(lease, 0.0, error="ValueError: nope"), "ValueError: nope"),
            "release": (release(lease), "released"),
            "snooze": (snooze(lease, 0.0, limit=5, error="not ready yet"), "not ready yet"),
        }[outcome]

    settlement, ended = outcome_of(lease)
    assert await backend.settle([outcome_of(sibling)[0], settlement]) == [True, True]
    got = await record(backend, job_id)
    assert (got.status, got.error, got.cancel_requested, got.lease_owner) == ("cancelled", REQUESTED + ended, False, None)
    assert (await record(backend, sibling.id)).status == "pending"
    assert await claimed_ids(backend, {"t": 1, "s": 1}) == [sibling.id]
    assert await backend.rescue_expired(base_seconds=0.0) == 0
    assert (await record(backend, job_id)).status == "cancelled"
    assert await backend.cancel_requests("owner-a") == []
    assert not await settle_one(backend, stop(lease))
    await free_key(backend, "k")


@pytest.mark.parametrize("started", [True, False], ids=["started", "claimed ahead"])
async def test_an_expired_lease_whose_cancel_was_requested_is_rescued_cancelled(backend: Backend, started: bool) -> None:
    (job_id,) = await add(backend, max_attempts=5)
    (plain,) = await add(backend, job_type="u", max_attempts=5)  # expires beside it, no cancel asked: rescued as ever
    (lease,) = await backend.claim({"t": 1}, owner="gone:1", lease_seconds=SHORT, start=None if started else {"t": 0})
    assert lease.started is started
    await backend.claim({"u": 1}, owner="gone:1", lease_seconds=SHORT)
    assert await backend.cancel([job_id], reason=REASON) == [CANCELLING]
    await outlive(SHORT)
    assert await backend.rescue_expired(base_seconds=0.0) == 2
    got = await record(backend, job_id)
    assert (got.status, got.error, got.cancel_requested, got.lease_owner, got.lease_expires_at) == (
        "cancelled", RESCUED, False, None, None)
    assert (await record(backend, plain)).status == "pending"
    assert await claimed_ids(backend, {"t": 1, "u": 1}) == [plain]
    assert await backend.cancel_requests("gone:1") == []
    assert not await settle_one(backend, stop(lease))
    assert await backend.rescue_expired(base_seconds=0.0) == 0


@pytest.mark.parametrize("end", ["cancel outcome", "retry after a request", "rescue"])
async def test_a_cancelled_run_gives_its_place_back_under_a_global_limit(backend: Backend, end: str) -> None:
    """A type limited to one running job: once its job ended cancelled, the next one is claimed."""
    (first,) = await add(backend)
    (lease,) = await backend.claim({"t": 1}, owner="w", lease_seconds=SHORT if end == "rescue" else LONG,
                                   limits={"t": 1})
    (second,) = await add(backend)
    assert await backend.claim({"t": 1}, owner="w", lease_seconds=LONG, limits={"t": 1}) == []
    assert await backend.cancel([first], reason=REASON) == [CANCELLING]
    if end == "cancel outcome":
        assert await settle_one(backend, stop(lease))
    elif end == "retry after a request":
        assert await settle_one(backend, retry(lease, 0.0))
    else:
        await outlive(SHORT)
        assert await backend.rescue_expired(base_seconds=0.0) == 1
    assert (await record(backend, first)).status == "cancelled"
    assert await claimed_ids(backend, {"t": 1}, limits={"t": 1}) == [second]


# -- revive ------------------------------------------------------------------------------------------


async def test_revive_makes_a_cancelled_job_pending_with_its_counters_reset(backend: Backend) -> None:
    (job_id,) = await add(backend, max_attempts=4)
    assert await settle_one(backend, retry(await claim_one(backend), 0.0, error="boom"))
    assert await settle_one(backend, snooze(await claim_one(backend), 0.0))
    lease = await claim_one(backend)
    assert await backend.set_progress(job_id, lease.token, 0.5, "half")
    assert await backend.cancel([job_id], reason=REASON) == [CANCELLING]
    assert await settle_one(backend, stop(lease, "stopped"))
    cancelled = await record(backend, job_id)
    assert (cancelled.status, cancelled.snoozes, cancelled.progress, cancelled.progress_message) == (
        "cancelled", 1, 0.5, "half")
    assert cancelled.attempts > 0

    before = ts()
    revived = await backend.revive(job_id)
    after = ts()
    assert revived == await record(backend, job_id)
    assert (revived.status, revived.attempts, revived.snoozes, revived.progress, revived.progress_message) == (
        "pending", 0, 0, None, None)
    assert (revived.cancel_requested, revived.result, revived.lease_owner, revived.error) == (False, None, None, "stopped")
    assert near(revived.run_after, before, after)
    lease = await claim_one(backend)
    assert (lease.id, lease.attempts) == (job_id, 1)


async def test_revive_of_a_job_cancelled_while_pending_holds_its_key_again(backend: Backend) -> None:
    (cancelled,) = await add(backend, unique_key="k")
    assert await backend.cancel([cancelled], reason=REASON) == ["cancelled"]
    (holder,) = await add(backend, unique_key="k")
    with pytest.raises(UsageError, match=holder):
        await backend.revive(cancelled)
    assert (await record(backend, cancelled)).status == "cancelled"
    assert await backend.cancel([holder], reason=REASON) == ["cancelled"]
    assert (await backend.revive(cancelled)).status == "pending"
    assert await backend.insert([job(unique_key="k")]) == [cancelled]


async def test_revive_names_the_statuses_it_takes(backend: Backend) -> None:
    (pending,) = await add(backend)
    run = await running(backend, "r")
    done = await running(backend, "d")
    assert await settle_one(backend, succeed(done))
    for job_id, status in ((pending, "pending"), (run.id, "running"), (done.id, "completed")):
        with pytest.raises(UsageError, match=f"job {job_id} is {status}, only dead or cancelled jobs can be retried"):
            await backend.revive(job_id)


# -- expiry ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["plain", "ahead", "limited"])
async def test_a_claim_ends_its_types_expired_jobs_cancelled_and_never_returns_one(backend: Backend, how: str) -> None:
    options: dict[str, Any] = {"plain": {}, "ahead": {"start": {"t": 0}}, "limited": {"limits": {"t": 5}}}[how]
    gone = [old(job(priority=0, expires_at=ts(-1.0))), old(job(priority=0, expires_at=ts(-0.01)))]  # first, unexpired
    live = job(priority=5, expires_at=ts(FUTURE))
    plain = job(priority=9)
    other = job("u", expires_at=ts(-1.0))  # a type this claim does not ask for
    await insert(backend, *gone, live, plain, other)
    before = ts()
    assert await claimed_ids(backend, {"t": 1}, **options) == [live.id]
    after = ts()
    for row in gone:
        got = await record(backend, row.id)
        assert (got.status, got.error, got.attempts, got.expires_at, got.lease_owner) == (
            "cancelled", expired_error(row.expires_at or ""), 0, row.expires_at, None)
        assert near(got.updated_at, before, after)
    assert (await record(backend, other.id)).status == "pending"
    assert (await record(backend, live.id)).expires_at == live.expires_at
    assert await claimed_ids(backend, {"t": 5}, **options) == [plain.id]


async def test_a_job_that_expires_while_it_waits_is_not_claimed(backend: Backend) -> None:
    soon = job(expires_at=ts(0.05))
    await insert(backend, soon)
    await trio.sleep(0.08)
    assert await backend.claim({"t": 1}, owner="w", lease_seconds=LONG) == []
    got = await record(backend, soon.id)
    assert (got.status, got.error) == ("cancelled", expired_error(soon.expires_at or ""))


async def test_rescue_ends_every_expired_pending_job_cancelled_whatever_its_type(backend: Backend) -> None:
    nobodys = old(job("nobody_claims", expires_at=ts(-1.0)))
    not_due = old(job(delay=FUTURE, expires_at=ts(-0.5)))  # not even due, and already past its expiry
    live = job(expires_at=ts(FUTURE))
    plain = job()
    await insert(backend, nobodys, not_due, live, plain)
    before = ts()
    assert await backend.rescue_expired(base_seconds=1.0) == 2
    after = ts()
    for row in (nobodys, not_due):
        got = await record(backend, row.id)
        assert (got.status, got.error) == ("cancelled", expired_error(row.expires_at or ""))
        assert near(got.updated_at, before, after)
    assert {(await record(backend, row.id)).status for row in (live, plain)} == {"pending"}
    assert await backend.rescue_expired(base_seconds=1.0) == 0
    assert await claimed_ids(backend, {"t": 5, "nobody_claims": 5}) == sorted([live.id, plain.id])


async def test_every_insert_path_stores_expires_at_and_the_claim_expires_what_each_wrote(
    backend: Backend, store_config: Config
) -> None:
    """A plain row, a keyed one, a traced one, a bulk load, a fired schedule and a caller's own
    transaction: each stores expires_at, and the claim ends the expired ones of each."""
    later, past = ts(FUTURE), ts(-1.0)

    def pair(**fields: Any) -> list[NewJob]:  # one that expires later, one already expired
        return [job(expires_at=later, **fields), job(expires_at=past, **fields)]

    keyed = [job(unique_key="k1", expires_at=later), job(unique_key="k2", expires_at=past)]
    traced = [row._replace(trace=TRACE) for row in pair()]
    plain, bulk, never = pair(), pair(), job()
    await insert(backend, *plain, *keyed, *traced, never)
    assert await backend.bulk_insert(iter(bulk)) == 2
    schedule = ScheduleRecord.of(Schedule("tick", "* * * * *", "t", "{}"), origin="operator")
    await backend.put_schedule(schedule)
    fired = job(expires_at=past)
    assert await backend.fire_schedule("tick", tick=schedule.next_run, next_run=ts(FUTURE), job=fired)
    written = [*plain, *keyed, *traced, *bulk, fired]
    if store_config.backend == "sqlite":
        from pipeline.backends.sqlite.outbox import insert_in_transaction

        written += (outbox := pair())
        conn = sqlite3.connect(store_config.database_path, isolation_level=None)
        conn.execute("BEGIN")
        assert insert_in_transaction(conn, outbox) == [row.id for row in outbox]
        conn.execute("COMMIT")
        conn.close()
    elif store_config.backend == "postgres":
        import psycopg

        from pipeline.backends.postgres import outbox as pg_outbox

        written += (outbox := pair())
        with psycopg.connect(store_config.database_url) as pg, pg.transaction():
            assert pg_outbox.insert_in_transaction(pg, outbox) == [row.id for row in outbox]

    for row in written:
        got = await record(backend, row.id)
        assert (got.expires_at, got.to_json()["expires_at"]) == (row.expires_at, row.expires_at), row
    assert (await record(backend, never.id)).expires_at is None
    assert await claimed_ids(backend, {"t": 100}) == sorted([never.id, *(r.id for r in written if r.expires_at == later)])
    for row in written:
        if row.expires_at == past:
            got = await record(backend, row.id)
            assert (got.status, got.error) == ("cancelled", expired_error(past)), row


# -- pause -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["plain", "ahead", "limited"])
async def test_a_paused_type_is_not_claimed_while_its_enqueues_are_kept(backend: Backend, how: str) -> None:
    options: dict[str, Any] = {"plain": {}, "ahead": {"start": {"a": 0, "b": 0}},
                               "limited": {"limits": {"a": 5, "b": 5}}}[how]
    assert await backend.paused_types() == set()
    busy = await running(backend, "a")  # running when the pause comes: it finishes
    await backend.set_type_paused("a", True)
    await backend.set_type_paused("a", True)  # twice: the same
    await backend.set_type_paused("reports.v2:eu {x}", True)  # any name
    assert await backend.paused_types() == {"a", "reports.v2:eu {x}"}
    a_ids = await add(backend, 2, "a")  # accepted while paused
    b_ids = await add(backend, 2, "b")
    assert await claimed_ids(backend, {"a": 5, "b": 5}, **options) == sorted(b_ids)
    assert {(await record(backend, i)).status for i in a_ids} == {"pending"}
    assert await settle_one(backend, succeed(busy))

    await backend.set_type_paused("a", False)
    await backend.set_type_paused("a", False)
    await backend.set_type_paused("never paused", False)
    assert await backend.paused_types() == {"reports.v2:eu {x}"}
    assert await claimed_ids(backend, {"a": 5}, **options) == sorted(a_ids)


async def test_a_pause_holds_for_every_process_sharing_the_store(backend: Backend, store_config: Config) -> None:
    (job_id,) = await add(backend, job_type="a")
    async with open_backend(store_config) as other:
        await other.set_type_paused("a", True)
        assert await backend.paused_types() == {"a"}
        assert await backend.claim({"a": 1}, owner="w", lease_seconds=LONG) == []
        assert await other.claim({"a": 1}, owner="w2", lease_seconds=LONG) == []
    async with open_backend(store_config) as later:  # the store keeps it, not the process that paused
        assert await later.paused_types() == {"a"}
        assert await later.claim({"a": 1}, owner="w3", lease_seconds=LONG) == []
        await later.set_type_paused("a", False)
    assert await backend.paused_types() == set()
    assert await claimed_ids(backend, {"a": 1}) == [job_id]


async def test_a_claim_made_with_an_insert_skips_paused_types_and_expired_jobs(store_config: Config) -> None:
    """The Poller's standing offer, taken by the batch that inserts (base.ClaimOffer), claims as
    claim() does: nothing of a paused type, no expired job."""
    nudge_send, nudge_recv = trio.open_memory_channel[Nudge](3)
    offers_send, offers_recv = trio.open_memory_channel[ClaimOffer](1)
    async with open_backend(store_config, nudge_send=nudge_send, offers_recv=offers_recv) as backend:
        await backend.set_type_paused("a", True)
        paused, expired, live = job("a"), job("b", priority=0, expires_at=ts(-1.0)), job("b", priority=9)
        try:
            offers_send.send_nowait(ClaimOffer({"a": 1, "b": 1}, "owner-a", LONG))
        except trio.BrokenResourceError:
            return  # a store that takes no offers claims only through claim(), which the tests above cover
        await insert(backend, paused, expired, live)
        if offers_send.statistics().current_buffer_used:
            assert store_config.backend != "sqlite", "the SQLite Ledger takes the offer with the next insert"
            return  # (as above)
        with trio.fail_after(5):
            while not isinstance(answer := await nudge_recv.receive(), Claimed):
                pass
        assert [lease.id for lease in answer.leases] == [live.id]
        assert (await record(backend, paused.id)).status == "pending"
        got = await record(backend, expired.id)
        assert (got.status, got.error) == ("cancelled", expired_error(expired.expires_at or ""))


# -- progress and results ----------------------------------------------------------------------------


async def test_progress_is_fenced_by_the_lease_and_stored(backend: Backend) -> None:
    (job_id,) = await add(backend)
    assert not await backend.set_progress(job_id, 1, 0.1, "pending: not running")
    assert not await backend.set_progress(new_id(), 1, 0.1, None)
    stale = await claim_one(backend)
    assert await settle_one(backend, retry(stale, 0.0))
    lease = await claim_one(backend)
    assert not await backend.set_progress(job_id, stale.token, 0.9, "stale")
    got = await record(backend, job_id)
    assert (got.progress, got.progress_message, got.to_json()["progress"]) == (None, None, None)

    assert await backend.set_progress(job_id, lease.token, 0.0, "starting")
    got = await record(backend, job_id)
    assert (got.progress, got.progress_message) == (0.0, "starting")
    assert await backend.set_progress(job_id, lease.token, 0.5, "half way: 50/100 ✓")
    got = await record(backend, job_id)
    assert (got.progress, got.progress_message) == (0.5, "half way: 50/100 ✓")
    assert got.to_json()["progress"] == {"fraction": 0.5, "message": "half way: 50/100 ✓"}
    assert await backend.set_progress(job_id, lease.token, 1.0, None)
    assert not await backend.set_progress(job_id, stale.token, 0.25, "stale")
    got = await record(backend, job_id)
    assert (got.progress, got.progress_message, got.status) == (1.0, None, "running")


@pytest.mark.parametrize("back", ["retry", "release", "snooze", "rescue", "unclaim"])
async def test_progress_is_cleared_when_the_job_goes_back_to_pending(backend: Backend, back: str) -> None:
    (job_id,) = await add(backend, max_attempts=5)
    expiring = back in ("rescue", "unclaim")
    (lease,) = await backend.claim({"t": 1}, owner="w", lease_seconds=SHORT if expiring else LONG,
                                   start={"t": 0} if back == "unclaim" else None)
    assert await backend.set_progress(job_id, lease.token, 0.5, "half")
    if back == "retry":
        assert await settle_one(backend, retry(lease, 0.0))
    elif back == "release":
        assert await settle_one(backend, release(lease))
    elif back == "snooze":
        assert await settle_one(backend, snooze(lease, 0.0))
    else:
        await outlive(SHORT)
        assert await backend.rescue_expired(base_seconds=0.0) == 1
    got = await record(backend, job_id)
    assert (got.status, got.progress, got.progress_message, got.to_json()["progress"]) == ("pending", None, None, None)


@pytest.mark.parametrize("end", ["succeed", "bury"])
async def test_progress_is_kept_when_the_job_ends(backend: Backend, end: str) -> None:
    lease = await running(backend)
    assert await backend.set_progress(lease.id, lease.token, 0.75, "nearly")
    assert await settle_one(backend, succeed(lease) if end == "succeed" else bury(lease))
    got = await record(backend, lease.id)
    assert (got.progress, got.progress_message) == (0.75, "nearly")
    assert not await backend.set_progress(lease.id, lease.token, 1.0, "after the end")
    assert (await record(backend, lease.id)).progress == 0.75


async def test_a_success_stores_its_result_and_the_json_view_parses_it(backend: Backend) -> None:
    big = '{"blob":"' + "x" * 60_000 + '"}'
    values = ['{"name":"é ✓","ok":true,"rows":[1,2,3]}', None, '"done"', "42", big, None, "[]", '{"k":null}']
    ids = await add(backend, len(values))
    leases = await backend.claim({"t": len(values)}, owner="w", lease_seconds=LONG)
    results: dict[str, str | None] = {lease.id: value for lease, value in zip(leases, values)}
    async with trio.open_nursery() as nursery:  # together, as the Ledger batches them
        for lease, value in zip(leases, values):
            nursery.start_soon(backend.settle, [succeed(lease, value)])
    for job_id in ids:
        got = await record(backend, job_id)
        assert (got.status, got.result) == ("completed", results[job_id])
        value = results[job_id]
        assert got.to_json()["result"] == (None if value is None else json.loads(value))


async def test_only_a_held_lease_stores_a_result(backend: Backend) -> None:
    (job_id,) = await add(backend)
    stale = await claim_one(backend)
    assert await settle_one(backend, retry(stale, 0.0))
    lease = await claim_one(backend)
    assert not await settle_one(backend, succeed(stale, '"stale"'))
    assert (await record(backend, job_id)).result is None
    assert await settle_one(backend, succeed(lease, '"mine"'))
    assert (await record(backend, job_id)).result == '"mine"'


# -- snooze ------------------------------------------------------------------------------------------


async def wait_claim(backend: Backend, job_type: str = "t", *, within: float = 2.0) -> Lease:
    """The first claim that takes a job of this type, polling every 10 ms."""
    with trio.fail_after(within):
        while not (leases := await backend.claim({job_type: 1}, owner="w", lease_seconds=LONG)):
            await trio.sleep(0.01)
    return leases[0]


async def test_a_snoozed_job_is_pending_again_after_its_delay_without_its_attempt_counted(backend: Backend) -> None:
    (job_id,) = await add(backend, max_attempts=5)
    first = await claim_one(backend)
    assert await settle_one(backend, retry(first, 0.0, error="ValueError: first"))
    second = await claim_one(backend)
    assert second.attempts == 2
    before = ts()
    assert await settle_one(backend, snooze(second, 0.1))
    after = ts()
    got = await record(backend, job_id)
    assert (got.status, got.attempts, got.snoozes, got.error, got.lease_owner, got.lease_expires_at) == (
        "pending", 1, 1, "ValueError: first", None, None)
    assert got.to_json()["snoozes"] == 1
    assert near(got.run_after, before, after, plus=0.1)
    assert await backend.claim({"t": 1}, owner="w", lease_seconds=LONG) == []  # not before its delay
    assert not await settle_one(backend, snooze(second, 0.0))  # stale now
    third = await wait_claim(backend)
    assert (third.id, third.attempts) == (job_id, 2)
    assert epoch(ts()) >= epoch(got.run_after)


async def test_a_job_claimed_ahead_snoozes_with_no_attempt_to_give_back(backend: Backend) -> None:
    (job_id,) = await add(backend, max_attempts=5)
    assert await settle_one(backend, retry(await claim_one(backend), 0.0))  # one attempt counted (and failed)
    (ahead,) = await backend.claim({"t": 1}, owner="w", lease_seconds=LONG, start={"t": 0})
    assert ahead.started is False
    assert await settle_one(backend, snooze(ahead, 0.0))
    got = await record(backend, job_id)
    assert (got.status, got.attempts, got.snoozes) == ("pending", 1, 1)
    # claimed ahead again, then started (its attempt counted), then snoozed: given back
    (ahead,) = await backend.claim({"t": 1}, owner="w", lease_seconds=LONG, start={"t": 0})
    assert await settle_one(backend, Settlement(ahead.id, ahead.token, Transition.START))
    assert (await record(backend, job_id)).attempts == 2
    assert await settle_one(backend, snooze(ahead, 0.0))
    got = await record(backend, job_id)
    assert (got.status, got.attempts, got.snoozes) == ("pending", 1, 2)
    assert (await claim_one(backend)).attempts == 2


async def test_snoozes_are_counted_and_one_past_the_limit_ends_the_job_dead(backend: Backend) -> None:
    (job_id,) = await add(backend, unique_key="k")
    for n in (1, 2):
        assert await settle_one(backend, snooze(await claim_one(backend), 0.0, limit=2, error="too many"))
        got = await record(backend, job_id)
        assert (got.status, got.snoozes, got.error) == ("pending", n, None)
    lease = await claim_one(backend)
    assert await settle_one(backend, snooze(lease, 0.0, limit=2, error="too many"))
    got = await record(backend, job_id)
    assert (got.status, got.snoozes, got.error, got.lease_owner) == ("dead", 3, "too many", None)
    assert await backend.claim({"t": 1}, owner="w", lease_seconds=LONG) == []
    assert not await settle_one(backend, snooze(lease, 0.0, limit=2))
    await free_key(backend, "k")


# -- what operators see and remove -------------------------------------------------------------------


async def test_list_and_stats_count_cancelled_jobs(backend: Backend) -> None:
    a_ids = await add(backend, 2, "a")
    assert await backend.cancel(a_ids, reason=REASON) == ["cancelled", "cancelled"]
    lease = await running(backend, "b")
    assert await backend.cancel([lease.id], reason=REASON) == [CANCELLING]
    assert await settle_one(backend, stop(lease))
    expired = job("c", expires_at=ts(-1.0))
    await insert(backend, expired)
    assert await backend.rescue_expired(base_seconds=1.0) == 1
    (pending,) = await add(backend, 1, "a")

    records, total = await backend.list(status="cancelled")
    assert total == 4 and sorted(r.id for r in records) == sorted([*a_ids, lease.id, expired.id])
    assert {r.status for r in records} == {"cancelled"}
    records, total = await backend.list(status="cancelled", job_type="a", order="claim")
    assert total == 2 and sorted(r.id for r in records) == sorted(a_ids)
    assert [r.id for r in (await backend.list(job_type="a", status="pending"))[0]] == [pending]
    stats = await backend.stats()
    assert stats["total"] == 5
    assert stats["by_status"]["cancelled"] == 4 and stats["by_status"]["pending"] == 1
    assert (stats["by_type"]["a"]["cancelled"], stats["by_type"]["b"]["cancelled"], stats["by_type"]["c"]["cancelled"]) == (
        2, 1, 1)
    assert sum(m["cancelled"] for m in stats["finished_per_minute"]) == 4
    assert sum(m["completed"] + m["dead"] for m in stats["finished_per_minute"]) == 0


async def test_cleanup_prune_and_delete_remove_cancelled_jobs(backend: Backend) -> None:
    # cancelled every way there is: while pending, stopped by its worker, racing a retry, expired, rescued
    gone = await add(backend, 3, "old")
    assert await backend.cancel(gone, reason=REASON) == ["cancelled"] * 3
    stopped, raced = await running(backend, "stopped"), await running(backend, "raced")
    await add(backend, job_type="rescued")
    (rescued,) = await backend.claim({"rescued": 1}, owner="gone:1", lease_seconds=SHORT)
    assert await backend.cancel([stopped.id, raced.id, rescued.id], reason=REASON) == [CANCELLING] * 3
    assert await backend.settle([stop(stopped), retry(raced, 0.0)]) == [True, True]
    expired = job("expired", expires_at=ts(-1.0))
    await insert(backend, expired)
    assert await backend.claim({"expired": 1}, owner="w", lease_seconds=LONG) == []
    await outlive(SHORT)
    assert await backend.rescue_expired(base_seconds=1.0) == 1
    gone += [stopped.id, raced.id, rescued.id, expired.id]
    assert {(await record(backend, i)).status for i in gone} == {"cancelled"}
    done = await running(backend, "done")
    assert await settle_one(backend, succeed(done))
    (pending,) = await add(backend, 1, "p")
    await trio.sleep(0.1)
    assert await backend.prune("cancelled", older_than_seconds=3600, limit=10) == 0
    assert [await backend.prune("cancelled", older_than_seconds=0.05, limit=4) for _ in range(3)] == [4, 3, 0]
    assert [await backend.get(i) for i in gone] == [None] * 7
    assert (await record(backend, done.id)).status == "completed"
    assert (await record(backend, pending)).status == "pending"

    young = await add(backend, 2, "young")
    assert await backend.cancel(young, reason=REASON) == ["cancelled"] * 2
    assert await backend.cleanup(statuses=["cancelled"], older_than_seconds=3600) == 0
    assert await backend.cleanup(statuses=["cancelled"]) == 2
    assert [await backend.get(i) for i in young] == [None, None]
    assert (await record(backend, done.id)).status == "completed"
    assert (await backend.stats())["by_status"].get("cancelled", 0) == 0

    (one,) = await add(backend)
    assert await backend.cancel([one], reason=REASON) == ["cancelled"]
    await backend.delete(one)
    assert await backend.get(one) is None
    asked = await running(backend, "r")
    assert await backend.cancel([asked.id], reason=REASON) == [CANCELLING]
    with pytest.raises(UsageError):
        await backend.delete(asked.id)  # it still runs until its worker stops it
    assert await settle_one(backend, stop(asked))
    await backend.delete(asked.id)
    assert await backend.get(asked.id) is None
