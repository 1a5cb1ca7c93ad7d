"""Control of running jobs from outside: the **canceller**, which stops the jobs whose cancel was
requested, and the **progress writer**, which stores what handlers report through ``ctx.progress``.

The canceller asks the store, twice a second and only while this process holds leases, which of
its running jobs were asked to stop (``Backend.cancel_requests``: an indexed read of this owner's
requests), and tells their pool (``Pool.request_cancel``): an async handler's run is cancelled, a
sync handler's thread sees ``ctx.cancel_requested``. The job's CANCEL outcome is then written
like any other, fenced by its lease token, so a cancel that races the job's own outcome ends in
exactly one of them. A process that dies before it stops the job leaves it to the rescue, which
ends an expired lease whose cancel was requested as cancelled.

At the same look it reads the paused types (``Backend.paused_types``) and tells each pool
(``Pool.paused``): a paused type's workers start nothing, and what they take (jobs claimed ahead,
before the pause) goes back to pending, its attempt not counted. So a pause made elsewhere is
acknowledged here within half a second while this process holds jobs (with none, its claims skip the
type); the process that pauses acknowledges it at once (Pipeline.pause_type).

The progress writer keeps the latest report of each running job and writes those that changed,
at most once a second per job (one ``Backend.set_progress`` each, fenced like an outcome: a report
of a job that has since ended changes nothing). The first report of a quiet second goes at once.
A job's last report is not left to its second: as its run ends, its worker asks the writer for it
(``ProgressBoard.flush``) and writes the outcome once it is stored, or the fence would drop it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import trio

from ...backends.base import Backend
from ...errors import PipelineClosed, PipelineError, StoreError
from .pools import Pool

log = logging.getLogger("pipeline.control")

CANCEL_POLL = 0.5  # seconds between two looks for cancel requests, while this process holds leases
IDLE_LOOK = 0.5  # seconds between two looks at whether it holds any
PROGRESS_PERIOD = 1.0  # a job's progress is written at most this often


async def run_canceller(
    backend: Backend, pools: Mapping[str, Pool], *, owner: str, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Stop the jobs of this process whose cancel was requested (see the module docstring)."""
    task_status.started()
    failing = False
    while True:
        if not any(pool.held for pool in pools.values()):
            await trio.sleep(IDLE_LOOK)
            continue
        marks = {name: pool.pause_marks for name, pool in pools.items()}
        try:
            requests = await backend.cancel_requests(owner)
            paused = await backend.paused_types()
        except PipelineClosed:
            return
        except (StoreError, PipelineError) as exc:
            if not failing:
                log.warning("could not read cancel requests and pauses (%s); trying again", exc)
            failing = True
            await trio.sleep(CANCEL_POLL)
            continue
        failing = False
        for name, pool in pools.items():
            if pool.pause_marks == marks[name] and pool.paused != (name in paused):  # (not one made here meanwhile)
                pool.paused = name in paused
                if pool.paused:
                    pool.paused_at = trio.current_time()
                log.info("job type %s %s", name, "paused: its jobs claimed ahead go back to pending, none starts"
                         if pool.paused else "resumed")
        for job_id, token in requests:
            for pool in pools.values():
                if pool.request_cancel(job_id, token):
                    log.info("job %s (%s): cancel requested; stopping it", job_id, pool.spec.name)
                    break
        await trio.sleep(CANCEL_POLL)


class ProgressBoard:
    """The latest progress each running job reported, until it is written (on the trio thread)."""

    def __init__(self) -> None:
        self.latest: dict[tuple[str, int], tuple[float, str | None]] = {}
        self.written: dict[tuple[str, int], float] = {}  # trio time each job's progress was last written
        self.changed = trio.Event()
        # the writer's: the jobs whose reports it took and has not written yet
        self.writing: set[tuple[str, int]] = set()
        # workers add (flush), the writer sets and removes: runs that ended, waiting for their last report
        self.flushing: dict[tuple[str, int], trio.Event] = {}
        self.urgent = trio.Event()  # a flush: the writer stops waiting out a second
        self.closed = False  # the writer ended: a flush waits for nothing

    def report(self, job_id: str, token: int, fraction: float, message: str | None) -> None:
        self.latest[(job_id, token)] = (fraction, message)
        self.changed.set()

    def flush(self, job_id: str, token: int) -> trio.Event | None:
        """A worker's, as the run ends: an event set once the job's last report is stored (written
        now, whatever its second), or None if nothing of it waits to be written. Its outcome is
        written after it: the fenced write of a report that came later would change nothing."""
        key = (job_id, token)
        if self.closed or (key not in self.latest and key not in self.writing):
            return None
        done = self.flushing.get(key)
        if done is None:
            done = self.flushing[key] = trio.Event()
        self.changed.set()
        self.urgent.set()
        return done


async def run_progress_writer(
    backend: Backend, board: ProgressBoard, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Write the reported progress, each job's at most once a second (see the module docstring)."""
    task_status.started()
    try:
        await _write_progress(backend, board)
    finally:
        board.closed = True
        for done in board.flushing.values():
            done.set()


async def _write_progress(backend: Backend, board: ProgressBoard) -> None:
    while True:
        await board.changed.wait()
        board.changed = trio.Event()
        now = trio.current_time()
        due = {key: value for key, value in board.latest.items()
               if key in board.flushing or now - board.written.get(key, -PROGRESS_PERIOD) >= PROGRESS_PERIOD}
        for key in due:
            del board.latest[key]
            board.written[key] = now
        board.writing.update(due)
        for (job_id, token), (fraction, message) in due.items():
            try:
                if not await backend.set_progress(job_id, token, fraction, message):
                    board.written.pop((job_id, token), None)  # it ended meanwhile: forget it
            except PipelineClosed:
                return
            except PipelineError as exc:  # progress is a view: one missed write is not worth more than a line
                log.debug("job %s: progress not stored (%s)", job_id, exc)
            finally:
                board.writing.discard((job_id, token))
        for key in [key for key in board.flushing if key not in board.latest and key not in board.writing]:
            board.flushing.pop(key).set()
            board.written.pop(key, None)  # (its run is over)
        if len(board.written) > 10_000:  # ended jobs whose last write answered True: drop the oldest marks
            for key in sorted(board.written, key=board.written.__getitem__)[:5_000]:
                del board.written[key]
        if board.latest:  # reports that came too soon: written once their second is up, or flushed
            wait = min(PROGRESS_PERIOD - (trio.current_time() - board.written.get(key, -PROGRESS_PERIOD)) for key in board.latest)
            with trio.move_on_after(max(wait, 0.0)):
                await board.urgent.wait()
            board.changed.set()
        board.urgent = trio.Event()
