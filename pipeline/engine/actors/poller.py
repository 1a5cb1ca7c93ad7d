"""The Poller: claims jobs for the handler pools, never more than they have room for.

Room is each pool's ``capacity`` (its workers plus a bounded prefetch of at most one
pool's worth) minus what it holds. The prefetch keeps workers busy while the
transaction that freed them commits: the database thread and the handlers overlap.

It claims again at once when a claim came back full (more is likely waiting), when the
backend nudged it (something due was committed), or when a pool full of claimed jobs freed
a slot; otherwise every ``WORKER_POLL_INTERVAL_MS``, for jobs written by other processes and
delayed jobs that came due. While it waits, its free room stands as an offer the backend
may claim for in the transaction of the next insert (see :class:`Offer`).

A rate limit bounds the handlers' starts, not the claims: the store keeps the window at the claim,
and a job starts some time after (the claim's commit, its answer, the worker taking it). So the
claims count the window over RATE_MARGIN more than its length, and a worker hands back a job it
takes more than pools.RATE_LATE (less than the margin) after its claim was sent: no start comes
later after its claim than the margin allows, and no window of the rate's length holds more starts
than the limit (issue 32: ten starts at "5/s" fell within 0.994 s, the first five some ms after
their claim, the next five at once). A rate-limited type is never in an offer: the Poller could
not tell when a claim made in another transaction was sent.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import trio

from ...backends.base import Backend, Claimed, ClaimOffer, Lease, Nudge
from ...errors import PipelineError, StoreError
from ..health import Health
from .pools import RATE_LATE, RATE_SLACK, Pool

log = logging.getLogger("pipeline.poller")

RETRY_MAX = 5.0  # seconds between claims while the store refuses them
RATE_RECHECK = 0.01  # seconds before a rate-limited type whose window had room after a short claim is claimed again
# seconds the claims add to a rate's window: more than a job may start after its claim was sent (RATE_LATE),
# so that its start, not only its claim, is counted in every window that holds it
RATE_MARGIN = RATE_LATE + RATE_SLACK  # (as Pool.rate_margin starts: a worker widens it, see pools._late_for_its_rate)


class Claimer:
    """The Poller's bookkeeping of pool capacity. Room is reserved before a claim is sent
    (``outstanding``) or offered to the backend (``offered``, see :class:`Offer`), and the
    unused part handed back when its answer arrives, so the Poller's claims and its offer
    can never together claim more than the pools' channels hold."""

    def __init__(self, pools: Mapping[str, Pool]) -> None:
        self.pools = pools
        # every claim carries the global limits of the types that have one (None: no type has)
        self.limits = {name: pool.global_limit for name, pool in pools.items() if pool.global_limit is not None} or None
        self.key_limits = {name: pool.key_limit for name, pool in pools.items() if pool.key_limit is not None} or None
        # trio time by which a rate-limited type whose last claim came back short has room in its window again
        self.rate_wake: dict[str, float] = {}
        # rate-limited types whose short claim was followed by a window with room: claimed once more
        # soon after (the window may have freed between the claim and the look), not again and again
        self.rate_rechecked: set[str] = set()

    @property
    def rates(self) -> dict[str, tuple[int, float]] | None:
        """The rate limits, the window as the claims count it: the pool's rate_margin longer (RATE_MARGIN,
        or wider once a worker saw its jobs come later: read at every claim)."""
        return {name: (pool.rate[0], pool.rate[1] + pool.rate_margin) for name, pool in self.pools.items()
                if pool.rate is not None} or None

    @property
    def extra(self) -> dict[str, Any]:
        """The claim's rates and key_limits, passed only when a type has them."""
        return {name: value for name, value in (("rates", self.rates), ("key_limits", self.key_limits)) if value}

    def room(self) -> dict[str, int]:
        return {name: pool.free for name, pool in self.pools.items() if pool.free > 0}

    def rate_room(self) -> bool:
        """A rate-limited type has room (never offered: the Poller claims for it itself)."""
        return any(pool.rate is not None and pool.free > 0 for pool in self.pools.values())

    def starting(self, wants: Mapping[str, int]) -> dict[str, int]:
        """How many of ``wants`` a worker takes as soon as the claim commits (Pool.takers, less
        the jobs queued ahead of them): their attempt counts at the claim; the rest are claimed
        ahead and count when they start (see Lease.started). A taker waiting for the commit of
        its last outcome sent it before this claim, so it commits first (or with it)."""
        return {name: min(n, max(0, self.pools[name].takers - self.pools[name].send.statistics().current_buffer_used))
                for name, n in wants.items()}

    def reserve(self) -> tuple[dict[str, int], dict[str, int]]:
        wants = self.room()
        start = self.starting(wants)
        for name, n in wants.items():
            self.pools[name].outstanding += n
        return wants, start

    def deliver(self, wants: Mapping[str, int], leases: list[Lease], *, sent: float | None = None,
                rates: Mapping[str, tuple[int, float]] | None = None) -> dict[str, int]:
        """``sent``: trio time the claim was sent (the Poller's own claims), and ``rates``: the rate
        windows that claim counted; a rate-limited job's worker checks, as it takes it, that it is no
        later than that window's margin allows (pools.RATE_LATE)."""
        got: dict[str, int] = {}
        for lease in leases:
            pool = self.pools[lease.job_type]
            if pool.paused and sent is not None and sent > pool.paused_at:
                # claimed by a claim sent after this process learned of the pause: the store has it
                # resumed (a resume made by another process, which this one would see only at its look)
                pool.paused = False
                pool.pause_marks += 1  # (a look read before this is not applied)
                log.info("job type %s resumed: a claim got its jobs", lease.job_type)
            if pool.rate is not None and sent is not None and rates is not None and lease.job_type in rates:
                margin = rates[lease.job_type][1] - pool.rate[1]
                pool.claimed_at[(lease.id, lease.token)] = (sent, margin - RATE_SLACK)
            try:
                pool.send.send_nowait(lease)  # cannot block: buffer == capacity >= outstanding
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                # the pool's workers are gone (the pipeline is going down): the job stays
                # running under our lease, which nobody renews, and is rescued when it expires
                log.warning("job %s claimed as the pool stopped; its lease will return it", lease.id)
                continue
            pool.hold(lease)
            got[lease.job_type] = got.get(lease.job_type, 0) + 1
        for name, n in wants.items():
            self.pools[name].outstanding -= n - got.get(name, 0)
        return got


