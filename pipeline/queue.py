"""The ``JobQueue`` protocol (seed 4.2) and its SQLite implementation.

The protocol speaks in backend-neutral terms (job type, payload JSON, lease) so a Redis
Streams backend can implement it too; the actors (Poller, handler pools, Enqueuer) only
ever talk to a ``JobQueue``. ``SqliteJobQueue`` turns each call into a command for the
Ledger and waits for the batch that carries it to commit.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs
import trio

from . import states, store
from .clock import format_ts, now_ts, to_epoch, to_ts
from .db import Database
from .errors import PipelineClosed, StoreError
from .ids import UUID7Factory
from .ledger import Command, Reply, Tray
from .states import Transition


@attrs.frozen
class NewJob:
    """A job to insert, already encoded (see ``Registry.encode``)."""

    job_type: str
    payload: str
    max_attempts: int = 3
    run_after: dt.datetime | str | float | None = None  # None: now
    priority: int = 5


@attrs.frozen
class Lease:
    """What a worker holds for a claimed job; every outcome is fenced by ``token``."""

    id: str
    job_type: str
    payload: str
    attempts: int  # including this one
    max_attempts: int
    token: int
    created_at: str
    run_after: str

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> Lease:
        """From a row of :func:`store.claim_rows` (ClaimedRow's order, which begins with Lease's)."""
        return cls(*row[:8])


class JobQueue(Protocol):
    """The seed's operations, plus what leases, batching and operators need."""

    async def enqueue(self, job: NewJob) -> str: ...
    async def enqueue_many(self, jobs: Sequence[NewJob]) -> list[str]: ...
    async def enqueue_delayed(self, job: NewJob, run_after: dt.datetime | str | float) -> str: ...
    async def dequeue(self, wants: Mapping[str, int]) -> list[Lease]: ...
    async def complete(self, lease: Lease) -> bool: ...
    async def fail(self, lease: Lease, error: str, *, permanent: bool = False, retry_delay: float | None = None) -> Transition | None: ...
    async def dead(self, lease: Lease, error: str) -> bool: ...
    async def release(self, lease: Lease) -> bool: ...
    async def rescue_expired(self) -> int: ...
    async def retry_count(self, status: str) -> int: ...


