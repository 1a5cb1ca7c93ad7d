"""Leases: the heartbeat that keeps this process's running jobs, and the keeper that
rescues jobs whose worker died.

The **heartbeat** is an OS thread with a connection of its own. Every third of
WORKER_LEASE_SECONDS it pushes the expiry of every lease this process holds (running
jobs and the few claimed ahead). A renewal that fails is tried again at once (after a
pause of 50 ms, doubling up to 0.5 s) for as long as the leases last, not a period later:
a retry after a renewal that waited a third of the lease or more for a lock came at or
after expiry, and another process ran the jobs again. It is a thread, not a trio task,
so that a handler that blocks the event loop by mistake (CPU-bound code, a blocking
call) cannot starve it: another process would otherwise rescue and run again a job
that is still running here. It writes one column, ``lease_expires_at``, of rows it holds a lease on, and only
while their token matches: the Ledger stays the only writer of job status. In the same
transaction it records this process and the job types it knows in ``workers``, so that
no other process buries pending jobs of a type a live worker knows. If the event loop
has not answered for longer than the longest job timeout (at least ten leases) plus a
lease, the process is taken for stuck and the heartbeat stops renewing, so its jobs can
be rescued.

The **keeper** is a trio task: through the Ledger it rescues jobs whose lease expired
(back to pending with backoff, or dead when out of attempts) and buries pending jobs of
types no code here knows (after WORKER_UNKNOWN_TYPE_GRACE_SECONDS).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence

import trio

from ...backends.base import Backend, LeaseRenewer
from ...errors import PipelineError, StoreError
from .pools import Pool

log = logging.getLogger("pipeline.leases")

RETRY_PAUSE = 0.05  # seconds before a failed renewal is tried again, doubling while they fail
RETRY_PAUSE_MOST = 0.5


class Heartbeat:
    """Renews this process's leases from a thread (see the module docstring)."""

    def __init__(self, renewer: LeaseRenewer, pools: Mapping[str, Pool], *, owner: str, job_types: Sequence[str], lease_seconds: float) -> None:
        self.renewer = renewer
        self.pools = pools
        self.owner = owner
        self.job_types = list(job_types)
        self.lease_seconds = lease_seconds
        self.period = lease_seconds / 3
        # how long the loop may go unanswered before the process is taken for stuck
        self.stall_limit = max(max((pool.timeout for pool in pools.values()), default=0.0), 10 * lease_seconds) + lease_seconds
        self.loop_seen = time.monotonic()  # written by the trio keeper, read by the thread
        self.renewals = 0  # written by the thread; tests read it
        self._stop = threading.Event()
        self._token = trio.lowlevel.current_trio_token()
        self._thread = threading.Thread(target=self._run, name="pipeline-lease-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _held(self) -> list[tuple[str, int]]:
        # list(dict.values()) runs in C under the GIL: a consistent snapshot even while the
        # trio thread adds and removes leases
        return [(lease.id, lease.token) for pool in list(self.pools.values()) for lease in list(pool.held.values())]

    def _run(self) -> None:
        renewed = False
        # monotonic time the last renewal that worked began: every lease held expires no
        # sooner than a lease after it (a lease claimed since runs a whole lease from its claim)
        renewed_at = time.monotonic()
        pause, failures = 0.0, 0  # while renewals fail: the last pause, and how many failed in a row
        try:
            while True:
                stalled = time.monotonic() - self.loop_seen
                if stalled > self.stall_limit:
                    log.error("the event loop has not answered for %.0f s; no longer renewing leases, so other "
                              "processes can rescue this one's jobs", stalled)
                    if self._stop.wait(self.period):
                        break
                    continue
                held = self._held()
                began = time.monotonic()
                try:
                    lost = self.renewer.renew(self.owner, self.job_types, held, lease_seconds=self.lease_seconds)
                except Exception as exc:  # noqa: BLE001 - the store refused: try again while the leases last
                    failures += 1
                    left = renewed_at + self.lease_seconds - time.monotonic()
                    if left > 0:
                        pause = min(pause * 2 if pause else RETRY_PAUSE, RETRY_PAUSE_MOST, left / 2)
                        (log.warning if failures == 1 else log.debug)(
                            "lease renewal failed (%s); trying again in %.2f s, %.1f s before the leases run out",
                            exc, pause, left)
                    else:  # run out: other processes may rescue the jobs; a renewal says which
                        pause = self.period
                        log.warning("lease renewal failed (%s) and the leases ran out; retrying in %.1f s", exc, pause)
                    if self._stop.wait(pause):
                        break
                    continue
                if failures:
                    log.warning("lease renewal works again after %d failures", failures)
                    pause, failures = 0.0, 0
                renewed_at = began
                renewed = True
                self.renewals += 1
                if lost:
                    gone = set(lost)
                    try:
                        self._token.run_sync_soon(self._lost, [(i, token) for i, token in held if i in gone])
                    except trio.RunFinishedError:
                        return
                if self._stop.wait(self.period):
                    break
            if renewed:  # a graceful stop: this worker is gone
                self.renewer.forget(self.owner)
        except Exception as exc:  # noqa: BLE001 - leaving the row is harmless: it goes stale
            log.warning("could not remove worker %s from the worker registry: %s", self.owner, exc)
        finally:
            self.renewer.close()

    def _lost(self, lost: list[tuple[str, int]]) -> None:
        """On the trio thread: cancel the runs whose lease another process now holds."""
        for job_id, token in lost:
            for pool in self.pools.values():
                lease = pool.held.get(job_id)
                # a job settled while the renewal ran is not lost, just done; a lease with
                # another token is a newer claim of the same job, ours and fine
                if lease is None or lease.token != token:
                    continue
                if pool.mark_lost(lease):
                    if (job_id, token) in pool.running:
                        log.warning("job %s: lease lost to another worker; its run here was cancelled", job_id)
                    else:
                        log.warning("job %s: lease lost to another worker before it started here; it will not start", job_id)


# how often each process sweeps for waiting jobs whose parents all ended (Backend.rescue_waiting): a
# repair, for what a defect or a hand-edited store left behind; the stores apply edges as jobs end
WAITING_SWEEP_SECONDS = 60.0


async def run_lease_keeper(
    backend: Backend,
    pools: Mapping[str, Pool],
    *,
    owner: str,
    job_types: Sequence[str],
    lease_seconds: float,
    backoff_base_seconds: float,
    unknown_type_grace_seconds: float,
    task_status: trio.TaskStatus[Heartbeat] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Runs the heartbeat thread; every third of the lease tells it the loop is alive,
    rescues expired leases and buries unknown job types; once a minute sweeps for waiting jobs
    left behind. Cancel the surrounding scope once
    the last worker has settled. ``task_status`` gets the heartbeat (tests read it)."""
    heartbeat = Heartbeat(backend.lease_renewer(), pools, owner=owner, job_types=sorted(job_types), lease_seconds=lease_seconds)
    heartbeat.start()
    next_sweep = time.monotonic() + WAITING_SWEEP_SECONDS / 2
    try:
        task_status.started(heartbeat)
        while True:
            heartbeat.loop_seen = time.monotonic()
            try:
                # every expired lease but those our workers hold: a row left running under our
                # name that no worker holds (a claim whose answer came too late, a bug) returns too
                held = [(lease.id, lease.token) for pool in pools.values() for lease in pool.held.values()]
                rescued = await backend.rescue_expired(base_seconds=backoff_base_seconds, spare=held)
                if rescued:
                    log.warning("rescued %d jobs whose lease expired", rescued)
                buried = await backend.bury_unknown_types(job_types, grace_seconds=unknown_type_grace_seconds)
                if buried:
                    log.error("%d pending jobs have a job type no code here knows; moved to dead", buried)
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + WAITING_SWEEP_SECONDS
                    repaired = await backend.rescue_waiting()
                    if repaired:
                        log.warning("%d waiting jobs whose parents had all ended were woken or cancelled by the sweep", repaired)
            except StoreError as exc:
                log.warning("lease upkeep failed (%s); retrying", exc)
            except PipelineError as exc:  # the backend closed under it: nothing would rescue jobs
                await trio.lowlevel.checkpoint()  # (a cancellation of our caller's explains it)
                log.error("the lease keeper stopped: %s; the pipeline stops", exc)
                raise
            await trio.sleep(heartbeat.period)
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(heartbeat.stop)
