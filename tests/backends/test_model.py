"""A hypothesis state machine drives a real backend through the protocol and compares it with a
plain model of the design written here, not taken from pipeline.states: claim (priority,
then run_after, then id), succeed, fail (bury when out of attempts or permanent, else retry
after a drawn delay), release, renew, rescue of expired leases (backoff with jitter: bounds
checked, then the stored time adopted), revive, delete, cleanup; several job types and
priorities, two owners, and leases that go stale, whose outcomes must change nothing.

Time is real (the store's clock is the wall clock): delays and leases are either long
enough never to pass during an example or short enough to be waited out, so that every
question the model asks has one answer. The backend runs on a trio loop in a thread of its
own, for the whole example; rules call into it with trio.from_thread.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import attrs
import pytest
import trio
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from pipeline.backends import Backend, JobRecord, Lease, NewJob, Settlement, open_backend
from pipeline.clock import format_ts, to_epoch
from pipeline.errors import UsageError
from pipeline.ids import UUID7Factory
from pipeline.states import Transition

from .stores import BACKENDS

T = TypeVar("T")

TYPES = ("a", "b", "c")
REVIVED = "r"  # the type of renew_after_a_rescue_and_a_new_claim's jobs: no other rule claims it
OWNERS = ("w1", "w2")
LEASES = {"short": 0.02, "long": 3600.0}
FAR = 3600.0  # a delay or backoff base that does not pass during an example
LOW, HIGH = 0.85, 1.15  # the jitter of a rescue's backoff
SLACK = 0.002  # two millisecond roundings
ANY = object()  # a field the protocol leaves to the backend (the model adopts what it finds)


class Driver:
    """A backend open on a fresh store, on a trio loop in a thread, for one example."""

    def __init__(self, name: str, directory: Path) -> None:
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self.backend: Backend
        self._thread = threading.Thread(target=trio.run, args=(self._main, name, directory), daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise TimeoutError("the backend did not open")
        if self._failure is not None:
            raise self._failure

    async def _main(self, name: str, directory: Path) -> None:
        try:
            async with BACKENDS[name](directory) as config, open_backend(config) as backend:
                self.backend = backend
                self._token = trio.lowlevel.current_trio_token()
                self._stop = trio.Event()
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:
            self._failure = exc
            self._ready.set()
            raise

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def close(self) -> None:
        if self._failure is None:
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(30)


@attrs.define
class ModelJob:
    job_type: str
    priority: int
    max_attempts: int
    payload: str
    run_after: str  # the stored text: chosen at insert, or adopted after bounds were checked
    status: str = "pending"
    attempts: int = 0
    token: int | None = None  # the lease that holds it, while running
    tokens: set[int] = attrs.field(factory=set)  # every token it was ever given
    owner: str | None = None
    lease: str = "long"
    expires_by: float = 0.0  # epoch by which its lease has surely run out (short leases)
    started: bool = False  # while running: its attempt is counted (claimed to start, or a START written)
    error: object = None  # str | None | ANY


def stamp(seconds: float) -> str:
    return format_ts(seconds)


class BackendVsModel(RuleBasedStateMachine):
    backend_name = "sqlite"

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.driver = Driver(self.backend_name, Path(self.tmp.name))
        self.backend = self.driver.backend
        self.start = time.time()
        self.new_id = UUID7Factory()
        self.model: dict[str, ModelJob] = {}
        self.held: list[Lease] = []  # every lease handed out, stale ones included
        self.errors = 0

    def teardown(self) -> None:
        try:
            self.driver.close()
        finally:
            self.tmp.cleanup()

    # -- helpers ----------------------------------------------------------------------------

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        async def go() -> T:
            return await fn(*args, **kwargs)

        return self.driver.run(go)

    def get(self, job_id: str) -> JobRecord | None:
        return self.call(self.backend.get, job_id)

    def is_current(self, lease: Lease) -> bool:
        job = self.model.get(lease.id)
        return job is not None and job.status == "running" and job.token == lease.token

    def stale(self) -> list[Lease]:
        return [lease for lease in self.held if not self.is_current(lease)]

    def next_error(self) -> str:
        self.errors += 1
        return f"error {self.errors}"

    def adopt_run_after(self, job_id: str, low: float, high: float) -> None:
        """The backend chose a time: check it lies within [low, high], then take it."""
        got = self.get(job_id)
        assert got is not None
        assert low - SLACK <= to_epoch(got.run_after) <= high + SLACK, (got.run_after, stamp(low), stamp(high))
        self.model[job_id].run_after = got.run_after

    def renew_call(self, owner: str, held: list[tuple[str, int]], lease_seconds: float) -> list[str]:
        renewer = self.backend.lease_renewer()
        try:
            return self.call(trio.to_thread.run_sync, lambda: renewer.renew(owner, TYPES, held, lease_seconds=lease_seconds))
        finally:
            renewer.close()

    def finish(self, job: ModelJob) -> None:
        job.token, job.owner = None, None

    # -- producing --------------------------------------------------------------------------

    JOBS = st.lists(
        st.tuples(st.sampled_from(TYPES), st.sampled_from([1, 5, 9]), st.integers(1, 3),
                  st.sampled_from([-100.0, -100.0, -50.0, FAR])),
        min_size=1, max_size=4,
    )

    # Rules have no preconditions: hypothesis gives up on a step when the rules it draws are
    # disabled, which cut most examples short; a rule with nothing to do returns instead.

    @initialize(specs=JOBS.map(lambda specs: specs * 2), lease=st.sampled_from(sorted(LEASES)))
    def some_jobs_some_running(self, specs: list[tuple[str, int, int, float]], lease: str) -> None:
        self.insert([(t, 5, 2, -100.0) for t in TYPES] + specs, duplicate=False)
        self.claim(dict.fromkeys(TYPES, 1), "w1", lease)

    @rule(specs=JOBS, duplicate=st.booleans())
    def insert(self, specs: list[tuple[str, int, int, float]], duplicate: bool) -> None:
        """A batch; with ``duplicate``, its last row repeats the id of a stored job: nothing of it is written."""
        if sum(job.status == "pending" for job in self.model.values()) >= 12:
            return  # enough waiting: let the steps go to the worker side
        rows = []
        for job_type, priority, max_attempts, offset in specs:
            job_id = self.new_id()
            payload = json.dumps({"id": job_id[-6:]})
            rows.append(NewJob(job_id, job_type, payload, max_attempts, stamp(self.start + offset), priority, stamp(self.start)))
        rows.reverse()  # newest id first: ties of (priority, run_after) go by id, not by insertion order
        if duplicate and self.model:
            rows.append(rows[0]._replace(id=min(self.model)))
            try:
                self.call(self.backend.insert, rows)
            except Exception:  # noqa: BLE001 - the backend's own error; the invariant checks that nothing was written
                return
            raise AssertionError("a batch with a duplicate id was accepted")
        self.call(self.backend.insert, rows)
        for r in rows:
            self.model[r.id] = ModelJob(r.job_type, r.priority, r.max_attempts, r.payload, r.run_after)

    # -- the worker side ----------------------------------------------------------------------

    @rule(
        wants=st.dictionaries(st.sampled_from(TYPES), st.integers(1, 3), min_size=1, max_size=3),
        owner=st.sampled_from(OWNERS), lease=st.sampled_from(sorted(LEASES)),
        # how many of each type start at once; the rest are claimed ahead (None: all start)
        start=st.none() | st.dictionaries(st.sampled_from(TYPES), st.integers(0, 3), max_size=3),
    )
    def claim(self, wants: dict[str, int], owner: str, lease: str, start: dict[str, int] | None = None) -> None:
        before = time.time()
        leases = self.call(self.backend.claim, wants, owner=owner, lease_seconds=LEASES[lease], start=start)
        after = time.time()
        low, high = stamp(before), stamp(after)
        for job_type, limit in wants.items():
            pending = [(job.priority, job.run_after, job_id) for job_id, job in self.model.items()
                       if job.job_type == job_type and job.status == "pending"]
            assert all(r <= low or r > high for _, r, _ in pending), "the model cannot tell whether a job is due"
            expected = [job_id for _, _, job_id in sorted(p for p in pending if p[1] <= low)][:limit]
            got = [lease.id for lease in leases if lease.job_type == job_type]
            assert got == expected, f"claimed {got} of type {job_type!r}, expected {expected} (claim order)"
        assert {lease.job_type for lease in leases} <= set(wants)
        event(f"claim: {len(leases)}")
        nth: Counter[str] = Counter()
        for claimed in leases:
            job = self.model[claimed.id]
            assert (claimed.job_type, claimed.payload, claimed.max_attempts, claimed.run_after) == (
                job.job_type, job.payload, job.max_attempts, job.run_after)
            assert claimed.attempts == job.attempts + 1
            assert claimed.token not in job.tokens, "a claim reused a token"
            starts = start is None or nth[claimed.job_type] < start.get(claimed.job_type, 0)
            nth[claimed.job_type] += 1
            assert claimed.started == starts, f"lease {nth[claimed.job_type]} of {claimed.job_type!r}: started={claimed.started}"
            if not starts:
                event("claim: claimed ahead")
            if job.tokens:
                event("claim: a job claimed again")
            job.status, job.token, job.owner, job.lease = "running", claimed.token, owner, lease
            job.attempts += starts
            job.started = starts
            job.tokens.add(claimed.token)
            job.expires_by = after + LEASES[lease]
            self.held.append(claimed)

    def outcome(self, lease: Lease, kind: str, delay: float = 0.0) -> Settlement:
        """The engine's decision for ``kind``, made here: a failure is buried when permanent or
        out of attempts, else retried after ``delay``."""
        if kind == "succeed":
            return Settlement(lease.id, lease.token, Transition.SUCCEED)
        if kind == "release":
            return Settlement(lease.id, lease.token, Transition.RELEASE)
        if kind == "start":
            return Settlement(lease.id, lease.token, Transition.START)
        if kind == "fail permanently" or lease.attempts >= lease.max_attempts:
            return Settlement(lease.id, lease.token, Transition.BURY, error=self.next_error())
        return Settlement(lease.id, lease.token, Transition.RETRY, error=self.next_error(), delay=delay)

    def apply(self, outcome: Settlement, before: float, after: float) -> None:
        """What a written outcome did, in the model (``before``/``after``: around the write)."""
        job = self.model[outcome.id]
        if outcome.transition is Transition.START:  # still running, its attempt counted (once)
            job.attempts += not job.started
            job.started = True
            return
        self.finish(job)
        if outcome.transition is Transition.SUCCEED:
            job.status, job.error = "completed", ANY
        elif outcome.transition is Transition.BURY:
            job.status, job.error = "dead", outcome.error
        elif outcome.transition is Transition.RETRY:  # the attempt counts
            job.status, job.error = "pending", outcome.error
            self.adopt_run_after(outcome.id, before + outcome.delay, after + outcome.delay)
        else:  # RELEASE: the attempt, if counted, is given back; due at once
            job.status, job.attempts, job.error = "pending", job.attempts - job.started, ANY
            self.adopt_run_after(outcome.id, before, after)

    @rule(data=st.data(), kind=st.sampled_from(["succeed", "fail", "fail permanently", "release", "start"]),
          delay=st.sampled_from([0.0, FAR]))
    def settle(self, data: st.DataObject, kind: str, delay: float) -> None:
        if not self.held:
            return
        current = [lease for lease in self.held if self.is_current(lease)]
        lease = data.draw(st.sampled_from(current or self.held))
        outcome = self.outcome(lease, kind, delay)
        fresh = self.is_current(lease)
        before_record = self.get(lease.id)
        before = time.time()
        (held,) = self.call(self.backend.settle, [outcome])
        after = time.time()
        assert held == fresh, f"{outcome.transition.name} of a {'current' if fresh else 'stale'} lease: told {held}"
        if fresh:
            self.apply(outcome, before, after)
        else:
            assert self.get(lease.id) == before_record, "a stale outcome changed the job"

    @rule(data=st.data(), kinds=st.lists(st.sampled_from(["succeed", "fail", "fail permanently", "release", "start"]), min_size=2,
                                         max_size=5))
    def settle_several_at_once(self, data: st.DataObject, kinds: list[str]) -> None:
        """One call, leases of different jobs, some stale: each answered for itself."""
        if not self.held:
            return
        by_job = {lease.id: lease for lease in data.draw(st.permutations(self.held))}  # one lease per job
        chosen = list(by_job.values())[: len(kinds)]
        outcomes = [self.outcome(lease, kind, FAR) for lease, kind in zip(chosen, kinds)]
        expected = [self.is_current(lease) for lease in chosen]
        if len(set(expected)) > 1:
            event("settle several: stale and current together")
        before = time.time()
        answers = self.call(self.backend.settle, outcomes)
        after = time.time()
        assert answers == expected
        for outcome, held in zip(outcomes, answers):
            if held:
                self.apply(outcome, before, after)  # the stale ones: the invariant checks they changed nothing

    @rule(data=st.data(), owner=st.sampled_from(OWNERS), lease=st.sampled_from(sorted(LEASES)))
    def renew(self, data: st.DataObject, owner: str, lease: str) -> None:
        if not self.held:
            return
        chosen = data.draw(st.lists(st.sampled_from(self.held), min_size=1, max_size=4, unique_by=lambda h: (h.id, h.token)))
        lost = self.renew_call(owner, [(h.id, h.token) for h in chosen], LEASES[lease])
        after = time.time()
        assert Counter(lost) == Counter(h.id for h in chosen if not self.is_current(h))
        for h in chosen:
            if self.is_current(h):
                job = self.model[h.id]
                job.lease, job.expires_by = lease, after + LEASES[lease]

    @rule(data=st.data(), kind=st.sampled_from(["succeed", "fail", "fail permanently", "release", "start", "renew"]))
    def stale_lease_changes_nothing(self, data: st.DataObject, kind: str) -> None:
        stale = self.stale()
        if not stale:
            return
        # the dangerous ones first: the job runs again, under a newer lease
        reclaimed = [lease for lease in stale if lease.id in self.model and self.model[lease.id].status == "running"]
        lease = data.draw(st.sampled_from(reclaimed or stale))
        event(f"stale lease: job {self.model[lease.id].status if lease.id in self.model else 'deleted'}")
        before = self.get(lease.id)
        if kind == "renew":
            assert self.renew_call("w1", [(lease.id, lease.token)], FAR) == [lease.id]
        else:
            assert self.call(self.backend.settle, [self.outcome(lease, kind, 0.0)]) == [False]
        assert self.get(lease.id) == before, f"a stale {kind} changed the job"

    @rule(data=st.data(), new_owner=st.sampled_from(OWNERS), lease=st.sampled_from(sorted(LEASES)))
    def renew_after_a_rescue_and_a_new_claim(self, data: st.DataObject, new_owner: str, lease: str) -> None:
        """The dangerous stale renewal, reached in one step rather than left to chance: a job
        of its own type whose short lease ran out is rescued (due at once) and claimed again,
        by either owner; a renewal naming the old token says it is lost and changes nothing
        (the new lease keeps its expiry), and one naming both pushes only the new one."""
        if not any(job.job_type == REVIVED and job.status == "pending" for job in self.model.values()):
            before = len(self.model)
            self.insert([(REVIVED, 5, 3, -100.0)], duplicate=False)
            if len(self.model) == before:
                return  # enough pending already
        held = len(self.held)
        self.claim({REVIVED: 1}, "w1", "short")
        if len(self.held) == held:
            return  # none of its type is due (one waits out a backoff)
        old = self.held[-1]
        self._rescue(0.0, set())
        if self.model[old.id].status != "pending":
            return  # out of attempts: dead, not claimed again
        self.claim({REVIVED: 1}, new_owner, lease)
        new = self.held[-1]
        if new.id != old.id:
            return  # another job of its type (revived) was due before it
        assert new.token != old.token
        event(f"reclaimed by {'the same' if new_owner == 'w1' else 'another'} owner")
        before_record = self.get(old.id)
        assert self.renew_call("w1", [(old.id, old.token)], FAR) == [old.id], "a stale token was renewed"
        assert self.get(old.id) == before_record, "a renewal with a stale token changed the job (its lease's expiry)"
        if data.draw(st.booleans()):
            assert self.renew_call(new_owner, [(old.id, old.token), (new.id, new.token)], FAR) == [old.id]
            job = self.model[new.id]
            job.lease, job.expires_by = "long", time.time() + FAR

    @rule(data=st.data(), base=st.sampled_from([0.0, FAR]))
    def rescue(self, data: st.DataObject, base: float) -> None:
        # the leases the caller still holds: not rescued, whoever owns them
        current = sorted({(lease.id, lease.token) for lease in self.held if self.is_current(lease)})
        spare = set(data.draw(st.lists(st.sampled_from(current), unique=True) if current else st.just([])))
        self._rescue(base, spare)

    def _rescue(self, base: float, spare: set[tuple[str, int]]) -> None:
        running = {job_id: job for job_id, job in self.model.items() if job.status == "running"}
        short = [job.expires_by for job in running.values() if job.lease == "short"]
        if short:
            wait = max(short) + SLACK - time.time()
            if wait > 0:
                time.sleep(wait)  # every short lease has run out; no long one will
        before = time.time()
        moved = self.call(self.backend.rescue_expired, base_seconds=base, spare=spare)
        after = time.time()
        expected = [job_id for job_id, job in running.items() if job.lease == "short" and (job_id, job.token) not in spare]
        assert moved == len(expected)
        if any(job.lease == "short" and (job_id, job.token) in spare for job_id, job in running.items()):
            event("rescue: an expired lease the caller still holds")
        for job_id in expected:
            job = self.model[job_id]
            started = job.started
            self.finish(job)
            got = self.get(job_id)
            if not started:  # claimed ahead, never started: back in its place, nothing counted
                job.status = "pending"
                event("rescue: a job that never started")
                continue
            assert got is not None and isinstance(got.error, str) and "lease" in got.error
            job.error = got.error
            if job.attempts >= job.max_attempts:
                job.status = "dead"
                event("rescue: out of attempts")
            else:
                job.status = "pending"
                backoff = base * 2 ** (job.attempts - 1)
                self.adopt_run_after(job_id, before + backoff * LOW, after + backoff * HIGH)
                event(f"rescue: backoff after attempt {job.attempts}" if base else "rescue: due at once")

    # -- operators (one rule: the worker side should get most of the steps) ---------------------

    @rule(data=st.data(), action=st.sampled_from(["revive", "delete", "cleanup"]), unknown=st.booleans())
    def operator(self, data: st.DataObject, action: str, unknown: bool) -> None:
        if action == "cleanup":
            statuses = data.draw(st.sampled_from([("completed",), ("dead",), ("completed", "dead")]))
            self.cleanup(statuses, older=data.draw(st.sampled_from([None, FAR])))
        elif unknown or not self.model:
            with pytest.raises(LookupError):
                self.call(getattr(self.backend, action), self.new_id())
        else:
            # a job of any status there is, drawn by status first: dead and running ones are the few that matter
            status = data.draw(st.sampled_from(sorted({job.status for job in self.model.values()})))
            job_id = data.draw(st.sampled_from(sorted(i for i, job in self.model.items() if job.status == status)))
            (self.revive if action == "revive" else self.delete)(job_id)

    def revive(self, job_id: str) -> None:
        job = self.model[job_id]
        before_record = self.get(job_id)
        before = time.time()
        try:
            revived = self.call(self.backend.revive, job_id)
        except UsageError:
            assert job.status != "dead", "a dead job was not revived"
            assert self.get(job_id) == before_record
            return
        after = time.time()
        assert job.status == "dead", f"a {job.status} job was revived"
        assert (revived.status, revived.attempts) == ("pending", 0)
        job.status, job.attempts, job.error = "pending", 0, ANY
        self.adopt_run_after(job_id, before, after)

    def delete(self, job_id: str) -> None:
        try:
            self.call(self.backend.delete, job_id)
        except UsageError:
            assert self.model[job_id].status == "running", "a job that is not running was not deleted"
            return
        assert self.model[job_id].status != "running", "a running job was deleted"
        del self.model[job_id]

    def cleanup(self, statuses: tuple[str, ...], older: float | None) -> None:
        deleted = self.call(self.backend.cleanup, statuses=statuses, older_than_seconds=older)
        doomed = [] if older is not None else [job_id for job_id, job in self.model.items() if job.status in statuses]
        assert deleted == len(doomed)
        for job_id in doomed:
            del self.model[job_id]

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def the_backend_holds_what_the_model_says(self) -> None:
        records, total = self.call(self.backend.list, limit=100_000)
        assert total == len(records) == len(self.model), "jobs appeared or disappeared"
        found = {r.id: r for r in records}
        assert set(found) == set(self.model)
        for job_id, job in self.model.items():
            r = found[job_id]
            assert (r.status, r.attempts) == (job.status, job.attempts), (job_id, r, job)
            assert (r.job_type, r.priority, r.max_attempts, r.payload) == (job.job_type, job.priority, job.max_attempts,
                                                                            job.payload)
            assert r.run_after == job.run_after, (job_id, r.run_after, job.run_after)
            assert 0 <= r.attempts <= r.max_attempts
            if job.status == "running":
                assert r.lease_owner == job.owner
            if job.error is ANY:
                job.error = r.error
            assert r.error == job.error, (job_id, r.error, job.error)
        by_status = self.call(self.backend.stats)["by_status"]
        assert {k: v for k, v in by_status.items() if v} == dict(Counter(job.status for job in self.model.values()))


for _name in BACKENDS:
    _machine = type(f"BackendVsModel_{_name}", (BackendVsModel,), {"backend_name": _name})
    _case = _machine.TestCase
    _case.settings = settings(
        max_examples=10, stateful_step_count=20, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    globals()[f"TestBackendVsModel_{_name}"] = _case
del _name, _machine, _case  # unittest classes are collected under any name: only the Test* one stays
