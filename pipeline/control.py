"""Control over many jobs at once and over job types (issue 23): what the CLI, the admin API and the
engine share, written once over the :class:`Backend` protocol so that the three say the same thing.

* :func:`cancel_jobs` cancels jobs by id and says, per id, what became of each;
* :func:`bulk` cancels, retries or deletes every job that matches a filter (status, job type), in
  bounded batches: each call to the store handles at most ``batch`` jobs, so a filter that matches a
  million jobs never holds the store (or its write lock) for the whole of them, and the loop ends
  even when the action refuses some of them (a retry whose unique key is held, a delete of a job that
  started meanwhile, a running job whose cancel is only requested): a job is acted on once per call;
* :func:`types_summary` describes each job type (paused or not, its limits, its jobs by status);
  :func:`set_paused` pauses or resumes one the registry knows;
* :func:`batch_view` reads a batch's progress and a page of its jobs (``batches show``,
  ``GET /admin/batches/{id}``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .backends.base import CANCELLING, BatchMember, BatchRecord
from .errors import UsageError
from .limits import global_limits, rate_limits, rate_text
from .states import REVIVABLE, TERMINAL, Status
from .workflows import decoded

if TYPE_CHECKING:
    from .backends.base import Backend
    from .config import Config
    from .registry import Registry

BATCH = 500  # jobs per call to the store: one list, one cancel (or that many retries or deletes)
WIDTH = 16  # retries or deletes in flight at once (the SQLite Ledger writes them in one transaction)
MAX_REASONS = 5  # why jobs were skipped, as examples: the first few distinct messages

# what each bulk action takes: the statuses it applies to (those it takes when none is given)
ACTIONS: Mapping[str, tuple[str, ...]] = {
    "cancel": tuple(s.value for s in Status if s not in TERMINAL),  # waiting, pending, running
    "retry": tuple(s.value for s in Status if s in REVIVABLE),
    "delete": tuple(s.value for s in Status if s is not Status.RUNNING),
}
DONE = {"cancel": "cancelled", "retry": "retried", "delete": "deleted"}  # the count of the jobs it changed


# -- cancelling by id ----------------------------------------------------------------------------


@attrs.frozen
class Cancelled:
    """What one cancel did to one job. ``outcome``: "cancelled" (it was pending or waiting: final now),
    "cancel_requested" (it runs: its worker stops it), "already_final" (``status`` says which), or
    "unknown" (no such job)."""

    id: str
    outcome: str
    status: str | None  # the job's status after the call (None: no such job)

    @classmethod
    def of(cls, job_id: str, answer: str | None) -> Cancelled:
        if answer is None:
            return cls(job_id, "unknown", None)
        if answer == Status.CANCELLED:  # cancelled now (or before: see cancel_jobs)
            return cls(job_id, "cancelled", answer)
        if answer == CANCELLING:
            return cls(job_id, "cancel_requested", Status.RUNNING.value)
        return cls(job_id, "already_final", answer)

    def text(self) -> str:
        """As the CLI prints it after the id."""
        return {"cancelled": "cancelled", "cancel_requested": "running: cancel requested",
                "unknown": "no such job"}.get(self.outcome, f"already {self.status}")

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "outcome": self.outcome, "status": self.status}


async def cancel_jobs(backend: Backend, job_ids: Sequence[str], *, reason: str) -> list[Cancelled]:
    """Cancel each job (``reason``: who asks, stored in a pending job's error), per id in order, in
    batches of :data:`BATCH` ids per call. The store answers "cancelled" alike for a job it cancelled
    now and for one cancelled before; each job is read first so that the second says "already_final"
    (for the few ids a person types: a bulk cancel lists pending and running jobs only)."""
    out: list[Cancelled] = []
    for start in range(0, len(job_ids), BATCH):
        part = list(job_ids[start:start + BATCH])
        before = {job_id: await backend.get(job_id) for job_id in dict.fromkeys(part)}
        answers = await backend.cancel(part, reason=reason)
        for job_id, answer in zip(part, answers, strict=True):
            was = before[job_id]
            if answer == Status.CANCELLED and was is not None and was.status == Status.CANCELLED:
                out.append(Cancelled(job_id, "already_final", answer))
            else:
                out.append(Cancelled.of(job_id, answer))
    return out


# -- bulk actions over a filter ------------------------------------------------------------------


@attrs.frozen
class JobFilter:
    """Which jobs a bulk action takes: those of ``status`` (None: every status the action applies
    to, :data:`ACTIONS`) and of ``job_type`` (None: any)."""

    action: str
    status: str | None = None
    job_type: str | None = None

    @classmethod
    def checked(cls, action: str, status: Any, job_type: Any, *, status_name: str = "status",
                type_name: str = "job_type") -> JobFilter:
        """The filter as an operator gave it, or UsageError naming what does not fit. At least one
        of the two is needed (a bulk action over every job is asked for by naming the status), and
        ``delete`` needs a status (deleting every job of a type, pending ones and all, should be said)."""
        statuses = ACTIONS[action]
        if status is not None and (type(status) is not str or status not in statuses):
            shown = status if type(status) is str else type(status).__name__
            raise UsageError(f"{action} takes jobs of status {' or '.join(statuses)}; {status_name} {shown!r} is not one")
        if job_type is not None and (type(job_type) is not str or not job_type):
            raise UsageError(f"{type_name} must be a non-empty string (leave it out for every type)")
        if job_type is not None and "\x00" in job_type:  # no store's text holds one (Postgres refuses to be asked)
            raise UsageError(f"{type_name} must not contain a NUL character: no job type is named so")
        if status is None and job_type is None:
            raise UsageError(f"{action} of every matching job needs a filter: {status_name} "
                             f"({', '.join(statuses)}), {type_name}, or both")
        if action == "delete" and status is None:
            raise UsageError(f"delete of every job of a type needs a {status_name} too ({', '.join(statuses)}): "
                             "name the jobs it removes")
        return cls(action, status, job_type)

    @property
    def statuses(self) -> tuple[str, ...]:
        return ACTIONS[self.action] if self.status is None else (self.status,)

    def describe(self) -> str:
        """"pending jobs of type send_email", "dead or cancelled jobs"."""
        kind = " or ".join(self.statuses)
        return f"{kind} jobs" + ("" if self.job_type is None else f" of type {self.job_type}")


@attrs.define
class BulkOutcome:
    """What a bulk action did: of the ``matched`` jobs it found, ``done`` were cancelled, retried or
    deleted; ``requested``: running jobs whose cancel was requested (cancel only; their workers end
    them); ``skipped``: refused or changed meanwhile (finished, deleted, started), with the first
    few ``reasons``."""

    filter: JobFilter
    matched: int = 0
    done: int = 0
    requested: int = 0
    skipped: int = 0
    reasons: list[str] = attrs.field(factory=list)

    def skip(self, reason: str | None = None) -> None:
        self.skipped += 1
        if reason and len(self.reasons) < MAX_REASONS and reason not in self.reasons:
            self.reasons.append(reason)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"matched": self.matched, DONE[self.filter.action]: self.done}
        if self.filter.action == "cancel":
            out["cancel_requested"] = self.requested
        out.update(skipped=self.skipped, reasons=list(self.reasons))
        return out

    def text(self) -> str:
        """One line for people: "cancelled 12 pending jobs of type x; 2 running: cancel requested"."""
        done = DONE[self.filter.action]
        line = f"{done} {self.done} of {self.matched} {self.filter.describe()}"
        if self.filter.action == "cancel" and self.requested:
            line += f"; {self.requested} running: cancel requested (their workers stop them)"
        if self.skipped:
            line += f"; {self.skipped} skipped" + (f" ({'; '.join(self.reasons)})" if self.reasons else "")
        return line


async def bulk(backend: Backend, job_filter: JobFilter, *, reason: str = "by an operator", batch: int = BATCH) -> BulkOutcome:
    """Apply ``job_filter.action`` to every job that matches it, ``batch`` at a time, until none is
    left that this call has not already acted on.

    The store lists a status newest first, by id, with an offset (:meth:`Backend.list`); this walks it
    like a cursor. ``mark`` is the oldest id handled so far: every matching job from the head of the
    list down to it was acted on (or skipped, counted), and the jobs past it are fresh. Jobs handled that
    still match (a running job whose cancel was requested, a refused retry) stay ahead of the mark, so the
    next page starts at an offset guessed from how many of them remain, one before: that page must begin
    at or above the mark, proof that nothing between the mark and its fresh jobs was passed over. When
    jobs ahead of the mark ended meanwhile (finished, deleted), the list shifted under the guess and the
    page begins below the mark: the walk steps back until it overlaps again. An offset alone (the walk
    before issue 32) skipped the jobs that the shift carried below it: 3 of 30 running jobs were never
    asked to stop, and the report said "27 of 27". A job this call acted on is not acted on again (a
    retried job that dies again at once is not retried for ever), so the walk ends when the filter
    matches nothing new, however many jobs the action refuses. Jobs enqueued after the walk passed the
    head of the list (newer than its first page) are not its business. ``reason`` is stored in a
    cancelled job's error."""
    if batch < 1:
        raise UsageError(f"batch must be >= 1, got {batch}")
    outcome = BulkOutcome(job_filter)
    act = _ACT[job_filter.action]
    many = len(job_filter.statuses) > 1
    seen: set[str] = set()  # with several statuses: a job that moved from one to the next is counted once
    for status in job_filter.statuses:
        mark: str | None = None
        offset = 0
        while True:
            # two at least: with one, the page would be only its overlap and the walk would not move
            page, total = await backend.list(status=status, job_type=job_filter.job_type, limit=max(batch, 2), offset=offset)
            if offset and (not page or page[0].id < mark):  # type: ignore[operator]
                offset = max(0, min(offset, total) - batch)  # shifted under the guess: step back
                continue
            behind = sum(1 for job in page if mark is not None and job.id >= mark)  # handled, still matching
            fresh = [job.id for job in page[behind:]][:batch]
            if not fresh:
                if len(page) < max(batch, 2):
                    break  # the end of the list
                offset += len(page) - 1
                continue
            mark = fresh[-1]
            todo = [job_id for job_id in fresh if job_id not in seen] if many else fresh
            if many:
                seen.update(todo)
            outcome.matched += len(todo)
            still = await act(backend, todo, outcome, reason, status) if todo else 0
            offset = max(0, offset + behind + len(fresh) - len(todo) + still - 1)
    return outcome


# Each action returns a guess of how many of the jobs it was given still match their status (they stay
# in the list, ahead of bulk's mark): the next page's offset. A wrong guess costs a page read, no more.


async def _cancel(backend: Backend, ids: list[str], outcome: BulkOutcome, reason: str, status: str) -> int:
    still = 0
    for answer in await backend.cancel(ids, reason=reason):
        if answer == Status.CANCELLED:
            outcome.done += 1
        elif answer == CANCELLING:
            outcome.requested += 1
            still += status == Status.RUNNING  # it runs on, its cancel requested
        else:
            outcome.skip(None if answer is None else f"{answer} meanwhile")
    return still


async def _retry(backend: Backend, ids: list[str], outcome: BulkOutcome, reason: str, status: str) -> int:
    return await _each(ids, backend.revive, outcome)


async def _delete(backend: Backend, ids: list[str], outcome: BulkOutcome, reason: str, status: str) -> int:
    return await _each(ids, backend.delete, outcome)


async def _each(ids: Collection[str], act: Callable[[str], Awaitable[Any]], outcome: BulkOutcome) -> int:
    """``act`` on each id, :data:`WIDTH` at a time; a job gone meanwhile (LookupError) or refused
    (UsageError: running, its unique key held) is skipped. Any other error stops the call, raised
    as it is (not in an exception group). Returns how many were refused (they may still match)."""
    limiter = trio.CapacityLimiter(WIDTH)
    refused = 0

    async def one(job_id: str) -> None:
        nonlocal refused
        async with limiter:
            try:
                await act(job_id)
            except LookupError:
                outcome.skip("deleted meanwhile")
            except UsageError as exc:
                outcome.skip(str(exc))
                refused += 1
            else:
                outcome.done += 1

    try:
        async with trio.open_nursery() as tn:
            for job_id in ids:
                tn.start_soon(one, job_id)
    except BaseExceptionGroup as group:
        raise _first_leaf(group) from None
    return refused


def _first_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


_ACT: Mapping[str, Callable[[Backend, list[str], BulkOutcome, str, str], Awaitable[int]]] = {
    "cancel": _cancel, "retry": _retry, "delete": _delete,
}


# -- job types -------------------------------------------------------------------------------------


@attrs.frozen
class TypeSummary:
    """One job type as operators see it. ``concurrency``: the workers each process runs for it (its
    own, else WORKER_CONCURRENCY; never above its global limit); ``global_limit``: the most that run
    at once across every process (WORKER_GLOBAL_LIMITS, else its registration's); ``rate_limit``: the
    most of its jobs that start in a window, across every process, as "N/s", "N/m" or "N/h"
    (WORKER_RATE_LIMITS, else its registration's). A type the store holds jobs of (or holds paused) that the registry does
    not know is listed with ``registered`` False and no limits."""

    name: str
    paused: bool
    registered: bool
    concurrency: int | None
    global_limit: int | None
    rate_limit: str | None
    counts: Mapping[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "paused": self.paused, "registered": self.registered,
                "concurrency": self.concurrency, "global_limit": self.global_limit, "rate_limit": self.rate_limit,
                "counts": dict(self.counts)}


async def types_summary(backend: Backend, registry: Registry, config: Config, *,
                        stats: Mapping[str, Any] | None = None) -> list[TypeSummary]:
    """Every job type of the registry, then those only the store knows, by name. ``stats``: the
    store's :meth:`Backend.stats`, if the caller has them (they scan the jobs table)."""
    if stats is None:
        stats = await backend.stats()
    paused = await backend.paused_types()
    by_type: Mapping[str, Mapping[str, int]] = stats.get("by_type", {})
    limits = global_limits(config, registry)
    rates = {name: rate_text(rate) for name, rate in rate_limits(config, registry).items()}
    known = registry.job_types()
    out = []
    for name in [*known, *sorted((set(by_type) | paused) - set(known))]:
        counts = {s.value: int(by_type.get(name, {}).get(s.value, 0)) for s in Status}
        concurrency = limit = None
        if name in known:
            limit = limits.get(name)
            concurrency = registry.spec(name).concurrency or config.worker.concurrency
            if limit is not None:
                concurrency = min(concurrency, limit)
        out.append(TypeSummary(name, name in paused, name in known, concurrency, limit, rates.get(name), counts))
    return out


async def set_paused(backend: Backend, registry: Registry, name: str, paused: bool) -> None:
    """Pause or resume job type ``name`` for every process on the store (idempotent). LookupError
    naming the known types if the registry does not know it; a type paused before it left the
    registry can still be resumed."""
    if name not in registry.job_types() and not (not paused and name in await backend.paused_types()):
        known = ", ".join(registry.job_types()) or "none"
        shown = name if len(name) <= 80 else name[:80] + "…"
        raise LookupError(f"no job type named {shown!r} (known: {known})")
    await backend.set_type_paused(name, paused)


# -- batches ---------------------------------------------------------------------------------------


@attrs.frozen
class BatchView:
    """A batch as operators see it: its record (members counted by status, the callback's status)
    and one page of its jobs, in the order they were enqueued."""

    record: BatchRecord
    jobs: Sequence[BatchMember]
    limit: int
    offset: int

    def to_json(self) -> dict[str, Any]:
        """The record's fields, then ``jobs``: ``{"id", "job_type", "status", "result", "error"}`` each
        (``result``: a completed job's, decoded; null otherwise), ``limit`` and ``offset``."""
        return {**self.record.to_json(), "jobs": [member_json(m) for m in self.jobs], "limit": self.limit,
                "offset": self.offset}


def member_json(member: BatchMember) -> dict[str, Any]:
    return {"id": member.id, "job_type": member.job_type, "status": member.status,
            "result": decoded(member.result) if member.status == Status.COMPLETED else None, "error": member.error}


async def batch_view(backend: Backend, batch_id: str, *, limit: int, offset: int) -> BatchView | None:
    """The batch ``batch_id`` and its jobs ``offset`` to ``offset + limit``; None if the store has no
    such batch (never made, or removed by retention with the last of its jobs)."""
    record = await backend.batch(batch_id)
    if record is None:
        return None
    return BatchView(record, await backend.batch_jobs(batch_id, limit=limit, offset=offset), limit, offset)
