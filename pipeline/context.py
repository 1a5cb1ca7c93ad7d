"""What a handler gets besides its job: :class:`JobContext`.

Its own module, beneath the registry (which names it in a handler's type) and the handler pools
(which make one per attempt), so that neither imports the other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import trio

from .errors import UsageError

if TYPE_CHECKING:
    from .config import Config


class HandlerThread(Protocol):
    """A sync handler's call in a worker thread, as its context needs it (the pool's own record)."""

    token: trio.lowlevel.TrioToken  # the loop, for the handler's emit from any thread
    abandoned: bool  # the attempt is over (its outcome decided, the thread given up on if it still runs)

    def over(self) -> bool:
        """On the loop: whether the attempt is over, or past its deadline (its end is on the way)."""


@attrs.frozen
class JobContext:
    """What a handler gets besides its job: which run this is, and what it may use."""

    id: str  # the job's id: make side effects idempotent with it (execution is at-least-once)
    job_type: str
    attempt: int  # 1 for the first run
    max_attempts: int
    _emit: Callable[[Any], Awaitable[list[str]]] = attrs.field(alias="emit")  # the pipeline's emit (trio)
    resources: Mapping[str, Any]  # what the registry's resources opened (an HTTP client, a mailer)
    config: Config
    # a sync handler's call (set by the pool, through attrs.evolve): how its emit reaches the
    # loop from other threads, and whether the attempt is over. None for an async handler.
    _thread: HandlerThread | None = attrs.field(default=None, eq=False, repr=False)
    # the trace context of the code that enqueued the job (NewJob.trace: W3C traceparent, then a
    # space and the tracestate if any), the same for every attempt; None if it had none
    trace: str | None = None

    def emit(self, event: Any) -> Any:
        """Publish a domain event: the ids of the jobs it routed to, once committed. In an
        async handler, ``await ctx.emit(event)``; from a thread (a sync handler, or a thread it
        started), ``ctx.emit(event)`` blocks until committed and returns the ids. Refused
        (UsageError) once the attempt is over, from any thread (one the pool abandoned at a timeout,
        or one the handler started and left running): its retry emits instead."""
        if trio.lowlevel.in_trio_run():  # on the loop: the coroutine, to await
            return self._emit(event)
        thread = self._thread
        if thread is None:
            return trio.from_thread.run(self._emit, event)
        if thread.abandoned:
            raise self._over()
        return trio.from_thread.run(self._emit_in_attempt, event, thread, trio_token=thread.token)

    async def _emit_in_attempt(self, event: Any, thread: HandlerThread) -> list[str]:
        # looked at again on the loop, where the attempt ends: an emit the thread sent as its
        # deadline passed is refused, not committed beside the job's timeout
        if thread.over():
            raise self._over()
        return await self._emit(event)

    def _over(self) -> UsageError:
        return UsageError(f"job {self.id} ({self.job_type}): attempt {self.attempt} is over (it ended, or its thread was "
                          "abandoned at its timeout, a lost lease or shutdown); its emit is refused")
