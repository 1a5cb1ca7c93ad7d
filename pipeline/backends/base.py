"""The one boundary between the engine and where job state lives: the ``Backend`` protocol.

The actors (Enqueuer, Poller, handler pools, lease keeper), the CLI and the admin API touch
job state only through these methods; a backend passes tests/backends/, the conformance
suite, or it is not a backend. The engine gives every write what it needs to be fenced
and ordered the same way on any store:

* a job is inserted ``pending`` with an id (UUID v7 text) chosen by the engine;
* a claim turns due ``pending`` jobs of each requested type into ``running`` under an
  owner and a lease, with a new fencing token, in the order priority ASC, then run_after,
  then id; the attempt counts (attempts + 1) for the jobs that start at once, and, for the
  jobs claimed ahead of a free worker, only when a START outcome says they started;
* every outcome names ``(id, token)`` and changes the row only while it is ``running``
  with that token: a stale outcome (the lease expired and the job was rescued, claimed by
  someone else, or finished) changes nothing and says so;
* leases are renewed from a thread (:class:`LeaseRenewer`) so that a blocked event loop
  cannot starve them;
* a lease that expired is rescued: back to ``pending`` after a backoff, or ``dead`` when
  out of attempts; a job that never started goes back to ``pending`` with nothing counted.

Times are ISO 8601 UTC text with milliseconds (``clock.format_ts``), so they sort as text.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import attrs
import trio

from ..clock import now_ts
from ..config import masked_url
from ..errors import CommitUnknown, StoreError, UsageError
from ..schedules import Schedule, next_tick
from ..states import Transition

# The priorities every backend keeps exactly and in order: SQLite and Postgres store 64 bits,
# but Redis orders by a ZSET score, a double (exact to 2**53); 32 bits is also what the admin
# API and the CLI have always taken, and what a browser's JavaScript shows as it is.
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1
PRIORITY_DEFAULT = 5  # a job enqueued without one; lower runs first

# Backend.list's orders: newest first (by id), or the order a claim takes pending jobs in
LIST_ORDERS = ("newest", "claim")


def check_list_order(order: str) -> str:
    if order not in LIST_ORDERS:
        raise UsageError(f"unknown order {order!r}; expected one of {', '.join(LIST_ORDERS)}")
    return order


class NewJob(NamedTuple):
    """A job to insert, already validated and encoded by the engine. (A tuple: a bulk load
    makes one per line, and a batch goes to the driver as it is.)"""

    id: str
    job_type: str
    payload: str  # canonical JSON of the job's class
    max_attempts: int
    run_after: str  # when it is due; the insert's created_at when not delayed
    priority: int  # lower runs first
    created_at: str
    # while a job of this type and key is pending or running, inserting another one inserts
    # nothing and answers that job's id (see Backend.insert); None: no such promise. Never
    # empty (requests.check_unique_key: Redis stores "no key" as the empty string)
    unique_key: str | None = None
    # the trace context of the code that enqueued it (W3C ``traceparent``, then a space and the
    # ``tracestate`` if there is one: see pipeline/otel.py), handed back in its Lease; None: none.
    # Stores insert rows without one (and without a unique key) with their statement of old.
    trace: str | None = None
    # when a job not started by then is never started: the claim (and the rescue, for jobs nobody
    # claims) ends it ``cancelled`` with :func:`expired_error` instead; None: no such limit
    expires_at: str | None = None
    # per-key limits (Backend.claim's key_limits): the key this job counts under (a tenant, an
    # account), or None: the job is not limited by key
    limit_key: str | None = None
    # how long the unique key is held: None while pending or running (the default); "pending": only
    # while pending: the claim frees it, so an enqueue made while the job runs inserts a new one. A job
    # of this kind sent back to pending (retry, release, snooze, rescue) holds its key again only if no
    # other pending or running job took it meanwhile; otherwise it goes on without holding it
    unique_while: str | None = None
    # workflows (docs/workflows.md): the ids of the jobs this one waits for (its parents), each an
    # existing job of the store or a job EARLIER in the same insert call (so no call can make a cycle).
    # With parents the job is inserted ``waiting`` (see Backend.insert); () : none, inserted pending
    after: tuple[str, ...] = ()
    # what a parent that ends dead or cancelled (or is deleted) does to this job while it waits:
    # None (the default, "cancel"): it ends cancelled, its error naming the parent (:func:`parent_failed`),
    # and so do its own waiting descendants that follow the default; "run": the parent counts as
    # done (as a completed one does), so the job still runs once every parent has ended
    on_parent_failure: str | None = None
    # the batch (NewBatch.id) this job belongs to: a member, or the batch's callback (NewBatch.callback_id)
    batch_id: str | None = None
    # the caller's idempotency key (enqueue's idempotency_key=): while a key of this type was recorded
    # less than ``idempotency_seconds`` ago, whatever became of its job since, inserting nothing and
    # answering the recorded job's id; else the job is inserted (or held by its unique key) and the
    # key recorded for the id answered. Kept in a table (Redis: a key) of its own, which outlives
    # the job: see Backend.insert. None: no key
    idempotency_key: str | None = None
    idempotency_seconds: float = 86_400.0  # JOB_IDEMPOTENCY_SECONDS, as the engine read it


UNIQUE_WHILE = ("pending_or_running", "pending")  # the enqueue's unique_while=, the first the default


ON_PARENT_FAILURE = ("cancel", "run")  # NewJob.on_parent_failure's values, the first the default (stored None)
MAX_LISTED_RELATIVES = 100  # JobRecord.parents/children hold at most this many ids (the counts say how many in all)


class NewBatch(NamedTuple):
    """A batch to record with its jobs in one :meth:`Backend.insert` call: every job of the call
    whose ``batch_id`` is ``id`` is a member, except ``callback_id`` (None: no callback), the job
    that runs once every member has ended. The engine makes the callback wait for every member
    (its ``after`` lists them all) with ``on_parent_failure="run"``: so it is released exactly once,
    by the transaction (or script) that ends the last member, like any child."""

    id: str
    callback_id: str | None
    created_at: str


class ParentResult(NamedTuple):
    """A parent's result as :meth:`Backend.parent_results` reads it: its job type (whose ``returns``
    reads the result back: Registry.decode_result) and its result."""

    job_type: str
    result: str | None  # JSON text of a completed job's result (None: none)


class BatchMember(NamedTuple):
    """One job of a batch as :meth:`Backend.batch_jobs` reads it (ctx.batch(), the admin API)."""

    id: str
    job_type: str
    status: str
    result: str | None  # JSON text of a completed job's result (None: none)
    error: str | None


@attrs.frozen
class BatchRecord:
    """A batch as operators see it: its members' statuses counted."""

    id: str
    callback_id: str | None
    created_at: str
    total: int  # members (the callback not counted)
    counts: Mapping[str, int]  # members by status (only the statuses that occur)
    callback_status: str | None = None  # the callback's status (None: no callback, or it was deleted)

    @property
    def finished(self) -> int:
        return sum(n for status, n in self.counts.items() if status in ("completed", "dead", "cancelled"))

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "callback_id": self.callback_id, "callback_status": self.callback_status,
                "created_at": self.created_at, "total": self.total, "finished": self.finished,
                "counts": dict(self.counts)}


