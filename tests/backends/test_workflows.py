"""Workflows (issue 24) on every store: jobs that wait for other jobs (``NewJob.after``), their
edges applied exactly once by whatever ends a parent, batches with a callback, the repair sweep,
retention of the graph, and parents' outcomes racing across processes. Written from the protocol's
contract (pipeline/backends/base.py: Backend.insert and the docstrings it points to, and
pipeline/states.py), not from any store's code; the failure semantics as :data:`FAILURE_TABLE`."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import pipeline
from pipeline import Config
from pipeline.backends import Backend, Lease, NewJob, Nudge, open_backend
from pipeline.backends.base import (
    CANCELLING,
    MAX_LISTED_RELATIVES,
    NUDGE_BUFFER,
    BatchMember,
    cancelled_error,
    expired_error,
    parent_failed,
    unknown_parents,
)
from pipeline.errors import UsageError

from .kit import (
    FUTURE,
    LONG,
    SHORT,
    batch_rows,
    bury,
    claim_one,
    epoch,
    flow_job,
    insert,
    job,
    new_id,
    outlive,
    record,
    release,
    released_together,
    retry,
    settle_one,
    snooze,
    statuses,
    stop,
    store_state,
    succeed,
    ts,
)
from .stores import BACKENDS, on_each_store, report_stores

REASON = "by an operator, from the test"


async def running(backend: Backend, job_type: str, *, lease_seconds: float = LONG, **fields: object) -> Lease:
    """A new job of ``job_type`` (a type of its own: the claim takes it and nothing else), claimed."""
    row = job(job_type, **fields)  # type: ignore[arg-type]
    await insert(backend, row)
    lease = await claim_one(backend, job_type, lease_seconds=lease_seconds)
    assert lease.id == row.id
    return lease


async def ended(backend: Backend, job_type: str, how: str, result: str | None = None) -> str:
    """A new job of ``job_type``, run to ``how`` ("completed" or "dead"); its id."""
    lease = await running(backend, job_type)
    assert await settle_one(backend, succeed(lease, result) if how == "completed" else bury(lease))
    return lease.id


# The failure semantics (docs/workflows.md's table): what a parent's end does to a child still waiting
# for it, by (how the parent ended, the child's on_parent_failure): it "counts" (one parent less to wait
# for; with none left the child is pending) or "cancels" (the child ends cancelled, its error
# parent_failed(parent, how), and its own waiting children follow the same table as "cancelled").
FAILURE_TABLE = {
    ("completed", None): "counts", ("completed", "run"): "counts",
    ("dead", None): "cancels", ("dead", "run"): "counts",
    ("cancelled", None): "cancels", ("cancelled", "run"): "counts",
    ("deleted", None): "cancels", ("deleted", "run"): "counts",
}


def after_parent_ended(how: str, on_parent_failure: str | None, parent_id: str) -> tuple[str, str | None]:
    """What becomes of a child that waited for one more parent than this one (so that it is still
    waiting when the parent ends ``how``), as (status, error), by :data:`FAILURE_TABLE`."""
    if FAILURE_TABLE[how, on_parent_failure] == "cancels":
        return "cancelled", parent_failed(parent_id, how)
    return "waiting", None


def near(text: str, before: str, after: str) -> bool:
    """``text`` is a time between ``before`` and ``after``, to the millisecond."""
    return epoch(before) - 0.002 <= epoch(text) <= epoch(after) + 0.002


async def claimed(backend: Backend, job_type: str, n: int = 100) -> set[str]:
    """The ids a claim of up to ``n`` jobs of ``job_type`` takes (started, under a long lease)."""
    return {lease.id for lease in await backend.claim({job_type: n}, owner="w", lease_seconds=LONG)}


async def parent_results(backend: Backend, job_id: str) -> dict[str, str | None]:
    """``backend.parent_results`` as {parent id: result}, each parent's job type checked against its record."""
    found = await backend.parent_results(job_id)
    for parent, (job_type, _) in found.items():
        assert job_type == (await record(backend, parent)).job_type
    return {parent: result for parent, (_, result) in found.items()}


# -- insert ----------------------------------------------------------------------------------------------


