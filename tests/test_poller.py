"""The Poller's standing offer and its nudges, on hand-made channels.

The interleaving below (an offer's answer waiting in the channel while a full pool frees a
slot, during the Poller's own claim) cannot be arranged on purpose with a real Ledger, so the
backend here is a few lines that answer claims from counts; the Poller, the pools and the
channels are the real ones.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import trio

from pipeline.backends.base import NUDGE_BUFFER, Claimed, Lease, nudge
from pipeline.engine.actors.poller import run_poller
from pipeline.engine.actors.pools import Pool

_ids = itertools.count()


class CountingBackend:
    """Claims answer from ``due`` after a short batch; records every claim."""

    def __init__(self, due: dict[str, int]) -> None:
        self.due = due
        self.claims: list[dict[str, int]] = []

    async def claim(self, wants: Mapping[str, int], *, owner: str, lease_seconds: float, start: object = None,
                    limits: object = None) -> list[Lease]:
        self.claims.append(dict(wants))
        await trio.sleep(0.1)  # the batch the claim rides on
        leases = []
        for job_type, n in wants.items():
            k = min(n, self.due[job_type])
            self.due[job_type] -= k
            leases += [Lease(f"{job_type}{next(_ids)}", job_type, "{}", 1, 3, 1, "", "") for _ in range(k)]
        return leases


def settle_one(pool: Pool, nudge_send: trio.MemorySendChannel[object]) -> None:
    """What a worker does with the job it ran: free its slot, and nudge if the pool was full."""
    lease = pool.recv.receive_nowait()
    was_full = pool.capacity - pool.outstanding <= 0
    pool.held.pop(lease.id, None)
    pool.outstanding -= 1
    if was_full:
        nudge(nudge_send)  # type: ignore[arg-type]


@asynccontextmanager
async def polling(backend: CountingBackend, names: str, *, room: int = 1,
                  rates: Mapping[str, tuple[int, float]] | None = None) -> AsyncIterator[
        tuple[dict[str, Pool], trio.MemorySendChannel[object], trio.MemoryReceiveChannel[object]]]:
    """The real Poller over ``backend``, a pool of ``room`` (and its rate) for each of ``names``, a 30 s
    poll interval: (the pools, the nudge channel's sending end, the offers channel's receiving end, as a Ledger's)."""
    pools = {}
    for name in names:
        send, recv = trio.open_memory_channel[Lease](room)
        pools[name] = Pool(None, room, room, 10.0, send, recv, rate=(rates or {}).get(name))  # type: ignore[arg-type]
    nudge_send, nudge_recv = trio.open_memory_channel[object](NUDGE_BUFFER)
    offers_send, offers_recv = trio.open_memory_channel[object](1)
    async with trio.open_nursery() as tn:
        claiming = await tn.start(lambda task_status: run_poller(
            backend, pools, nudge_recv, offers_send, offers_recv.clone(),  # type: ignore[arg-type]
            owner="me", lease_seconds=30, interval=30.0, task_status=task_status,
        ))
        yield pools, nudge_send, offers_recv
        claiming.cancel()
        for pool in pools.values():  # (the jobs the test left there)
            while True:
                try:
                    pool.recv.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
        nudge_send.close()


async def test_a_pool_that_frees_a_slot_behind_a_waiting_answer_is_claimed_for() -> None:
    backend = CountingBackend({"a": 5, "b": 0, "e": 5})
    async with polling(backend, "abe") as (pools, nudge_send, offers_recv):
        with trio.fail_after(5):  # a and e are full (one job each), b's room stands as the offer...
            offer = await offers_recv.receive()  # ...and the Ledger takes it into a batch
        settle_one(pools["a"], nudge_send)  # a has room: the Poller claims for it...
        await trio.sleep(0.05)
        nudge_send.send_nowait(Claimed(offer, []))  # ...while the offer's batch commits: nothing for b
        settle_one(pools["e"], nudge_send)  # e has room, behind the waiting answer
        with trio.fail_after(1):  # far less than the 30 s poll interval
            while pools["e"].outstanding == 0:
                await trio.sleep(0.01)
        assert any("e" in wants for wants in backend.claims[1:])


async def test_a_nudge_while_the_offer_is_taken_is_answered_by_a_claim_once_the_offers_answer_is_in() -> None:
    """An insert committed in a transaction of its own (on Postgres, one with parents) wakes the
    Poller while a batch holds its offer, all its room: it cannot claim then, and the offer's answer,
    from a claim that ran before that insert, comes back empty. The Poller claims once more then,
    instead of taking the empty answer for "nothing is due" and waiting for its next poll."""
    backend = CountingBackend({"b": 0})
    async with polling(backend, "b") as (pools, nudge_send, offers_recv):
        with trio.fail_after(5):  # its first claim found nothing: b's room stands as the offer...
            offer = await offers_recv.receive()  # ...and a batch takes it
        backend.due["b"] = 1  # another transaction's insert commits...
        nudge(nudge_send)  # type: ignore[arg-type]  # ...and its NOTIFY wakes the Poller, the offer out
        await trio.sleep(0.05)
        nudge_send.send_nowait(Claimed(offer, []))  # the batch's claim ran before that insert: nothing
        with trio.fail_after(1):  # far less than the 30 s poll interval
            while pools["b"].outstanding == 0:
                await trio.sleep(0.01)


class RateBackend(CountingBackend):
    """CountingBackend with one rate window, as the stores keep it: the claim times of the window."""

    def __init__(self, due: dict[str, int], limit: int, window: float) -> None:
        super().__init__(due)
        self.limit, self.window = limit, window
        self.at: list[float] = []  # trio time of each job claimed

    def take(self, wants: Mapping[str, int]) -> list[Lease]:
        """A claim as a batch runs it (the Poller's own, or an offer's): as many as due and the window's room."""
        now = trio.current_time()
        self.at = [t for t in self.at if t > now - self.window]
        leases = []
        for job_type, n in wants.items():
            k = max(0, min(n, self.due[job_type], self.limit - len(self.at)))
            self.due[job_type] -= k
            self.at += [now] * k
            leases += [Lease(f"{job_type}{next(_ids)}", job_type, "{}", 1, 3, 1, "", "") for _ in range(k)]
        return leases

    async def claim(self, wants: Mapping[str, int], *, owner: str, lease_seconds: float, start: object = None,
                    limits: object = None, rates: object = None) -> list[Lease]:
        self.claims.append(dict(wants))
        return self.take(wants)

    async def rate_free_at(self, job_type: str, limit: int, window: float) -> float:
        now = trio.current_time()
        inside = sorted(t for t in self.at if t > now - window)
        return max(0.0, inside[-limit] + window - now) if len(inside) >= limit else 0.0


async def test_a_rate_limited_type_is_never_offered_and_an_offers_answer_has_the_poller_claim_for_it() -> None:
    """A rate-limited type's room never stands in an offer: the Poller times a rate-limited job's start
    from when its claim was sent (pools.RATE_LATE), which it cannot tell of a batch's claim. An offer's
    answer (a batch that may have inserted jobs of the type) has the Poller claim for the type itself,
    not wait for its 30 s poll. (Issue 32; before, the offer held the type's room.)"""
    backend = RateBackend({"r": 2, "b": 0}, limit=3, window=1.0)
    async with polling(backend, "rb", rates={"r": (3, 1.0)}) as (pools, nudge_send, offers_recv):
        with trio.fail_after(5):  # r's claim came back full (1 of 1); b's room stands as the offer...
            first = await offers_recv.receive()  # ...which a batch takes
        assert first.wants == {"b": 1}
        r = pools["r"]
        r.held.pop(r.recv.receive_nowait().id)  # r's job ends, freeing room (a worker's nudge left out)
        r.outstanding -= 1
        nudge_send.send_nowait(Claimed(first, []))  # nothing for b: the Poller claims for r
        with trio.fail_after(3):  # the poll is 30 s away
            while not r.held:  # (delivered: a claim reserves its room in outstanding before it is sent)
                await trio.sleep(0.01)
            second = await offers_recv.receive()
        assert second.wants == {"b": 1}
        assert backend.due["r"] == 0


class RacingRateBackend(RateBackend):
    """Its first ``racing`` looks at the window say it has room whatever it holds: as a look does when
    records leave a sliding window (or an offer's claim takes the room) between the claim and the look."""

    racing = 0

    async def rate_free_at(self, job_type: str, limit: int, window: float) -> float:
        if self.racing:
            self.racing -= 1
            return 0.0
        return await super().rate_free_at(job_type, limit, window)


async def test_a_window_that_looks_free_after_two_short_claims_is_looked_at_again_after_a_window() -> None:
    """Two claims cut short by a full window, each followed by a look that found room (the window moved
    between the two): the Poller takes it for "nothing is due" but looks again a window later, not at
    its 30 s poll. (Jobs waited so for a minute in the engine's rate test, on Postgres and Redis.)"""
    backend = RacingRateBackend({"r": 5}, limit=3, window=1.0)
    backend.racing = 2
    backend.at = [trio.current_time()] * 3  # another process filled the window
    async with polling(backend, "r", room=2, rates={"r": (3, 1.0)}) as (pools, _, _):
        with trio.fail_after(3):  # the window has room after 1 s; the poll is 30 s away
            while len(pools["r"].held) < 2:
                await trio.sleep(0.01)
        assert backend.racing == 0 and len(backend.claims) >= 3
