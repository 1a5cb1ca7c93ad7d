"""The job state machine: one pure table, applied by the Ledger, drawn in diagrams/.

This module imports neither trio nor sqlite3. The engine decides here; a backend turns
each transition into a fenced write. The conformance suite (tests/backends/) checks every
backend against a model of its own, not against these decisions.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable
from typing import Final

import attrs

from .errors import UsageError


class Status(enum.StrEnum):
    WAITING = "waiting"  # enqueued with after=[...]: pending once every parent completed (never claimed before)
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    DEAD = "dead"
    CANCELLED = "cancelled"  # final: by an operator or a client, or expired before it started
    # durable functions (docs/durable.md): a job that left its worker in ctx.sleep or ctx.wait_for, holding
    # nothing, until its time comes or its signal arrives (then pending, run again from the top)
    SUSPENDED = "suspended"


class Transition(enum.StrEnum):
    """Every way a job changes status. The value is the label drawn on the diagram."""

    CLAIM = "claim (attempts + 1, unless claimed ahead of a free worker)"
    START = "a job claimed ahead starts (attempts + 1)"
    SUCCEED = "ok"
    RETRY = "error, attempts < max_attempts: run_after = now + backoff"
    BURY = "error, attempts >= max_attempts, or permanent error"
    RESCUE = "lease expired, attempts < max_attempts: backoff"
    RESCUE_BURY = "lease expired, out of attempts"
    UNCLAIM = "lease expired before the job started (attempt not counted)"
    RELEASE = "graceful shutdown, unfinished (attempt not counted)"
    REVIVE = "admin retry (attempts reset)"
    REVIVE_CANCELLED = "admin retry of a cancelled job (attempts reset)"
    CANCEL = "cancel requested while running: the handler stopped"
    CANCEL_PENDING = "cancelled before it started (operator, client)"
    EXPIRE = "not started by its expires_at"
    RESCUE_CANCEL = "lease expired while a cancel was requested"
    SNOOZE = "Snooze(delay): pending after the delay (attempt not counted)"
    SNOOZE_BURY = "snoozed more than WORKER_MAX_SNOOZES times"
    WAKE = "every parent completed (or ended, with on_parent_failure='run')"
    CANCEL_WAITING = "a parent ended dead, cancelled or deleted; or cancelled by an operator"
    STEP = "ctx.step's value committed (the job keeps running)"
    SUSPEND = "ctx.sleep / ctx.wait_for: leaves its worker (attempt not counted)"
    RESUME = "its sleep or wait's time came, or its signal was sent"
    CANCEL_SUSPENDED = "cancelled while suspended (operator, client)"
    REPLAY = "admin retry --from-step of a completed job (attempts reset)"


TRANSITIONS: Final[dict[Transition, tuple[Status, Status]]] = {
    Transition.CLAIM: (Status.PENDING, Status.RUNNING),
    Transition.START: (Status.RUNNING, Status.RUNNING),
    Transition.SUCCEED: (Status.RUNNING, Status.COMPLETED),
    Transition.RETRY: (Status.RUNNING, Status.PENDING),
    Transition.BURY: (Status.RUNNING, Status.DEAD),
    Transition.RESCUE: (Status.RUNNING, Status.PENDING),
    Transition.RESCUE_BURY: (Status.RUNNING, Status.DEAD),
    Transition.UNCLAIM: (Status.RUNNING, Status.PENDING),
    Transition.RELEASE: (Status.RUNNING, Status.PENDING),
    Transition.REVIVE: (Status.DEAD, Status.PENDING),
    Transition.REVIVE_CANCELLED: (Status.CANCELLED, Status.PENDING),
    Transition.CANCEL: (Status.RUNNING, Status.CANCELLED),
    Transition.CANCEL_PENDING: (Status.PENDING, Status.CANCELLED),
    Transition.EXPIRE: (Status.PENDING, Status.CANCELLED),
    Transition.RESCUE_CANCEL: (Status.RUNNING, Status.CANCELLED),
    Transition.SNOOZE: (Status.RUNNING, Status.PENDING),
    Transition.SNOOZE_BURY: (Status.RUNNING, Status.DEAD),
    Transition.WAKE: (Status.WAITING, Status.PENDING),
    Transition.CANCEL_WAITING: (Status.WAITING, Status.CANCELLED),
    Transition.STEP: (Status.RUNNING, Status.RUNNING),
    Transition.SUSPEND: (Status.RUNNING, Status.SUSPENDED),
    Transition.RESUME: (Status.SUSPENDED, Status.PENDING),
    Transition.CANCEL_SUSPENDED: (Status.SUSPENDED, Status.CANCELLED),
    Transition.REPLAY: (Status.COMPLETED, Status.PENDING),
}

TERMINAL: Final = frozenset({Status.COMPLETED, Status.DEAD, Status.CANCELLED})
# what an operator's retry puts back to pending (attempts reset)
REVIVABLE: Final = frozenset({Status.DEAD, Status.CANCELLED})


def check_finished(statuses: Iterable[str], doing: str) -> None:
    """UsageError unless there is a status and every one is final: what cleanup and retention
    may remove (``doing``: "cleanup deletes", "retention removes")."""
    statuses = list(statuses)
    bad = [s for s in statuses if s not in TERMINAL]
    if bad or not statuses:
        raise UsageError(f"{doing} only finished jobs (completed, dead or cancelled), not {bad or 'nothing'}")


def source(transition: Transition) -> Status:
    return TRANSITIONS[transition][0]


def target(transition: Transition) -> Status:
    return TRANSITIONS[transition][1]


JITTER: Final = (0.85, 1.15)
MAX_DELAY: Final = 30 * 24 * 3600.0  # no retry is put further off than a month


def backoff_seconds(attempts: int, base_seconds: float, rng: random.Random | None = None) -> float:
    """Delay before the next try, after the attempt numbered ``attempts`` failed.

    base × 2^(attempts−1) × jitter, jitter uniform in [0.85, 1.15]: with a 10 s base,
    ~10 s after the first failure, ~20 s after the second, ~40 s after the third.
    The exponent is capped so a large max_attempts cannot overflow.
    """
    exponent = min(max(attempts - 1, 0), 30)
    jitter = (rng or random).uniform(*JITTER)
    return base_seconds * (2**exponent) * jitter


@attrs.frozen
class FailureDecision:
    transition: Transition
    delay: float  # seconds until run_after; 0 when buried


def settle_failure(
    *,
    attempts: int,
    max_attempts: int,
    permanent: bool,
    base_seconds: float,
    retry_delay: float | None = None,
    rng: random.Random | None = None,
) -> FailureDecision:
    """What a failed attempt leads to. ``attempts`` counts the attempt that just failed."""
    if permanent or attempts >= max_attempts:
        return FailureDecision(Transition.BURY, 0.0)
    delay = retry_delay if retry_delay is not None else backoff_seconds(attempts, base_seconds, rng)
    if not 0 <= delay <= MAX_DELAY:  # NaN, negative or absurd: clamp rather than store a time that cannot sort
        delay = MAX_DELAY if delay > 0 else 0.0
    return FailureDecision(Transition.RETRY, delay)


def rescue(*, attempts: int, max_attempts: int, base_seconds: float, rng: random.Random | None = None) -> FailureDecision:
    """What an expired lease leads to: the attempt it held counts as failed."""
    if attempts >= max_attempts:
        return FailureDecision(Transition.RESCUE_BURY, 0.0)
    return FailureDecision(Transition.RESCUE, backoff_seconds(attempts, base_seconds, rng))