async def test_insert_stores_the_edges_and_applies_the_parents_it_finds_final_at_once(backend: Backend) -> None:
    parent = job("p")
    await insert(backend, parent)
    done = await ended(backend, "done", "completed", '"done"')
    dead = await ended(backend, "dead", "dead")
    cancelled = job("x")
    await insert(backend, cancelled)
    assert await backend.cancel([cancelled.id], reason=REASON) == ["cancelled"]

    first = job("c")  # a parent earlier in the same call
    rows = [
        first,
        waits := flow_job("c", after=[parent.id, first.id]),
        after_done := flow_job("c", after=[done]),
        after_dead := flow_job("c", after=[dead]),
        runs_after_dead := flow_job("c", after=[dead], on_parent_failure="run"),
        after_cancelled := flow_job("c", after=[cancelled.id]),
        runs_after_cancelled := flow_job("c", after=[cancelled.id], on_parent_failure="run"),
        runs_after_all := flow_job("c", after=[done, dead, cancelled.id], on_parent_failure="run"),
        # cancelled at once although another parent has not ended: a failed parent is enough
        dead_and_pending := flow_job("c", after=[parent.id, dead]),
        keyed := flow_job("c", after=[parent.id], unique_key="ku"),
        # parents earlier in the call that the call itself cancelled, or left waiting
        below_cancelled := flow_job("c", after=[after_dead.id]),
        runs_below_cancelled := flow_job("c", after=[after_dead.id, first.id], on_parent_failure="run"),
        below_waiting := flow_job("c", after=[waits.id]),
    ]
    before = ts()
    assert await backend.insert(rows) == [row.id for row in rows]
    end = ts()
    expected = {
        first.id: ("pending", None, 0),
        waits.id: ("waiting", None, 2),
        after_done.id: ("pending", None, 0),
        after_dead.id: ("cancelled", parent_failed(dead, "dead"), None),
        runs_after_dead.id: ("pending", None, 0),
        after_cancelled.id: ("cancelled", parent_failed(cancelled.id, "cancelled"), None),
        runs_after_cancelled.id: ("pending", None, 0),
        runs_after_all.id: ("pending", None, 0),
        dead_and_pending.id: ("cancelled", parent_failed(dead, "dead"), None),
        keyed.id: ("waiting", None, 1),
        below_cancelled.id: ("cancelled", parent_failed(after_dead.id, "cancelled"), None),
        runs_below_cancelled.id: ("waiting", None, 1),
        below_waiting.id: ("waiting", None, 1),
    }
    for row in rows:
        got = await record(backend, row.id)
        status, error, waiting_for = expected[row.id]
        assert (got.status, got.error) == (status, error), f"{row.after} ({row.on_parent_failure}): {got.status}, {got.error}"
        assert (got.parents, got.parent_count, got.on_parent_failure, got.batch_id) == (
            row.after, len(row.after), row.on_parent_failure, None)
        if waiting_for is not None:  # (what a child cancelled by a failed parent counts is not said)
            assert got.waiting_for == waiting_for, f"{row.after}: waiting for {got.waiting_for}"
        if status == "cancelled":
            assert near(got.updated_at, before, end), "a child cancelled at its insert is finished now"
        assert (got.run_after, got.attempts) == (row.run_after, 0)
    assert (await record(backend, waits.id)).to_json()["parents"] == [parent.id, first.id]
    for parent_id, children in ((parent.id, [waits, dead_and_pending, keyed]), (first.id, [waits, runs_below_cancelled]),
                                (after_dead.id, [below_cancelled, runs_below_cancelled]), (waits.id, [below_waiting]),
                                (done, [after_done, runs_after_all]),
                                (dead, [after_dead, runs_after_dead, runs_after_all, dead_and_pending]),
                                (cancelled.id, [after_cancelled, runs_after_cancelled, runs_after_all])):
        got = await record(backend, parent_id)
        assert (got.children, got.child_count) == (tuple(c.id for c in children), len(children)), parent_id
    # the pending ones are claimed, not the waiting ones
    assert await claimed(backend, "c") == {first.id, after_done.id, runs_after_dead.id, runs_after_cancelled.id,
                                           runs_after_all.id}
    # a waiting job holds its unique key: a second child of that key inserts nothing, nor an edge
    assert await backend.insert([flow_job("c", after=[parent.id], unique_key="ku"), job("c", unique_key="ku")]) == [
        keyed.id, keyed.id]
    assert (await record(backend, parent.id)).child_count == 3
    # two jobs of one type and key in one call, the first with parents: the first is inserted (waiting)
    first_keyed, second_keyed = flow_job("c", after=[parent.id], unique_key="kf"), job("c", unique_key="kf")
    assert await backend.insert([first_keyed, second_keyed]) == [first_keyed.id, first_keyed.id]
    assert await statuses(backend, [first_keyed.id, second_keyed.id]) == ["waiting", None]

    # a parent's children beyond those a record lists: the oldest listed, all counted
    fan = [flow_job("fan", after=[first.id]) for _ in range(MAX_LISTED_RELATIVES + 1)]
    await insert(backend, *fan)
    got = await record(backend, first.id)
    assert (got.children, got.child_count) == (tuple(r.id for r in [waits, runs_below_cancelled, *fan][:MAX_LISTED_RELATIVES]),
                                               MAX_LISTED_RELATIVES + 3)

    # bulk_insert: parents earlier in the iterable, committed already (commit_every) or not
    bulk_parent = job("p")
    bulk = [bulk_parent, bulk_waits := flow_job("c", after=[bulk_parent.id]),
            bulk_two := flow_job("c", after=[done, bulk_parent.id], on_parent_failure="run"),
            bulk_cancelled := flow_job("c", after=[dead, bulk_parent.id])]
    assert await backend.bulk_insert(iter(bulk), commit_every=2) == 4
    assert await statuses(backend, [r.id for r in bulk]) == ["pending", "waiting", "waiting", "cancelled"]
    assert [(await record(backend, r.id)).waiting_for for r in (bulk_waits, bulk_two)] == [1, 1]
    assert (await record(backend, bulk_cancelled.id)).error == parent_failed(dead, "dead")
    assert (await record(backend, bulk_parent.id)).children == (bulk_waits.id, bulk_two.id, bulk_cancelled.id)


async def test_a_refused_insert_writes_nothing(backend: Backend) -> None:
    parent = job("p")
    await insert(backend, parent)
    await insert(backend, flow_job("c", after=[parent.id]))
    unknown, other_unknown = new_id(), new_id()
    itself = job("c")
    later = job("c")
    keyed = job("c", unique_key="new-key")  # nobody holds it: this call would insert it
    calls: dict[str, tuple[list[NewJob], str]] = {
        "unknown parents": ([job("c"), flow_job("c", after=[parent.id, unknown, other_unknown])],
                            str(unknown_parents([unknown, other_unknown]))),
        "the job itself": ([job("c"), itself._replace(after=(itself.id,))], "itself"),
        "a job later in the call": ([job("c"), flow_job("c", after=[later.id]), later], "later in the same call"),
        "a parent twice": ([job("c"), flow_job("c", after=[parent.id, parent.id])], "twice"),
        "a unique-keyed parent in the call": ([keyed, flow_job("c", after=[keyed.id])], "unique key"),
        "an empty id": ([job("c"), flow_job("c", after=[""])], "non-empty"),
        "an unknown on_parent_failure": ([job("c"), flow_job("c", after=[parent.id], on_parent_failure="skip")],
                                         "on_parent_failure must be"),
        "on_parent_failure without after": ([flow_job("c", after=[parent.id]), job("c")._replace(on_parent_failure="run")],
                                            "without after"),
    }
    state = await store_state(backend)
    parent_before = await record(backend, parent.id)
    for name, (rows, says) in calls.items():
        with pytest.raises(UsageError) as refused:
            await backend.insert(rows)
        assert says in str(refused.value), f"{name}: {refused.value}"
        assert await store_state(backend) == state, f"{name}: the refused call wrote something"
        assert await record(backend, parent.id) == parent_before, f"{name}: an edge was written"
    # the batch record goes with its jobs
    rows, batch = batch_rows([job("m"), flow_job("m", after=[unknown])])
    with pytest.raises(UsageError, match="unknown parent"):
        await backend.insert(rows, batch=batch)
    assert await backend.batch(batch.id) is None and await backend.batch_jobs(batch.id) == []
    # an unknown parent fails a bulk load like a bad line: nothing of the open transaction is kept
    with pytest.raises(UsageError, match="unknown parent"):
        await backend.bulk_insert(iter([job("c"), flow_job("c", after=[parent.id]), flow_job("c", after=[unknown])]))
    assert await store_state(backend) == state
    assert await record(backend, parent.id) == parent_before


# -- waiting, and waking ---------------------------------------------------------------------------------


