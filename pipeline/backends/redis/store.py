"""The Redis job store's operations, as named synchronous functions taking a client and the
key prefix: each one script (scripts.py) or a pipeline of them, so each transition is atomic
on the server and fenced there. Nothing here knows about trio.

Times cross the wire as epoch milliseconds (the scripts compare and add them as numbers,
with the server's ``TIME``); the protocol's ISO text is made here, on the way out
(:func:`text_of`), and parsed on the way in (:func:`ms_of`): both exact to the millisecond.
"""

from __future__ import annotations

import functools
import json
import math
import random
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import attrs
import redis

from ... import states
from ...clock import to_epoch
from ...errors import SignalKeyUsed, UsageError
from ...states import Status
from ..base import (
    MAX_LISTED_RELATIVES,
    BatchMember,
    BatchRecord,
    JobRecord,
    Lease,
    NewBatch,
    NewJob,
    ParentResult,
    Settlement,
    StepRecord,
    WorkerRecord,
    cancelled_error,
    cancelled_running_error,
    check_list_order,
    signal_refused,
    unique_key_held,
    unknown_parents,
)
from .db import describe, run_pipelined, run_script
from .scripts import ALL, RECORD_FIELDS

_INSERT, _INSERT_STAGED, _CLAIM, _SETTLE = ALL["insert"], ALL["insert_staged"], ALL["claim"], ALL["settle"]
_INSERT_UNIQUE, _INSERT_FLOW, _INSERT_IDEMPOTENT = ALL["insert_unique"], ALL["insert_flow"], ALL["insert_idempotent"]

CLEANUP_CHUNK = 2000  # jobs deleted per script call: a long script stops every other client