def parent_failed(parent_id: str, how: str) -> str:
    """The error of a waiting job cancelled because a parent of its ended dead or cancelled, or was
    deleted (``how``: "dead", "cancelled", "deleted"); every store writes this text."""
    return f"cancelled while waiting: its parent job {parent_id} ended {how}" if how != "deleted" else (
        f"cancelled while waiting: its parent job {parent_id} was deleted")


def check_after(jobs: Sequence[NewJob]) -> None:
    """UsageError unless every job's dependencies (``after``, ``on_parent_failure``, ``batch_id``) are
    well formed for one insert call: parent ids are non-empty text, none repeated, none the job itself
    nor a job LATER in the call (a parent comes before its children: this is what rules out a cycle),
    and a parent in the same call has no unique key (it might not be inserted). Whether a parent not
    in the call exists is the store's to check, in the insert's transaction. Pure; every store's
    insert calls it when a job has parents."""
    position = {job.id: i for i, job in enumerate(jobs)}
    for i, job in enumerate(jobs):
        if job.on_parent_failure is not None and job.on_parent_failure not in ON_PARENT_FAILURE[1:]:
            raise UsageError(f"on_parent_failure must be one of {', '.join(map(repr, ON_PARENT_FAILURE))}, "
                             f"got {job.on_parent_failure!r:.40}")
        if not job.after:
            if job.on_parent_failure is not None:
                raise UsageError(f"job {job.id}: on_parent_failure is given without after: it says what a parent's failure does")
            continue
        if type(job.after) is not tuple:
            raise UsageError(f"job {job.id}: after must be a tuple of job ids, got {type(job.after).__name__}")
        seen: builtins.set[str] = builtins.set()
        for parent in job.after:
            if type(parent) is not str or not parent:
                raise UsageError(f"job {job.id}: after must hold job ids (non-empty text), got {parent!r:.60}")
            if parent in seen:
                raise UsageError(f"job {job.id}: after names job {parent} twice")
            seen.add(parent)
            if parent == job.id:
                raise UsageError(f"job {job.id}: after names the job itself: a job cannot wait for itself (a cycle)")
            at = position.get(parent)
            if at is not None and at > i:
                raise UsageError(f"job {job.id}: after names job {parent}, which comes later in the same call: "
                                 "parents come before their children (this is what rules out a cycle)")
            if at is not None and (jobs[at].unique_key is not None or jobs[at].idempotency_key is not None):
                which = "a unique key" if jobs[at].unique_key is not None else "an idempotency key"
                raise UsageError(f"job {job.id}: after names job {parent} of the same call, which has {which}: "
                                 "it might not be inserted; enqueue it first, then wait for the id it answers")


def lost(error: StoreError) -> StoreError:
    """Marks a driver's connection error (the server unreachable, or the connection dropped): a
    command sent on it may have run, its answer lost. An attribute, not a subclass: the Ledgers hand
    each caller of a failed batch a copy of its error (replies._own_copy), which keeps it."""
    error.connection_lost = True  # type: ignore[attr-defined]
    return error


def connection_lost(error: BaseException) -> bool:
    return bool(getattr(error, "connection_lost", False))


ASK_AGAIN_TRIES = 5  # looks at the store for an insert whose answer a dropped connection lost
ASK_AGAIN_PAUSE = 0.5  # seconds between them (the pool reconnects meanwhile)


def asked_again(rows: Sequence[NewJob], found: Sequence[tuple[bool, str | None]]) -> builtins.list[str] | None:
    """What an insert whose answer was lost did, from what the store holds now: ``found``, per row,
    whether its id is stored and the id its idempotency key (else its unique key) names now (None:
    none). One transaction wrote the rows or none: a row stored means it committed, and each row
    not stored was held by its key (the id it names answers). No row stored: it did not commit, if
    a row without a key was in it (that row would be stored): None. With keys only, either way the
    keys answer what a retry would, unless one names nothing: then nothing was written (None)."""
    if any(stored for stored, _ in found):
        return [row.id if stored else (named or row.id) for row, (stored, named) in zip(rows, found)]
    if found and all(named is not None for _, named in found):
        return [named for _, named in found if named is not None]
    return None


def commit_unknown(rows: Sequence[NewJob], lost: BaseException, shown: str,
                   why: str = "the store could not be asked again") -> CommitUnknown:
    """The error of an insert whose commit the store dropped and whose outcome asking again could not
    learn (``why``: the store still unreachable, or the server session that ran it could not be ended):
    it may have been committed; how to check; what makes a retry safe."""
    first = rows[0].id if rows else "?"
    return CommitUnknown(
        f"{shown}: the connection dropped during the commit of {len(rows)} job{'s' if len(rows) != 1 else ''} "
        f"({str(lost).splitlines()[0] if str(lost) else type(lost).__name__}), and {why}"
        f": they may have been committed (all or none). Before enqueueing again, check whether job {first} "
        f"exists (`python -m pipeline jobs show {first}`, Client.get, GET /admin/jobs/{first}); an enqueue with an "
        "idempotency_key can be sent again safely instead (docs/jobs.md, \"Retrying an enqueue safely\")",
        tuple(row.id for row in rows))


