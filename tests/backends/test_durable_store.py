"""Durable functions (issue 35) on every store: steps written under the lease (STEP), a job that leaves its
worker for a sleep or a wait (SUSPEND, the ``suspended`` status) and comes back (a signal, wake_suspended),
signals kept and consumed once (signal, take_signal), and what operators do to such jobs (cancel, delete,
cleanup, prune, revive from a step; get, list, stats). Written from the protocol's contract
(pipeline/backends/base.py: Settlement, StepRecord, FOREVER and the Backend's durable methods; and
pipeline/states.py), not from any store's code. Last, SQLite's own: a file of the schema before
(version 16) upgrades."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from pipeline import Config
from pipeline.backends import Backend, Lease, Nudge, Settlement, open_backend
from pipeline.backends.base import FOREVER, NUDGE_BUFFER, StepRecord, cancelled_error, signal_refused
from pipeline.backends.sqlite import durable, migrations, open_sqlite_backend, store
from pipeline.errors import SignalKeyUsed, UsageError
from pipeline.sqlite_files import apply_migrations
from pipeline.states import Transition

from .kit import (
    FUTURE,
    LONG,
    add,
    bury,
    claim_one,
    epoch,
    flow_job,
    insert,
    job,
    new_id,
    record,
    retry,
    settle_one,
    snooze,
    succeed,
    ts,
)

REASON = "by an operator, from the test"


async def running(backend: Backend, job_type: str = "t", *, owner: str = "owner-a", **fields: Any) -> Lease:
    """A new job of its own type, claimed (started) by ``owner``."""
    (job_id,) = await add(backend, job_type=job_type, **fields)
    lease = await claim_one(backend, job_type, owner=owner)
    assert lease.id == job_id
    return lease


def done_step(name: str, value: str | None = '"v"') -> StepRecord:
    """A completed step as the engine writes it (value: JSON text)."""
    at = ts()
    return StepRecord(name, "completed", value, at, at)


def waiting_step(name: str) -> StepRecord:
    """A ctx.wait_for's record while its signal has not come."""
    return StepRecord(name, "waiting", None, ts())


def put(lease: Lease, step: StepRecord, *, token: int | None = None) -> Settlement:
    return Settlement(lease.id, lease.token if token is None else token, Transition.STEP, step=step)


def suspend(lease: Lease, delay: float, *, awaiting: str | None = None, step: StepRecord | None = None,
            token: int | None = None) -> Settlement:
    return Settlement(lease.id, lease.token if token is None else token, Transition.SUSPEND, delay=delay,
                      awaiting=awaiting, step=step)


async def names(backend: Backend, job_id: str) -> list[str]:
    return [step.name for step in await backend.steps(job_id)]


def near(text: str, before: str, after: str, *, plus: float = 0.0) -> bool:
    """``text`` is a time between ``before`` and ``after`` (+ ``plus`` seconds), to the millisecond."""
    return epoch(before) + plus - 0.002 <= epoch(text) <= epoch(after) + plus + 0.002


async def suspended(backend: Backend, job_type: str = "t", delay: float = math.inf, *, awaiting: str | None = None,
                    **fields: Any) -> str:
    """A new job of its own type, claimed and suspended (``delay`` seconds; ``awaiting`` a signal)."""
    lease = await running(backend, job_type, **fields)
    assert await settle_one(backend, suspend(lease, delay, awaiting=awaiting))
    assert (await record(backend, lease.id)).status == "suspended"
    return lease.id


async def claimed_ids(backend: Backend, wants: dict[str, int], **options: Any) -> list[str]:
    leases = await backend.claim(wants, owner="w", lease_seconds=LONG, **options)
    return sorted(lease.id for lease in leases)


# -- STEP ------------------------------------------------------------------------------------------------