async def test_a_waiting_job_is_never_claimed_and_wakes_with_its_last_parent(backend: Backend) -> None:
    one, two = await running(backend, "p1"), await running(backend, "p2")
    due = flow_job("w", after=[one.id, two.id], unique_key="kw")  # due a minute ago
    later = flow_job("w", after=[one.id], delay=FUTURE)
    expiring = flow_job("w", after=[one.id, two.id], expires_at=ts(-1.0))  # expired before it may run
    keyed = flow_job("w", after=[two.id], unique_key="kp", unique_while="pending")
    rows = [due, later, expiring, keyed]
    await insert(backend, *rows)
    got = await record(backend, due.id)
    assert (got.status, got.parents, got.parent_count, got.waiting_for, got.children, got.child_count) == (
        "waiting", (one.id, two.id), 2, 2, (), 0)
    assert (got.batch_id, got.on_parent_failure, got.to_json()["on_parent_failure"]) == (None, None, "cancel")
    assert (await record(backend, one.id)).children == (due.id, later.id, expiring.id)
    grandchild = flow_job("g", after=[due.id])  # waits for a waiting job
    await insert(backend, grandchild)
    with pytest.raises(UsageError):
        await backend.revive(due.id)  # neither dead nor cancelled

    # never claimed though due; not expired while it waits (expiry applies once pending); its key held
    assert await claimed(backend, "w") == set()
    assert await backend.rescue_expired(base_seconds=1.0) == 0
    assert await backend.bury_unknown_types([], grace_seconds=0.0) == 0  # (pending jobs only)
    assert await statuses(backend, [r.id for r in rows]) == ["waiting"] * 4
    assert await backend.insert([job("w", unique_key="kw")]) == [due.id]
    assert await backend.insert([job("w", unique_key="kp", unique_while="pending")]) == [keyed.id]

    # seen by operators
    stats = await backend.stats()
    assert stats["by_status"].get("waiting") == 5 and stats["by_type"]["w"].get("waiting") == 4
    assert stats["total"] == 7 and stats["by_status"]["running"] == 2
    assert stats["oldest_due_pending_age_seconds"] is None  # waiting is not pending
    for order in ("newest", "claim"):
        records, total = await backend.list(status="waiting", order=order)
        assert total == 5 and {r.id for r in records} == {r.id for r in [*rows, grandchild]}
        assert {r.status for r in records} == {"waiting"}
    records, total = await backend.list(status="waiting", job_type="p1")
    assert (records, total) == ([], 0)

    # the first parent completes: the job that waited for it alone wakes, and its run_after still holds
    assert await settle_one(backend, succeed(one, '"one"'))
    got = await record(backend, later.id)
    assert (got.status, got.waiting_for, got.run_after) == ("pending", 0, later.run_after)
    assert [(await record(backend, r.id)).waiting_for for r in (due, expiring)] == [1, 1]
    assert await statuses(backend, [due.id, expiring.id, keyed.id]) == ["waiting"] * 3
    assert await claimed(backend, "w") == set()
    # the last one: they wake in the settle that ends it (due at once: their run_after passed)
    assert await settle_one(backend, succeed(two))
    assert await statuses(backend, [due.id, expiring.id, keyed.id]) == ["pending"] * 3
    got = await record(backend, due.id)
    assert (got.waiting_for, got.run_after, got.parents) == (0, due.run_after, (one.id, two.id))
    assert (await backend.stats())["by_status"].get("waiting", 0) == 1  # the grandchild
    leases = await backend.claim({"w": 10}, owner="w", lease_seconds=LONG)
    assert {lease.id for lease in leases} == {due.id, keyed.id}  # the expired one is ended by the claim instead
    got = await record(backend, expiring.id)
    assert (got.status, got.error) == ("cancelled", expired_error(expiring.expires_at))  # type: ignore[arg-type]
    assert await claimed(backend, "w") == set()
    # a unique_while="pending" key is freed by the claim, as for a job that never waited
    assert (await backend.insert([fresh := job("w", unique_key="kp", unique_while="pending")])) == [fresh.id]
    # the chain goes on: the job that waited for a waiting job wakes when that one completes
    assert (await record(backend, grandchild.id)).status == "waiting"
    (lease,) = [lease for lease in leases if lease.id == due.id]
    assert await settle_one(backend, succeed(lease, '"due"'))
    got = await record(backend, grandchild.id)
    assert (got.status, got.waiting_for, got.parents) == ("pending", 0, (due.id,))
    assert await parent_results(backend, grandchild.id) == {due.id: '"due"'}
    assert await claimed(backend, "g") == {grandchild.id}


# -- every path to a final status applies the edges ------------------------------------------------------


# The parent of each path has a type of its own: path → how it ends (None: an outcome that is not final)
PATHS: dict[str, str | None] = {
    "succeed": "completed",  # settle SUCCEED
    "bury": "dead",  # settle BURY
    "stop": "cancelled",  # settle CANCEL: its cancel was requested while it ran
    "snooze_bury": "dead",  # settle SNOOZE past the limit (SNOOZE_BURY)
    "rescue_bury": "dead",  # rescue_expired: its lease expired out of attempts
    "rescue_cancel": "cancelled",  # rescue_expired: its lease expired, its cancel requested
    "expire_claim": "cancelled",  # expired: ended by a claim of its type
    "expire_rescue": "cancelled",  # expired: ended by rescue_expired
    "cancel_pending": "cancelled",  # cancel() while pending
    "ghost": "dead",  # bury_unknown_types
    "delete_pending": "deleted",  # delete() while pending
    "retry": None,  # settle RETRY
    "release": None,  # settle RELEASE
    "snooze": None,  # settle SNOOZE within the limit
}
PARENT_FIELDS: dict[str, dict[str, object]] = {
    "rescue_bury": {"max_attempts": 1}, "expire_claim": {"expires_at": ts(-1.0)},
    "expire_rescue": {"expires_at": ts(-1.0)}, "ghost": {"delay": -120.0},
}


