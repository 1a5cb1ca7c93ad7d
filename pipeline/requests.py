"""Jobs as operators send them (the CLI, the admin API, the outbox): a type name and a raw
payload, checked against the registry and turned into rows for the backend."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from .backends.base import PRIORITY_DEFAULT, PRIORITY_MAX, PRIORITY_MIN, UNIQUE_WHILE, NewJob
from .clock import now_ts, to_ts
from .errors import UsageError
from .texts import check_text
from .ids import UUID7Factory
from .registry import Registry
from .workflows import check_on_parent_failure, check_parents


class JobRequest(NamedTuple):
    """A job as the CLI and the admin API receive it: type name and raw payload. (A tuple:
    ``enqueue --from-file`` makes one per line.)"""

    job_type: str
    payload: Mapping[str, Any] | str
    max_attempts: int | None = None
    run_after: Any = None
    priority: int = PRIORITY_DEFAULT
    unique_key: str | None = None
    expires_at: Any = None  # a time (ISO 8601 text, a datetime, epoch seconds); None: it never expires
    unique_while: str | None = None  # "pending_or_running" (None: the default) or "pending"
    after: Any = None  # job ids it waits for (docs/workflows.md); None: none
    on_parent_failure: str | None = None  # "cancel" (None: the default) or "run"
    idempotency_key: str | None = None  # enqueue's idempotency_key (docs/jobs.md, "Retrying an enqueue safely")


MAX_UNIQUE_KEY_CHARS = 200  # a key names a thing ("user:42", an order number), not a payload


def check_unique_key(value: Any, what: str = "unique_key") -> str | None:
    """A job's unique key as given (None: no key): a non-empty string of at most
    MAX_UNIQUE_KEY_CHARS characters, without NUL (no store's text holds one); UsageError otherwise."""
    if value is None:
        return None
    if type(value) is not str:
        raise UsageError(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise UsageError(f"{what} must not be empty (leave it out for a job without one)")
    if len(value) > MAX_UNIQUE_KEY_CHARS:
        raise UsageError(f"{what} must be at most {MAX_UNIQUE_KEY_CHARS} characters, got {len(value)}")
    return check_text(value, what)


def check_job_id(value: Any, what: str = "job id") -> str:
    """A job (or batch) id as a caller names it: text a store can hold; UsageError naming ``what`` otherwise
    (no job has such an id)."""
    if type(value) is not str:
        raise UsageError(f"{what} must be a string, got {type(value).__name__}")
    return check_text(value, what)


def prepare_rows(
    registry: Registry,
    requests: Iterable[JobRequest],
    *,
    default_max_attempts: int = 3,
    new_id: UUID7Factory | None = None,
    now: str | None = None,
) -> list[NewJob]:
    """Validate every request (UsageError naming the problem) and build rows; writes nothing."""
    new_id = new_id or UUID7Factory()
    now = now or now_ts()
    return [prepare_row(registry, req, default_max_attempts, new_id, now) for req in requests]


def prepare_row(registry: Registry, req: JobRequest, default_max_attempts: int, new_id: UUID7Factory, now: str) -> NewJob:
    """One request checked against its job type, as the row to insert."""
    payload = registry.validate(req.job_type, req.payload)
    max_attempts = req.max_attempts
    if max_attempts is None:
        max_attempts = registry.spec(req.job_type).max_attempts or default_max_attempts
    if type(max_attempts) is not int or max_attempts < 1:  # bool is not an int here
        raise UsageError(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
    if type(req.priority) is not int or not PRIORITY_MIN <= req.priority <= PRIORITY_MAX:
        raise UsageError(f"priority must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX}, got {req.priority!r}")
    run_after = now if req.run_after is None else check_time(req.run_after, "run_after")
    unique_key = req.unique_key if req.unique_key is None else check_unique_key(req.unique_key)
    spec = registry.spec(req.job_type)
    if req.expires_at is None and req.unique_while is None and spec.limit_key is None and req.after is None \
            and req.on_parent_failure is None and req.idempotency_key is None:
        # the common case: the row the hot path has always inserted
        return NewJob(new_id(), req.job_type, payload, max_attempts, run_after, req.priority, now, unique_key)
    expires_at = None if req.expires_at is None else check_expires_at(req.expires_at, now=now, run_after=run_after)
    unique_while = check_unique_while(req.unique_while, unique_key)
    limit_key = None if spec.limit_key is None else limit_key_of(spec, registry.decode(req.job_type, payload, stored=True))
    after = check_parents(req.after)
    return NewJob(new_id(), req.job_type, payload, max_attempts, run_after, req.priority, now, unique_key,
                  expires_at=expires_at, limit_key=limit_key, unique_while=unique_while, after=after,
                  on_parent_failure=check_on_parent_failure(req.on_parent_failure, after),
                  idempotency_key=check_unique_key(req.idempotency_key, "idempotency_key"))


def check_time(value: Any, what: str) -> str:
    """A job's time (``run_after``, ``expires_at``) as stored: ISO 8601 UTC text. It is given as an aware
    datetime, ISO 8601 text with a UTC offset (``Z``, ``+02:00``), or epoch seconds. One rule at every door
    (Pipeline, the clients, pipeline.testing, the CLI, the admin API): a time without a zone (a naive
    datetime, text without an offset) is refused, not guessed: read as UTC it was hours off for everyone
    east or west of it ("now + 30 min" in Tokyo became 9 h 30 min). UsageError naming ``what`` and the fix."""
    if isinstance(value, bool):
        raise UsageError(f"{what} must be a time, got a boolean")
    if isinstance(value, dt.datetime) and value.utcoffset() is None:
        raise UsageError(f"{what} {value!r:.80} is a naive datetime (no time zone, so no one instant): pass an aware one, "
                         "e.g. datetime.now(timezone.utc) + timedelta(minutes=30)")
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value)
        except ValueError:
            parsed = None  # not ISO 8601: to_ts below says so
        if parsed is not None and parsed.utcoffset() is None:
            raise UsageError(f"{what} {value!r:.80} has no UTC offset (so no one instant): add one, e.g. "
                             f"'{parsed.isoformat()}Z' for UTC or '{parsed.isoformat()}+02:00'")
    try:
        return to_ts(value)
    except (ValueError, TypeError, OverflowError) as exc:
        if isinstance(value, str):
            raise UsageError(f"{what} {value!r:.80} is not an ISO 8601 time: {exc}") from None
        raise UsageError(f"{what} {value!r:.80} is not a time (an aware datetime, ISO 8601 text with an offset, or epoch "
                         f"seconds): {exc}") from None


def check_unique_while(value: Any, unique_key: str | None, what: str = "unique_while") -> str | None:
    """How long a unique key is held, as stored: None for the default ("pending_or_running"), or
    "pending"; UsageError for anything else, or for one given without a key."""
    if value is None:
        return None
    if value not in UNIQUE_WHILE:
        raise UsageError(f"{what} must be one of {', '.join(map(repr, UNIQUE_WHILE))}, got {value!r:.40}")
    if unique_key is None:
        raise UsageError(f"{what} is given without a unique_key: it says how long the key is held")
    return None if value == UNIQUE_WHILE[0] else value


def limit_key_of(spec: Any, job: Any) -> str | None:
    """The key a job counts under for its type's per-key limit: its ``limit_key`` function's answer,
    as text (None: not limited by key); UsageError if the function fails or the key is not one."""
    try:
        key = spec.limit_key(job)
    except Exception as exc:
        raise UsageError(f"job type {spec.name!r}: its limit_key function failed on this job: {exc!r}") from exc
    return None if key is None else check_unique_key(str(key), f"job type {spec.name!r}: the limit key")


def check_expires_at(value: Any, *, now: str, run_after: str | None = None, what: str = "expires_at") -> str:
    """A job's ``expires_at`` as stored (ISO 8601 UTC text), or UsageError naming it: not a time, not
    after ``now`` (the job could never start), or not after its ``run_after`` (it would expire before
    it is due)."""
    expires_at = check_time(value, what)
    if expires_at <= now:
        raise UsageError(f"{what} {value!r} is not in the future (now is {now}): the job would never run")
    if run_after is not None and expires_at <= run_after:
        raise UsageError(f"{what} {value!r} is not after the job's run_after {run_after}: it would expire "
                         "before it is due and never run")
    return expires_at