async def test_steps_are_written_under_the_lease_and_read_in_the_order_first_written(backend: Backend) -> None:
    lease = await running(backend)
    before = await record(backend, lease.id)
    a, b, c = done_step("a", "1"), done_step("b", '{"x": [1, 2]}'), done_step("c", None)
    assert await backend.settle([put(lease, a), put(lease, b)]) == [True, True]  # one batch, one job
    assert await settle_one(backend, put(lease, c))
    assert await backend.steps(lease.id) == [a, b, c]

    # written again under its name: replaced whole, in its first place
    b2 = StepRecord("b", "completed", '"again"', ts(), ts())
    assert await settle_one(backend, put(lease, b2))
    assert await backend.steps(lease.id) == [a, b2, c]

    # the job keeps running under the same lease, its attempt as it was
    got = await record(backend, lease.id)
    assert (got.status, got.lease_owner, got.attempts, got.lease_expires_at) == (
        "running", "owner-a", before.attempts, before.lease_expires_at)
    assert got.steps == (a, b2, c)
    assert got.to_json()["steps"][1] == {"name": "b", "status": "completed", "value": "again",
                                         "started_at": b2.started_at, "ended_at": b2.ended_at}
    listed, _ = await backend.list()
    assert [(r.id, r.steps) for r in listed] == [(lease.id, ())]  # list leaves the steps out

    # a step ends with its job's lease; an unknown job has none
    assert await settle_one(backend, succeed(lease, '"done"'))
    assert not await settle_one(backend, put(lease, done_step("late")))
    assert await names(backend, lease.id) == ["a", "b", "c"]
    assert await backend.steps(new_id()) == []


async def test_a_stale_step_writes_nothing(backend: Backend) -> None:
    (job_id,) = await add(backend)
    stale = await claim_one(backend)
    assert await settle_one(backend, put(stale, done_step("first")))
    assert await settle_one(backend, retry(stale, 0.0))
    lease = await claim_one(backend)
    assert lease.token != stale.token
    before = await record(backend, job_id)
    assert await backend.settle([put(stale, done_step("first", '"stale"')), put(stale, done_step("second")),
                                 put(lease, done_step("x"), token=lease.token + 1)]) == [False, False, False]
    assert await record(backend, job_id) == before
    assert await backend.steps(job_id) == list(before.steps) and await names(backend, job_id) == ["first"]


async def test_steps_and_suspends_ride_one_batch_with_other_outcomes(backend: Backend) -> None:
    one, two, three = await running(backend, "a"), await running(backend, "b"), await running(backend, "c")
    outcomes = [put(one, done_step("s")), suspend(two, FUTURE, step=done_step("before")), succeed(three, "3"),
                put(three, done_step("stale"), token=three.token + 1), suspend(one, FUTURE, token=one.token + 1)]
    assert await backend.settle(outcomes) == [True, True, True, False, False]
    assert [(await record(backend, j)).status for j in (one.id, two.id, three.id)] == ["running", "suspended", "completed"]
    assert (await names(backend, one.id), await names(backend, two.id), await names(backend, three.id)) == (["s"], ["before"], [])


# -- SUSPEND ---------------------------------------------------------------------------------------------


async def test_a_suspended_job_gives_back_its_attempt_and_holds_no_worker(backend: Backend) -> None:
    # a job that snoozed once (snoozes unchanged by a suspend), may expire (cleared: it applies to the first
    # start), counts under a key limit and a global limit, and holds a unique key (kept while suspended)
    (job_id,) = await add(backend, job_type="s", unique_key="k", limit_key="acct", expires_at=ts(60.0))
    first = await claim_one(backend, "s")
    assert await settle_one(backend, snooze(first, 0.0))
    lease = await claim_one(backend, "s")
    assert (lease.id, lease.attempts) == (job_id, 1)
    (other,) = await add(backend, job_type="s", limit_key="acct")
    assert await claimed_ids(backend, {"s": 5}, limits={"s": 1}) == []  # its slot is taken

    step = waiting_step("sleep:1")
    start = ts()
    assert await settle_one(backend, suspend(lease, 30.0, step=step))
    end = ts()
    got = await record(backend, job_id)
    assert (got.status, got.attempts, got.snoozes, got.lease_owner, got.lease_expires_at, got.expires_at,
            got.awaiting_signal, got.error) == ("suspended", 0, 1, None, None, None, None, None)
    assert near(got.run_after, start, end, plus=30.0)
    assert got.steps == (step,)
    assert not await settle_one(backend, succeed(lease))  # its lease ended with the suspend

    # never claimed (not due yet, nor once due: only a wake makes it pending); its slots are free
    assert await claimed_ids(backend, {"s": 5}, limits={"s": 1}, key_limits={"s": 1}) == [other]
    assert await backend.insert([job("s", unique_key="k")]) == [job_id]  # its key still held
    assert await backend.rescue_expired(base_seconds=1.0) == 0
    assert await backend.bury_unknown_types([], grace_seconds=0.0) == 0
    assert await record(backend, job_id) == got