class SqliteJobQueue:
    """``JobQueue`` on one SQLite file; writes go through the Ledger's inbox."""

    def __init__(
        self,
        db: Database,
        ledger_send: trio.MemorySendChannel[Command],
        *,
        owner: str,
        lease_seconds: float,
        backoff_base_seconds: float,
        new_id: UUID7Factory | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.db = db
        self._ledger_send = ledger_send
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.backoff_base_seconds = backoff_base_seconds
        self._new_id = new_id or UUID7Factory()
        self._rng = rng or random.Random()
        self._tray: Tray | None = None  # outcomes waiting for the Ledger (see ledger.Tray)
        # set by the Poller while it runs: reserves capacity for a claim the Ledger adds to a
        # batch that inserted work (see poller.Claimer.eager)
        self.eager_claimer: Callable[[], tuple[dict[str, int], Callable[[bool, Any], None]] | None] | None = None

    async def _call(self, kind: str, fn: Any, *, wakes_poller: bool = False, rows: list[store.NewJobRow] | None = None) -> Any:
        reply = Reply()
        try:
            await self._ledger_send.send(Command(kind, fn, reply, wakes_poller, rows=rows))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise PipelineClosed("the pipeline is shut down; the job store takes no more writes") from None
        return await reply.wait()

    def close(self) -> None:
        """Close this queue's end of the Ledger inbox (the wiring calls it once all actors stopped)."""
        self._ledger_send.close()

    # -- enqueue ----------------------------------------------------------------------------

    def rows_for(self, jobs: Sequence[NewJob]) -> list[store.NewJobRow]:
        now = now_ts()
        return [
            store.NewJobRow(
                id=self._new_id(),
                job_type=j.job_type,
                payload=j.payload,
                max_attempts=j.max_attempts,
                run_after=now if j.run_after is None else to_ts(j.run_after),
                priority=j.priority,
                created_at=now,
            )
            for j in jobs
        ]

    async def enqueue_rows(self, rows: list[store.NewJobRow]) -> list[str]:
        """Insert prepared rows in one command; returns once they are committed."""
        await self._call("insert", None, wakes_poller=True, rows=rows)
        return [r.id for r in rows]

    async def enqueue_many(self, jobs: Sequence[NewJob]) -> list[str]:
        if not jobs:
            return []
        return await self.enqueue_rows(self.rows_for(jobs))

    async def enqueue(self, job: NewJob) -> str:
        (job_id,) = await self.enqueue_many([job])
        return job_id

    async def enqueue_delayed(self, job: NewJob, run_after: dt.datetime | str | float) -> str:
        return await self.enqueue(attrs.evolve(job, run_after=run_after))

    # -- the worker side ----------------------------------------------------------------------

    def _claim_fn(self, wants: Mapping[str, int]) -> Callable[[Any, str], list[Lease]]:
        owner = self.owner
        lease_seconds = self.lease_seconds

        def claim_all(conn: Any, now: str) -> list[Lease]:
            expires = format_ts(to_epoch(now) + lease_seconds)
            claimed: list[Lease] = []
            for job_type, limit in wants.items():
                if limit > 0:
                    rows = store.claim_rows(conn, job_type, limit, now=now, owner=owner, expires=expires)
                    claimed.extend(map(Lease.from_row, rows))
            return claimed

        return claim_all

    async def dequeue(self, wants: Mapping[str, int]) -> list[Lease]:
        """Claim up to ``wants[job_type]`` due jobs of each type, in one transaction."""
        return await self._call("claim", self._claim_fn(wants))

    def eager_command(self) -> Command | None:
        """The Ledger's hook: a claim to run in the same transaction as an insert."""
        if self.eager_claimer is None:
            return None
        reserved = self.eager_claimer()
        if reserved is None:
            return None
        wants, then = reserved
        return Command("claim", self._claim_fn(wants), Reply(then=then))

    async def _settle(self, item: store.Settlement) -> bool:
        """Write one outcome: on the open tray if there is one, else on a new tray sent to
        the Ledger (see ledger.Tray). True if the lease still held."""
        tray = self._tray
        if tray is not None and tray.is_open:
            index = tray.add(item)
            return (await tray.reply.wait())[index]
        tray = self._tray = Tray()
        tray.add(item)
        try:
            await self._ledger_send.send(Command("outcomes", None, tray.reply, tray=tray))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            tray.is_open = False
            closed = PipelineClosed("the pipeline is shut down; the job store takes no more writes")
            tray.reply.fail(closed)
            raise closed from None
        except BaseException:
            # cancelled while the inbox was full: the outcomes added meanwhile were never
            # sent; their workers hear so and send them again
            tray.is_open = False
            tray.reply.fail(StoreError("outcome not handed to the Ledger (the task carrying it was cancelled); trying again"))
            raise
        return (await tray.reply.wait())[0]

    async def complete(self, lease: Lease) -> bool:
        """running → completed. False when the lease was stale (the row changed hands)."""
        return await self._settle(store.Settlement(lease.id, lease.token, Transition.SUCCEED))

    async def fail(self, lease: Lease, error: str, *, permanent: bool = False, retry_delay: float | None = None) -> Transition | None:
        """A failed attempt: back to pending after backoff, or dead. None when the lease was stale."""
        decision = states.settle_failure(
            attempts=lease.attempts,
            max_attempts=lease.max_attempts,
            permanent=permanent,
            base_seconds=self.backoff_base_seconds,
            retry_delay=retry_delay,
            rng=self._rng,
        )
        held = await self._settle(store.Settlement(lease.id, lease.token, decision.transition, error, decision.delay))
        return decision.transition if held else None

    async def dead(self, lease: Lease, error: str) -> bool:
        return await self.fail(lease, error, permanent=True) is not None

    async def release(self, lease: Lease) -> bool:
        """Graceful shutdown: running → pending, due now, the attempt not counted."""
        return await self._settle(store.Settlement(lease.id, lease.token, Transition.RELEASE))

    async def rescue_expired(self) -> int:
        base, rng, owner = self.backoff_base_seconds, self._rng, self.owner
        rescued = await self._call(
            "rescue",
            lambda conn, now: store.rescue_expired(conn, now=now, base_seconds=base, rng=rng, exclude_owner=owner),
            wakes_poller=True,
        )
        return len(rescued)

    async def bury_unknown_types(self, known: set[str], *, grace_seconds: float) -> int:
        def write(conn: Any, now: str) -> int:
            unknown = [t for t in store.pending_job_types(conn) if t not in known]
            if not unknown:
                return 0
            return store.bury_unknown_types(conn, unknown, now=now, due_before=format_ts(to_epoch(now) - grace_seconds))

        return await self._call("bury_unknown", write)


    # -- operators ----------------------------------------------------------------------------

    async def revive(self, job_id: str) -> store.JobRecord:
        return await self._call("revive", lambda conn, now: store.revive(conn, job_id, now=now), wakes_poller=True)

    async def delete(self, job_id: str) -> None:
        await self._call("delete", lambda conn, now: store.delete_job(conn, job_id))

    async def cleanup(self, *, statuses: Sequence[str] = ("completed", "dead"), older_than_seconds: float | None = None) -> int:
        def write(conn: Any, now: str) -> int:
            cutoff = None if older_than_seconds is None else format_ts(to_epoch(now) - older_than_seconds)
            return store.cleanup(conn, statuses=statuses, older_than=cutoff)

        return await self._call("cleanup", write)

    # -- reads (pooled connections, not the Ledger) --------------------------------------------

    async def get(self, job_id: str) -> store.JobRecord | None:
        return await self.db.read(store.get_job, job_id)

    async def list(self, **filters: Any) -> tuple[list[store.JobRecord], int]:
        return await self.db.read(lambda conn: store.list_jobs(conn, **filters))

    async def stats(self) -> dict[str, Any]:
        return await self.db.read(store.stats)

    async def retry_count(self, status: str) -> int:
        return await self.db.read(store.count_by_status, status)