async def test_every_path_to_a_final_status_applies_the_edges(backend: Backend) -> None:
    """Per path, two children: one under the default, one under "run"; each also waits for ``last``,
    which completes at the end (so that each child is still waiting when its path's parent ends)."""
    last = job("last")
    parents = {path: job(path, **PARENT_FIELDS.get(path, {})) for path in PATHS}  # type: ignore[arg-type]
    await insert(backend, last, *parents.values())
    leases = {path: await claim_one(backend, path) for path in ("succeed", "bury", "stop", "snooze_bury", "retry",
                                                                 "release", "snooze")}
    leases |= {path: await claim_one(backend, path, lease_seconds=SHORT) for path in ("rescue_bury", "rescue_cancel")}
    assert await backend.cancel([leases["stop"].id, leases["rescue_cancel"].id], reason=REASON) == [CANCELLING] * 2
    children = {(path, opf): flow_job("c", after=[parent.id, last.id], on_parent_failure=opf)
                for path, parent in parents.items() for opf in (None, "run")}
    unknown_type = flow_job("ghost_child", after=[last.id], delay=-120.0)  # waiting: not pending, not buried
    await insert(backend, *children.values(), unknown_type)
    assert {(got.status, got.waiting_for) for got in [await record(backend, c.id) for c in children.values()]} == {
        ("waiting", 2)}
    got = await record(backend, last.id)
    assert got.children == (*(c.id for c in children.values()), unknown_type.id)
    assert got.child_count == 2 * len(PATHS) + 1 <= MAX_LISTED_RELATIVES

    assert await backend.settle([succeed(leases["succeed"], '"ok"'), bury(leases["bury"]), stop(leases["stop"]),
                                 snooze(leases["snooze_bury"], 0.0, limit=0), retry(leases["retry"], FUTURE),
                                 release(leases["release"]), snooze(leases["snooze"], FUTURE, limit=5)]) == [True] * 7
    assert await backend.claim({"expire_claim": 1}, owner="w", lease_seconds=LONG) == []
    assert await backend.cancel([parents["cancel_pending"].id], reason=REASON) == ["cancelled"]
    await backend.delete(parents["delete_pending"].id)
    known = [path for path in PATHS if path != "ghost"] + ["last", "c"]
    assert await backend.bury_unknown_types(known, grace_seconds=60.0) == 1
    await outlive(SHORT)
    assert await backend.rescue_expired(base_seconds=60.0) >= 3

    parent_statuses = await statuses(backend, [parents[path].id for path in PATHS])
    assert dict(zip(PATHS, parent_statuses)) == {
        path: None if how == "deleted" else how or "pending" for path, how in PATHS.items()}
    for (path, opf), child in children.items():
        how = PATHS[path]
        status, error = ("waiting", None) if how is None else after_parent_ended(how, opf, parents[path].id)
        got = await record(backend, child.id)
        assert (got.status, got.error) == (status, error), f"{path}, on_parent_failure={opf}: {got.status}, {got.error}"
        if status == "waiting":
            assert got.waiting_for == (2 if how is None else 1), f"{path}, on_parent_failure={opf}: counted wrong"
    assert (await record(backend, unknown_type.id)).status == "waiting"
    assert await claimed(backend, "c") == set()

    # the last parent completes: every child still waiting whose other parent ended wakes
    lease = await claim_one(backend, "last")
    assert await settle_one(backend, succeed(lease))
    woken = set()
    for (path, opf), child in children.items():
        how = PATHS[path]
        if how is None:
            status, error = "waiting", None
        else:
            status, error = after_parent_ended(how, opf, parents[path].id)
            status = "pending" if status == "waiting" else status
        got = await record(backend, child.id)
        assert (got.status, got.error) == (status, error), f"{path}, on_parent_failure={opf}: {got.status}, {got.error}"
        if status == "pending":
            woken.add(child.id)
            assert got.waiting_for == 0
    assert await claimed(backend, "c") == woken
    assert len(woken) == 12  # both children of "succeed", and the "run" child of each of the 10 failures
    assert (await record(backend, unknown_type.id)).status == "pending"


async def test_cancelling_or_deleting_a_waiting_job_applies_its_edges_down_the_graph(backend: Backend) -> None:
    root = job("root")
    top = flow_job("c", after=[root.id])
    middle = flow_job("c", after=[top.id], unique_key="km")
    bottom = flow_job("c", after=[middle.id])
    runs = flow_job("c", after=[middle.id, root.id], on_parent_failure="run")  # also waits for root
    deleted = flow_job("c", after=[root.id])
    below_deleted = flow_job("c", after=[deleted.id])
    runs_below_deleted = flow_job("c", after=[deleted.id, root.id], on_parent_failure="run")
    links = [flow_job("link", after=[root.id])]
    for _ in range(99):
        links.append(flow_job("link", after=[links[-1].id]))
    await insert(backend, root, top, middle)  # (a parent with a unique key cannot be in its child's call)
    await insert(backend, bottom, runs, deleted, below_deleted, runs_below_deleted, *links)

    before = ts()
    assert await backend.cancel([top.id], reason=REASON) == ["cancelled"]
    end = ts()
    assert (await record(backend, top.id)).error == cancelled_error(REASON)
    for child, parent in ((middle, top), (bottom, middle)):
        got = await record(backend, child.id)
        assert (got.status, got.error) == ("cancelled", parent_failed(parent.id, "cancelled")), child
        assert near(got.updated_at, before, end)
    got = await record(backend, runs.id)
    assert (got.status, got.waiting_for) == ("waiting", 1)
    assert await backend.cancel([top.id, middle.id], reason="again") == ["cancelled", "cancelled"]
    assert (await record(backend, middle.id)).error == parent_failed(top.id, "cancelled")
    assert await backend.insert([freed := job("c", unique_key="km")]) == [freed.id]  # the key was freed

    await backend.delete(deleted.id)
    assert await backend.get(deleted.id) is None
    got = await record(backend, below_deleted.id)
    assert (got.status, got.error) == ("cancelled", parent_failed(deleted.id, "deleted"))
    got = await record(backend, runs_below_deleted.id)
    assert (got.status, got.waiting_for) == ("waiting", 1)
    assert await parent_results(backend, runs_below_deleted.id) == {root.id: None}
    got = await record(backend, root.id)  # the deleted job's edge to its parent went with it
    assert (got.children, got.child_count) == ((top.id, runs.id, runs_below_deleted.id, links[0].id), 4)

    # a chain of a hundred, cancelled down at once
    assert await backend.cancel([links[0].id], reason=REASON) == ["cancelled"]
    records, total = await backend.list(status="cancelled", job_type="link", limit=200)
    assert total == 100
    assert (await record(backend, links[-1].id)).error == parent_failed(links[-2].id, "cancelled")

    lease = await claim_one(backend, "root")
    assert await settle_one(backend, succeed(lease, '"root"'))
    assert await statuses(backend, [runs.id, runs_below_deleted.id]) == ["pending", "pending"]
    assert await parent_results(backend, runs.id) == {middle.id: None, root.id: '"root"'}
    assert await claimed(backend, "c") == {runs.id, runs_below_deleted.id, freed.id}
    assert await statuses(backend, [top.id, middle.id, bottom.id, below_deleted.id]) == ["cancelled"] * 4


