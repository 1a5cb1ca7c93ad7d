"""Cron schedules on Redis (see pipeline/schedules.py): a hash per schedule (``sched:<name>``),
the set of their names (``scheds``) and the enabled ones by next run (``scheds:due``). A tick fires in one script (lua/schedule_fire.lua);
the operators' changes and the start-up merge of the code's schedules are optimistic
transactions (WATCH the schedules read, MULTI/EXEC the writes, again if one changed meanwhile),
so a tick fired in between is never written back as due."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from ...clock import now_ts
from ...errors import UsageError
from ...schedules import check_advance
from ..base import NewJob, ScheduleRecord, code_schedule_writes, with_enabled
from .db import run_script
from .scripts import ALL
from .store import insert_call, ms_of

_FIELDS = ("type", "payload", "cron", "tz", "enabled", "origin", "next", "last", "job", "declared", "created", "updated")


def _key(prefix: str, name: str) -> str:
    return f"{prefix}sched:{name}"


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode()


def _record(name: str, f: Sequence[bytes | None]) -> ScheduleRecord:
    t = [_text(value) for value in f]
    return ScheduleRecord(
        name=name, job_type=t[0] or "", payload=t[1] or "", cron=t[2] or "", timezone=t[3] or "UTC",
        enabled=t[4] == "1", origin=t[5] or "operator", next_run=t[6] or "", last_run=t[7], last_job_id=t[8],
        declared=t[9] != "0", created_at=t[10] or "", updated_at=t[11] or "",
    )


def _mapping(record: ScheduleRecord) -> dict[str, Any]:
    mapping = {"type": record.job_type, "payload": record.payload, "cron": record.cron, "tz": record.timezone,
               "enabled": int(record.enabled), "origin": record.origin, "next": record.next_run,
               "declared": int(record.declared), "created": record.created_at, "updated": record.updated_at}
    if record.last_run is not None:
        mapping["last"] = record.last_run
    if record.last_job_id is not None:
        mapping["job"] = record.last_job_id
    return mapping


def _read(client: Any, prefix: str, names: Sequence[str], *, watched: bool = False) -> dict[str, ScheduleRecord]:
    """The schedules of those names that exist: in one round trip, or (``watched``: on a
    transaction's watching connection, which has no pipeline of its own) one each."""
    if watched:
        rows = [client.hmget(_key(prefix, name), _FIELDS) for name in names]
    else:
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.hmget(_key(prefix, name), _FIELDS)
        rows = pipe.execute()
    return {name: _record(name, f) for name, f in zip(names, rows) if f[0] is not None}


def _names(client: Any, prefix: str) -> list[str]:
    return sorted(name.decode() for name in client.smembers(f"{prefix}scheds"))


def all_schedules(client: Any, prefix: str) -> list[ScheduleRecord]:
    found = _read(client, prefix, _names(client, prefix))
    return [found[name] for name in sorted(found)]


def due_schedules(client: Any, prefix: str, now: str) -> list[ScheduleRecord]:
    names = [name.decode() for name in client.zrangebyscore(f"{prefix}scheds:due", "-inf", ms_of(now))]
    found = _read(client, prefix, names)
    # (read after the range: one fired or paused in between is left out here)
    return [found[name] for name in names if name in found and found[name].enabled and found[name].next_run <= now]


def _put(pipe: Any, prefix: str, record: ScheduleRecord) -> None:
    key = _key(prefix, record.name)
    pipe.delete(key)  # fields the record has not (last, job) do not linger
    pipe.hset(key, mapping=_mapping(record))
    pipe.sadd(f"{prefix}scheds", record.name)
    if record.enabled:
        pipe.zadd(f"{prefix}scheds:due", {record.name: ms_of(record.next_run)})
    else:
        pipe.zrem(f"{prefix}scheds:due", record.name)


def add_schedule(client: Any, prefix: str, record: ScheduleRecord) -> ScheduleRecord:
    def add(pipe: Any) -> bool:
        if pipe.exists(_key(prefix, record.name)):
            return False
        pipe.multi()
        _put(pipe, prefix, record)
        return True

    if not client.transaction(add, _key(prefix, record.name), value_from_callable=True):
        raise UsageError(f"a schedule named {record.name!r} already exists; remove it first, or pick another name")
    return record


def remove_schedule(client: Any, prefix: str, name: str) -> None:
    pipe = client.pipeline(transaction=True)
    pipe.delete(_key(prefix, name))
    pipe.srem(f"{prefix}scheds", name)
    pipe.zrem(f"{prefix}scheds:due", name)
    deleted, *_ = pipe.execute()
    if not deleted:
        raise LookupError(f"no schedule named {name!r}")


def set_enabled(client: Any, prefix: str, name: str, enabled: bool) -> ScheduleRecord:
    def change(pipe: Any) -> ScheduleRecord:
        found = _read(pipe, prefix, [name], watched=True).get(name)
        if found is None:
            raise LookupError(f"no schedule named {name!r}")
        if found.enabled == enabled:
            return found
        changed = with_enabled(found, enabled, now=now_ts())
        pipe.multi()
        _put(pipe, prefix, changed)
        return changed

    result: ScheduleRecord = client.transaction(change, _key(prefix, name), value_from_callable=True)
    return result


def sync_code(client: Any, prefix: str, records: Sequence[ScheduleRecord], *, owned: Collection[str] | None = None) -> None:
    now = now_ts()
    names = sorted(set(_names(client, prefix)) | {record.name for record in records})

    def merge(pipe: Any) -> None:
        stored = _read(pipe, prefix, names, watched=True)
        writes = code_schedule_writes(stored, records, now=now, owned=owned)
        pipe.multi()
        for record in writes:
            _put(pipe, prefix, record)

    # a schedule another process adds meanwhile is not code's to retire: only those read are watched
    client.transaction(merge, f"{prefix}scheds", *(_key(prefix, name) for name in names))


def fire(client: Any, prefix: str, *, name: str, tick: str, next_run: str, job: NewJob) -> bool:
    check_advance(name, tick=tick, next_run=next_run)
    # a schedule's job has no unique key (nor a producer's trace context, the Scheduler's own):
    # INSERT's seven values (insert_call's, after prefix and count), or INSERT_UNIQUE's twelve with an
    # expires_at or a limit key
    args = [prefix, name, tick, next_run, ms_of(next_run), now_ts(),
            *insert_call(prefix, [job._replace(unique_key=None, trace=None, unique_while=None)])[1][2:]]
    return bool(run_script(client, ALL["schedule_fire"], args))