# -- times ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8192)
def _second_text(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


def text_of(ms: int | bytes | str) -> str:
    """Epoch milliseconds as the protocol's text (clock.format_ts's, without a float between)."""
    second, millis = divmod(int(ms), 1000)
    return f"{_second_text(second)}.{millis:03d}Z"


@functools.lru_cache(maxsize=8192)
def ms_of(text: str) -> int:
    """The protocol's text as epoch milliseconds (many rows of a batch share a time: cached)."""
    return round(to_epoch(text) * 1000)


def _s(value: bytes | None) -> str | None:
    return None if value is None else value.decode()


# -- inserts -------------------------------------------------------------------------------------


def insert_call(prefix: str, rows: Sequence[NewJob], batch: NewBatch | None = None) -> tuple[Any, list[Any]]:
    """The script and arguments that insert ``rows``: INSERT, as before unique keys, when no row
    has a key, a trace context, an expires_at, a limit key, unique_while "pending", parents or a
    batch (the common case: 7 values a row); else INSERT_UNIQUE (12: see :func:`_special`), or
    INSERT_FLOW when a row has parents or a batch, or ``batch`` is given (12 a row, then
    :func:`flow_values`). (Rows with parents are checked by base.check_after before they get here.)"""
    args: list[Any] = [prefix, len(rows)]
    if any(row.idempotency_key is not None for row in rows):
        return _INSERT_IDEMPOTENT, idempotent_args(prefix, rows, batch)
    for row in rows:
        if (row.unique_key is not None or row.trace is not None or row.expires_at is not None
                or row.limit_key is not None or row.unique_while == "pending" or row.after or row.batch_id is not None):
            break
        args += (row.id, row.job_type, row.payload, row.max_attempts, ms_of(row.run_after), row.priority,
                 ms_of(row.created_at))
    else:
        if batch is None:
            return _INSERT, args
    del args[2:]
    for row in rows:
        args += _special(row)
    flow = flow_values(rows)
    if not flow and batch is None:
        return _INSERT_UNIQUE, args
    args += (len(flow), *(value for values in flow for value in values))
    if batch is not None:
        args += (batch.id, batch.callback_id or "", ms_of(batch.created_at))
    return _INSERT_FLOW, args


def idempotent_args(prefix: str, rows: Sequence[NewJob], batch: NewBatch | None = None) -> list[Any]:
    """INSERT_IDEMPOTENT's arguments: INSERT_UNIQUE's, then the idempotency keys (how many, then
    per key its row's place, the key, the window in ms), then INSERT_FLOW's workflow part."""
    args: list[Any] = [prefix, len(rows)]
    for row in rows:
        args += _special(row)
    keyed = [(i, row) for i, row in enumerate(rows) if row.idempotency_key is not None]
    args.append(len(keyed))
    for i, row in keyed:
        args += (i, row.idempotency_key, max(1, round(row.idempotency_seconds * 1000)))
    flow = flow_values(rows)
    args += (len(flow), *(value for values in flow for value in values))
    if batch is not None:
        args += (batch.id, batch.callback_id or "", ms_of(batch.created_at))
    return args


def idempotency_name(prefix: str, job_type: str, key: str) -> str:
    """The STRING naming the job of a type's idempotency key (INSERT_IDEMPOTENT's idem:<len>:<type>:<key>,
    the length in bytes, as Lua's # counts: no type and key make another pair's name)."""
    return f"{prefix}idem:{len(job_type.encode())}:{job_type}:{key}"


def insert_outcome(client: Any, prefix: str, rows: Sequence[NewJob]) -> list[tuple[bool, str | None]]:
    """For an insert whose answer was lost (base.asked_again): per row, whether its id is stored,
    and the id its idempotency key (else its unique key) names now; one round trip."""
    pipe = client.pipeline(transaction=False)
    for row in rows:
        pipe.exists(f"{prefix}job:{row.id}")
        if row.idempotency_key is not None:
            pipe.get(idempotency_name(prefix, row.job_type, row.idempotency_key))
        else:
            pipe.echo("")
        if row.unique_key is not None:
            pipe.hget(f"{prefix}uniq:{row.job_type}", row.unique_key)
        else:
            pipe.echo("")
    answers = iter(pipe.execute())
    found: list[tuple[bool, str | None]] = []
    for _row, exists, by_key, holder in zip(rows, answers, answers, answers):
        named = by_key or holder or None
        found.append((bool(exists), None if named is None else named.decode()))
    return found


def flow_values(rows: Iterable[NewJob]) -> list[tuple[Any, ...]]:
    """The workflow part of the rows that have parents or a batch, as the scripts read it (the
    prelude's read_flow): per row its id, "1" for on_parent_failure "run" ('' for the default), its
    batch id ('' for none), how many parents, then their ids in ``after`` order."""
    return [(row.id, "1" if row.on_parent_failure == "run" else "", row.batch_id or "", len(row.after), *row.after)
            for row in rows if row.after or row.batch_id is not None]


def refused(exc: BaseException, shown: str) -> Exception:
    """A driver error as the pipeline's (db.describe), except an insert refused because parents it
    names are not in the store (the scripts' UNKNOWN): base.unknown_parents's UsageError."""
    return _unknown(exc) or describe(exc, shown)


def _unknown(exc: BaseException) -> UsageError | None:
    text = str(exc)
    if isinstance(exc, redis.exceptions.ResponseError) and text.startswith("UNKNOWN "):
        return unknown_parents(json.loads(text.removeprefix("UNKNOWN ")))
    return None


def _special(row: NewJob) -> tuple[Any, ...]:
    """A row's 12 values for INSERT_UNIQUE and staged loads: INSERT's 7, then its unique key, trace
    context, expires_at in ms, limit key ('' for none) and "1" for unique_while "pending"."""
    return (row.id, row.job_type, row.payload, row.max_attempts, ms_of(row.run_after), row.priority,
            ms_of(row.created_at), row.unique_key or "", row.trace or "",
            "" if row.expires_at is None else ms_of(row.expires_at), row.limit_key or "",
            "1" if row.unique_while == "pending" else "")


def stored_ids(rows: Sequence[NewJob], answer: Any) -> list[str]:
    """Per row, the id stored for it, from an insert script's answer: how many were inserted
    (every row), or that count, then the id and holder's id of each row whose key was held."""
    if isinstance(answer, int):  # every row inserted: the common case
        return [row.id for row in rows]
    held = {answer[i].decode(): answer[i + 1].decode() for i in range(1, len(answer), 2)}
    return [held.get(row.id, row.id) for row in rows]


def insert(client: Any, prefix: str, rows: Sequence[NewJob], batch: NewBatch | None = None) -> list[str]:
    """Every row or none (a duplicate id, stored or repeated, fails the whole call; so do parents
    not in the store: UsageError); per row, the id stored for it (its own, or the holder's of its
    unique key). ``batch``: the batch record, written with the rows."""
    if not rows:
        return []
    try:
        return stored_ids(rows, run_script(client, *insert_call(prefix, rows, batch)))
    except redis.exceptions.ResponseError as exc:
        unknown = _unknown(exc)
        if unknown is not None:
            raise unknown from None
        raise


def stage(client: Any, key: str, rows: Sequence[NewJob]) -> bool:
    """Push rows to a bulk load's staging list (not job state: nothing claims it), and the
    workflow part of those that have parents or a batch to ``key:flow`` (:func:`flow_values`);
    both expire after a day if the loader dies before committing them. True if any row has parents or a batch."""
    values: list[Any] = []
    for row in rows:
        values += _special(row)
    flow = flow_values(rows)
    pipe = client.pipeline(transaction=False)
    pipe.rpush(key, *values)
    pipe.expire(key, 86400)
    if flow:
        pipe.rpush(f"{key}:flow", *(value for values in flow for value in values))
        pipe.expire(f"{key}:flow", 86400)
    pipe.execute()
    return bool(flow)


def commit_staged(client: Any, prefix: str, key: str, answer_key: str, *, flow: bool = False) -> tuple[int, list[tuple[str, str]]]:
    """Insert a staging list's rows (``flow``: some of them have parents or a batch, staged in
    ``key:flow``); how many were inserted, and (id, holder's id) of each
    row whose unique key was held. Called again with the same keys (its answer lost), it
    answers the same and inserts nothing more: the answer is kept under ``answer_key``."""
    args = [prefix, key, answer_key]
    if flow:
        args += [f"{key}:flow"]
    answer = run_script(client, _INSERT_STAGED, args)
    if isinstance(answer, int):
        return answer, []
    return int(answer[0]), [(answer[i].decode(), answer[i + 1].decode()) for i in range(1, len(answer), 2)]


# -- claim and settle -------------------------------------------------------------------------------


def claim(client: Any, prefix: str, *, wants: Mapping[str, int], owner: str, lease_seconds: float,
          start: Mapping[str, int] | None = None, limits: Mapping[str, int] | None = None,
          rates: Mapping[str, tuple[int, float]] | None = None, key_limits: Mapping[str, int] | None = None,
          ) -> list[Lease]:
    """pending → running for up to ``wants[type]`` due jobs of each type, in claim order; the
    first ``start[type]`` of each start at once (all when None), the rest are claimed ahead;
    a type in ``limits`` up to its limit less its running jobs; a type in ``rates`` up to N less
    its claims within the window; a type in ``key_limits`` round-robin across its jobs' limit
    keys, up to L running per key (lua/claim.lua)."""
    args: list[Any] = [prefix, owner, round(lease_seconds * 1000), 0]
    m = 0
    limits, rates, key_limits = limits or {}, rates or {}, key_limits or {}
    for job_type, n in wants.items():
        if n > 0:
            k = n if start is None else max(0, min(n, start.get(job_type, 0)))
            rate = rates.get(job_type)
            args += (job_type, n, k, limits.get(job_type, ""), "" if rate is None else int(rate[0]),
                     "" if rate is None else _window_ms(rate[1]), key_limits.get(job_type, ""))
            m += 1
    if not m:
        return []
    args[3] = m
    out = run_script(client, _CLAIM, args)
    leases = []
    at = 0
    for job_type, n in wants.items():
        if n <= 0:
            continue
        got = out[at]
        at += 1
        for _ in range(got):
            attempts, max_attempts, token, created, run, started, expat, *trace = out[at + 2].split(b" ", 7)
            leases.append(Lease(out[at].decode(), job_type, out[at + 1].decode(), int(attempts), int(max_attempts),
                                int(token), text_of(created), text_of(run), started == b"1",
                                trace[0].decode() if trace else None, None if expat == b"-" else text_of(expat)))
            at += 3
    return leases


def _window_ms(seconds: float) -> int:
    return max(round(seconds * 1000), 1)


def rate_free_at(client: Any, prefix: str, job_type: str, limit: int, window_seconds: float) -> float:
    """Seconds until a claim of a type limited to ``limit`` per ``window_seconds`` may take a job
    again: 0 while its window has room (lua/rate_free.lua; the claim's own log, the server's clock)."""
    ms = run_script(client, ALL["rate_free"], [prefix, job_type, int(limit), _window_ms(window_seconds)])
    return int(ms) / 1000


_KINDS = {
    states.Transition.SUCCEED: "succeed",
    states.Transition.RETRY: "retry",
    states.Transition.BURY: "bury",
    states.Transition.RELEASE: "release",
    states.Transition.START: "start",
    states.Transition.CANCEL: "cancel",
    states.Transition.SNOOZE: "snooze",
    states.Transition.STEP: "step",
    states.Transition.SUSPEND: "suspend",
}


def settle_args(prefix: str, items: Sequence[Settlement]) -> list[Any]:
    """SETTLE's arguments (see lua/settle.lua): a SUCCEED with a result is kind ``result``, the
    result in the error's place; a SNOOZE is ``snooze/<limit>``; a STEP or SUSPEND carries its step
    and the signal it awaits in that place (:func:`_durable_part`), a SUSPEND without a deadline
    the delay ``f``."""
    args: list[Any] = [prefix, len(items)]
    for s in items:
        kind = _KINDS.get(s.transition)
        if kind is None:
            raise ValueError(f"{s.transition!r} is not an outcome")
        third: Any = s.error or ""
        if s.result is not None and kind == "succeed":
            kind, third = "result", s.result
        elif kind == "snooze":
            kind = f"snooze/{int(s.snooze_limit)}"
        elif kind == "step" or kind == "suspend":
            if kind == "step" and s.step is None:
                raise ValueError(f"the STEP outcome of job {s.id} has no step to write")
            delay = "f" if math.isinf(s.delay) else round(s.delay * 1000)
            args += (s.id, f"{s.token} {kind} {delay} 0", _durable_part(s))
            continue
        args += (s.id, f"{s.token} {kind} {round(s.delay * 1000)} {0 if s.error is None else 1}", third)
    return args


# -- durable functions (issue 35) ----------------------------------------------------------------------


def _step_head(step: StepRecord) -> bytes:
    """A step as steps:<id> keeps it, less its value (the prelude's put_step): status NUL started NUL
    ended ('' for none) NUL."""
    return f"{step.status}\0{step.started_at}\0{step.ended_at or ''}\0".encode()


def _step_body(step: StepRecord) -> bytes:
    return _step_head(step) + (b"" if step.value is None else b"v" + step.value.encode())


def _durable_part(s: Settlement) -> bytes:
    """A STEP's or SUSPEND's third value (the prelude's durable_part): the byte lengths of the awaited
    signal's name and of the step's name ('-' for none), then those names, then the step's body."""
    awaiting = None if s.awaiting is None else s.awaiting.encode()
    name = None if s.step is None else s.step.name.encode()
    head = f"{'-' if awaiting is None else len(awaiting)} {'-' if name is None else len(name)} ".encode()
    return head + (awaiting or b"") + (name or b"") + (b"" if s.step is None else _step_body(s.step))


def _steps(pairs: Iterable[tuple[bytes, bytes]]) -> list[StepRecord]:
    """steps:<id>'s fields (name, "<place> <body>") as records, in the order first written."""
    placed = []
    for name, raw in pairs:
        place, _, body = raw.partition(b" ")
        status, started, ended, value = body.split(b"\0", 3)
        placed.append((int(place), StepRecord(name.decode(), status.decode(), value[1:].decode() if value else None,
                                              started.decode(), ended.decode() or None)))
    placed.sort(key=lambda pair: pair[0])
    return [step for _, step in placed]


def steps(client: Any, prefix: str, job_id: str) -> list[StepRecord]:
    """The job's steps in the order first written ([] for none, or an unknown job): one HGETALL."""
    return _steps(client.hgetall(f"{prefix}steps:{job_id}").items())


def take_signal(client: Any, prefix: str, job_id: str, token: int, name: str,
                step: StepRecord) -> tuple[bool, str | None] | None:
    """Fenced (None: not running under ``token``, nothing changed); in one script the oldest
    unconsumed signal ``name`` is consumed and ``step`` written with its payload as the value:
    (True, payload); (False, None) if none was sent (lua/take_signal.lua)."""
    answer = run_script(client, ALL["take_signal"], [prefix, job_id, token, name, step.name, _step_head(step)])
    if answer == 0:
        return None
    if answer == 1:
        return False, None
    payload = answer[1:]  # after the '+': 'v' then the JSON text, or nothing for none
    return True, payload[1:].decode() if payload else None


def signal_key_used(client: Any, prefix: str, job_id: str, key: str) -> bool:
    """Whether a signal with ``key`` was sent to the job: one HEXISTS of its sig:<id> hash (see signal.lua)."""
    return bool(client.hexists(f"{prefix}sig:{job_id}", f"k:{key}"))


def send_signal(client: Any, prefix: str, job_id: str, name: str, payload: str | None, *, key: str | None = None) -> str:
    """Keep the signal for the job; "woken" if it was suspended awaiting it (now pending, Pollers
    woken), else "kept" (lua/signal.lua)."""
    answer = run_script(client, ALL["signal"], [prefix, job_id, name, "" if payload is None else "v" + payload,
                                                 "" if key is None else "1", key or ""]).decode()
    if answer in ("woken", "kept"):
        return answer
    if answer == "missing":
        raise LookupError(f"no job with id {job_id!r}")
    if answer == "used":
        raise SignalKeyUsed(f"job {job_id}: a signal with key {key!r} was sent to it already (a signal's key works "
                            "once); nothing was sent")
    raise UsageError(signal_refused(job_id, answer))


def wake_suspended(client: Any, prefix: str, *, limit: int = 500) -> tuple[int, float | None]:
    """Up to ``limit`` suspended jobs whose time came → pending (lua/wake_suspended.lua): how many,
    and the seconds until the next one is due (None: none has a deadline)."""
    n, ms = run_script(client, ALL["wake_suspended"], [prefix, max(int(limit), 0)])
    return int(n), None if ms < 0 else ms / 1000


def settle(client: Any, prefix: str, items: Sequence[Settlement]) -> list[bool]:
    if not items:
        return []
    return [v == 49 for v in run_script(client, _SETTLE, settle_args(prefix, items))]  # b"1"


def write_batch(client: Any, prefix: str, items: Sequence[Settlement], inserts: Sequence[Sequence[NewJob]],
                shown: str, *, quiet: bool = False) -> tuple[list[bool], list[BaseException | list[str]], list[str]]:
    """The Ledger's batch in one round trip: every outcome (one script), then each caller's
    insert (a script each: a duplicate fails that caller alone). Returns the outcomes' answers,
    per insert the ids stored for its rows or the error that refused it, and (``quiet``) the jobs
    the outcomes woke, not PUBLISHed: the caller claims them and PUBLISHes for any it left."""
    calls = []
    if items:
        calls.append((_SETTLE, [*settle_args(prefix, items), "q"] if quiet else settle_args(prefix, items)))
    calls += [insert_call(prefix, rows) for rows in inserts]
    results = run_pipelined(client, calls) if calls else []
    held: list[bool] = []
    woken: list[str] = []
    if items:
        answer = results.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        answer, _, ids = answer.partition(b"|")
        held = [v == 49 for v in answer]  # b"1"
        woken = ids.decode().split(",") if ids else []
    answers: list[BaseException | list[str]] = [
        refused(r, shown) if isinstance(r, BaseException) else stored_ids(rows, r) for rows, r in zip(inserts, results)
    ]
    return held, answers, woken


# -- leases -----------------------------------------------------------------------------------------


def renew(client: Any, prefix: str, owner: str, job_types: Sequence[str], held: Sequence[tuple[str, int]], *,
          lease_seconds: float) -> list[str]:
    args: list[Any] = [prefix, owner, json.dumps(sorted(job_types)), round(lease_seconds * 1000), len(held)]
    for job_id, token in held:
        args += (job_id, token)
    return [i.decode() for i in run_script(client, ALL["renew"], args)]


def forget_worker(client: Any, prefix: str, owner: str) -> None:
    run_script(client, ALL["forget"], [prefix, owner])


RESCUE_CHUNK = 10_000


def rescue_expired(client: Any, prefix: str, *, base_seconds: float, rng: random.Random | None = None,
                   spare: Collection[tuple[str, int]] = ()) -> int:
    """End the pending jobs whose expires_at passed (EXPIRED does, as it reads), read the expired
    leases, decide each one's fate here (backoff with jitter, or dead), then write them in one
    script fenced by what was read: rescuers running at once move each job once, and a lease
    renewed in between is left alone. A lease whose cancel was requested ends cancelled (RESCUE
    sees the request as it writes). Returns the jobs expired and moved."""
    ended, *expired = run_script(client, ALL["expired"], [prefix, RESCUE_CHUNK])
    args: list[Any] = [prefix, 0, _CANCELLED_RUN]
    n = 0
    for raw_id, token, attempts, max_attempts, owner, started in expired:
        job_id = raw_id.decode()
        if (job_id, token) in spare:
            continue
        dead, delay, error = 0, 0, ""
        if started:
            decision = states.rescue(attempts=attempts, max_attempts=max_attempts, base_seconds=base_seconds, rng=rng)
            dead = int(decision.transition is not states.Transition.RESCUE)
            delay = 0 if dead else round(decision.delay * 1000)
            error = f"lease expired: worker {owner.decode() or '?'} stopped renewing it during attempt {attempts}"
        args += (job_id, token, attempts, started, dead, delay, error)
        n += 1
    if not n:
        return int(ended)
    args[1] = n
    return int(ended) + int(run_script(client, ALL["rescue"], args))


_CANCELLED_RUN = cancelled_running_error("its cancel was requested")


def bury_unknown_types(client: Any, prefix: str, *, known: Iterable[str], grace_seconds: float) -> int:
    before = "no worker handles job type '"
    after = ("': no live process registers a handler for it (it may be registered without one, or not at all); "
             "add a handler, then retry the job")
    return int(run_script(client, ALL["bury_unknown"], [prefix, round(grace_seconds * 1000), before, after, *known]))


# -- operators ----------------------------------------------------------------------------------------


def _record(job_id: str, f: Sequence[bytes | None]) -> JobRecord:
    # f: scripts.RECORD_FIELDS
    return JobRecord(
        id=job_id, job_type=_s(f[0]) or "", payload=_s(f[1]) or "", status=_s(f[2]) or "", attempts=int(f[3] or 0),
        max_attempts=int(f[4] or 0), run_after=text_of(f[5] or 0), error=_s(f[6]), created_at=text_of(f[7] or 0),
        updated_at=text_of(f[8] or 0), priority=int(f[9] or 0), lease_owner=_s(f[10]),
        lease_expires_at=None if f[11] is None else text_of(f[11]), unique_key=_s(f[12]), result=_s(f[13]),
        progress=None if f[14] is None else float(f[14]), progress_message=_s(f[15]), snoozes=int(f[16] or 0),
        expires_at=None if f[17] is None else text_of(f[17]), cancel_requested=f[18] is not None,
        limit_key=_s(f[19]), waiting_for=int(f[20] or 0), on_parent_failure="run" if f[21] else None, batch_id=_s(f[22]),
        awaiting_signal=_s(f[23]),
    )


def get_job(client: Any, prefix: str, job_id: str) -> JobRecord | None:
    """The job's fields, its parents (in ``after`` order) and children (oldest first), each up to
    MAX_LISTED_RELATIVES, with their counts, and its steps: one script, one snapshot (lua/get.lua)."""
    out = run_script(client, ALL["get"], [prefix, job_id, MAX_LISTED_RELATIVES, *RECORD_FIELDS])
    if out is None:
        return None
    f, parents, parent_count, children, child_count, flat = out
    return attrs.evolve(_record(job_id, f), parents=tuple(p.decode() for p in parents), parent_count=int(parent_count),
                        children=tuple(c.decode() for c in children), child_count=int(child_count),
                        steps=tuple(_steps(zip(flat[::2], flat[1::2]))))


def list_jobs(client: Any, prefix: str, *, status: str | None = None, job_type: str | None = None, limit: int = 50,
              offset: int = 0, priority: int | None = None, order: str = "newest") -> tuple[list[JobRecord], int]:
    """Newest first (ids are time-ordered), or in claim order, with the total that matches the filters."""
    if status is not None and status not in set(Status):
        raise UsageError(f"unknown status {status!r}; expected one of {', '.join(Status)}")
    check_list_order(order)
    across: list[str] = []  # list.lua unites the types' sets of a status that has none across types (its HOT)
    if status is not None and job_type is not None:
        index = f"{prefix}st:{status}:{job_type}"
    elif status is not None:
        index, across = f"{prefix}status:{status}", [status]
    elif job_type is not None:
        index = f"{prefix}type:{job_type}"
    else:
        index = f"{prefix}all"
    out = run_script(client, ALL["list"], [prefix, index, max(offset, 0), max(limit, 0),
                                           "" if priority is None else int(priority), order, *across])
    total = int(out[0])
    records = [_record(out[i].decode(), out[i + 1]) for i in range(1, len(out), 2)]
    return records, total


# as stats.lua counts them (in the order of states.Status)
_STATUSES = ("waiting", "pending", "running", "completed", "dead", "cancelled", "suspended")


def operator_stats(client: Any, prefix: str) -> dict[str, Any]:
    """Counts by status and by type; finished per minute over the last hour; the age of the
    oldest due pending job. One script: one snapshot, the server's "now"."""
    now, by_status_raw, by_type_raw, minutes, oldest = run_script(client, ALL["stats"], [prefix])
    by_status = dict(zip(_STATUSES, map(int, by_status_raw)))
    by_type = {row[0].decode(): dict(zip(_STATUSES, map(int, row[1:]))) for row in by_type_raw}
    first = (now // 60000) * 60000 - 59 * 60000
    finished = [{"minute": f"{text_of(first + i * 60000)[:16]}:00Z", "completed": int(minutes[i]), "dead": int(minutes[60 + i]),
                 "cancelled": int(minutes[120 + i])} for i in range(60)]
    age = None if oldest < 0 else round(max(now - oldest, 0) / 1000, 3)
    return {"by_status": by_status, "by_type": by_type, "total": sum(by_status.values()), "finished_per_minute": finished,
            "oldest_due_pending_age_seconds": age, "now": text_of(now)}


def revive(client: Any, prefix: str, job_id: str, *, from_step: str | None = None) -> JobRecord:
    """Admin retry: dead or cancelled → pending, attempts, snoozes, progress, result and a cancel
    request reset, due now (its steps kept). UsageError if neither dead nor cancelled, or its unique
    key is held. ``from_step``: a replay, of a completed job too, forgetting that step and every one
    first written after it; UsageError naming its steps if it has none of that name."""
    answer = run_script(client, ALL["revive"], [prefix, job_id, "" if from_step is None else "1", from_step or ""])
    if isinstance(answer, list):  # ['nostep', its step names in order]: nothing changed
        names = [name.decode() for name in answer[1]]
        have = f"its steps are {', '.join(repr(name) for name in names)}" if names else "it has no steps"
        raise UsageError(f"job {job_id} has no step {from_step!r} to replay from ({have}); nothing was changed")
    answer = answer.decode()
    if answer == "missing":
        raise LookupError(f"no job with id {job_id!r}")
    if answer.startswith("held "):
        job = get_job(client, prefix, job_id)
        if job is None:  # deleted in between
            raise LookupError(f"no job with id {job_id!r}")
        raise UsageError(unique_key_held(job, answer.removeprefix("held ")))
    if answer != "ok":
        if from_step is not None:
            raise UsageError(f"job {job_id} is {answer}, only dead, cancelled or completed jobs can be replayed from a step")
        raise UsageError(f"job {job_id} is {answer}, only dead or cancelled jobs can be retried")
    job = get_job(client, prefix, job_id)
    if job is None:  # deleted in between
        raise LookupError(f"no job with id {job_id!r}")
    return job


# -- control (issue 23) --------------------------------------------------------------------------------


def cancel(client: Any, prefix: str, job_ids: Sequence[str], *, reason: str) -> list[str | None]:
    """One script: per id, "cancelled" (it was pending), CANCELLING (it runs: requested), the
    status of a final job (unchanged), or None (unknown)."""
    if not job_ids:
        return []
    answers = run_script(client, ALL["cancel"], [prefix, cancelled_error(reason), *job_ids])
    return [a.decode() or None for a in answers]


# -- workflows (issue 24) -----------------------------------------------------------------------------

SWEEP_VISITS = 1000  # waiting jobs a rescue_waiting call visits at most (the next call goes on from there)


def rescue_waiting(client: Any, prefix: str, limit: int = 500) -> int:
    """The repair sweep (lua/rescue_waiting.lua): waiting jobs whose parents ended (or are gone)
    without their edges counting, or whose count is 0, are woken or cancelled. Returns how many."""
    return int(run_script(client, ALL["rescue_waiting"], [prefix, max(int(limit), 1), SWEEP_VISITS]))


def parent_results(client: Any, prefix: str, job_id: str) -> dict[str, ParentResult]:
    out = run_script(client, ALL["parent_results"], [prefix, job_id])
    return {out[i].decode(): ParentResult(out[i + 1].decode(), _s(out[i + 2])) for i in range(0, len(out), 3)}


def batch(client: Any, prefix: str, batch_id: str) -> BatchRecord | None:
    out = run_script(client, ALL["batch"], [prefix, batch_id])
    if out is None:
        return None
    callback, created, total, flat, callback_status = out
    counts = {flat[i].decode(): int(flat[i + 1]) for i in range(0, len(flat), 2)}
    return BatchRecord(batch_id, callback.decode() or None, text_of(created), int(total), counts,
                       callback_status.decode() or None)


def batch_jobs(client: Any, prefix: str, batch_id: str, limit: int | None = None, offset: int = 0) -> list[BatchMember]:
    if limit is not None and limit <= 0:
        return []
    out = run_script(client, ALL["batch_jobs"], [prefix, batch_id, max(int(offset), 0), -1 if limit is None else int(limit)])
    members = []
    for i in range(0, len(out), 2):
        job_type, status, result, error = out[i + 1]
        members.append(BatchMember(out[i].decode(), job_type.decode(), status.decode(), _s(result), _s(error)))
    return members


def cancel_requests(client: Any, prefix: str, owner: str) -> list[tuple[str, int]]:
    out = run_script(client, ALL["cancel_requests"], [prefix, owner])
    return [(out[i].decode(), int(out[i + 1])) for i in range(0, len(out), 2)]


def set_progress(client: Any, prefix: str, job_id: str, token: int, fraction: float, message: str | None) -> bool:
    args = [prefix, job_id, token, repr(float(fraction)), 0 if message is None else 1, message or ""]
    return bool(run_script(client, ALL["set_progress"], args))


def set_type_paused(client: Any, prefix: str, job_type: str, paused: bool) -> None:
    """Idempotent: pausing a paused type keeps when it was first paused. A resumed type wakes the
    Pollers (its due jobs wait for no poll)."""
    if paused:
        seconds, micros = client.time()
        client.hsetnx(prefix + "paused", job_type, int(seconds) * 1000 + int(micros) // 1000)
    elif client.hdel(prefix + "paused", job_type):
        client.publish(prefix + "wake", "1")


def paused_types(client: Any, prefix: str) -> set[str]:
    return {t.decode() for t in client.hkeys(prefix + "paused")}


def delete_job(client: Any, prefix: str, job_id: str) -> None:
    answer = run_script(client, ALL["delete"], [prefix, job_id]).decode()
    if answer == "missing":
        raise LookupError(f"no job with id {job_id!r}")
    if answer == "running":
        raise UsageError(f"job {job_id} is running; wait for it to finish before deleting it")


def cleanup(client: Any, prefix: str, *, statuses: Sequence[str] = ("completed", "dead"),
            older_than_seconds: float | None = None) -> int:
    """Delete finished jobs, ``CLEANUP_CHUNK`` per script call (each call atomic, the whole not)."""
    states.check_finished(statuses, "cleanup deletes")
    older = "" if older_than_seconds is None else round(older_than_seconds * 1000)
    total = 0
    while True:
        n = int(run_script(client, ALL["cleanup"], [prefix, older, CLEANUP_CHUNK, *statuses]))
        total += n
        if n < CLEANUP_CHUNK:
            return total


def ping(client: Any, prefix: str) -> None:
    client.ping()


def workers(client: Any, prefix: str) -> list[WorkerRecord]:
    """The ``workers`` hash (owner -> "beat_ms|lease_ms|types"), alive by the server's clock."""
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    found = []
    for owner, value in client.hgetall(prefix + "workers").items():
        owner = owner.decode() if isinstance(owner, bytes) else owner
        text = value.decode() if isinstance(value, bytes) else value
        beat, lease, types = text.split("|", 2)
        try:
            job_types = tuple(json.loads(types))
        except (ValueError, TypeError):
            job_types = ()
        found.append((int(beat), WorkerRecord(owner, job_types, text_of(int(beat)), int(beat) + int(lease) >= now_ms)))
    found.sort(key=lambda pair: (-pair[0], pair[1].owner))
    return [record for _, record in found]