# -- exactly once ----------------------------------------------------------------------------------------


async def test_an_edge_counts_once_whatever_happens_to_its_parent_later(backend: Backend) -> None:
    a, b, c, d, e, f = (job(name) for name in "abcdef")
    await insert(backend, a, b, c, d, e, f)
    runs = flow_job("x", after=[a.id, b.id], on_parent_failure="run")
    cancelled = flow_job("x", after=[a.id])
    stopped = flow_job("x", after=[c.id, d.id])  # an operator cancels it while it waits
    revived = flow_job("x", after=[e.id, f.id])  # cancelled by e's failure, then retried by an operator
    await insert(backend, runs, cancelled, stopped, revived)

    async def end(parent: NewJob, how: str) -> None:
        lease = await claim_one(backend, parent.job_type)
        assert await settle_one(backend, succeed(lease) if how == "completed" else bury(lease))

    # a dies: counts for the child under "run", cancels the other
    await end(a, "dead")
    got = await record(backend, runs.id)
    assert (got.status, got.waiting_for) == ("waiting", 1)
    cancelled_got = await record(backend, cancelled.id)
    assert (cancelled_got.status, cancelled_got.error) == ("cancelled", parent_failed(a.id, "dead"))
    # retried by an operator, a completes this time: nothing counts again, nothing is un-cancelled
    await backend.revive(a.id)
    await end(a, "completed")
    got = await record(backend, runs.id)
    assert (got.status, got.waiting_for) == ("waiting", 1)
    assert await record(backend, cancelled.id) == cancelled_got
    await end(b, "completed")
    got = await record(backend, runs.id)
    assert (got.status, got.waiting_for) == ("pending", 0)

    # a child an operator cancelled while it waited: its parents' edges only move its count
    assert await backend.cancel([stopped.id], reason=REASON) == ["cancelled"]
    for parent in (c, d):
        await end(parent, "completed")
        got = await record(backend, stopped.id)
        assert (got.status, got.error) == ("cancelled", cancelled_error(REASON))

    # a child cancelled by its parent's failure and retried runs without waiting; its other parent
    # completing later changes nothing of it
    await end(e, "dead")
    assert (await record(backend, revived.id)).error == parent_failed(e.id, "dead")
    got = await backend.revive(revived.id)
    assert got == await record(backend, revived.id)  # (the answer is the record as get() reads it)
    assert (got.status, got.attempts, got.parents) == ("pending", 0, (e.id, f.id))
    await end(f, "completed")
    assert attrs.evolve(await record(backend, revived.id), waiting_for=got.waiting_for) == got  # its count may move
    await backend.revive(cancelled.id)

    assert await claimed(backend, "x") == {runs.id, revived.id, cancelled.id}
    assert await claimed(backend, "x") == set()
    assert await parent_results(backend, runs.id) == {a.id: None, b.id: None}


# -- batches ---------------------------------------------------------------------------------------------


async def test_a_batch_counts_its_members_and_releases_its_callback_after_the_last(backend: Backend) -> None:
    fillers = [job("m", payload={"n": n}) for n in range(MAX_LISTED_RELATIVES - 1)]
    first, cancelled, last = job("m_first"), job("m_cancelled"), job("m_last")
    rows, batch = batch_rows([first, *fillers, cancelled, last])
    members, callback = rows[:-1], rows[-1]
    member_ids = [m.id for m in members]
    assert await backend.insert(rows, batch=batch) == [r.id for r in rows]
    total = len(members)  # 102: more than a record lists

    async def check(counts: dict[str, int], callback_status: str | None) -> None:
        got = await backend.batch(batch.id)
        assert got is not None
        assert (got.id, got.callback_id, got.created_at, got.total) == (batch.id, callback.id, batch.created_at, total)
        assert (dict(got.counts), got.callback_status) == (counts, callback_status)
        assert got.finished == sum(n for status, n in counts.items() if status in ("completed", "dead", "cancelled"))
        assert got.to_json()["finished"] == got.finished

    await check({"pending": total}, "waiting")
    got = await record(backend, callback.id)
    assert (got.status, got.batch_id, got.on_parent_failure, got.to_json()["batch"]) == ("waiting", batch.id, "run", batch.id)
    assert (got.parents, got.parent_count, got.waiting_for) == (tuple(member_ids[:MAX_LISTED_RELATIVES]), total, total)
    got = await record(backend, first.id)
    assert (got.batch_id, got.children, got.child_count, got.status) == (batch.id, (callback.id,), 1, "pending")
    assert await backend.batch_jobs(batch.id) == [BatchMember(m.id, m.job_type, "pending", None, None) for m in members]
    assert [m.id for m in await backend.batch_jobs(batch.id, limit=3, offset=total - 2)] == member_ids[-2:]
    assert [m.id for m in await backend.batch_jobs(batch.id, limit=2)] == member_ids[:2]

    leases = await backend.claim({"m": total}, owner="w", lease_seconds=LONG)
    assert len(leases) == len(fillers)
    results = {lease.id: json.dumps({"r": n}) for n, lease in enumerate(leases)}
    assert await backend.settle([succeed(lease, results[lease.id]) for lease in leases]) == [True] * len(leases)
    await check({"completed": len(fillers), "pending": 3}, "waiting")
    lease = await claim_one(backend, "m_first")
    assert await settle_one(backend, bury(lease, "fatal"))
    await check({"completed": len(fillers), "dead": 1, "pending": 2}, "waiting")
    assert await backend.cancel([cancelled.id], reason=REASON) == ["cancelled"]
    await check({"completed": len(fillers), "dead": 1, "cancelled": 1, "pending": 1}, "waiting")
    got = await record(backend, callback.id)
    assert (got.status, got.waiting_for) == ("waiting", 1)
    lease = await claim_one(backend, "m_last")
    await check({"completed": len(fillers), "dead": 1, "cancelled": 1, "running": 1}, "waiting")
    assert await settle_one(backend, succeed(lease, '"last"'))
    await check({"completed": len(fillers) + 1, "dead": 1, "cancelled": 1}, "pending")

    results |= {last.id: '"last"'}
    assert await backend.batch_jobs(batch.id) == [
        BatchMember(first.id, "m_first", "dead", None, "fatal"),
        *(BatchMember(f.id, "m", "completed", results[f.id], None) for f in fillers),
        BatchMember(cancelled.id, "m_cancelled", "cancelled", None, cancelled_error(REASON)),
        BatchMember(last.id, "m_last", "completed", '"last"', None)]
    found = await parent_results(backend, callback.id)
    assert list(found) == member_ids  # in the order of its after
    assert found == {m: results.get(m) for m in member_ids}
    assert await parent_results(backend, first.id) == {}
    assert await parent_results(backend, new_id()) == {}

    lease = await claim_one(backend, "callback")
    assert lease.id == callback.id
    await check({"completed": len(fillers) + 1, "dead": 1, "cancelled": 1}, "running")
    assert await claimed(backend, "callback") == set()
    assert await settle_one(backend, succeed(lease))
    await check({"completed": len(fillers) + 1, "dead": 1, "cancelled": 1}, "completed")
    await backend.delete(callback.id)  # the batch stays while its members do; its callback's status is gone
    await check({"completed": len(fillers) + 1, "dead": 1, "cancelled": 1}, None)

    # a batch without a callback, and batches that do not exist
    rows, plain = batch_rows([job("n"), job("n")], callback_type=None)
    await backend.insert(rows, batch=plain)
    got = await backend.batch(plain.id)
    assert got is not None and (got.callback_id, got.callback_status, got.total, dict(got.counts)) == (
        None, None, 2, {"pending": 2})
    assert [m.id for m in await backend.batch_jobs(plain.id)] == [r.id for r in rows]
    assert await backend.batch(new_id()) is None and await backend.batch_jobs(new_id()) == []


