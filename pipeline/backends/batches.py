"""What the three Ledgers (SQLite's, Postgres's, Redis's) share: taking a batch from the inbox,
answering the Poller's offer, and failing what is in hand when a Ledger is cancelled; and, for
the two server backends, their command, their counters and the half of the backend class they share.

Each Ledger waits for the first command, drains whatever else is already waiting (up to its
batch limit), and writes the batch in one go (see each backend's ledger.py for how).
"""

from __future__ import annotations

import builtins
import functools
import logging
import math
import random
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import attrs
import trio

from ..clock import now_ts
from ..errors import PipelineClosed, StoreError
from ..replies import Reply
from ..states import Transition
from .base import (
    Claimed,
    ClaimOffer,
    HealthReport,
    JobRecord,
    Lease,
    NewJob,
    Nudge,
    ScheduleRecord,
    Settlement,
    StepRecord,
    WorkerRecord,
    nudge,
)
from .trays import Tray, Trays

log = logging.getLogger("pipeline.ledger")

BATCH_LIMIT = 1024


class Carried(Protocol):
    """A Ledger command as these helpers see it: its answer, and the tray it may carry."""

    @property
    def reply(self) -> Reply: ...

    @property
    def tray(self) -> Tray | None: ...


C = TypeVar("C", bound=Carried)
T = TypeVar("T")


def gather(first: C, inbox_recv: trio.MemoryReceiveChannel[C], batch: list[C], limit: int) -> int:
    """Fill ``batch`` with ``first`` and whatever else waits, up to ``limit``; close the trays
    taken (later outcomes go on the next one). Returns how many outcomes the trays hold beyond
    one each (a tray is one command: the counters count each outcome)."""
    batch.clear()
    batch.append(first)
    while len(batch) < limit:
        try:
            batch.append(inbox_recv.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            break
    extra = 0
    for command in batch:
        if command.tray is not None:
            command.tray.is_open = False
            extra += len(command.tray.items) - 1
    return extra


def fail_in_hand(batch: Sequence[Carried], inbox_recv: trio.MemoryReceiveChannel[C]) -> None:
    """Only a cancellation (the caller's scope, not a graceful stop) leaves a Ledger with work
    in hand: answer all of it, the batch and what still waits, so that nobody waits for ever."""
    gone = PipelineClosed("the Ledger was cancelled before writing this")
    for command in batch:
        if not command.reply.answered:
            command.reply.fail(gone)
    while True:
        try:
            waiting = inbox_recv.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel):
            break
        if waiting.tray is not None:
            waiting.tray.is_open = False
        waiting.reply.fail(gone)


def take_offer(offers_recv: trio.MemoryReceiveChannel[ClaimOffer] | None) -> ClaimOffer | None:
    """The Poller's standing offer, if one waits (see base.ClaimOffer)."""
    if offers_recv is None:
        return None
    try:
        return offers_recv.receive_nowait()
    except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
        return None


def thread_taker(offers_recv: trio.MemoryReceiveChannel[ClaimOffer] | None,
                 taken: list[ClaimOffer]) -> Callable[[], ClaimOffer | None] | None:
    """For a Ledger's worker thread: a call that takes the Poller's standing offer, if one waits,
    on the trio thread (trio.from_thread), and keeps it in ``taken`` for the Ledger to answer
    (see :func:`answer`); None without an offers channel."""
    if offers_recv is None:
        return None

    def take() -> ClaimOffer | None:  # (on the trio thread)
        got = take_offer(offers_recv)
        if got is not None:
            taken.append(got)
        return got

    return lambda: trio.from_thread.run_sync(take)


def answer(nudge_send: trio.MemorySendChannel[Nudge], claimed: Claimed) -> None:
    """Answer a taken offer on the Poller's nudge channel (every offer taken is answered)."""
    try:
        nudge_send.send_nowait(claimed)  # never full: one offer is out at a time (see base.nudge)
    except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
        # the Poller is gone: the jobs stay running under its lease, which nobody renews,
        # and are rescued when it expires
        if claimed.leases:
            log.warning("%d jobs claimed for a Poller that stopped; their leases will return them", len(claimed.leases))


# -- the server backends' Ledgers (Postgres, Redis) ---------------------------------------------------