async def test_a_suspended_job_is_never_claimed_even_once_due_until_it_is_woken(backend: Backend) -> None:
    lease = await running(backend, "z")
    assert await settle_one(backend, suspend(lease, 0.0))
    await trio.sleep(0.01)
    assert await claimed_ids(backend, {"z": 5}) == []
    assert await backend.bury_unknown_types([], grace_seconds=0.0) == 0  # due, of a type nobody knows: left alone
    assert await backend.rescue_expired(base_seconds=1.0) == 0
    assert (await record(backend, lease.id)).status == "suspended"
    assert await backend.wake_suspended() == (1, None)
    assert await claimed_ids(backend, {"z": 5}) == [lease.id]


async def test_a_suspend_without_a_deadline_is_due_forever_and_shows_what_it_awaits(backend: Backend) -> None:
    lease = await running(backend, "w")
    assert await settle_one(backend, suspend(lease, math.inf, awaiting="approve", step=waiting_step("wait:approve")))
    got = await record(backend, lease.id)
    assert (got.status, got.run_after, got.awaiting_signal) == ("suspended", FOREVER, "approve")
    assert got.to_json()["awaiting_signal"] == "approve"
    assert [s.status for s in got.steps] == ["waiting"]
    assert await backend.wake_suspended() == (0, None)

    # operators see it
    (pending,) = await add(backend, job_type="w")
    for order in ("newest", "claim"):
        records, total = await backend.list(status="suspended", order=order)
        assert total == 1 and [(r.id, r.status, r.awaiting_signal, r.steps) for r in records] == [
            (lease.id, "suspended", "approve", ())]
    records, _ = await backend.list(job_type="w")
    assert {r.id: r.awaiting_signal for r in records} == {lease.id: "approve", pending: None}
    stats = await backend.stats()
    assert stats["by_status"]["suspended"] == 1 and stats["by_type"]["w"]["suspended"] == 1
    assert stats["by_status"]["running"] == 0 and stats["total"] == 2


async def test_a_stale_suspend_writes_nothing(backend: Backend) -> None:
    (job_id,) = await add(backend)
    stale = await claim_one(backend)
    assert await settle_one(backend, retry(stale, 0.0))
    lease = await claim_one(backend)
    assert await backend.signal(job_id, "go", '"p"') == "kept"
    before = await record(backend, job_id)
    assert await backend.settle([suspend(stale, math.inf, awaiting="go", step=done_step("x")),
                                 suspend(stale, 10.0)]) == [False, False]
    assert await record(backend, job_id) == before
    assert await backend.take_signal(job_id, lease.token, "go", waiting_step("wait")) == (True, '"p"')


async def test_a_suspend_finds_the_signal_sent_before_it_and_goes_pending_at_once(backend: Backend) -> None:
    lease = await running(backend, "w", unique_key="k")
    assert await backend.signal(lease.id, "other", None) == "kept"
    assert await backend.signal(lease.id, "approve", '{"ok": true}') == "kept"  # sent while it runs: kept
    assert (await record(backend, lease.id)).status == "running"
    start = ts()
    assert await settle_one(backend, suspend(lease, math.inf, awaiting="approve", step=waiting_step("wait:approve")))
    end = ts()
    got = await record(backend, lease.id)
    assert (got.status, got.attempts, got.lease_owner, got.awaiting_signal) == ("pending", 0, None, None)
    assert near(got.run_after, start, end)  # due now
    assert [s.name for s in got.steps] == ["wait:approve"]
    assert await backend.insert([job("w", unique_key="k")]) == [lease.id]

    # run again, it consumes the signal; the other name was not touched
    again = await claim_one(backend, "w")
    taken = done_step("wait:approve", None)
    assert await backend.take_signal(lease.id, again.token, "approve", taken) == (True, '{"ok": true}')
    assert await backend.steps(lease.id) == [attrs.evolve(taken, value='{"ok": true}')]
    assert await backend.take_signal(lease.id, again.token, "approve", taken) == (False, None)

    # a suspend awaiting a name nobody sent stays suspended, whatever else was sent
    assert await settle_one(backend, suspend(again, math.inf, awaiting="later"))
    assert (await record(backend, lease.id)).status == "suspended"


