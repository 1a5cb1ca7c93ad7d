"""The **waker**: suspended jobs (ctx.sleep, ctx.wait_for with a timeout) back to pending when their
time comes (docs/durable.md).

Every worker process runs one. It asks the store to wake what is due (``Backend.wake_suspended``: an
indexed look that changes nothing while nothing is due), which also says when the next suspended job
is due; it looks again then, or after the poll interval if sooner (a job another process suspends
meanwhile may be due earlier). A job this process suspends tells it its time directly (:meth:`Waker.due`),
so a short sleep resumes on time without a faster poll. A woken job is due at once: the store wakes the
Pollers as an insert does. A signal wakes its job in the same transaction that stores it, not here.
"""

from __future__ import annotations

import logging
import math

import attrs
import trio

from ...backends.base import Backend
from ...errors import PipelineClosed, PipelineError, StoreError

log = logging.getLogger("pipeline.waker")

SLACK = 0.005  # looked for a little after the due time: stored times are cut to the millisecond
WAKE_LIMIT = 500  # jobs woken per look at most (the next look follows at once while more are due)


@attrs.define
class Waker:
    """When this process next looks (trio time), lowered by a job it suspends."""

    next_at: float = math.inf
    changed: trio.Event = attrs.field(factory=trio.Event)

    def due(self, seconds: float) -> None:
        """A job this process suspended is due in ``seconds`` (on the loop)."""
        at = trio.current_time() + max(seconds, 0.0) + SLACK
        if at < self.next_at:
            self.next_at = at
            self.changed.set()


async def run_waker(backend: Backend, waker: Waker, *, interval: float,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    task_status.started()
    failing = False
    while True:
        try:
            woken, next_in = await backend.wake_suspended(limit=WAKE_LIMIT)
        except PipelineClosed:
            return
        except (StoreError, PipelineError) as exc:
            if not failing:
                log.warning("could not wake the suspended jobs that are due (%s); trying again", exc)
            failing, woken, next_in = True, 0, None
        except Exception:  # a bug, or a row it cannot read: said, and tried again, not the end of the process
            log.exception("waking the suspended jobs that are due failed; trying again")
            failing, woken, next_in = True, 0, None
        else:
            if failing:
                log.info("waking suspended jobs again")
            failing = False
        if woken:
            log.debug("woke %d suspended jobs", woken)
        wait = interval if next_in is None else min(interval, next_in + SLACK)
        waker.next_at = min(waker.next_at, trio.current_time() + wait)
        while trio.current_time() < waker.next_at:
            waker.changed = trio.Event()
            with trio.move_on_at(waker.next_at):
                await waker.changed.wait()
        waker.next_at = math.inf