# -- the repair sweep ------------------------------------------------------------------------------------


async def test_the_repair_sweep_changes_nothing_in_a_store_that_kept_its_promise(backend: Backend) -> None:
    parent, failed = job("p"), job("f")
    await insert(backend, parent, failed)
    done = await ended(backend, "d", "completed")
    children = [flow_job("c", after=[parent.id]), flow_job("c", after=[parent.id, done]), flow_job("c", after=[done]),
                flow_job("c", after=[failed.id]), flow_job("c", after=[failed.id, parent.id], on_parent_failure="run")]
    await insert(backend, *children)
    assert await backend.cancel([failed.id], reason=REASON) == ["cancelled"]
    state = await store_state(backend)
    records = [await backend.get(r.id) for r in [parent, failed, *children]]
    assert await backend.rescue_waiting() == 0
    assert await backend.rescue_waiting(limit=1) == 0
    assert await store_state(backend) == state
    assert [await backend.get(r.id) for r in [parent, failed, *children]] == records


# -- retention -------------------------------------------------------------------------------------------


async def test_removing_finished_jobs_removes_their_edges_and_their_empty_batches(backend: Backend) -> None:
    first = await ended(backend, "p", "completed", '"first"')
    second = await ended(backend, "p", "completed", '"second"')
    third = await ended(backend, "p3", "completed", '"third"')
    parent = job("q")  # pending throughout
    await insert(backend, parent)
    child = flow_job("c", after=[first, second, third])
    cancelled = flow_job("c", after=[parent.id])
    await insert(backend, child, cancelled)
    assert await backend.cancel([cancelled.id], reason=REASON) == ["cancelled"]
    batch_jobs, batch = batch_rows([job("m"), job("m")])
    other_jobs, other = batch_rows([job("n")], callback_type="n_callback")
    await backend.insert(batch_jobs, batch=batch)
    await backend.insert(other_jobs, batch=other)
    for job_type in ("m", "callback", "n", "n_callback"):  # the members first, then the callbacks
        leases = await backend.claim({job_type: 5}, owner="w", lease_seconds=LONG)
        assert await backend.settle([succeed(lease) for lease in leases]) == [True] * len(leases)
    await trio.sleep(0.1)
    assert await statuses(backend, [r.id for r in batch_jobs + other_jobs]) == ["completed"] * 5

    # retention, oldest first: the first parent goes, and its edge
    assert await backend.prune("completed", older_than_seconds=0.05, limit=1) == 1
    assert await backend.get(first) is None
    got = await record(backend, child.id)
    assert (got.status, got.parents, got.parent_count) == ("pending", (second, third), 2)
    assert await parent_results(backend, child.id) == {second: '"second"', third: '"third"'}
    # an operator's delete of a finished parent, the same
    await backend.delete(second)
    assert (await record(backend, child.id)).parents == (third,)
    assert await parent_results(backend, child.id) == {third: '"third"'}
    # the other direction: a parent's children
    assert await backend.prune("cancelled", older_than_seconds=0.05, limit=10) == 1
    got = await record(backend, parent.id)
    assert (got.children, got.child_count) == ((), 0)

    # the rest of the old completed jobs: the batches' members and callbacks, so their records
    assert await backend.prune("completed", older_than_seconds=0.05, limit=3) == 3  # third, then the first batch's members
    assert await backend.batch(batch.id) is not None  # its callback is left
    assert await backend.prune("completed", older_than_seconds=0.05, limit=1) == 1
    assert await backend.get(batch_jobs[-1].id) is None
    assert await backend.batch(batch.id) is None and await backend.batch_jobs(batch.id) == []
    assert (await record(backend, child.id)).parents == ()
    assert await parent_results(backend, child.id) == {}
    assert await backend.cleanup(statuses=["completed"]) == 2
    assert await backend.batch(other.id) is None


# -- wake-ups --------------------------------------------------------------------------------------------


async def test_a_woken_job_wakes_the_pollers_as_an_insert_does(tmp_path: Path) -> None:
    """This process's Poller at once (every store), and another process's (Postgres NOTIFY, Redis
    PUBLISH; SQLite's WAL watch nudges on every commit of another process, so there is nothing to tell
    apart there). A settle that wakes nothing is the control: it nudges nobody."""
    async def on(name: str, config: Config, folder: Path) -> None:
        send, recv = trio.open_memory_channel[Nudge](NUDGE_BUFFER)
        async with open_backend(config, nudge_send=send) as here, open_backend(config) as other:

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
                """Take every nudge in hand until none came for 0.3 s."""
                with trio.fail_after(5):
                    while await nudged(0.3):
                        pass

            parents = [job("p", max_attempts=1) for _ in range(4)]
            await insert(here, *parents)
            leases = await here.claim({"p": 4}, owner="w", lease_seconds=LONG)
            first, childless, second, other_childless = sorted(leases, key=lambda lease: lease.id)
            await insert(here, flow_job("c", after=[first.id]), flow_job("c", after=[second.id], on_parent_failure="run"))
            await quiet()  # the listener's first nudges, once it listens, and the inserts'
            assert await settle_one(here, succeed(childless))
            assert not await nudged(0.2), "a settle that woke nothing nudged the Poller: the check below proves nothing"
            assert await settle_one(here, succeed(first))
            assert await nudged(0.5), "the job this settle woke did not nudge this process's Poller"
            if name == "sqlite":
                return
            await quiet()
            assert await settle_one(other, succeed(other_childless))
            assert not await nudged(0.3), "a settle that woke nothing nudged the Poller: the check below proves nothing"
            assert await settle_one(other, bury(second))
            assert await nudged(1.0), "the job another process's settle woke did not nudge this process's Poller"
        recv.close()

    await on_each_store(tmp_path, on)