# -- signals ---------------------------------------------------------------------------------------------


async def test_take_signal_consumes_the_oldest_of_its_name_once_under_the_lease(backend: Backend) -> None:
    lease = await running(backend)
    for name, payload in (("a", "1"), ("b", '"b"'), ("a", "2"), ("a", None)):
        assert await backend.signal(lease.id, name, payload) == "kept"
    step = waiting_step("wait:a")
    assert await backend.take_signal(lease.id, lease.token + 1, "a", step) is None  # stale: nothing consumed
    assert await backend.steps(lease.id) == []
    assert await backend.take_signal(lease.id, lease.token, "a", step) == (True, "1")
    assert await backend.steps(lease.id) == [attrs.evolve(step, value="1")]
    assert await backend.take_signal(lease.id, lease.token, "a", done_step("wait:a2")) == (True, "2")
    assert await backend.take_signal(lease.id, lease.token, "a", done_step("wait:a3")) == (True, None)
    assert await backend.take_signal(lease.id, lease.token, "a", done_step("wait:a4")) == (False, None)
    assert await names(backend, lease.id) == ["wait:a", "wait:a2", "wait:a3"]  # nothing written for the fourth
    assert await backend.take_signal(lease.id, lease.token, "b", done_step("wait:b")) == (True, '"b"')
    assert await backend.take_signal(new_id(), lease.token, "a", step) is None

    # once the job has ended, its lease takes nothing
    assert await backend.signal(lease.id, "c", "3") == "kept"
    assert await settle_one(backend, succeed(lease))
    assert await backend.take_signal(lease.id, lease.token, "c", done_step("wait:c")) is None
    assert "wait:c" not in await names(backend, lease.id)


async def test_a_signal_wakes_the_job_waiting_for_it_and_is_kept_for_any_other(backend: Backend) -> None:
    waiting_id = await suspended(backend, "w", awaiting="approve")
    sleeping_id = await suspended(backend, "s", FUTURE)
    (pending_id,) = await add(backend, job_type="p")
    parent = await running(backend, "parent")
    child = flow_job("c", after=[parent.id])
    await insert(backend, child)

    assert await backend.signal(waiting_id, "other", '"o"') == "kept"
    assert (await record(backend, waiting_id)).status == "suspended"
    for job_id in (sleeping_id, pending_id, parent.id, child.id):
        before = await record(backend, job_id)
        assert await backend.signal(job_id, "approve", "1") == "kept"
        after = await record(backend, job_id)
        assert (after.status, after.run_after, after.awaiting_signal, after.attempts, after.lease_owner) == (
            before.status, before.run_after, before.awaiting_signal, before.attempts, before.lease_owner)

    start = ts()
    assert await backend.signal(waiting_id, "approve", '{"by": "ann"}') == "woken"
    end = ts()
    got = await record(backend, waiting_id)
    assert (got.status, got.awaiting_signal, got.lease_owner) == ("pending", None, None)
    assert epoch(got.run_after) <= epoch(end) + 0.002 and near(got.updated_at, start, end)
    assert await backend.signal(waiting_id, "approve", '"second"') == "kept"  # pending now: kept

    lease = await claim_one(backend, "w")
    assert lease.id == waiting_id
    assert await backend.take_signal(waiting_id, lease.token, "approve", done_step("wait")) == (True, '{"by": "ann"}')
    assert await backend.take_signal(waiting_id, lease.token, "approve", done_step("wait2")) == (True, '"second"')
    assert await backend.take_signal(waiting_id, lease.token, "other", done_step("wait3")) == (True, '"o"')


async def test_a_signal_to_an_unknown_or_finished_job_is_refused_and_writes_nothing(backend: Backend) -> None:
    with pytest.raises(LookupError):
        await backend.signal(new_id(), "approve", None)
    done = await running(backend, "d")
    assert await settle_one(backend, succeed(done))
    dead = await running(backend, "x")
    assert await settle_one(backend, bury(dead))
    (cancelled,) = await add(backend, job_type="c")
    assert await backend.cancel([cancelled], reason=REASON) == ["cancelled"]
    for job_id, status in ((done.id, "completed"), (dead.id, "dead"), (cancelled, "cancelled")):
        before = await record(backend, job_id)
        with pytest.raises(UsageError) as refused:
            await backend.signal(job_id, "approve", '"p"', key="once")
        assert not isinstance(refused.value, SignalKeyUsed)
        assert signal_refused(job_id, status) in str(refused.value)
        assert await record(backend, job_id) == before
    # revived, the dead job finds no signal kept, and its key was not used
    await backend.revive(dead.id)
    lease = await claim_one(backend, "x")
    assert await backend.take_signal(dead.id, lease.token, "approve", done_step("wait")) == (False, None)
    assert await backend.signal(dead.id, "approve", '"p"', key="once") == "kept"


