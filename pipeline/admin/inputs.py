"""What operators send, checked once for the admin API and the CLI alike.

A job arrives as a JSON object ``{"job_type", "payload", "priority"?, "max_attempts"?,
"run_after"?, "unique_key"?, "expires_at"?, "unique_while"?, "after"?, "on_parent_failure"?}`` (a POST
body, one line of ``enqueue --from-file``, or the CLI's flags); a batch as ``{"jobs": [job, ...],
"then"?: job}`` (its jobs without a unique key, its callback without one nor ``after``); an event as
``{"event", "data"}``; a schedule as ``{"name", "cron", "job_type", "payload"?, "timezone"?}``.
These functions check the *shape* and bounds and raise UsageError naming the field;
``outbox.prepare_rows`` then checks the payload against the job's class (``make_schedule`` the
rest of a schedule). Integers are bounded so that SQLite can store them (a Python int has no
limit, an SQLite INTEGER has 64 bits).

What an operator sent comes back in error messages clipped one way, ``clip``: a name, a cron
expression, an unknown field of 100,000 characters is echoed as its first 80 and "…". The admin
API applies it at its one door for errors (``clip_echoes``), to its own messages and to those of
the engine's checks it passes on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs

from ..backends.base import ON_PARENT_FAILURE, PRIORITY_MAX, PRIORITY_MIN, NewBatch, NewJob
from ..clock import now_ts
from ..errors import UsageError
from ..ids import UUID7Factory
from ..registry import Registry
from ..requests import JobRequest, check_unique_key, prepare_row
from ..workflows import MAX_PARENTS

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
JOB_FIELDS = ("job_type", "payload", "priority", "max_attempts", "run_after", "unique_key", "expires_at", "unique_while",
              "after", "on_parent_failure", "idempotency_key")
# a batch's jobs are all inserted (no unique or idempotency key); its callback waits for them (no after of its own)
BATCH_JOB_FIELDS = tuple(f for f in JOB_FIELDS if f not in ("unique_key", "unique_while", "idempotency_key"))
CALLBACK_FIELDS = tuple(f for f in BATCH_JOB_FIELDS if f not in ("after", "on_parent_failure"))
BATCH_FIELDS = ("jobs", "then")
EVENT_FIELDS = ("event", "data")
SCHEDULE_FIELDS = ("name", "cron", "job_type", "payload", "timezone")
MAX_OLDER_THAN_SECONDS = 100 * 366 * 86400  # a century: anything older is "all of them"
_FIELD_SETS: dict[tuple[str, ...], frozenset[str]] = {
    fields: frozenset(fields)
    for fields in (JOB_FIELDS, BATCH_JOB_FIELDS, CALLBACK_FIELDS, BATCH_FIELDS, EVENT_FIELDS, SCHEDULE_FIELDS)}
MAX_ECHO_CHARS = 80  # of one input echoed in an error message
MAX_MESSAGE_CHARS = 1000  # of an error message, whatever it echoes (a list of 10,000 short unknown names)


def clip(text: str) -> str:
    """``text`` as an error message echoes it: at most MAX_ECHO_CHARS characters, then "…"."""
    return text if len(text) <= MAX_ECHO_CHARS else text[:MAX_ECHO_CHARS] + "…"


def clip_echoes(message: str, sent: Iterable[str] = ()) -> str:
    """``message`` with every long string of ``sent`` (what the client sent: query, path, body keys and
    values) clipped wherever it is echoed, quoted (``'…'``, as ``!r`` writes it) or bare; then bounded to
    MAX_MESSAGE_CHARS, its head and tail kept. Messages written by the engine's checks (a cron expression,
    a time zone, a payload's unknown fields) echo what they were given whole: this is where it is clipped."""
    if len(message) <= MAX_ECHO_CHARS:
        return message
    longest = sorted({s for s in sent if len(s) > MAX_ECHO_CHARS}, key=len, reverse=True)
    for text in longest[:32]:  # the longest make the long messages; the bound below does the rest
        if text in message:
            message = message.replace(repr(text), repr(clip(text))).replace(text, clip(text))
    if len(message) > MAX_MESSAGE_CHARS:
        head, tail = MAX_MESSAGE_CHARS * 2 // 3, MAX_MESSAGE_CHARS // 4
        message = f"{message[:head]} … ({len(message) - head - tail:,} characters left out) … {message[-tail:]}"
    return message