@attrs.define(eq=False)
class ClaimRequest:
    """A claim of the Poller's sent to the Postgres Ledger, to ride its next transaction. The Ledger
    sets ``taken`` as it takes it into a batch; one not taken in time is ``withdrawn`` by its sender
    (then made on a connection of its own) and left out by the Ledger: both on the trio thread, so
    it is made once, one way or the other."""

    offer: ClaimOffer
    taken: trio.Event = attrs.field(factory=trio.Event)
    withdrawn: bool = False


@attrs.frozen
class Command:
    """A tray of outcomes, the rows of one insert, or (Postgres) a claim of the Poller's that
    rides the Ledger's next transaction; answered on ``reply``."""

    reply: Reply
    tray: Tray | None = None
    rows: list[NewJob] | None = None
    claim: ClaimRequest | None = None  # answered with its leases


@attrs.define
class LedgerStats:
    """Written by the Ledger only; read by benchmarks and /metrics."""

    batches: int = 0
    commands: int = 0
    failed_batches: int = 0
    give_up_at: float = math.inf  # kept for symmetry with SQLite's: the driver's timeouts bound a stop here
    trouble: str | None = None  # why batches cannot be written right now (for /healthz), None while they can


def makes_work_due(batch: Sequence[Command]) -> bool:
    """An insert of a job due now, or a release (due again at once): this process's Poller
    should look at once. (A retry is due after its backoff: a poll finds it.)"""
    now: str | None = None
    for command in batch:
        if command.tray is not None and any(item.transition is Transition.RELEASE for item in command.tray.items):
            return True
        if command.rows:
            now = now or now_ts()
            if any(row.run_after <= now for row in command.rows):
                return True
    return False


class ServerDatabase(Protocol):
    """What :class:`ServerBackend` needs of a server backend's connection holder."""

    shown: str  # the URL with its password masked
    limiter: trio.CapacityLimiter  # the connections everyone but the Ledger shares

    async def run(self, fn: Callable[..., T], *args: Any) -> T: ...


D = TypeVar("D", bound=ServerDatabase)