async def test_a_signal_key_is_used_once_per_job(backend: Backend) -> None:
    waiting_id = await suspended(backend, "w", awaiting="approve")
    other = await running(backend, "o")
    assert not await backend.signal_key_used(waiting_id, "link-1")
    assert await backend.signal(waiting_id, "note", '"first"', key="link-1") == "kept"
    assert await backend.signal_key_used(waiting_id, "link-1")  # what a used link's page reads
    assert not await backend.signal_key_used(other.id, "link-1") and not await backend.signal_key_used(new_id(), "link-1")
    before = await record(backend, waiting_id)
    for name in ("approve", "note"):  # any name
        with pytest.raises(SignalKeyUsed):
            await backend.signal(waiting_id, name, '"again"', key="link-1")
    assert await record(backend, waiting_id) == before  # not woken: nothing was sent
    assert await backend.signal(other.id, "approve", '"o"', key="link-1") == "kept"  # another job's key
    assert await backend.signal(waiting_id, "approve", '"yes"', key="link-2") == "woken"
    lease = await claim_one(backend, "w")
    assert await backend.take_signal(waiting_id, lease.token, "approve", done_step("w1")) == (True, '"yes"')
    assert await backend.take_signal(waiting_id, lease.token, "approve", done_step("w2")) == (False, None)
    assert await backend.take_signal(waiting_id, lease.token, "note", done_step("n1")) == (True, '"first"')
    assert await backend.take_signal(waiting_id, lease.token, "note", done_step("n2")) == (False, None)
    with pytest.raises(SignalKeyUsed):  # consumed or not, a key stays used
        await backend.signal(waiting_id, "note", None, key="link-1")
    # and once the job has finished, a used key is still "used" (a link pressed again: 410), not "finished"
    assert await settle_one(backend, succeed(lease))
    with pytest.raises(SignalKeyUsed):
        await backend.signal(waiting_id, "approve", None, key="link-2")
    with pytest.raises(UsageError) as refused:  # a key never used: the job's end
        await backend.signal(waiting_id, "approve", None, key="link-3")
    assert not isinstance(refused.value, SignalKeyUsed)


# -- wake_suspended ----------------------------------------------------------------------------------------


async def test_wake_suspended_wakes_the_due_ones_and_says_when_the_next_is_due(backend: Backend) -> None:
    assert await backend.wake_suspended() == (0, None)
    forever = await suspended(backend, "f", awaiting="approve")
    assert await backend.wake_suspended() == (0, None)  # no deadline
    soon = await suspended(backend, "s", 0.3, awaiting="reply")  # a wait with a timeout
    late = await suspended(backend, "l", FUTURE)
    count, next_due = await backend.wake_suspended()
    assert count == 0 and next_due is not None and 0.0 < next_due <= 0.3
    assert [(await record(backend, j)).status for j in (forever, soon, late)] == ["suspended"] * 3

    await trio.sleep(0.35)
    due_at = (await record(backend, soon)).run_after
    count, next_due = await backend.wake_suspended()
    assert count == 1 and next_due is not None and FUTURE - 5.0 < next_due <= FUTURE
    got = await record(backend, soon)
    assert (got.status, got.awaiting_signal) == ("pending", None)
    assert due_at <= got.run_after <= ts()  # unchanged, or now
    assert await claimed_ids(backend, {"s": 1}) == [soon]
    count, next_due = await backend.wake_suspended()
    assert count == 0 and next_due is not None and FUTURE - 5.0 < next_due <= FUTURE
    assert [(await record(backend, j)).status for j in (forever, late)] == ["suspended"] * 2