# -- concurrency: real processes -------------------------------------------------------------------------

SETTLER = Path(__file__).parent / "workflow_settler.py"
PACE, FAN_IN, MANY, RACED = 0.003, 30, 10, 40  # see the test's docstring


def settle_step(slot: int, lease: Lease, dead: set[str]) -> list[Any]:
    return [slot, "settle", lease.id, lease.token, "dead" if lease.id in dead else "completed"]


@attrs.define
class Race:
    """One store's part of the race of processes: the parents and children this process made, the
    parents that end dead, each process's plan (:mod:`workflow_settler`), and what the claimer saw."""

    name: str
    url: str  # the store's DATABASE_URL, for the processes
    backend: Backend
    children: list[str] = attrs.Factory(list)
    dead: set[str] = attrs.Factory(set)
    plans: list[list[list[Any]]] = attrs.Factory(list)
    claims: list[str] = attrs.Factory(list)
    early: list[str] = attrs.Factory(list)

    async def prepare(self) -> None:
        backend = self.backend
        parents = [[job(f"p{k}") for _ in range(FAN_IN)] for k in range(3)]
        crowd = [[[job(f"q{k}") for _ in range(MANY)] for k in range(3)] for _ in range(3)]  # [child][process][n]
        chased = [job("r") for _ in range(RACED)]
        await backend.insert([row for column in parents for row in column] + chased
                             + [row for child in crowd for column in child for row in column])
        fanned = [flow_job("c", after=[parents[k][i].id for k in range(3)],
                           on_parent_failure="run" if i % 3 == 0 else None) for i in range(FAN_IN)]
        crowded = [flow_job("c", after=[row.id for column in crowd[i] for row in column],
                            on_parent_failure="run" if i == 0 else None) for i in range(3)]
        await backend.insert(fanned + crowded)
        self.children = [c.id for c in fanned + crowded]
        wants = {f"p{k}": FAN_IN for k in range(3)} | {f"q{k}": 3 * MANY for k in range(3)} | {"r": RACED}
        leases = {lease.id: lease for lease in await backend.claim(wants, owner="w", lease_seconds=LONG)}
        dead = {parents[k][i].id for i in range(FAN_IN) for k in range(3) if (i * 3 + k) % 8 == 0}
        dead |= {crowd[1][2][MANY - 1].id, crowd[0][1][0].id}  # the last parent of one; the first of another
        dead |= {row.id for n, row in enumerate(chased) if n % 5 == 2}
        self.dead = dead
        plans = [[settle_step(i, leases[parents[k][i].id], dead) for i in range(FAN_IN)] for k in range(3)]
        for k in range(3):
            plans[k] += [settle_step(FAN_IN + 5 + 3 * n + i, leases[crowd[i][k][n].id], dead)
                         for n in range(MANY) for i in range(3)]
        later = FAN_IN + 3 * MANY + 10
        plans[1].append([later, "named", chased[0].id])  # (the chasers may come later than this process)
        plans[1] += [settle_step(later + 1 + 2 * n, leases[row.id], dead) for n, row in enumerate(chased)]
        plans[0].append([later, "chase", "r", 3 * RACED])
        plans[2].append([later + 1, "chase", "r", 3 * RACED])
        self.plans = plans

    async def claim_children(self, over: trio.Event) -> None:
        """Claim the children (type "c") as they become pending, and complete them, until the
        processes are done and nothing is left; note any claimed before its parents ended. (A
        parent runs until it ends: one still running just after a claim had not ended at it.)"""
        while True:
            last = over.is_set()  # once the processes are done: one more claim, which finds all
            leases = await self.backend.claim({"c": 20}, owner="main", lease_seconds=LONG)
            for lease in leases:
                self.claims.append(lease.id)
                child = await record(self.backend, lease.id)
                for parent in child.parents:
                    status = (await record(self.backend, parent)).status
                    if status == "running" or (status == "dead" and child.on_parent_failure != "run"):
                        self.early.append(f"{lease.id} claimed while its parent {parent} was {status}")
            assert await self.backend.settle([succeed(lease) for lease in leases]) == [True] * len(leases)
            if last and not leases:
                return
            if not leases:
                await trio.sleep(0.05)  # (the processes starting need the CPU more than the claims)

    async def check(self, outputs: list[list[str]]) -> None:
        """Every child, those made here and those the processes inserted, against the model: cancelled
        by a dead parent (under the default), or else woken and claimed exactly once, never before its
        parents ended; none left waiting."""
        spans = []
        children = list(self.children)
        for lines in outputs:
            assert [line for line in lines if line.startswith("stale")] == []
            children += [line.split()[1] for line in lines if line.startswith("child")]
            (span,) = [line.split()[1:] for line in lines if line.startswith("span")]
            spans.append((float(span[0]), float(span[1])))
        assert max(first for first, _ in spans) < min(last for _, last in spans), f"the processes did not overlap: {spans}"
        assert len(children) > len(self.children), "the chasers inserted no child"

        assert self.early == []
        assert sorted(self.claims) == sorted(set(self.claims)), "a child was claimed twice: woken twice"
        woken = set()
        for child_id in children:
            got = await record(self.backend, child_id)
            failed = self.dead.intersection(got.parents)
            if got.on_parent_failure == "run" or not failed:
                woken.add(child_id)
                assert (got.status, got.waiting_for) == ("completed", 0), (child_id, got.status, got.waiting_for)
            else:
                assert got.status == "cancelled" and got.error in {parent_failed(p, "dead") for p in failed}, (
                    child_id, got.status, got.error)
        assert set(self.claims) == woken
        assert (await self.backend.list(status="waiting"))[1] == 0
        assert await self.backend.rescue_waiting() == 0