class ServerBackend(Generic[D]):
    """The half of a :class:`~pipeline.backends.base.Backend` that the Postgres and Redis
    backends share: inserts and outcomes through their Ledger (trays), everything else a
    blocking function of the backend's own run in a thread by ``db.run``. A subclass names
    its module of worker-side functions (``calls``: claim, rate_free_at, rescue_expired, bury_unknown_types)
    and of operator functions (``operators``: get_job, list_jobs, operator_stats, revive,
    delete_job, cleanup, ping, workers, cancel, set_type_paused, paused_types; ``calls`` also has
    cancel_requests and set_progress) and of cron schedules' (``scheduling``: all_schedules,
    due_schedules, add_schedule, remove_schedule, set_enabled, sync_code, fire) and of retention's
    (``upkeep``: take_turn, prune, prune_workers), and adds bulk_insert,
    lease_renewer and counters."""

    calls: ClassVar[Any]
    operators: ClassVar[Any]
    scheduling: ClassVar[Any]
    upkeep: ClassVar[Any]  # retention: take_turn, prune, prune_workers

    def __init__(self, db: D, ledger_send: trio.MemorySendChannel[Command], stats: LedgerStats,
                 *, rng: random.Random | None = None) -> None:
        self.url = db.shown
        self._db = db
        self._ledger_send = ledger_send
        self._stats = stats
        self._rng = rng or random.Random()
        self._trays = Trays(self._send_tray)
        # operators' calls (the admin API, the dashboard, the CLI) never take every connection the
        # worker side shares: claims, rescues and the Scheduler always have one of their own
        self._operators = trio.CapacityLimiter(max(int(db.limiter.total_tokens) - 1, 1))

    async def _operate(self, fn: Callable[..., T], *args: Any) -> T:
        async with self._operators:
            return await self._db.run(fn, *args)

    # for this backend's own tests and benchmarks: the engine never looks past the protocol
    @property
    def database(self) -> D:
        return self._db

    @property
    def ledger_stats(self) -> LedgerStats:
        return self._stats

    async def _send_tray(self, tray: Tray) -> None:
        await self._ledger_send.send(Command(tray.reply, tray=tray))

    async def insert(self, jobs: Sequence[NewJob]) -> builtins.list[str]:
        if not jobs:
            return []
        reply = Reply()
        try:
            await self._ledger_send.send(Command(reply, rows=list(jobs)))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise PipelineClosed("the pipeline is shut down; the job store takes no more writes") from None
        ids: builtins.list[str] = await reply.wait()  # per job, the id stored for it (see Backend.insert)
        return ids

    async def claim(
        self, wants: Mapping[str, int], *, owner: str, lease_seconds: float, start: Mapping[str, int] | None = None,
        limits: Mapping[str, int] | None = None, rates: Mapping[str, tuple[int, float]] | None = None,
        key_limits: Mapping[str, int] | None = None,
    ) -> list[Lease]:
        # rates and key_limits reach the store's claim only when given, as the engine passes them
        extra = {name: value for name, value in (("rates", rates), ("key_limits", key_limits)) if value}
        return await self._db.run(functools.partial(self.calls.claim, wants=dict(wants), owner=owner,
                                                    lease_seconds=lease_seconds, start=start, limits=limits, **extra))

    async def rate_free_at(self, job_type: str, limit: int, window_seconds: float) -> float:
        # the Poller's, after a short claim: on the worker side's connections, as the claim
        return await self._db.run(self.calls.rate_free_at, job_type, limit, window_seconds)

    async def settle(self, outcomes: Sequence[Settlement]) -> list[bool]:
        """On the open tray, or a new one sent to the Ledger (see trays.Tray)."""
        return await self._trays.settle(outcomes)

    async def rescue_expired(self, *, base_seconds: float, spare: Collection[tuple[str, int]] = ()) -> int:
        # no nudge: a rescued job is due only after its backoff (or dead), which a poll finds
        return await self._db.run(functools.partial(self.calls.rescue_expired, base_seconds=base_seconds, rng=self._rng,
                                                    spare=frozenset(spare)))

    async def bury_unknown_types(self, known: Iterable[str], *, grace_seconds: float) -> int:
        return await self._db.run(functools.partial(self.calls.bury_unknown_types, known=sorted(set(known)),
                                                    grace_seconds=grace_seconds))

    # -- operators ----------------------------------------------------------------------------

    async def get(self, job_id: str) -> JobRecord | None:
        return await self._operate(self.operators.get_job, job_id)

    async def list(
        self, *, status: str | None = None, job_type: str | None = None, limit: int = 50, offset: int = 0,
        priority: int | None = None, order: str = "newest",
    ) -> tuple[builtins.list[JobRecord], int]:
        return await self._operate(functools.partial(self.operators.list_jobs, status=status, job_type=job_type,
                                                    limit=limit, offset=offset, priority=priority, order=order))

    async def stats(self) -> dict[str, Any]:
        return await self._operate(self.operators.operator_stats)

    async def revive(self, job_id: str, *, from_step: str | None = None) -> JobRecord:
        return await self._operate(functools.partial(self.operators.revive, from_step=from_step), job_id)

    # -- durable functions (issue 35): ``calls`` has steps, take_signal, wake_suspended (the worker
    # side's); ``operators`` has send_signal (a person's or a client's)

    async def steps(self, job_id: str) -> builtins.list[StepRecord]:
        return await self._db.run(self.calls.steps, job_id)

    async def take_signal(self, job_id: str, token: int, name: str, step: StepRecord) -> tuple[bool, str | None] | None:
        return await self._db.run(self.calls.take_signal, job_id, token, name, step)

    async def signal(self, job_id: str, name: str, payload: str | None, *, key: str | None = None) -> str:
        return await self._operate(functools.partial(self.operators.send_signal, key=key), job_id, name, payload)

    async def wake_suspended(self, *, limit: int = 500) -> tuple[int, float | None]:
        return await self._db.run(functools.partial(self.calls.wake_suspended, limit=limit))

    async def signal_key_used(self, job_id: str, key: str) -> bool:
        return await self._operate(self.operators.signal_key_used, job_id, key)

    async def delete(self, job_id: str) -> None:
        await self._operate(self.operators.delete_job, job_id)

    # -- control (issue 23): ``operators`` has cancel, set_type_paused, paused_types; ``calls`` has
    # cancel_requests and set_progress (the worker side's: never behind the operators' reads)

    async def cancel(self, job_ids: Sequence[str], *, reason: str) -> builtins.list[str | None]:
        return await self._operate(functools.partial(self.operators.cancel, reason=reason), list(job_ids))

    async def cancel_requests(self, owner: str) -> builtins.list[tuple[str, int]]:
        return await self._db.run(self.calls.cancel_requests, owner)

    async def set_progress(self, job_id: str, token: int, fraction: float, message: str | None) -> bool:
        return await self._db.run(self.calls.set_progress, job_id, token, fraction, message)

    async def set_type_paused(self, job_type: str, paused: bool) -> None:
        await self._operate(self.operators.set_type_paused, job_type, paused)

    async def paused_types(self) -> builtins.set[str]:
        return await self._operate(self.operators.paused_types)

    async def cleanup(self, *, statuses: Sequence[str] = ("completed", "dead"), older_than_seconds: float | None = None) -> int:
        return await self._operate(functools.partial(self.operators.cleanup, statuses=tuple(statuses),
                                                    older_than_seconds=older_than_seconds))

    async def ping(self) -> None:
        await self._db.run(self.operators.ping)  # /healthz: never behind the operators' reads

    async def workers(self) -> builtins.list[WorkerRecord]:
        return await self._operate(self.operators.workers)

    # -- cron schedules -------------------------------------------------------------------------

    async def schedules(self) -> builtins.list[ScheduleRecord]:
        return await self._operate(self.scheduling.all_schedules)

    async def due_schedules(self, now: str) -> builtins.list[ScheduleRecord]:
        return await self._db.run(self.scheduling.due_schedules, now)

    async def put_schedule(self, record: ScheduleRecord) -> ScheduleRecord:
        return await self._operate(self.scheduling.add_schedule, record)

    async def remove_schedule(self, name: str) -> None:
        await self._operate(self.scheduling.remove_schedule, name)

    async def set_schedule_enabled(self, name: str, enabled: bool) -> ScheduleRecord:
        return await self._operate(self.scheduling.set_enabled, name, enabled)

    async def sync_code_schedules(self, records: Sequence[ScheduleRecord], *, owned: Collection[str] | None = None) -> None:
        await self._operate(functools.partial(self.scheduling.sync_code, owned=owned), list(records))

    async def fire_schedule(self, name: str, *, tick: str, next_run: str, job: NewJob) -> bool:
        # one transaction (one script) of its own, not the Ledger's: its insert wakes the Pollers
        # as any insert does (NOTIFY, PUBLISH), this process's by its own listener
        return await self._db.run(functools.partial(self.scheduling.fire, name=name, tick=tick, next_run=next_run, job=job))

    # -- the engine's housekeeping -------------------------------------------------------------

    async def retention_turn(self, *, interval_seconds: float) -> bool:
        return await self._db.run(self.upkeep.take_turn, interval_seconds)

    async def prune(self, status: str, *, older_than_seconds: float, limit: int) -> int:
        return await self._db.run(self.upkeep.prune, status, older_than_seconds, limit)

    async def prune_workers(self, *, older_than_seconds: float) -> int:
        return await self._db.run(self.upkeep.prune_workers, older_than_seconds)

    def trouble(self) -> str | None:
        return self._stats.trouble

    def begin_stop(self, grace: float) -> None:
        """A graceful stop began. Nothing to shorten here: every call is bounded by the driver's
        own timeouts (db.CONNECT_TIMEOUT and the like), and none is retried by the backend."""
        self._stats.give_up_at = trio.current_time() + grace