def unknown_parents(missing: Iterable[str]) -> UsageError:
    """What an insert raises (writing nothing) when parents named in ``after`` are not in the store."""
    missing = sorted(builtins.set(missing))
    shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    return UsageError(f"unknown parent job{'s' if len(missing) > 1 else ''} in after: {shown} "
                      "(never enqueued, or deleted by an operator or by retention); nothing was enqueued")


@attrs.frozen
class Lease:
    """What a worker holds for a claimed job; every outcome is fenced by ``(id, token)``."""

    id: str
    job_type: str
    payload: str
    attempts: int  # including this one
    max_attempts: int
    token: int
    created_at: str
    run_after: str
    # False for a job claimed ahead of a free worker: its attempt is counted (a START
    # outcome) only when it starts, so a job that never started is never charged one
    started: bool = True
    trace: str | None = None  # NewJob.trace, as inserted
    # NewJob.expires_at: a job claimed ahead that its worker takes after this time never starts
    # (its worker ends it cancelled, expired_error); None: it never expires
    expires_at: str | None = None


# a suspended job with no deadline (ctx.wait_for without a timeout) is due at this time: never, in practice
FOREVER = "9999-12-31T23:59:59.999Z"
STEP_STATUSES = ("completed", "waiting", "timed_out")


@attrs.frozen
class StepRecord:
    """One step of a durable job (docs/durable.md) as the store keeps it: a row per (job, name),
    written by a STEP or SUSPEND settlement or by :meth:`Backend.take_signal`, replaced whole when
    written again under the same name (keeping its place in the order). The engine decides what the
    names and values mean (a ``ctx.step``'s value; a sleep's or a wait's record); the store keeps
    them, returns them in the order first written (:meth:`Backend.steps`, ``JobRecord.steps``) and
    removes them with their job (delete, cleanup, retention) or by a replay (:meth:`Backend.revive`)."""

    name: str
    # STEP_STATUSES: "completed"; "waiting": a ctx.wait_for's record while its signal has not come; "timed_out":
    # one whose timeout passed first. Stores keep the text as given
    status: str
    value: str | None  # JSON text (None: none)
    started_at: str
    ended_at: str | None = None

    def to_json(self) -> dict[str, Any]:
        try:
            value: Any = None if self.value is None else json.loads(self.value)
        except ValueError:
            value = self.value
        return {"name": self.name, "status": self.status, "value": value, "started_at": self.started_at,
                "ended_at": self.ended_at}


@attrs.frozen
class Settlement:
    """One outcome to write. ``transition`` is one of SUCCEED, RETRY, BURY, RELEASE, START,
    CANCEL, SNOOZE; RETRY is due ``delay`` seconds after the write; RELEASE is due at once and
    gives back the attempt if it was counted (a graceful stop, a job that never started); START
    counts the attempt of a job claimed ahead, which keeps running under its lease.

    SUCCEED stores ``result`` (JSON text, or None) as the job's result. CANCEL: running →
    cancelled with ``error`` (its cancel was requested; final, never retried). SNOOZE: running →
    pending, due ``delay`` seconds after the write, the attempt given back as RELEASE gives it
    back, the job's ``snoozes`` + 1; but when that count would exceed ``snooze_limit``, → dead
    with ``error`` instead (the engine writes the text: :func:`snoozed_too_often`)."""

    id: str
    token: int
    transition: Transition
    error: str | None = None
    delay: float = 0.0
    result: str | None = None
    snooze_limit: int = 0
    # durable functions (docs/durable.md): STEP writes ``step`` (upserted by name: see StepRecord) while the
    # job keeps running; SUSPEND writes ``step`` if given, in the same transaction, then: if ``awaiting``
    # (a signal name) names a signal sent to the job and not consumed yet, the job goes pending due now
    # (nothing waits); else running → ``suspended``, due ``delay`` seconds after the write (math.inf: no
    # deadline, run_after = FOREVER), ``awaiting_signal`` = ``awaiting``. Either way the attempt is given
    # back as RELEASE gives it back, the lease cleared, ``expires_at`` cleared (it applies to the first
    # start only), ``snoozes`` unchanged; limit slots are freed as for any job that stops running; a
    # unique key stays held (a suspended job holds it as a pending one does)
    step: StepRecord | None = None
    awaiting: str | None = None