async def test_wake_suspended_takes_the_oldest_due_first_up_to_its_limit(backend: Backend) -> None:
    leases = [await running(backend, f"t{i}") for i in range(3)]
    # due in the order 1, 2, 0 (10 ms apart), all within 40 ms
    assert await backend.settle([suspend(leases[0], 0.03), suspend(leases[1], 0.01), suspend(leases[2], 0.02)]) == [True] * 3
    await trio.sleep(0.06)
    assert await backend.wake_suspended(limit=1) == (1, 0)  # more are due now
    assert [(await record(backend, lease.id)).status for lease in leases] == ["suspended", "pending", "suspended"]
    assert await backend.wake_suspended(limit=1) == (1, 0)
    assert [(await record(backend, lease.id)).status for lease in leases] == ["suspended", "pending", "pending"]
    assert await backend.wake_suspended(limit=5) == (1, None)
    assert await backend.wake_suspended(limit=5) == (0, None)


async def test_a_job_a_signal_or_its_time_makes_pending_wakes_this_processs_poller(store_config: Config) -> None:
    """As an insert does: a signal that wakes its job, a SUSPEND that finds its signal sent, wake_suspended.
    A settle that makes nothing due is the control: it nudges nobody."""
    send, recv = trio.open_memory_channel[Nudge](NUDGE_BUFFER)
    async with open_backend(store_config, nudge_send=send) as backend:

        async def nudged(within: float) -> bool:
            with trio.move_on_after(within):
                await recv.receive()
                while True:  # and whatever else came with it
                    try:
                        recv.receive_nowait()
                    except trio.WouldBlock:
                        return True
            return False

        async def quiet() -> None:
            """Take every nudge in hand until none came for 0.2 s."""
            with trio.fail_after(5):
                while await nudged(0.2):
                    pass

        waiting = await suspended(backend, "w", awaiting="go")
        sleeping = await running(backend, "s")
        signalled = await running(backend, "g")
        control = await running(backend, "c")
        assert await backend.signal(signalled.id, "go", None) == "kept"
        assert await settle_one(backend, suspend(sleeping, 0.3))
        await quiet()
        assert await settle_one(backend, succeed(control))
        assert not await nudged(0.2), "a settle that made nothing due nudged the Poller: the checks below prove nothing"

        assert await backend.signal(waiting, "go", None) == "woken"
        assert await nudged(0.5), "the job a signal woke did not nudge this process's Poller"
        await quiet()
        assert await settle_one(backend, suspend(signalled, math.inf, awaiting="go"))
        assert (await record(backend, signalled.id)).status == "pending"
        assert await nudged(0.5), "the job whose SUSPEND found its signal did not nudge this process's Poller"
        await quiet()
        with trio.fail_after(5):
            while (await backend.wake_suspended())[0] == 0:
                await trio.sleep(0.02)
        assert await nudged(0.5), "the job wake_suspended woke did not nudge this process's Poller"
    recv.close()


# -- operators -------------------------------------------------------------------------------------------


async def test_a_suspended_job_is_cancelled_at_once_and_frees_its_key_and_its_children(backend: Backend) -> None:
    lease = await running(backend, "w", unique_key="k")
    child = flow_job("c", after=[lease.id])
    await insert(backend, child)
    assert await settle_one(backend, suspend(lease, 0.0, awaiting="approve", step=done_step("a")))
    assert await backend.cancel([lease.id], reason=REASON) == ["cancelled"]
    got = await record(backend, lease.id)
    assert (got.status, got.error, got.awaiting_signal, got.lease_owner) == ("cancelled", cancelled_error(REASON), None, None)
    assert (await record(backend, child.id)).status == "cancelled"  # its edges applied, as for a pending job
    successor = job("w", unique_key="k")
    assert await backend.insert([successor]) == [successor.id]
    await trio.sleep(0.01)
    assert await backend.wake_suspended() == (0, None)
    assert (await record(backend, lease.id)).status == "cancelled"
    with pytest.raises(UsageError, match="cancelled"):
        await backend.signal(lease.id, "approve", None)
    assert await backend.cancel([lease.id], reason="again") == ["cancelled"]


async def test_after_children_wait_through_their_parents_suspension(backend: Backend) -> None:
    parent = await running(backend, "p")
    child = flow_job("c", after=[parent.id])
    await insert(backend, child)
    assert await settle_one(backend, suspend(parent, 0.0, awaiting="go"))
    assert await backend.signal(parent.id, "go", None) == "woken"
    await trio.sleep(0.01)
    assert await backend.wake_suspended() == (0, None)
    got = await record(backend, child.id)
    assert (got.status, got.waiting_for) == ("waiting", 1)
    again = await claim_one(backend, "p")
    assert await claimed_ids(backend, {"c": 1}) == []
    assert await settle_one(backend, succeed(again))
    assert (await record(backend, child.id)).status == "pending"


