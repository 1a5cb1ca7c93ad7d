"""Every exception the pipeline raises on purpose.

    PipelineError                  base of everything below
    ├── ConfigError                a setting is missing or malformed (CLI exit 2)
    ├── UsageError                 bad input from a caller: unknown job type or event,
    │   │                          payload that does not fit, bad option (CLI exit 2)
    │   ├── UnknownJobType
    │   ├── UnknownEvent
    │   └── InvalidPayload
    ├── StoreError                 the database refused or failed (CLI exit 1)
    │   ├── SchemaTooNew           the file was migrated by a newer pipeline
    │   ├── DatabaseUnavailable    the file cannot be opened or is not a database
    │   └── CommitUnknown          the store dropped an enqueue's commit: it may have been written
    ├── PipelineClosed             enqueue/emit after the pipeline began shutting down
    │   └── ClientClosed           a Client / AsyncClient call after close(), or a result() wait
    │                              that close() ended
    └── JobFailed                  result() of a job that ended dead (or cancelled)
        └── JobCancelled           ... that ended cancelled
    └── JobError                   raised by handlers to steer what happens to a job
        ├── PermanentError         dead at once, no retry
        ├── RetryLater             retry after a given delay instead of the backoff
        └── Snooze                 pending again after a delay, the attempt not counted

A handler's other exceptions are not special: any ``Exception`` a handler raises is
recorded on the job as its error and retried with backoff. ``trio.Cancelled`` and
``KeyboardInterrupt`` are never caught.
"""

from __future__ import annotations


class PipelineError(Exception):
    """Base class of the pipeline's own exceptions."""


class ConfigError(PipelineError):
    """A configuration value is missing or malformed; the message names the variable."""


class UsageError(PipelineError):
    """A caller asked for something that cannot be done as asked."""


class UnknownJobType(UsageError):
    pass


class UnknownEvent(UsageError):
    pass


class InvalidPayload(UsageError):
    pass


class SignalKeyUsed(UsageError):
    """A signal with this key was sent to the job already (a signed link works once): nothing was sent."""


class StoreError(PipelineError):
    """The job store failed (disk full, locked for too long, I/O error)."""


class SchemaTooNew(StoreError):
    pass


class DatabaseUnavailable(StoreError):
    pass


class CommitUnknown(StoreError):
    """An enqueue whose commit the store (Postgres, Redis) dropped before answering, and which
    could not be asked again: its jobs may have been committed (all or none). ``job_ids``: the ids
    they would have; the message says how to check. An enqueue with an ``idempotency_key`` can
    simply be sent again: docs/jobs.md, "Retrying an enqueue safely"."""

    def __init__(self, message: str, job_ids: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.job_ids = job_ids


class PipelineClosed(PipelineError):
    """The pipeline is shutting down and takes no new work."""


class ClientClosed(PipelineClosed):
    """A :class:`pipeline.Client` or :class:`pipeline.AsyncClient` call made after ``close()`` (or
    on a client whose loop failed), or a ``result()`` wait that ``close()`` ended: what it waited for
    is unchanged in the store (ask a new client). An ``Exception``, unlike the ``trio.Cancelled``
    such a waiting thread used to get."""


class JobFailed(PipelineError):
    """``result()`` of a job that ended without completing: ``status`` says how (dead, or cancelled for
    :class:`JobCancelled`), ``error`` is the job's last error."""

    def __init__(self, job_id: str, status: str, error: str | None) -> None:
        first = (error or "no error recorded").splitlines()[0]
        super().__init__(f"job {job_id} ended {status}: {first}")
        self.job_id = job_id
        self.status = status
        self.error = error


class JobCancelled(JobFailed):
    """``result()`` of a job that was cancelled (by an operator, a client, or its expiry)."""


class JobError(Exception):
    """Raised by a handler to say how the job should be settled."""


class PermanentError(JobError):
    """The job can never succeed: it goes dead at once, with this message as its error."""


class RetryLater(JobError):
    """Retry this job after ``delay`` seconds (counts as a failed attempt)."""

    MAX_DELAY = 30 * 24 * 3600.0  # a month; longer asks are capped to it

    def __init__(self, message: str, *, delay: float) -> None:
        super().__init__(message)
        delay = float(delay)
        if not delay >= 0:  # also refuses NaN
            raise ValueError(f"RetryLater delay must be a number of seconds >= 0, got {delay!r}")
        self.delay = min(delay, self.MAX_DELAY)


class SignalTimeout(JobError):
    """Raised in a handler by ``ctx.wait_for(name, timeout=...)`` when the timeout passed before the
    signal came. Uncaught, it fails the attempt as any error does (its retry waits again)."""

    def __init__(self, job_id: str, name: str, timeout: float | None = None) -> None:
        self.job_id, self.name, self.timeout = job_id, name, timeout
        after = f" within {timeout:g} s" if timeout is not None else ""
        super().__init__(f"job {job_id}: no signal {name!r} came{after}")


class Snooze(JobError):
    """Put this job back to pending for ``delay`` seconds without counting the attempt (unlike
    :class:`RetryLater`): "not yet" rather than "failed". The job's snooze count goes up by one; past
    WORKER_MAX_SNOOZES it ends dead, so a job that snoozes for ever is noticed."""

    MAX_DELAY = RetryLater.MAX_DELAY

    def __init__(self, delay: float = 0.0, message: str = "") -> None:
        if hasattr(delay, "total_seconds"):  # a datetime.timedelta
            delay = delay.total_seconds()
        delay = float(delay)
        if not delay >= 0:  # also refuses NaN
            raise ValueError(f"Snooze delay must be a number of seconds >= 0, got {delay!r}")
        self.delay = min(delay, self.MAX_DELAY)
        super().__init__(message or f"snoozed for {self.delay:g} s")