class Offer:
    """The Poller's standing offer to the backend (see base.ClaimOffer): at most one out.

    ``withdraw`` takes it back if the backend has not taken it (both ends are served on
    the trio thread, so the backend either has it or not); once taken, its answer comes
    as a :class:`Claimed` on the nudge channel."""

    def __init__(self, claimer: Claimer, send: trio.MemorySendChannel[ClaimOffer],
                 recv: trio.MemoryReceiveChannel[ClaimOffer], owner: str, lease_seconds: float) -> None:
        self.claimer, self._send, self._recv = claimer, send, recv
        self._owner, self._lease_seconds = owner, lease_seconds
        self.out: ClaimOffer | None = None
        self.posted = 0.0  # trio time the offer out was posted: its claim runs after it

    def post(self) -> None:
        if self.out is not None:
            return
        pools = self.claimer.pools
        wants = {name: n for name, n in self.claimer.room().items() if pools[name].rate is None}
        if not wants:
            return
        offer = ClaimOffer(wants, self._owner, self._lease_seconds, self.claimer.starting(wants), self.claimer.limits,
                           self.claimer.rates, self.claimer.key_limits)
        try:
            self._send.send_nowait(offer)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            return  # no backend takes offers
        for name, n in wants.items():
            pools[name].offered += n
        self.out, self.posted = offer, trio.current_time()

    def _unreserve(self, offer: ClaimOffer) -> None:
        for name, n in offer.wants.items():
            self.claimer.pools[name].offered -= n

    def withdraw(self) -> None:
        if self.out is None:
            return
        try:
            offer = self._recv.receive_nowait()
        except trio.WouldBlock:
            return  # taken: its answer is on its way
        assert offer is self.out
        self._unreserve(offer)
        self.out = None

    def answered(self, claimed: Claimed) -> dict[str, int]:
        self.out = None
        self._unreserve(claimed.offer)
        for name, n in claimed.offer.wants.items():
            self.claimer.pools[name].outstanding += n  # what deliver hands back when unused
        return self.claimer.deliver(claimed.offer.wants, claimed.leases, sent=self.posted)