@pytest.mark.parametrize("how", ["delete", "cleanup", "prune"])
async def test_a_jobs_steps_and_signals_go_with_it(backend: Backend, how: str) -> None:
    lease = await running(backend, "d")
    assert await settle_one(backend, put(lease, done_step("a")))
    assert await backend.signal(lease.id, "go", '"old"', key="once") == "kept"
    assert await backend.signal(lease.id, "used", '"u"', key="twice") == "kept"
    assert await backend.take_signal(lease.id, lease.token, "used", done_step("b")) == (True, '"u"')
    if how == "delete":  # allowed while suspended, as while pending
        assert await settle_one(backend, suspend(lease, math.inf, awaiting="go2"))
        await backend.delete(lease.id)
    else:
        assert await settle_one(backend, succeed(lease))
        await trio.sleep(0.01)
        if how == "cleanup":
            assert await backend.cleanup(statuses=["completed"]) == 1
        else:
            assert await backend.prune("completed", older_than_seconds=0.0, limit=10) == 1
    assert await backend.get(lease.id) is None
    assert await backend.steps(lease.id) == []

    # a job inserted again under the same id finds nothing of the old one's
    await insert(backend, job("d", job_id=lease.id))
    again = await claim_one(backend, "d")
    assert (await record(backend, lease.id)).steps == ()
    assert await backend.take_signal(lease.id, again.token, "go", done_step("w")) == (False, None)
    assert await backend.signal(lease.id, "go", '"new"', key="once") == "kept"
    assert await backend.signal(lease.id, "go", '"new2"', key="twice") == "kept"
    assert await backend.take_signal(lease.id, again.token, "go", done_step("w")) == (True, '"new"')


async def four_steps(backend: Backend, job_type: str, **fields: Any) -> Lease:
    """A running job with the steps a, b, c, d written (b written again after c: its place kept)."""
    lease = await running(backend, job_type, **fields)
    assert await backend.settle([put(lease, done_step(n)) for n in "abc"]) == [True] * 3
    assert await backend.settle([put(lease, done_step("b", '"b2"')), put(lease, done_step("d"))]) == [True] * 2
    assert await names(backend, lease.id) == ["a", "b", "c", "d"]
    return lease


async def test_revive_from_a_step_replays_a_completed_or_dead_job_from_there(backend: Backend) -> None:
    done = await four_steps(backend, "c", unique_key="k")
    assert await settle_one(backend, succeed(done, '"result"'))
    dead = await four_steps(backend, "x")
    assert await settle_one(backend, bury(dead))
    with pytest.raises(UsageError):
        await backend.revive(done.id)  # a completed job only with from_step

    start = ts()
    revived = await backend.revive(done.id, from_step="b")
    end = ts()
    assert revived == await record(backend, done.id)
    assert (revived.status, revived.result, revived.attempts, revived.error) == ("pending", None, 0, None)
    assert epoch(revived.run_after) <= epoch(end) + 0.002 and near(revived.updated_at, start, end)
    assert [s.name for s in revived.steps] == ["a"]  # b, and every step first written after it (c, d)
    assert await backend.insert([job("c", unique_key="k")]) == [done.id]  # it holds its key again
    lease = await claim_one(backend, "c")
    assert (lease.id, lease.attempts) == (done.id, 1)

    revived = await backend.revive(dead.id, from_step="a")
    assert (revived.status, revived.steps) == ("pending", ())
    assert await backend.steps(dead.id) == []


