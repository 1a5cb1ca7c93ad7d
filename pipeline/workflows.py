"""Workflows: jobs that wait for other jobs, chains, and batches with a callback (docs/workflows.md).

The stores keep the graph (pipeline/backends/base.py: ``NewJob.after``, ``Backend.insert``'s
edges); this module holds what producers and handlers see of it: :func:`chain`, :class:`Batch`
(what ``enqueue_batch`` answers) and :class:`BatchOutcome` (what ``ctx.batch()`` answers).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from .backends.base import ON_PARENT_FAILURE, BatchMember, BatchRecord
from .errors import UsageError

MAX_PARENTS = 10_000  # after= names at most this many jobs (a batch's callback waits for at most this many members)


class Chain(tuple[Any, ...]):
    """Jobs to run one after the other: :func:`chain`'s answer, for ``enqueue_many``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"chain({', '.join(map(repr, self))})"


def chain(*jobs: Any) -> Chain:
    """``enqueue_many(chain(a, b, c))``: the three jobs in one transaction, ``b`` waiting for ``a`` and
    ``c`` for ``b`` (``b`` runs only once ``a`` completed; if ``a`` ends dead or cancelled, ``b`` and
    ``c`` are cancelled). A chain may stand among other jobs in ``enqueue_many``'s list; each is
    linked within itself only."""
    if not jobs:
        raise UsageError("chain() needs at least one job")
    for job in jobs:
        if isinstance(job, Chain):
            raise UsageError("a chain cannot hold a chain: pass the jobs of both to one chain()")
    return Chain(jobs)


def check_parents(after: Any) -> tuple[str, ...]:
    """``after=`` as given (one id, or ids) checked and made a tuple; () for None."""
    if after is None:
        return ()
    if isinstance(after, str):
        after = (after,)
    elif not isinstance(after, Iterable) or isinstance(after, (bytes, Mapping)):
        raise UsageError(f"after must be a job id or a list of job ids, got {type(after).__name__}")
    parents = tuple(after)
    for parent in parents:
        if not isinstance(parent, str) or not parent:
            raise UsageError(f"after must hold job ids (non-empty text), got {parent!r:.60}")
        if "\x00" in parent:  # no store's text holds one: Postgres refused the insert as "database unavailable"
            raise UsageError(f"after names {parent!r:.60}, which contains a NUL character: no job has such an id")
    if len(parents) > MAX_PARENTS:
        raise UsageError(f"after names {len(parents)} jobs; at most {MAX_PARENTS}")
    if len(set(parents)) != len(parents):
        raise UsageError("after names a job more than once")
    return parents


def check_on_parent_failure(value: Any, after: Sequence[str]) -> str | None:
    """``on_parent_failure=`` as stored: None for the default ("cancel"), or "run"."""
    if value is None:
        return None
    if value not in ON_PARENT_FAILURE:
        raise UsageError(f"on_parent_failure must be one of {', '.join(map(repr, ON_PARENT_FAILURE))}, got {value!r:.40}")
    if not after:
        raise UsageError("on_parent_failure is given without after: it says what a parent's failure does to the job")
    return None if value == ON_PARENT_FAILURE[0] else value


@attrs.frozen
class Batch:
    """What ``enqueue_batch`` answers: the batch's id (``GET /admin/batches/{id}``, ``batches show
    ID``), its jobs' ids in the order given, and the callback's id (None without ``then=``)."""

    id: str
    job_ids: tuple[str, ...]
    callback_id: str | None


@attrs.frozen
class BatchJob:
    """One job of a batch as ``ctx.batch()`` shows it: ``result`` decoded (None unless completed),
    ``error`` the last error (None if it completed)."""

    id: str
    job_type: str
    status: str
    result: Any
    error: str | None


@attrs.frozen
class BatchOutcome:
    """What ``await ctx.batch()`` answers in a batch's callback (or in one of its jobs): every job of
    the batch, in the order they were enqueued, and their statuses counted."""

    id: str
    jobs: tuple[BatchJob, ...]

    @property
    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for job in self.jobs:
            counts[job.status] = counts.get(job.status, 0) + 1
        return counts

    @property
    def ids(self) -> list[str]:
        return [job.id for job in self.jobs]

    @property
    def results(self) -> dict[str, Any]:
        """{id: result} of the jobs that completed."""
        return {job.id: job.result for job in self.jobs if job.status == "completed"}

    @property
    def errors(self) -> dict[str, str | None]:
        """{id: error} of the jobs that did not complete (dead, cancelled; or not finished yet)."""
        return {job.id: job.error for job in self.jobs if job.status != "completed"}

    @property
    def succeeded(self) -> bool:
        """Every job completed."""
        return all(job.status == "completed" for job in self.jobs)


def decoded(result: str | None) -> Any:
    """A stored result (JSON text) as a value; a row that is not JSON is shown as it is."""
    if result is None:
        return None
    try:
        return json.loads(result)
    except ValueError:
        return result


def batch_outcome(record: BatchRecord, members: Sequence[BatchMember]) -> BatchOutcome:
    return BatchOutcome(record.id, tuple(BatchJob(m.id, m.job_type, m.status, decoded(m.result) if m.status == "completed"
                                                  else None, m.error) for m in members))
