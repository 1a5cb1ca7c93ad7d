"""Retention: finished job records and the worker-registry entries of dead processes are
removed once they are old enough, so that a store nobody cleans by hand does not fill up.

Every ``JOB_RETENTION_INTERVAL_SECONDS`` each worker process asks the store whose turn it is
(``Backend.retention_turn``: one process per interval, whichever store); the one whose turn it
is deletes completed jobs older than ``JOB_RETENTION_COMPLETED_SECONDS`` and dead ones older
than ``JOB_RETENTION_DEAD_SECONDS`` (0: kept for ever), oldest first, ``BATCH`` rows per
transaction with a pause between, so that the writes of running jobs go on meanwhile; then the
worker entries whose lease ran out more than ``WORKER_RECORD_GRACE`` ago.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping

import trio

from ...backends.base import Backend
from ...errors import PipelineClosed, PipelineError

log = logging.getLogger("pipeline.retention")

BATCH = 1000  # rows deleted per transaction (per script call on Redis)
PAUSE = 0.01  # seconds between two batches of one round: other writers get the store meanwhile
ROUND_LIMIT = 100  # batches in one round at most; the rest waits for the next round
WORKER_RECORD_GRACE = 3600.0  # a worker entry goes once its lease ran out this long ago
RETRY = 5.0  # seconds before a round that failed is tried again (at most the interval)


async def run_retention(
    backend: Backend,
    *,
    kept_for: Mapping[str, float],
    interval: float,
    pruned: MutableMapping[str, int],
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """``kept_for``: by final status, the age in seconds past which its records go (a status
    not in it is kept for ever). ``pruned``: rows removed, by status and "workers" (/metrics)."""
    task_status.started()
    failing = False
    while True:
        try:
            if await backend.retention_turn(interval_seconds=interval):
                await prune_once(backend, kept_for=kept_for, pruned=pruned)
            if failing:
                log.info("retention works again")
            failing = False
            await trio.sleep(interval)
        except PipelineClosed:
            return
        except PipelineError as exc:  # the store refused or is unreachable (/healthz says so): soon again
            if not failing:
                log.warning("retention: %s; trying again every %g s", exc, min(interval, RETRY))
            failing = True
            await trio.sleep(min(interval, RETRY))


async def prune_once(backend: Backend, *, kept_for: Mapping[str, float], pruned: MutableMapping[str, int]) -> dict[str, int]:
    """One round: every status's old records, in bounded batches, then old worker entries."""
    done: dict[str, int] = {}
    for status, age in kept_for.items():
        for _ in range(ROUND_LIMIT):
            n = await backend.prune(status, older_than_seconds=age, limit=BATCH)
            done[status] = done.get(status, 0) + n
            pruned[status] = pruned.get(status, 0) + n
            if n < BATCH:
                break
            await trio.sleep(PAUSE)
    gone = await backend.prune_workers(older_than_seconds=WORKER_RECORD_GRACE)
    pruned["workers"] = pruned.get("workers", 0) + gone
    if gone:
        done["workers"] = gone
    if any(done.values()):
        log.info("retention removed %s", ", ".join(f"{n} {what}" for what, n in done.items() if n))
    return done
