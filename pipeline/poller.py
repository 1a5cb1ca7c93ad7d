"""The Poller: claims jobs for the handler pools, never more than they have room for.

Room is each pool's ``capacity`` (its workers plus a bounded prefetch of at most one
pool's worth) minus what it holds. The prefetch keeps workers busy while the
transaction that freed them commits: the database thread and the handlers overlap.

It claims again at once when a claim came back full (more is likely waiting), when the
Ledger committed something due (the wake channel), or when a full pool freed a slot;
otherwise every ``WORKER_POLL_INTERVAL_MS``, for jobs written by other processes and
delayed jobs that came due.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from .errors import PipelineError, StoreError

if TYPE_CHECKING:
    from .app import Pipeline
    from .pools import Pool
    from .queue import Lease

log = logging.getLogger("pipeline.poller")

# The longest the Poller waits, shielded from cancellation, for the Ledger to answer a
# claim: past the Ledger's own patience with a locked database, so only a Ledger that
# is gone hits it.
SHIELD_LIMIT = 60.0


class Claimer:
    """The Poller's bookkeeping of pool capacity, shared with the Ledger's eager claims.

    Capacity is reserved (``outstanding`` raised) before a claim is sent and the unused
    part handed back when its answer arrives, so the Poller's own claims and the eager
    ones the Ledger adds to a batch that inserted work can never together claim more
    than the pools' channels hold.
    """

    def __init__(self, pools: dict[str, Pool]) -> None:
        self.pools = pools
        self.eager_in_flight = 0  # eager claims sent but not answered (the Ledger's)
        self.eager_done = trio.Event()

    def reserve(self) -> dict[str, int]:
        wants = {name: pool.free for name, pool in self.pools.items() if pool.free > 0}
        for name, n in wants.items():
            self.pools[name].outstanding += n
        return wants

    def deliver(self, wants: dict[str, int], leases: list[Lease]) -> dict[str, int]:
        got: dict[str, int] = {}
        for lease in leases:
            pool = self.pools[lease.job_type]
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

    # -- eager claims: run by the Ledger in the same transaction as an insert ----------------

    def eager(self) -> tuple[dict[str, int], Callable[[bool, Any], None]] | None:
        """Called by the Ledger when a batch inserts work: what to claim right there, and
        what to do with the answer. The new job then starts as soon as its insert commits,
        with no second transaction in between."""
        wants = self.reserve()
        if not wants:
            return None
        self.eager_in_flight += 1

        def done(ok: bool, value: Any) -> None:
            try:
                self.deliver(wants, value if ok else [])
            finally:
                self.eager_in_flight -= 1
                if self.eager_in_flight == 0:
                    self.eager_done.set()
                    self.eager_done = trio.Event()

        return wants, done


async def run_poller(
    pipeline: Pipeline,
    pools: dict[str, Pool],
    wake_recv: trio.MemoryReceiveChannel[None],
    *,
    task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Claim until the returned cancel scope is cancelled; then close every pool's channel,
    which tells its workers no more jobs are coming."""
    queue = pipeline.queue
    interval = pipeline.config.poll_interval
    claimer = Claimer(pools)
    failures = 0
    with wake_recv:
        try:
            with trio.CancelScope() as claiming:
                queue.eager_claimer = claimer.eager
                task_status.started(claiming)
                while True:
                    wants = claimer.reserve()
                    more = False
                    if wants:
                        try:
                            # shielded: a claim cancelled half-way would commit rows as ours
                            # that no worker holds, stranded as running until their lease ran out
                            with trio.CancelScope(shield=True) as shield:
                                shield.deadline = trio.current_time() + SHIELD_LIMIT
                                leases = await queue.dequeue(wants)
                            if shield.cancelled_caught:  # the Ledger never answered: give up on it
                                raise PipelineError("the Ledger did not answer a claim")
                        except StoreError as exc:
                            claimer.deliver(wants, [])
                            failures += 1
                            log.warning("claim failed (%s); retrying", exc)
                            await trio.sleep(min(interval * failures, 5.0))
                            continue
                        failures = 0
                        got = claimer.deliver(wants, leases)
                        more = any(got.get(name, 0) == n and pools[name].free > 0 for name, n in wants.items())
                    if more:
                        await trio.lowlevel.checkpoint()
                        continue
                    with trio.move_on_after(interval):
                        await wake_recv.receive()
        except PipelineError as exc:
            log.info("poller stopping: %s", exc)
        finally:
            queue.eager_claimer = None
            with trio.move_on_after(SHIELD_LIMIT, shield=True):
                while claimer.eager_in_flight:  # answers still on their way from the Ledger
                    await claimer.eager_done.wait()
            for pool in pools.values():
                pool.send.close()