@pytest.mark.slow
async def test_parents_ending_in_three_processes_at_once_count_once_for_each_child(tmp_path: Path) -> None:
    """Three processes, each serving the three stores at once (a task per store), run three loads one
    after the other, while this process claims the children that become pending:

    * fan-in: 30 children of three parents each; process k ends the k-th parent of every child, the
      three in step (child n's three parents at the same moment), some of them dead;
    * many parents: 3 children of 30 parents each; each process ends ten parents of each child, the
      three processes on the same child at the same moments, its count moved by all three at once;
    * inserts against outcomes: process 1 ends 40 parents one after the other, some of them dead,
      while processes 0 and 2 insert children as fast as they can, each naming the next two parents
      that process 1 is about to end: ended before the insert (counted at once), being ended as it
      reads them, or ended after (the child waits, then wakes).

    (Three processes for the three stores rather than three each: each start costs about half a
    second of CPU, and nine of them on two cores were most of the test's time.) Failures are
    reported per store, as stores.on_each_store reports them."""
    races: list[Race] = []
    skipped: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        for name in sorted(BACKENDS):
            folder = tmp_path / name
            folder.mkdir()
            try:
                config = await stack.enter_async_context(BACKENDS[name](folder))
            except pytest.skip.Exception as skip:
                skipped.append(f"{name}: {skip.msg}")
                continue
            race = Race(name, config.database_url, await stack.enter_async_context(open_backend(config)))
            await race.prepare()
            races.append(race)
            for k, steps in enumerate(race.plans):
                (folder / f"plan-{k}.json").write_text(json.dumps({"pace": PACE, "steps": steps}))
        commands = [[sys.executable, str(SETTLER),
                     *(part for race in races for part in (race.url, str(tmp_path / race.name / f"plan-{k}.json")))]
                    for k in range(3)]
        # the processes import the package this process imported (not one installed elsewhere)
        package_root = str(Path(pipeline.__file__).parents[1])
        env = {**os.environ, "REDIS_ALLOW_NON_DURABLE": "true", "LOG_LEVEL": "warning",
               "PYTHONPATH": os.pathsep.join([package_root, *filter(None, [os.environ.get("PYTHONPATH")])])}
        over = trio.Event()
        async with trio.open_nursery() as nursery:
            for race in races:
                nursery.start_soon(race.claim_children, over)
            outputs = await trio.to_thread.run_sync(released_together, commands, env)
            over.set()
        failures: list[BaseException] = []
        for n, race in enumerate(races):
            mine = [[line.split(" ", 1)[1] for line in lines if line.split(" ", 1)[0] == str(n)] for lines in outputs]
            try:
                await race.check(mine)
            except Exception as error:
                error.add_note(f"(on the {race.name} store)")
                failures.append(error)
    report_stores(failures, [race.name for race in races], skipped)


# SQL that leaves a store as a defect would: the edges of two final parents marked not counted and
# their children waiting again, a parent row deleted under its edge, a job waiting with nothing to wait
# for. (The Redis store keeps the graph in keys of its own layout: tests/backends/test_redis_workflows.py.)
BREAKS = {
    "sqlite": ["UPDATE edges SET counted = 0 WHERE parent_id IN ({done}, {dead})",
               "UPDATE jobs SET status = 'waiting', waiting_for = 1, error = NULL WHERE id IN ({children})",
               "DELETE FROM jobs WHERE id = {gone}",
               "UPDATE jobs SET waiting_for = 0 WHERE id = {unblocked}"],
    "postgres": ["UPDATE job_edges SET counted = false WHERE parent_id IN ({done}, {dead})",
                 "UPDATE jobs SET status = 'waiting', waiting_for = 1, error = NULL WHERE id IN ({children})",
                 "DELETE FROM jobs WHERE id = {gone}",
                 "UPDATE jobs SET waiting_for = 0 WHERE id = {unblocked}"],
}


def broken(name: str, url: str, **ids: str) -> None:
    """Run the store's BREAKS in one transaction, the ids quoted in."""
    quoted = {key: ", ".join(f"'{job_id}'" for job_id in value.split()) for key, value in ids.items()}
    statements = [sql.format(**quoted) for sql in BREAKS[name]]
    if name == "sqlite":
        import sqlite3

        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            for sql in statements:
                conn.execute(sql)
            conn.execute("COMMIT")
        finally:
            conn.close()
    else:
        import psycopg

        with psycopg.connect(url) as pg, pg.transaction():
            for sql in statements:
                pg.execute(sql)  # type: ignore[call-overload]


@pytest.mark.parametrize("name", sorted(BREAKS))
async def test_the_repair_sweep_applies_edges_left_uncounted(name: str, tmp_path: Path) -> None:
    """No call of the protocol leaves an edge uncounted (that is the promise); SQL written by hand can
    (:data:`BREAKS`). The sweep repairs each case as the parent's end would have."""
    async with BACKENDS[name](tmp_path) as config, open_backend(config) as backend:
        done = await ended(backend, "p", "completed", '"done"')
        dead = await ended(backend, "p", "dead")
        gone, waiting = job("g"), job("w")
        await insert(backend, gone, waiting)
        after_done = flow_job("c", after=[done])  # pending at once: its edge counted
        after_dead = flow_job("c", after=[dead])  # cancelled at once
        runs_after_dead = flow_job("c", after=[dead], on_parent_failure="run")  # pending at once
        after_gone = flow_job("c", after=[gone.id])
        after_waiting = flow_job("c", after=[waiting.id])
        await insert(backend, after_done, after_dead, runs_after_dead, after_gone, after_waiting)
        rows = [after_done, after_dead, runs_after_dead, after_gone, after_waiting]
        assert await statuses(backend, [r.id for r in rows]) == ["pending", "cancelled", "pending", "waiting", "waiting"]

        await trio.to_thread.run_sync(lambda: broken(
            name, config.database_url, done=done, dead=dead, gone=gone.id, unblocked=after_waiting.id,
            children=" ".join([after_done.id, after_dead.id, runs_after_dead.id])))
        assert await statuses(backend, [r.id for r in rows]) == ["waiting"] * 5

        repaired = 0
        for _ in range(10):  # a bounded sweep: as many calls as it takes
            if not (moved := await backend.rescue_waiting(limit=1)):
                break
            repaired += moved
        assert repaired == 5
        expected = [("pending", None), ("cancelled", parent_failed(dead, "dead")), ("pending", None),
                    ("cancelled", parent_failed(gone.id, "deleted")), ("pending", None)]
        assert [((got := await record(backend, r.id)).status, got.error) for r in rows] == expected
        assert await claimed(backend, "c") == {after_done.id, runs_after_dead.id, after_waiting.id}
        assert await backend.rescue_waiting() == 0
        # what the sweep applied counts once: the waiting job's parent ending later wakes nothing again
        lease = await claim_one(backend, "w")
        assert await settle_one(backend, succeed(lease))
        assert (await record(backend, after_waiting.id)).status == "running"
