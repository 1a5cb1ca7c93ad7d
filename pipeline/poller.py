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
from typing import TYPE_CHECKING

import trio

from .errors import PipelineError, StoreError

if TYPE_CHECKING:
    from .app import Pipeline
    from .pools import Pool

log = logging.getLogger("pipeline.poller")


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
    failures = 0
    with wake_recv:
        try:
            with trio.CancelScope() as claiming:
                task_status.started(claiming)
                while True:
                    wants = {name: pool.free for name, pool in pools.items() if pool.free > 0}
                    more = False
                    if wants:
                        try:
                            # shielded: a claim cancelled half-way would commit rows as ours
                            # that no worker holds, stranded as running until their lease ran out
                            with trio.CancelScope(shield=True):
                                leases = await queue.dequeue(wants)
                        except StoreError as exc:
                            failures += 1
                            log.warning("claim failed (%s); retrying", exc)
                            await trio.sleep(min(interval * failures, 5.0))
                            continue
                        failures = 0
                        got: dict[str, int] = {}
                        for lease in leases:
                            pool = pools[lease.job_type]
                            pool.outstanding += 1
                            pool.held[lease.id] = lease
                            pool.send.send_nowait(lease)  # cannot block: buffer == capacity >= outstanding
                            got[lease.job_type] = got.get(lease.job_type, 0) + 1
                        more = any(got.get(name, 0) == n and pools[name].free > 0 for name, n in wants.items())
                    if more:
                        await trio.lowlevel.checkpoint()
                        continue
                    with trio.move_on_after(interval):
                        await wake_recv.receive()
        except PipelineError as exc:
            log.info("poller stopping: %s", exc)
        finally:
            for pool in pools.values():
                pool.send.close()


async def run_lease_keeper(
    pipeline: Pipeline, pools: dict[str, Pool], *, task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED
) -> None:
    """Every third of WORKER_LEASE_SECONDS: renew the leases this process holds, cancel the
    jobs whose lease another process took over, rescue jobs whose lease expired (their
    worker died), and bury pending jobs whose type nothing here knows."""
    queue = pipeline.queue
    period = pipeline.config.worker_lease_seconds / 3
    known = set(pipeline.registry.job_types())
    with trio.CancelScope() as scope:
        task_status.started(scope)
        while True:
            try:
                held = [lease for pool in pools.values() for lease in pool.held.values()]
                lost = await queue.renew(held)
                for job_id in lost:
                    for pool in pools.values():
                        # a job settled in the same batch as the renewal is not lost, just done
                        if job_id in pool.held and job_id not in pool.settling:
                            pool.lost.add(job_id)
                            if job_id in pool.running:
                                pool.running[job_id].cancel()
                            log.warning("job %s: lease lost to another worker; its run here was cancelled", job_id)
                rescued = await queue.rescue_expired()
                if rescued:
                    log.warning("rescued %d jobs whose lease expired", rescued)
                buried = await queue.bury_unknown_types(known, grace_seconds=pipeline.config.worker_unknown_type_grace_seconds)
                if buried:
                    log.error("%d pending jobs have a job type no code here knows; moved to dead", buried)
            except StoreError as exc:
                log.warning("lease upkeep failed (%s); retrying", exc)
            except PipelineError:
                return
            await trio.sleep(period)