@attrs.frozen
class JobRecord:
    """One job as operators see it."""

    id: str
    job_type: str
    payload: str
    status: str
    attempts: int
    max_attempts: int
    run_after: str
    error: str | None
    created_at: str
    updated_at: str
    priority: int
    lease_owner: str | None = None
    lease_expires_at: str | None = None
    unique_key: str | None = None
    result: str | None = None  # a completed job's handler's return value, JSON text (None: none)
    progress: float | None = None  # 0..1, the last the handler reported (ctx.progress)
    progress_message: str | None = None
    snoozes: int = 0  # times it raised Snooze
    expires_at: str | None = None  # NewJob.expires_at
    cancel_requested: bool = False  # running, and asked to stop (Backend.cancel)
    limit_key: str | None = None  # NewJob.limit_key
    # workflows (read by Backend.get; Backend.list may leave parents/children empty and the counts 0):
    parents: tuple[str, ...] = ()  # the jobs it waits or waited for (after=), at most MAX_LISTED_RELATIVES
    parent_count: int = 0  # all of them
    waiting_for: int = 0  # while waiting: parents that have not ended yet (or not completed, under "cancel")
    children: tuple[str, ...] = ()  # the jobs that wait or waited for it, at most MAX_LISTED_RELATIVES
    child_count: int = 0
    batch_id: str | None = None  # NewJob.batch_id
    on_parent_failure: str | None = None  # NewJob.on_parent_failure (None: "cancel")
    # durable functions: while suspended in ctx.wait_for, the signal's name (None otherwise)
    awaiting_signal: str | None = None
    # its steps in the order first written (read by Backend.get; Backend.list leaves them empty)
    steps: tuple[StepRecord, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The fields of ``--json`` and the admin API; payload as an object, in which a URL's
        password is shown masked (a webhook URL with credentials in it: the handler gets it
        whole, no person does)."""
        try:
            payload: Any = json.loads(self.payload)
        except ValueError:
            payload = self.payload  # a malformed row still shows what it holds
        try:
            result: Any = None if self.result is None else json.loads(self.result)
        except ValueError:
            result = self.result
        progress = None if self.progress is None else {"fraction": self.progress, "message": self.progress_message}
        return {
            "id": self.id,
            "job_type": self.job_type,
            "payload": _passwords_masked(payload),
            "status": self.status,
            "attempts": self.attempts,
            "max_attempts": self.max_attempts,
            "run_after": self.run_after,
            "error": self.error,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "priority": self.priority,
            "unique_key": self.unique_key,
            "result": result,
            "progress": progress,
            "snoozes": self.snoozes,
            "expires_at": self.expires_at,
            "cancel_requested": self.cancel_requested,
            "limit_key": self.limit_key,
            "parents": list(self.parents),
            "parent_count": self.parent_count,
            "waiting_for": self.waiting_for,
            "children": list(self.children),
            "child_count": self.child_count,
            "batch": self.batch_id,
            "on_parent_failure": self.on_parent_failure or ON_PARENT_FAILURE[0],
            "awaiting_signal": self.awaiting_signal,
            "steps": [step.to_json() for step in self.steps],
        }


def expired_error(expires_at: str) -> str:
    """The error of a job that was not started by its ``expires_at`` (every store writes this text)."""
    return f"expired at {expires_at} before it (or its next attempt) started"


def cancelled_error(reason: str) -> str:
    """The error of a job cancelled while pending (by an operator, a client): ``reason`` says who."""
    return f"cancelled before it started: {reason}"


def cancelled_running_error(reason: str) -> str:
    """The error of a running job whose cancel was requested and whose worker died before it
    stopped it (the rescue ends it, every store with this text)."""
    return f"cancelled while running ({reason}); its worker stopped renewing its lease before it ended"


def signal_refused(job_id: str, status: str) -> str:
    """The UsageError's text when a signal is sent to a finished job (every store writes this text)."""
    return f"job {job_id} is {status}: a finished job takes no signal"


def snoozed_too_often(limit: int) -> str:
    return (f"snoozed more than WORKER_MAX_SNOOZES={limit} times: a job that snoozes for ever is ended here; "
            "raise the limit or fix the handler's condition, then retry it")


# What Backend.cancel answers per id, besides a final status left as it was
CANCELLING = "cancelling"  # it runs: the request is stored, its worker stops it


def unique_key_held(job: JobRecord, holder: str) -> str:
    """Why a dead job cannot be revived: another job took its unique key meanwhile."""
    return (f"job {job.id} cannot be retried: its unique key {job.unique_key!r} (type {job.job_type}) is held by job "
            f"{holder}, which is pending or running; retry it once that job has finished")


def _passwords_masked(value: Any) -> Any:
    """A payload with every URL's password masked: the strings holding ``://`` and ``@``."""
    if isinstance(value, str):
        return masked_url(value) if "://" in value and "@" in value else value
    if isinstance(value, dict):
        return {key: _passwords_masked(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_passwords_masked(item) for item in value]
    return value


@attrs.frozen
class WorkerRecord:
    """A worker process as the store's registry knows it (its heartbeat writes it)."""

    owner: str  # host:pid:nonce, as in the leases it holds
    job_types: tuple[str, ...]  # the types it handles
    heartbeat_at: str
    alive: bool  # it beat within its own lease

    def to_json(self) -> dict[str, Any]:
        return {"owner": self.owner, "job_types": list(self.job_types), "heartbeat_at": self.heartbeat_at, "alive": self.alive}


@attrs.frozen
class ScheduleRecord:
    """A cron schedule as the store keeps it (see pipeline/schedules.py). ``next_run`` is the tick
    it fires next (stored text, UTC): ``fire_schedule`` moves it on, fenced by its old value.
    ``origin`` is "code" (declared by the application, written at start) or "operator" (the CLI,
    the admin API); ``declared`` is False for a code schedule its code no longer declares (it is
    then disabled: see :func:`merge_declared`)."""

    name: str
    job_type: str
    payload: str  # canonical JSON of the job's class
    cron: str
    timezone: str
    enabled: bool
    origin: str
    next_run: str
    last_run: str | None = None  # the tick last fired
    last_job_id: str | None = None  # the job it enqueued
    declared: bool = True
    created_at: str = ""
    updated_at: str = ""

    @classmethod
    def of(cls, schedule: Schedule, *, origin: str, now: str | None = None) -> ScheduleRecord:
        """A declared schedule (code's or an operator's) as the store keeps it, its next run the
        first tick after ``now``."""
        now = now or now_ts()
        return cls(name=schedule.name, job_type=schedule.job_type, payload=schedule.payload, cron=schedule.cron,
                   timezone=schedule.timezone, enabled=True, origin=origin,
                   next_run=next_tick(schedule.cron, schedule.timezone, now), created_at=now, updated_at=now)

    def to_json(self) -> dict[str, Any]:
        try:
            payload: Any = json.loads(self.payload)
        except ValueError:
            payload = self.payload
        state = "active" if self.enabled else ("paused" if self.declared or self.origin != "code" else "removed from code")
        return {
            "name": self.name, "cron": self.cron, "timezone": self.timezone, "job_type": self.job_type,
            "payload": _passwords_masked(payload), "enabled": self.enabled, "state": state, "origin": self.origin,
            "next_run": self.next_run, "last_run": self.last_run, "last_job_id": self.last_job_id,
            "created_at": self.created_at, "updated_at": self.updated_at,
        }


def merge_declared(stored: ScheduleRecord | None, declared: ScheduleRecord, *, now: str) -> ScheduleRecord | None:
    """What a schedule declared in code makes of the stored one of that name; None: nothing to
    write. Its definition is the code's; its timing (next_run) is kept while the cron expression
    and the time zone are the same, so that processes starting at once do not move a tick; a
    pause an operator made is kept; one that was disabled because it left the code is enabled again."""
    if stored is None:
        return declared
    back = stored.origin == "code" and not stored.declared
    timing = stored.cron == declared.cron and stored.timezone == declared.timezone and not back
    merged = attrs.evolve(
        stored, job_type=declared.job_type, payload=declared.payload, cron=declared.cron, timezone=declared.timezone,
        origin="code", declared=True, enabled=True if back else stored.enabled,
        next_run=stored.next_run if timing else declared.next_run,
    )
    return None if merged == stored else attrs.evolve(merged, updated_at=now)


def retired(stored: ScheduleRecord, *, now: str) -> ScheduleRecord:
    """A code schedule its code no longer declares: disabled, not left firing (nor deleted: its
    history stays, and declaring it again enables it)."""
    return attrs.evolve(stored, enabled=False, declared=False, updated_at=now)


def code_schedule_writes(
    stored: Mapping[str, ScheduleRecord], declared: Sequence[ScheduleRecord], *, now: str,
    owned: Collection[str] | None = None,
) -> list[ScheduleRecord]:
    """What a start writes for the schedules its code declares, given those stored by name: each
    declared one merged with the stored one (:func:`merge_declared`), and every code schedule
    the code no longer declares retired, if its job type is ``owned`` (None: any). The same on
    every backend; each writes the list in one transaction (or one WATCHed MULTI)."""
    writes = [merged for merged in (merge_declared(stored.get(r.name), r, now=now) for r in declared) if merged is not None]
    names = {r.name for r in declared}
    writes += [retired(r, now=now) for r in stored.values()
               if r.origin == "code" and r.declared and r.name not in names and (owned is None or r.job_type in owned)]
    return writes


def with_enabled(found: ScheduleRecord, enabled: bool, *, now: str) -> ScheduleRecord:
    """Paused, or resumed from the first tick after now (the pause's ticks are not made up)."""
    next_run = next_tick(found.cron, found.timezone, now) if enabled else found.next_run
    return attrs.evolve(found, enabled=enabled, next_run=next_run, updated_at=now)


@attrs.frozen
class ClaimOffer:
    """Free worker capacity the Poller offers to the next batch that makes work due: a
    backend that can claim in the same transaction as an insert (SQLite's Ledger) takes
    it and answers with a :class:`Claimed` on the Poller's nudge channel, so a job written
    by this process starts as soon as its insert commits. One offer is out at a time; the
    Poller takes back one that was not taken before it claims on its own."""

    wants: Mapping[str, int]
    owner: str
    lease_seconds: float
    start: Mapping[str, int] | None = None  # as Backend.claim's
    limits: Mapping[str, int] | None = None  # as Backend.claim's
    rates: Mapping[str, tuple[int, float]] | None = None  # as Backend.claim's
    key_limits: Mapping[str, int] | None = None  # as Backend.claim's


@attrs.frozen
class Claimed:
    """The answer to a :class:`ClaimOffer` (no leases if the batch failed)."""

    offer: ClaimOffer
    leases: list[Lease]


# What the Poller hears on its nudge channel: None for "work may be due, or a pool has
# room: look again", or the answer to its offer. The channel holds three messages: nudges
# are sent only while fewer than two wait (see nudge), and one offer is out at a time, so
# an answer always fits, and a nudge always follows an answer waiting ahead of it (an
# answer that came back short does not send the Poller to claim).
Nudge = Claimed | None
NUDGE_BUFFER = 3


def nudge(send: trio.MemorySendChannel[Nudge]) -> None:
    """Tell the Poller to look again, unless a nudge already waits for it."""
    if send.statistics().current_buffer_used >= NUDGE_BUFFER - 1:
        return
    try:
        send.send_nowait(None)
    except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # already nudged, or the Poller has stopped


class HealthReport(Protocol):
    """Where a backend's own actors (the server backends' wake-up listener) say what they cannot
    do right now, for ``/healthz`` (the engine's ``Health``: the stores import nothing from the engine)."""

    def report(self, part: str, reason: str) -> None: ...

    def clear(self, part: str) -> None: ...


class Topology(Protocol):
    """Where a backend records the channels it creates and the edges it adds, for the actors'
    diagram (the engine's ``diagrams.Wiring``)."""

    def channel(self, src: str, dst: str, label: str, size: int, *, size_label: str | None = None) -> tuple[Any, Any]: ...

    def edge(self, src: str, dst: str, label: str) -> None: ...


class LeaseRenewer(Protocol):
    """Blocking calls for the lease heartbeat's OS thread (one connection of its own)."""

    def renew(self, owner: str, job_types: Sequence[str], held: Sequence[tuple[str, int]], *, lease_seconds: float) -> list[str]:
        """Record ``owner`` as a live worker knowing ``job_types``, push the expiry of the
        leases ``held`` (id, token) to now + ``lease_seconds``; return the ids whose lease
        is no longer held (the job changed hands or finished)."""

    def forget(self, owner: str) -> None:
        """``owner`` stopped: remove it from the worker registry."""

    def close(self) -> None: ...


class Backend(Protocol):
    """Where job state lives. Every method may raise StoreError (the store refused or is
    unreachable: try again) and PipelineClosed (the backend is closing)."""

    url: str  # DATABASE_URL with any password masked: the one to show in logs and pages

    # -- producing --------------------------------------------------------------------------

    async def insert(self, jobs: Sequence[NewJob], *, batch: NewBatch | None = None) -> builtins.list[str]:
        """Commit every job, or none (a duplicate id fails the whole call). Returns, per job,
        the id stored for it: its own, or, for a job with a ``unique_key`` whose type and key
        a waiting, pending or running job already holds, that job's id (nothing is inserted for it;
        two jobs of one type and key in one call: the first is inserted). The store itself
        enforces the key, so concurrent inserts from any number of processes agree.

        Workflows (docs/workflows.md). A job with ``after`` (checked by :func:`check_after`) is
        inserted with one edge per parent, in the same transaction, each parent read under a lock
        that orders the insert against the parent's own outcome (so that one of the two sees the
        other): a parent that is not in the store nor earlier in the call fails the whole call with
        :func:`unknown_parents` (nothing written). Per parent, as the insert finds it: completed →
        the edge counts at once; dead or cancelled → as if it ended now (below); otherwise the edge
        waits. The job is inserted ``pending`` when every edge counted, ``cancelled`` (finished now,
        error :func:`parent_failed`) when a failed parent cancels it, else ``waiting``: never
        claimed, its ``run_after`` kept (due at once if past when it wakes). A waiting job holds its
        unique key as a pending one does.

        The edges of a parent are applied by the same transaction (or script) that ends it, on every
        path to a final status (settle, rescue, expiry, cancel, bury_unknown_types, delete): each edge
        of the parent that has not counted yet counts once (an edge counts exactly once, whatever
        happens to the parent later: an operator's retry of a dead parent wakes nothing and
        un-cancels nothing). Parent completed, or ended dead/cancelled/deleted under
        ``on_parent_failure="run"``: the child's count of parents not yet ended drops by one, and at
        zero the child, if still waiting, becomes pending (WAKE; waking Pollers as an insert does).
        Parent dead, cancelled or deleted under the default: the child, if still waiting, is
        cancelled (CANCEL_WAITING, :func:`parent_failed`), and its own edges are applied the same
        way, in the same transaction, down the graph. Jobs without children pay nothing for this
        but an indexed look (a store may keep a flag on the parent to skip even that).

        ``batch``: the batch record, written in the same transaction; its members and callback are
        jobs of this call (see :class:`NewBatch`). Batch members never have a unique key (the
        engine refuses one).

        Idempotency keys (``NewJob.idempotency_key``, docs/jobs.md "Retrying an enqueue safely"):
        a row whose type and key were recorded less than the key's window ago is not inserted and
        answers the recorded id, whatever its job's status (even once retention removed it); two
        rows of one call with one type and key: the first is inserted, the second answers its id.
        Otherwise the row is inserted (or held by its unique key) and its type and key recorded,
        in the same transaction, for the id it answers. The store enforces it (a primary key, a
        script), so concurrent callers in any number of processes leave one job; a key past its
        window is recorded again by the next insert naming it, and expired keys are removed (by
        the inserts with keys, a few each, or by the server's expiry)."""

    async def bulk_insert(
        self, jobs: Iterable[NewJob], *, commit_every: int | None = None,
        duplicates: builtins.list[tuple[str, str]] | None = None,
    ) -> int:
        """Insert an iterable too big to hold, in one transaction (or one per
        ``commit_every`` jobs); the iterable is consumed in a worker thread and may raise
        (a bad line): nothing of the open transaction is kept. Returns the jobs committed.
        A job whose unique key is held (as in :meth:`insert`) is skipped: not committed nor
        counted, and (its id, the holder's id) appended to ``duplicates`` if given. Jobs with
        ``after`` are inserted as :meth:`insert` inserts them (a parent may be an earlier job of
        the iterable: committed already, or in the open transaction); an unknown parent fails the
        call like a bad line."""

    # -- the worker side ----------------------------------------------------------------------

    async def claim(
        self, wants: Mapping[str, int], *, owner: str, lease_seconds: float, start: Mapping[str, int] | None = None,
        limits: Mapping[str, int] | None = None, rates: Mapping[str, tuple[int, float]] | None = None,
        key_limits: Mapping[str, int] | None = None,
    ) -> list[Lease]:
        """Claim up to ``wants[job_type]`` due jobs of each type. Of each type the first
        ``start[job_type]`` start at once (their attempt counts now; all of them when
        ``start`` is None); the rest are claimed ahead (``Lease.started`` False, attempts
        unchanged until a START outcome). Started ones first, each part in claim order. The
        lease runs ``lease_seconds`` from the claim's own commit, however long it waited.

        ``limits``: global limits by type. Of a type limited to L, the claim takes at most L
        minus the jobs of that type running now (whoever holds them, claimed-ahead ones
        included), counted and claimed atomically against every other limited claim of that
        type, from any process: the type's running jobs never exceed L through claims. A type
        not in ``limits`` is claimed exactly as without it.

        A paused type (:meth:`set_type_paused`) is not claimed at all. Before it claims, in the
        same transaction or script, every pending job of the requested types whose ``expires_at``
        is at or before now is ended ``cancelled`` with :func:`expired_error`: no expired job is
        ever claimed (an index on the expiring pending jobs keeps this free when none expire).

        ``rates``: (N, window seconds) by type. Of a rate-limited type, the claim takes at most N
        less the starts the store recorded for the type within the last window (from any process),
        and records one start per job it claims (claimed ahead or not: a conservative count), in the
        same transaction or script: no window of that length ever holds more than N claims of the
        type. Records older than the window are dropped as it goes. See :meth:`rate_free_at`.

        ``key_limits``: L by type. Of such a type, at most L jobs with the same ``limit_key`` are
        running at once (whoever holds them), counted and claimed atomically as ``limits``; and the
        due jobs are taken round-robin across keys: one job of each key in turn (keys in the claim
        order of their first due job), then a second of each, and so on, so that one key's backlog
        cannot starve another key. Jobs without a key (None) are one group of their own, not limited."""

    async def rate_free_at(self, job_type: str, limit: int, window_seconds: float) -> float:
        """Seconds until a claim of this rate-limited type may take a job again (0: it may now): the
        Poller waits that long, instead of polling, when a claim came back short."""

    async def settle(self, outcomes: Sequence[Settlement]) -> list[bool]:
        """Write outcomes, each fenced by (id, running, token); one bool per outcome: True
        if it was written, False if its lease was stale and nothing changed. StoreError if
        one could not be written (the others may have been: writing one again answers False)."""

    async def rescue_expired(self, *, base_seconds: float, spare: Collection[tuple[str, int]] = ()) -> int:
        """Running jobs whose lease expired, whoever held it, except the leases ``spare``
        (id, token) that the caller still holds: back to pending after a backoff (the attempt
        counts as failed), or dead when out of attempts; a job that never started back to
        pending, nothing counted; an expired lease whose cancel was requested → cancelled
        (:func:`cancelled_running_error`). Also ends ``cancelled`` every pending job of any type
        whose ``expires_at`` passed (:func:`expired_error`): the jobs nobody claims. Safe to run
        from several processes at once. Returns how many moved. (Every job it ends applies its
        edges, as :meth:`insert` says.)"""

    async def rescue_waiting(self, *, limit: int = 500) -> int:
        """The sweep that keeps the workflow promise "nothing stays waiting once its parents are final"
        whatever happened (a crash mid-way on a store without transactions, a defect, a row restored
        by hand): up to ``limit`` edges that have not counted although their parent is final (or
        gone) are applied now, as :meth:`insert` says (a gone parent as "deleted"), in one
        transaction or script; a waiting job whose count of parents not yet ended is 0 is woken.
        Called by every process once a minute; cheap when there is nothing to do (an index on the
        edges that have not counted). Returns how many jobs it woke or cancelled."""

    async def bury_unknown_types(self, known: Iterable[str], *, grace_seconds: float) -> int:
        """Pending jobs of types neither ``known`` nor known to a live worker, due for
        longer than ``grace_seconds`` → dead, with an error that says why."""

    def lease_renewer(self) -> LeaseRenewer:
        """A renewer for the heartbeat thread, with a connection of its own."""

    # -- operators ----------------------------------------------------------------------------

    async def get(self, job_id: str) -> JobRecord | None: ...

    async def list(
        self, *, status: str | None = None, job_type: str | None = None, limit: int = 50, offset: int = 0,
        priority: int | None = None, order: str = "newest",
    ) -> tuple[list[JobRecord], int]:
        """Newest first (``order="newest"``), or in claim order (``order="claim"``: priority,
        then run_after, then id), with the total that matches the filters; ``priority``
        keeps the jobs of that priority only. UsageError for an unknown status or order.
        ``status="waiting"`` lists the waiting jobs (and :meth:`stats` counts them)."""

    async def stats(self) -> dict[str, Any]:
        """Counts by status and by type; jobs finished per minute over the last hour; the
        age of the oldest due pending job."""

    async def revive(self, job_id: str, *, from_step: str | None = None) -> JobRecord:
        """dead or cancelled → pending, attempts, snoozes, progress and the cancel request reset,
        due now. LookupError if unknown, UsageError if neither dead nor cancelled, or if its
        unique key is held by another pending or running job (named). Its edges are not applied
        again (they counted when it ended): its children stay as they are; a child cancelled
        because of it and revived runs without waiting for it. Its steps are kept (it resumes).

        ``from_step`` (a replay, ``jobs retry ID --from-step NAME``): a completed job may be revived
        too (its result cleared); in the same transaction the step of that name and every step first
        written after it are removed, so that they run again. UsageError naming the job's steps if
        it has none of that name (nothing changed)."""

    # -- durable functions (issue 35; docs/durable.md) ------------------------------------------------

    async def steps(self, job_id: str) -> builtins.list[StepRecord]:
        """The job's steps in the order first written ([] for none, or an unknown job): what a durable
        job reads once as it runs again, and ``jobs show`` shows."""

    async def take_signal(self, job_id: str, token: int, name: str, step: StepRecord) -> tuple[bool, str | None] | None:
        """Fenced like an outcome (running under ``token``; None if not: nothing changed). In one
        transaction or script: the oldest signal named ``name`` sent to the job and not yet consumed is
        marked consumed and ``step`` written with its payload as the value (``attrs.evolve(step,
        value=payload)``): (True, payload); (False, None) if there is none (nothing written)."""

    async def signal(self, job_id: str, name: str, payload: str | None, *, key: str | None = None) -> str:
        """Send the signal ``name`` (``payload``: JSON text, None for none) to a job, in one transaction or
        script: kept for the job (each signal is consumed by one wait, oldest first: see
        :meth:`take_signal`); if the job is ``suspended`` awaiting this name it goes pending due now
        (RESUME, its ``awaiting_signal`` cleared; waking Pollers as an insert does): "woken"; else "kept"
        (a job not yet at its wait consumes it when it gets there). LookupError if the job is unknown;
        ``key``: a signal with this key was sent to this job already (any name) →
        :class:`pipeline.errors.SignalKeyUsed`, nothing written (a signed link's use-once), looked at before
        the job's status (a link pressed again after its signal finished the job is "used", not "finished");
        UsageError (:func:`signal_refused`) if it is completed, dead or cancelled. Signals go with their job
        (delete, cleanup, retention)."""

    async def signal_key_used(self, job_id: str, key: str) -> bool:
        """Whether a signal with ``key`` was sent to the job (what :meth:`signal` would refuse with
        SignalKeyUsed): a used approval link's page says so before anyone presses it. False for an
        unknown job. A read; changes nothing."""

    async def wake_suspended(self, *, limit: int = 500) -> tuple[int, float | None]:
        """Up to ``limit`` suspended jobs whose ``run_after`` passed → pending (RESUME, ``awaiting_signal``
        cleared; waking Pollers as an insert does), oldest due first. Returns how many, and the seconds until
        the next suspended job is due (0 when more are due now; None: none has a deadline). Safe from any
        number of processes at once; an index keeps it free while nothing is due."""

    # -- workflows (issue 24; docs/workflows.md) ----------------------------------------------------

    async def parent_results(self, job_id: str) -> dict[str, ParentResult]:
        """{parent id: (its job type, its result: JSON text, None for none)} of every parent of
        ``job_id`` still in the store, in the order of its ``after`` (a parent removed since is left
        out): what ``ctx.parent_results()`` returns, decoded. {} for a job without parents or unknown."""

    async def batch(self, batch_id: str) -> BatchRecord | None:
        """The batch and its members counted by status (one grouped, indexed read); None if unknown."""

    async def batch_jobs(self, batch_id: str, *, limit: int | None = None, offset: int = 0) -> builtins.list[BatchMember]:
        """The members of the batch (the callback not among them), in the order they were inserted;
        ``limit`` None: all. [] for an unknown batch."""

    # -- control (issue 23) -----------------------------------------------------------------------

    async def cancel(self, job_ids: Sequence[str], *, reason: str) -> builtins.list[str | None]:
        """In one transaction, per id in order, what the job is after the call: "cancelled" for a
        pending, waiting or suspended one (cancelled at once: final, ``error`` = :func:`cancelled_error` (reason),
        finished now, its unique key freed, its edges applied as :meth:`insert` says); ``CANCELLING`` for a running one (the request is
        stored, ``cancel_requested`` true: its worker ends it, see :meth:`cancel_requests`); the
        status of a job already final, unchanged; None for an unknown id. Asking twice is harmless."""

    async def cancel_requests(self, owner: str) -> builtins.list[tuple[str, int]]:
        """(id, lease token) of the running jobs ``owner`` holds whose cancel was requested: an
        indexed read, made twice a second by every process while it holds running jobs. The worker
        stops each and writes a CANCEL outcome (fenced like any other: if the job's own outcome was
        written first, the CANCEL changes nothing). :meth:`rescue_expired` ends an expired lease
        whose cancel was requested ``cancelled`` (:func:`cancelled_running_error`), never retried."""

    async def set_progress(self, job_id: str, token: int, fraction: float, message: str | None) -> bool:
        """Store a running job's progress (0 ≤ fraction ≤ 1, checked by the engine) and message,
        fenced like an outcome: False (nothing written) unless it runs under ``token``."""

    async def set_type_paused(self, job_type: str, paused: bool) -> None:
        """Pause or resume a job type, for every process sharing the store and across restarts:
        no claim takes a job of a paused type (the claim reads the paused types in its own
        transaction or script); enqueues are still accepted, running jobs finish."""

    async def paused_types(self) -> builtins.set[str]: ...

    async def delete(self, job_id: str) -> None:
        """LookupError if unknown, UsageError while it runs. A job deleted before its edges counted
        (pending, waiting) applies them as a parent that was "deleted" (see :meth:`insert`), in the
        same transaction; its own edges to its parents go with it."""

    async def cleanup(self, *, statuses: Sequence[str] = ("completed", "dead"), older_than_seconds: float | None = None) -> int:
        """Delete finished jobs; returns how many. Their edges go with them, as :meth:`prune` says."""

    async def ping(self) -> None:
        """Raise StoreError unless the store answers."""

    async def workers(self) -> builtins.list[WorkerRecord]:
        """The worker processes in the store's registry, the most recent heartbeat first."""

    # -- cron schedules (pipeline/schedules.py) ---------------------------------------------------

    async def schedules(self) -> builtins.list[ScheduleRecord]:
        """Every schedule, by name."""

    async def due_schedules(self, now: str) -> builtins.list[ScheduleRecord]:
        """The enabled schedules whose next run is at or before ``now``, the most overdue first
        (an indexed read: the Scheduler makes it every second in every process)."""

    async def put_schedule(self, record: ScheduleRecord) -> ScheduleRecord:
        """Add a schedule; UsageError if one of that name exists (nothing is changed)."""

    async def remove_schedule(self, name: str) -> None:
        """LookupError if there is none of that name. (A code schedule is written again at the next start.)"""

    async def set_schedule_enabled(self, name: str, enabled: bool) -> ScheduleRecord:
        """Pause or resume; a resumed schedule's next run is its first tick after now (the ticks
        of the pause are not made up). LookupError if unknown."""

    async def sync_code_schedules(self, records: Sequence[ScheduleRecord], *, owned: Collection[str] | None = None) -> None:
        """Written at start: each schedule declared in code merged into the stored one of its name
        (:func:`merge_declared`), and every code schedule not among them whose job type is
        ``owned`` (None: any) disabled (:func:`retired`), in one transaction."""

    async def fire_schedule(self, name: str, *, tick: str, next_run: str, job: NewJob) -> bool:
        """In one transaction, only if schedule ``name`` is enabled and its next_run is still
        ``tick``: insert ``job`` (waking Pollers as any insert does), set next_run to ``next_run``,
        last_run to ``tick``, last_job_id to the job's id. The job's ``unique_key`` is ignored: a
        tick always inserts its job (the tick's fence is what makes it one). True if this call
        fired the tick; False if another did, or the schedule changed (nothing written)."""

    # -- the engine's housekeeping ----------------------------------------------------------------

    async def retention_turn(self, *, interval_seconds: float) -> bool:
        """Whether the caller takes this round of retention: True for one caller per
        ``interval_seconds`` among every process sharing the store (the store keeps the time
        of the next round, and moving it on is atomic)."""

    async def prune(self, status: str, *, older_than_seconds: float, limit: int) -> int:
        """Delete up to ``limit`` jobs of the final ``status`` that finished more than
        ``older_than_seconds`` ago, oldest first; returns how many. UsageError for a status
        that is not final. The edges of the jobs it removes go with
        them (they counted when those jobs ended), and so does a batch none of whose jobs is left."""

    async def prune_workers(self, *, older_than_seconds: float) -> int:
        """Remove the worker-registry entries whose lease ran out more than
        ``older_than_seconds`` ago (processes that died without saying so); returns how many."""

    def counters(self) -> builtins.list[tuple[str, str, float]]:
        """(metric name, help, value) of the backend's own work, for /metrics."""

    def trouble(self) -> str | None:
        """Why the store cannot take writes right now (a lock held past patience, a server
        that does not answer), for /healthz; None while it does."""

    def begin_stop(self, grace: float) -> None:
        """A graceful stop began: a store that does not answer may hold it up ``grace`` seconds more."""