L = TypeVar("L")  # a listening connection

# A listening connection only reads, so a middlebox that drops its traffic without closing it (a
# NAT or a firewall forgetting an idle connection, a proxy whose upstream went away) would leave
# it waiting for ever while pickup falls back to the poll. Two guards, both on by default:
# - TCP keepalives, so that a NAT or firewall keeps the idle connection's state, and the kernel
#   gives up on a peer that stopped answering: first probe after LISTENER_KEEPALIVE[0] s idle,
#   then every [1] s, dropped after [2] unanswered probes;
# - a ping of the server itself (Postgres: SELECT 1, Redis: PING) after LISTENER_PING_INTERVAL s
#   of silence, to be answered within LISTENER_PING_DEADLINE s, or the connection is replaced.
#   Only this catches a proxy that answers the keepalives itself (pgbouncer, HAProxy, a cloud
#   load balancer). Module constants: tests lower them.
LISTENER_KEEPALIVE = (30, 10, 3)
LISTENER_PING_INTERVAL = 15.0
LISTENER_PING_DEADLINE = 5.0


async def listen_for_work(
    where: str, verb: str, *, connect: Callable[[], L], socket_of: Callable[[L], Any],
    receive: Callable[[L], Awaitable[tuple[bool, bool]]], ping: Callable[[L], Awaitable[None]],
    close: Callable[[L], None], errors: tuple[type[BaseException], ...], nudge_send: trio.MemorySendChannel[Nudge],
    logger: logging.Logger, health: HealthReport | None = None, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The server backends' wake-up listener, until cancelled: ``connect`` (in a thread), nudge the
    Poller for whatever became due while nobody listened, then listen (nudging at each wake-up)
    until the connection drops with one of ``errors`` or leaves a ping unanswered past its
    deadline; connect again with back-off. While it does not listen, ``health`` says so as the
    part "listener" (pickup falls back to the poll meanwhile). A first connection that fails
    raises StoreError (``where``: the masked server, ``verb``: LISTEN or SUBSCRIBE).

    The backend's part: ``socket_of`` the connection (to wait on from trio), ``receive`` what
    arrived once it is readable (whether it holds a wake-up, and whether it answers the ping),
    ``ping`` (send one, without waiting for the answer)."""
    delay = 0.05
    started = False
    down_since: str | None = None  # when it stopped listening, while it does not
    listening_since = 0.0
    with nudge_send:
        while True:
            try:
                conn = await trio.to_thread.run_sync(connect)
            except errors as exc:
                if not started:
                    raise StoreError(f"{where}: cannot {verb} for new jobs: {exc}") from None
                logger.warning("%s: listening for new jobs again in %.2f s (%s)", where, delay, exc)
                if health is not None:
                    health.report("listener", _not_listening(where, down_since, f"cannot connect again: {_said(exc)}"))
                await trio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            try:
                if not started:
                    started = True
                    task_status.started()
                else:
                    logger.info("%s: listening for new jobs again", where)
                if health is not None:
                    health.clear("listener")
                down_since = None
                listening_since = trio.current_time()
                nudge(nudge_send)  # whatever became due while nobody here listened
                why = await _listen(conn, socket_of, receive, ping, nudge_send)
                logger.warning("%s: %s; reconnecting", where, why)
            except errors as exc:
                why = f"the listening connection dropped: {_said(exc)}"
                logger.warning("%s: the listening connection dropped (%s); reconnecting", where, exc)
            finally:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(close, conn)
            down_since = now_ts()
            if health is not None:
                health.report("listener", _not_listening(where, down_since, why))
            # a connection that lived a while is connected again at once; one that dropped soon after
            # it began listening (a middlebox that kills it) backs off, or this would spin
            if trio.current_time() - listening_since >= LISTENER_PING_INTERVAL:
                delay = 0.05
            else:
                await trio.sleep(delay)
                delay = min(delay * 2, 5.0)


def _not_listening(where: str, since: str | None, why: str) -> str:
    return f"not listening to {where} for new jobs since {since} ({why}); new jobs wait for the poll meanwhile"


def _said(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()  # libpq's messages run on with hints
    return lines[0] if lines else type(exc).__name__


async def _listen(conn: L, socket_of: Callable[[L], Any], receive: Callable[[L], Awaitable[tuple[bool, bool]]],
                  ping: Callable[[L], Awaitable[None]], nudge_send: trio.MemorySendChannel[Nudge]) -> str:
    """Nudge at each wake-up on ``conn``; ping it after LISTENER_PING_INTERVAL s of silence.
    Returns (why) once a ping is not answered within LISTENER_PING_DEADLINE s; raises whatever
    ``receive`` or ``ping`` raise once the connection drops."""
    sock = socket_of(conn)
    heard_at = trio.current_time()  # the last bytes from the server
    pinged_at: float | None = None  # the ping waiting for its answer, if any
    while True:
        wake_at = heard_at + LISTENER_PING_INTERVAL if pinged_at is None else pinged_at + LISTENER_PING_DEADLINE
        readable = False
        with trio.move_on_at(wake_at):
            await trio.lowlevel.wait_readable(sock)
            readable = True
        if readable:
            woken, answered = await receive(conn)
            heard_at = trio.current_time()
            if answered:
                pinged_at = None
            if woken:
                nudge(nudge_send)
        elif pinged_at is None:
            pinged_at = trio.current_time()
            with trio.move_on_after(LISTENER_PING_DEADLINE) as sending:
                await ping(conn)
            if sending.cancelled_caught:
                return f"the listening connection could not send a ping in {LISTENER_PING_DEADLINE:g} s"
        else:
            return f"the listening connection left a ping unanswered for {LISTENER_PING_DEADLINE:g} s"