async def run_poller(
    backend: Backend,
    pools: Mapping[str, Pool],
    nudge_recv: trio.MemoryReceiveChannel[Nudge],
    offers_send: trio.MemorySendChannel[ClaimOffer],
    offers_recv: trio.MemoryReceiveChannel[ClaimOffer],
    *,
    owner: str,
    lease_seconds: float,
    interval: float,
    health: Health | None = None,
    task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Claim until the returned cancel scope is cancelled; then close every pool's channel,
    which tells its workers no more jobs are coming.

    A store that refuses claims (locked, unreachable) is tried again, for as long as it
    takes, and ``health`` says so meanwhile; anything else (the backend closed under it, a
    bug) is logged at ERROR and raised, which takes the pipeline down rather than leaving
    workers that are never fed. ``offers_recv`` is the Poller's own clone of the offers
    channel, to take back an offer the backend has not taken."""
    health = health if health is not None else Health()
    claimer = Claimer(pools)
    offer = Offer(claimer, offers_send, offers_recv, owner, lease_seconds)
    failures = 0
    with nudge_recv, offers_send, offers_recv:
        try:
            with trio.CancelScope() as claiming:
                task_status.started(claiming)
                while True:
                    offer.withdraw()
                    # an offer the backend took holds its room until its answer comes: what woke us (a
                    # nudge: an insert committed since) may be newer than that answer's claim, so once the
                    # answer is in, we claim again rather than take a short answer for "nothing is due"
                    owed = offer.out is not None
                    wants, start = claimer.reserve()
                    more = False
                    if wants:
                        sent = health.claiming_since = trio.current_time()
                        try:
                            # shielded: a claim cancelled half-way would commit rows as ours
                            # that no worker holds. Every backend answers within its patience
                            # (a failure is an answer), and /healthz tells of a claim that waits long.
                            extra = claimer.extra  # (the rate margins as this claim counts them)
                            with trio.CancelScope(shield=True):
                                leases = await backend.claim(wants, owner=owner, lease_seconds=lease_seconds, start=start,
                                                             limits=claimer.limits, **extra)
                        except StoreError as exc:
                            claimer.deliver(wants, [])
                            failures += 1
                            health.report("poller", f"claims fail ({failures} in a row): {exc}")
                            log.warning("claim failed (%s); retrying", exc)
                            await trio.sleep(min(interval * failures, RETRY_MAX))
                            continue
                        except PipelineError:
                            # the backend closed under us: if our caller's scope is being cancelled
                            # (the Ledger was cancelled with it), that is the way out; otherwise it is a fault
                            await trio.lowlevel.checkpoint()
                            raise
                        finally:
                            health.claiming_since = None
                        if failures:
                            log.warning("claims work again after %d failures", failures)
                            health.clear("poller")
                            failures = 0
                        got = claimer.deliver(wants, leases, sent=sent, rates=extra.get("rates"))
                        more = any(got.get(name, 0) == n and pools[name].free > 0 for name, n in wants.items())
                        if claimer.rates:
                            await _rate_waits(backend, claimer, wants, got)
                    if more:
                        await trio.lowlevel.checkpoint()
                        continue
                    await _wait(offer, nudge_recv, _until_rate_room(claimer, interval), owed=owed)
        except BaseException as exc:
            if not isinstance(exc, trio.Cancelled):
                log.error("the Poller stopped: %r; no job will be claimed: the pipeline stops", exc)
            raise
        finally:
            offer.withdraw()
            with trio.CancelScope(shield=True):
                while offer.out is not None:  # taken by the backend: its answer is on its way
                    try:
                        message = await nudge_recv.receive()
                    except trio.EndOfChannel:
                        break
                    if isinstance(message, Claimed):
                        offer.answered(message)
            for pool in pools.values():
                pool.send.close()


async def _rate_waits(backend: Backend, claimer: Claimer, wants: Mapping[str, int], got: Mapping[str, int]) -> None:
    """For each rate-limited type whose claim came back short: when its window has room again (the
    store says), so that the Poller claims for it then instead of polling, or waiting a whole interval."""
    assert claimer.rates is not None
    for name, (limit, window) in claimer.rates.items():
        if name not in wants or got.get(name, 0) >= wants[name]:
            claimer.rate_wake.pop(name, None)
            claimer.rate_rechecked.discard(name)
            continue
        try:
            wait = await backend.rate_free_at(name, limit, window)
        except StoreError as exc:
            log.warning("could not read the rate window of %s (%s); claiming again in %g s", name, exc, RATE_RECHECK * 10)
            claimer.rate_wake[name] = trio.current_time() + RATE_RECHECK * 10
            continue
        if wait > 0:
            claimer.rate_wake[name] = trio.current_time() + wait
            claimer.rate_rechecked.discard(name)
        elif name not in claimer.rate_rechecked:
            # room now, yet the claim came back short: nothing more is due, or the window freed between
            # the claim and this look (a full window's oldest claim left it meanwhile). Once, claim again
            # soon: a pool with room gets no nudge, and waiting a poll interval would stall the type
            claimer.rate_wake[name] = trio.current_time() + RATE_RECHECK
            claimer.rate_rechecked.add(name)
        else:
            # short twice with room: most likely nothing is due. Looked at again after a window all the
            # same: an offer's claim between the claim and the look (or a record leaving a sliding window
            # meanwhile) makes a window that was full at the claim look free, and taking that for "nothing
            # is due" left jobs pending until the poll (18 of 50 for a minute, in the engine's rate test)
            claimer.rate_wake[name] = trio.current_time() + window


def _until_rate_room(claimer: Claimer, interval: float) -> float:
    """The poll interval, or less: until the first rate-limited type's window has room again."""
    if not claimer.rate_wake:
        return interval
    now = trio.current_time()
    return max(0.0, min(interval, min(claimer.rate_wake.values()) - now))


async def _wait(offer: Offer, nudge_recv: trio.MemoryReceiveChannel[Nudge], interval: float, *, owed: bool = False) -> None:
    """Until a nudge or the poll interval, with the free room standing as an offer. An
    answered offer that came back short claimed everything due that this process has room
    for: the offer stands again, with no claim of the Poller's own in between; unless
    ``owed`` (the Poller was woken while that offer was out: its claim may predate what woke it)."""
    with trio.move_on_after(interval):
        while True:
            offer.post()  # free room waits for the next insert of this process
            try:
                message = await nudge_recv.receive()
            except trio.EndOfChannel:
                await trio.lowlevel.checkpoint()  # (a cancellation of our caller's explains it)
                raise PipelineError("the backend closed its channel to the Poller while the pipeline runs") from None
            if not isinstance(message, Claimed):
                return  # work may be due, or a pool full of claimed jobs has room: claim
            got = offer.answered(message)
            if owed or any(got.get(name, 0) == n for name, n in message.offer.wants.items()):
                return  # it came back full (more is likely waiting), or we owe a claim of our own
            if offer.claimer.rate_room():
                return  # the batch may have inserted jobs of a rate-limited type, which no offer claims