def storable(text: str) -> bool:
    """Whether every store can hold ``text``: no NUL (Postgres's text cannot) and no lone surrogate
    (not UTF-8). An id or a name that is not names nothing: the API answers 404 or an empty list
    without asking the store (Postgres would refuse the question itself)."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def strings_in(value: Any, *, limit: int = 100_000) -> Iterator[str]:
    """The strings of a JSON value, its object keys included (at most ``limit`` of them)."""
    stack, seen = [value], 0
    while stack and seen < limit:
        item = stack.pop()
        seen += 1
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            yield from item.keys()
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def loads(text: str | bytes, what: str) -> Any:
    """Strict JSON: no NaN or Infinity, no unpaired surrogates (SQLite cannot store them)."""
    try:
        if isinstance(text, bytes):  # as json.loads reads bytes
            text = text.decode(json.detect_encoding(text), "surrogatepass")
        value = _DECODER.decode(text)
    except RecursionError:
        raise UsageError(f"{what} is nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} is not valid JSON: {exc.msg} at character {exc.pos + 1}") from None
    except ValueError as exc:  # not UTF-8, an integer too long to read
        raise UsageError(f"{what} is not valid JSON: {exc}") from None
    # a lone surrogate can only come from a \\u escape in the text, or be in the text already:
    # look for one only then (this runs once per line of `enqueue --from-file`)
    try:
        text.encode("utf-8")
        if "\\u" in text:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{what} contains an unpaired UTF-16 surrogate (\\ud800-\\udfff), which is not text") from None
    except RecursionError:
        raise UsageError(f"{what} is nested too deeply") from None
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


# one decoder: json.loads with an argument builds a new one per call (a fifth of its cost)
_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def object_of(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UsageError(f"{what} must be a JSON object, got {_kind(value)}")
    return value


def job_request(value: Any, what: str = "the job", fields: tuple[str, ...] = JOB_FIELDS) -> JobRequest:
    """A job object as operators write it, shape-checked (the payload and the parents' ids are
    checked later, by ``prepare_row``); ``fields``: those it may have (a batch's jobs take fewer)."""
    obj = object_of(value, what)
    _no_unknown(obj, fields, what)
    job_type = obj.get("job_type")
    if type(job_type) is not str or not job_type:
        raise UsageError(f"{what}: job_type must be a non-empty string, got {_kind(job_type)}")
    payload = obj.get("payload", {})
    if not isinstance(payload, Mapping):
        raise UsageError(f"{what}: payload must be a JSON object, got {_kind(payload)}")
    priority = obj.get("priority", 5)
    if type(priority) is not int or not PRIORITY_MIN <= priority <= PRIORITY_MAX:  # the common case, without a call
        priority = integer(priority, f"{what}: priority", PRIORITY_MIN, PRIORITY_MAX)
    max_attempts = obj.get("max_attempts")
    if max_attempts is not None:
        max_attempts = integer(max_attempts, f"{what}: max_attempts", 1, INT32_MAX)
    run_after = obj.get("run_after")
    if run_after is not None and not isinstance(run_after, str):
        raise UsageError(f"{what}: run_after must be an ISO 8601 time as a string, got {_kind(run_after)}")
    unique_key = obj.get("unique_key")
    if unique_key is not None:
        unique_key = check_unique_key(unique_key, f"{what}: unique_key")
    expires_at = obj.get("expires_at")
    if expires_at is not None and not isinstance(expires_at, str):
        raise UsageError(f"{what}: expires_at must be an ISO 8601 time as a string, got {_kind(expires_at)}")
    unique_while = obj.get("unique_while")
    if unique_while is not None and not isinstance(unique_while, str):
        raise UsageError(f"{what}: unique_while must be \"pending\" or \"pending_or_running\", got {_kind(unique_while)}")
    after = obj.get("after")
    if after is not None:
        if type(after) is not list:
            raise UsageError(f"{what}: after must be an array of job ids, got {_kind(after)}")
        after = tuple(after)  # each id is checked by prepare_row (check_parents)
    on_parent_failure = obj.get("on_parent_failure")
    if on_parent_failure is not None and on_parent_failure not in ON_PARENT_FAILURE:
        shown = repr(clip(on_parent_failure)) if isinstance(on_parent_failure, str) else _kind(on_parent_failure)
        raise UsageError(f"{what}: on_parent_failure must be \"cancel\" or \"run\", got {shown}")
    idempotency_key = obj.get("idempotency_key")
    if idempotency_key is not None:
        idempotency_key = check_unique_key(idempotency_key, f"{what}: idempotency_key")
    return JobRequest(job_type, payload, max_attempts, run_after, priority, unique_key, expires_at, unique_while,
                      after, on_parent_failure, idempotency_key)


@attrs.frozen
class BatchRequest:
    """``POST /admin/batches``'s body: the batch's jobs, and its callback (None: none)."""

    jobs: list[JobRequest]
    then: JobRequest | None


def batch_request(value: Any, what: str = "the request body") -> BatchRequest:
    """A batch as operators write it, shape-checked: ``{"jobs": [job, ...], "then"?: job}``."""
    obj = object_of(value, what)
    _no_unknown(obj, BATCH_FIELDS, what)
    jobs = obj.get("jobs")
    if type(jobs) is not list or not jobs:
        raise UsageError(f"{what}: jobs must be a non-empty array of jobs, got "
                         f"{'an empty array' if jobs == [] else _kind(jobs)}")
    then = obj.get("then")
    if "then" in obj and then is None:
        raise UsageError(f"{what}: then must be a job object, got null (leave it out for a batch without a callback)")
    if then is not None and len(jobs) > MAX_PARENTS:
        raise UsageError(f"{what}: a batch with a callback holds at most {MAX_PARENTS} jobs, got {len(jobs)}")
    requests = [job_request(job, f"{what}: jobs[{i}]", BATCH_JOB_FIELDS) for i, job in enumerate(jobs)]
    return BatchRequest(requests, None if then is None else job_request(then, f"{what}: then", CALLBACK_FIELDS))


def batch_rows(registry: Registry, request: BatchRequest, *, default_max_attempts: int) -> tuple[list[NewJob], NewBatch]:
    """The rows of a batch and its record, as ``Pipeline.batch_rows`` makes them for ``enqueue_batch``:
    the jobs in order, each with the batch's id, then the callback, waiting for every one of them with
    ``on_parent_failure="run"`` (so it runs once each has ended, whatever its outcome). Writes nothing."""
    new_id, now = UUID7Factory(), now_ts()
    batch_id = new_id()

    def row(job: JobRequest, what: str) -> NewJob:
        try:
            return prepare_row(registry, job, default_max_attempts, new_id, now)._replace(batch_id=batch_id)
        except UsageError as exc:
            raise UsageError(f"{what}: {exc}") from None

    members = [row(job, f"jobs[{i}]") for i, job in enumerate(request.jobs)]
    if request.then is None:
        return members, NewBatch(batch_id, None, now)
    callback = row(request.then._replace(after=tuple(m.id for m in members), on_parent_failure="run"), "then")
    return [*members, callback], NewBatch(batch_id, callback.id, now)


def with_bounds(request: JobRequest, what: str = "the job") -> JobRequest:
    """Check the integers of a request built from CLI flags."""
    integer(request.priority, f"{what}: priority", PRIORITY_MIN, PRIORITY_MAX)
    if request.max_attempts is not None:
        integer(request.max_attempts, f"{what}: max_attempts", 1, INT32_MAX)
    return request


@attrs.frozen
class EventRequest:
    event: str
    data: dict[str, Any]


def event_request(value: Any, what: str = "the request") -> EventRequest:
    obj = object_of(value, what)
    _no_unknown(obj, EVENT_FIELDS, what)
    name = obj.get("event")
    if not isinstance(name, str) or not name:
        raise UsageError(f"{what}: event must be a non-empty string such as \"UserRegistered\", got {_kind(name)}")
    data = obj.get("data", {})
    return EventRequest(name, object_of(data, f"{what}: data"))


@attrs.frozen
class ScheduleRequest:
    name: Any  # name, cron, job_type and timezone are checked by make_schedule, which says what fits
    cron: Any
    job_type: Any
    payload: dict[str, Any]
    timezone: Any


def schedule_request(value: Any, what: str = "the request body") -> ScheduleRequest:
    obj = object_of(value, what)
    _no_unknown(obj, SCHEDULE_FIELDS, what)
    missing = [key for key in ("name", "cron", "job_type") if key not in obj]
    if missing:
        raise UsageError(f"{what} needs {', '.join(missing)}")
    payload = obj.get("payload", {})
    if not isinstance(payload, dict):
        raise UsageError(f"{what}: payload must be a JSON object, got {_kind(payload)}")
    return ScheduleRequest(obj["name"], obj["cron"], obj["job_type"], payload, obj.get("timezone", "UTC"))


def integer(value: Any, what: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{what} must be an integer, got {_kind(value)}")
    if not lo <= value <= hi:
        raise UsageError(f"{what} must be between {lo} and {hi}, got {value}")
    return value


def seconds(value: Any, what: str) -> float:
    """A non-negative number of seconds, at most a century."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{what} must be a number of seconds, got {_kind(value)}")
    if not 0 <= value <= MAX_OLDER_THAN_SECONDS:
        raise UsageError(f"{what} must be between 0 and {MAX_OLDER_THAN_SECONDS} seconds, got {value}")
    return float(value)


def _no_unknown(obj: Mapping[str, Any], fields: tuple[str, ...], what: str) -> None:
    if obj.keys() <= _FIELD_SETS[fields]:
        return
    unknown = [key for key in obj if key not in fields]
    if unknown:
        raise UsageError(f"{what}: unknown field {clip(unknown[0])!r}; expected {', '.join(fields)}")


def kind(value: Any) -> str:
    """What a JSON value is, as a message says it: "an object", "a string", "null"..."""
    return _kind(value)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number"}.get(type(value), type(value).__name__)


def read_jobs(
    lines: Iterable[bytes],
    name: str,
    registry: Registry,
    *,
    default_max_attempts: int,
    on_lines: Callable[[int], None] | None = None,
) -> Iterator[NewJob]:
    """Check the lines of a JSON-lines file of jobs and yield their rows, in file order.

    The first bad line raises UsageError naming the file and the line number; a file with
    no job raises at its end. Blank lines are skipped. ``on_lines(n)`` is told every 1,000
    lines read.
    """
    new_id = UUID7Factory()  # one factory: ids stay in file order, even within a millisecond
    now = now_ts()  # one creation time for the file: its jobs are due together, in file order
    found = False
    number = 0
    for number, raw in enumerate(lines, 1):
        if on_lines is not None and number % 1000 == 0:
            on_lines(1000)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(f"{name} line {number}: not UTF-8 text ({exc.reason} at byte {exc.start + 1})") from None
        if number == 1:
            text = text.removeprefix("\ufeff")  # a byte-order mark some editors write
        if not text.strip():
            continue
        try:
            request = job_request(loads(text, "the line"), "the job")
            row = prepare_row(registry, request, default_max_attempts, new_id, now)
        except UsageError as exc:
            raise UsageError(f"{name} line {number}: {exc}") from None
        found = True
        yield row
    if on_lines is not None and number % 1000:
        on_lines(number % 1000)
    if not found:
        raise UsageError(f"{name} holds no jobs (expected one JSON object per line)")