async def test_revive_keeps_the_steps_without_from_step_and_refuses_an_unknown_step(backend: Backend) -> None:
    dead = await four_steps(backend, "x")
    assert await settle_one(backend, bury(dead))
    before = await record(backend, dead.id)
    with pytest.raises(UsageError) as refused:
        await backend.revive(dead.id, from_step="nope")
    assert all(name in str(refused.value) for name in ("nope", "a", "b", "c", "d"))
    assert await record(backend, dead.id) == before
    revived = await backend.revive(dead.id)
    assert [s.name for s in revived.steps] == ["a", "b", "c", "d"]

    # a job that is neither completed, dead nor cancelled: refused, nothing changed
    run = await four_steps(backend, "r")
    before = await record(backend, run.id)
    with pytest.raises(UsageError):
        await backend.revive(run.id, from_step="a")
    assert await record(backend, run.id) == before
    with pytest.raises(LookupError):
        await backend.revive(new_id(), from_step="a")

    # a cancelled one replays too (here cancelled while suspended)
    cancelled = await four_steps(backend, "k")
    assert await settle_one(backend, suspend(cancelled, FUTURE))
    assert await backend.cancel([cancelled.id], reason=REASON) == ["cancelled"]
    revived = await backend.revive(cancelled.id, from_step="c")
    assert (revived.status, [s.name for s in revived.steps]) == ("pending", ["a", "b"])


async def test_revive_from_a_step_is_refused_while_another_job_holds_the_key(backend: Backend) -> None:
    done = await four_steps(backend, "c", unique_key="k")
    assert await settle_one(backend, succeed(done, '"result"'))
    (holder,) = await add(backend, job_type="c", unique_key="k")
    before = await record(backend, done.id)
    with pytest.raises(UsageError, match=holder):
        await backend.revive(done.id, from_step="c")
    assert await record(backend, done.id) == before
    assert await names(backend, done.id) == ["a", "b", "c", "d"]


# -- SQLite: a file of the schema before durable functions ----------------------------------------------


async def test_a_sqlite_file_of_version_16_upgrades_and_its_jobs_suspend_holding_their_keys(tmp_path: Path) -> None:
    path = tmp_path / "v16.db"
    conn = store.connect(path)
    apply_migrations(conn, [m for m in migrations.MIGRATIONS if m[0] <= 16], table=migrations.TABLE, known=migrations.RETIRED)
    assert migrations.current_version(conn) == 16
    conn.execute("INSERT INTO jobs (id, job_type, payload, status, attempts, max_attempts, run_after, created_at, "
                 "updated_at, unique_key, lease_token, lease_owner, lease_expires_at, started_at) VALUES "
                 "('old-running', 't', '{}', 'running', 1, 3, '2020-01-01T00:00:00.000Z', '2020', '2020', 'K', 4, 'w', "
                 "'2999-01-01T00:00:00.000Z', '2020'), "
                 "('old-done', 't', '{}', 'completed', 1, 3, '2020-01-01T00:00:00.000Z', '2020', '2020', NULL, 3, NULL, NULL, NULL)")
    conn.close()

    async with open_sqlite_backend(path) as backend:  # migrates
        # the job running before the upgrade writes a step and suspends, holding its key
        step = done_step("charge", '"ch_1"')
        assert await backend.settle([Settlement("old-running", 4, Transition.STEP, step=step),
                                     Settlement("old-running", 4, Transition.SUSPEND, delay=math.inf, awaiting="approve")]) == [True, True]
        got = await record(backend, "old-running")
        assert (got.status, got.awaiting_signal, got.run_after, got.steps, got.attempts) == (
            "suspended", "approve", FOREVER, (step,), 0)
        assert await backend.insert([job("t", unique_key="K")]) == ["old-running"]
        assert (await backend.stats())["by_status"]["suspended"] == 1
        assert await backend.signal("old-running", "approve", "true") == "woken"
        with pytest.raises(UsageError, match="no steps"):
            await backend.revive("old-done", from_step="charge")

    conn = store.connect(path)
    try:
        assert migrations.current_version(conn) == migrations.LATEST >= 17
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        (table,) = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'jobs'").fetchone()
        assert "OR status = 'suspended'" in table and "awaiting_signal TEXT" in table, table
        (unique,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'idx_jobs_unique'").fetchone()
        assert "status = 'suspended'" in unique and "unique_token = lease_token" in unique, unique
        objects = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
        assert {"job_steps", "job_signals", "idx_signals_unconsumed", "idx_signals_key", "idx_jobs_suspended"} <= objects
        # the idle look of wake_suspended is one seek of its partial index
        plan = " ".join(row[-1] for row in conn.execute(f"EXPLAIN QUERY PLAN {durable._NEXT_DUE}"))
        assert "idx_jobs_suspended" in plan, plan
    finally:
        conn.close()

