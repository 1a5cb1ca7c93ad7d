"""Workflows: jobs that wait for other jobs, chains, and batches with a callback (docs/workflows.md).

The stores keep the graph (pipeline/backends/base.py: ``NewJob.after``, ``Backend.insert``'s
edges); this module holds what producers and handlers see of it: :func:`chain`, :class:`Batch`
(what ``enqueue_batch`` answers) and :class:`BatchOutcome` (what ``ctx.batch()`` answers).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import trio

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
        try:  # nor a lone surrogate: Redis's write loop failed on one, Postgres's read raised it bare
            parent.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(f"after names {parent!r:.60}, which contains an unpaired UTF-16 surrogate (not text): no job "
                             "has such an id") from None
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
    """One job of a batch as ``ctx.batch()`` shows it: ``result`` decoded (None unless completed; read
    back as its job type's ``returns``, the handler's return annotation, as ``Client.result`` reads it),
    ``error`` the last error (None if it completed)."""

    id: str
    job_type: str
    status: str
    result: Any
    error: str | None


MEMBERS_PAGE = 500  # jobs (with their results) read per page by BatchOutcome.members()

# the jobs of a batch (limit, offset), in the order they were enqueued: Backend.batch_jobs of one batch
PageReader = Callable[[int, int], Awaitable[Sequence[BatchMember]]]
# (job type, stored result) -> the result read back: Registry.decode_result
ResultReader = Callable[[str, "str | None"], Any]


@attrs.frozen
class BatchOutcome:
    """What ``await ctx.batch()`` answers in a batch's callback (or in one of its jobs): the batch's
    jobs counted by status, read in one grouped read without any job's result; and
    :meth:`members`, which reads the jobs with their results a page at a time. A batch of 10,000
    jobs of 60 kB results each is 600 MB of results: they are never all loaded at once."""

    id: str
    counts: Mapping[str, int]  # the batch's jobs by status (only the statuses that occur)
    total: int  # its jobs (the callback not counted)
    _page: PageReader | None = attrs.field(default=None, alias="page", eq=False, repr=False)  # on the loop
    # how members() reads a page from where it runs: ctx.batch() sets it (on the loop, a coroutine; from
    # a sync handler's thread, the page, through the loop); None: _page itself, on the loop
    _fetch: Callable[[int, int], Any] | None = attrs.field(default=None, alias="fetch", eq=False, repr=False)
    # how a member's result is read back (the registry's decode_result); None: its JSON form
    _decode: ResultReader | None = attrs.field(default=None, alias="decode", eq=False, repr=False)

    @property
    def succeeded(self) -> bool:
        """Every job completed."""
        return self.counts.get("completed", 0) == self.total

    def members(self, page_size: int = MEMBERS_PAGE) -> Any:
        """The batch's jobs (:class:`BatchJob`: ``id``, ``job_type``, ``status``, ``result``, ``error``), in
        the order they were enqueued, read ``page_size`` at a time: ``async for job in
        outcome.members():`` in an async handler, ``for job in outcome.members():`` in a sync one.
        Only a page is held at once; a job removed meanwhile (by an operator) is left out."""
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise UsageError(f"page_size must be a whole number of jobs >= 1, got {page_size!r:.40}")
        fetch = self._fetch if self._fetch is not None else self._page
        if fetch is None:
            raise UsageError("this batch outcome was made outside a pipeline: there is no store to read its jobs from")
        if trio.lowlevel.in_trio_run():
            return self._members_async(fetch, page_size)
        return self._members_sync(fetch, page_size)

    async def _members_async(self, fetch: Callable[[int, int], Any], page_size: int) -> AsyncIterator[BatchJob]:
        offset = 0
        while True:
            page = await fetch(page_size, offset)
            for member in page:
                yield batch_job(member, self._decode)
            if len(page) < page_size:
                return
            offset += page_size

    def _members_sync(self, fetch: Callable[[int, int], Any], page_size: int) -> Iterator[BatchJob]:
        offset = 0
        while True:
            page = fetch(page_size, offset)
            for member in page:
                yield batch_job(member, self._decode)
            if len(page) < page_size:
                return
            offset += page_size

    # What BatchOutcome held before issue 32: every job with its result, loaded at once.
    @property
    def jobs(self) -> Any:
        raise self._paged("jobs", "[job async for job in outcome.members()]")

    @property
    def ids(self) -> Any:
        raise self._paged("ids", "[job.id async for job in outcome.members()]")

    @property
    def results(self) -> Any:
        raise self._paged("results", "{job.id: job.result async for job in outcome.members() if job.status == 'completed'}")

    @property
    def errors(self) -> Any:
        raise self._paged("errors", "{job.id: job.error async for job in outcome.members() if job.status != 'completed'}")

    def _paged(self, name: str, instead: str) -> UsageError:
        return UsageError(f"BatchOutcome.{name} is gone: it loaded every job's result at once (a batch of 10,000 "
                          f"jobs is gigabytes). Read the jobs a page at a time: {instead} (plain `for` in a sync "
                          "handler); counts, total and succeeded need no page")


def batch_job(member: BatchMember, decode: ResultReader | None = None) -> BatchJob:
    result = None
    if member.status == "completed":
        result = decoded(member.result) if decode is None else decode(member.job_type, member.result)
    return BatchJob(member.id, member.job_type, member.status, result, member.error)


def decoded(result: str | None) -> Any:
    """A stored result (JSON text) as its JSON form; a row that is not JSON is shown as it is (the
    admin API's; Registry.decode_result reads a result back as its type)."""
    if result is None:
        return None
    try:
        return json.loads(result)
    except ValueError:
        return result


def batch_outcome(record: BatchRecord, page: PageReader | None = None, decode: ResultReader | None = None) -> BatchOutcome:
    """``ctx.batch()``'s answer from the batch's record (its counts) and ``page``, which reads its jobs;
    ``decode`` reads a member's result back (None: its JSON form)."""
    return BatchOutcome(record.id, dict(record.counts), record.total, page=page, decode=decode)
