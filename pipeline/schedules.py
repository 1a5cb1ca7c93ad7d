"""Cron schedules: what a schedule is, how its next tick is found, and the checks every way of
adding one (code, the CLI, the admin API) goes through.

    registry.schedule("nightly-digest", "0 3 * * *", SendDigest(...), timezone="Europe/Paris")

A schedule names a job (type and payload) and a cron expression read in a time zone: five fields
(minute hour day month weekday) or six, a seconds field first. Expressions are parsed and stepped
by cronsim (DST gaps and repeats handled the way cron does); zones are the IANA names of zoneinfo.

Each tick is fired by ``Backend.fire_schedule``: in one transaction, the job is inserted and the
schedule's stored ``next_run`` moves on, only if it still holds the tick the caller read. Every
process may try; one wins. A tick missed while no process ran fires once, when one is back, and
the next run is the first tick after that moment (no burst of the ticks missed).
"""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo
from typing import TYPE_CHECKING, Any

import attrs
from cronsim import CronSim, CronSimError

from .clock import UTC, format_ts, now_ts, parse_ts
from .errors import UsageError

if TYPE_CHECKING:
    from .backends.base import ScheduleRecord
    from .registry import Registry

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,99}")


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        shown = name if not isinstance(name, str) else name[:80]
        raise UsageError(f"schedule name {shown!r} must be 1-100 letters, digits or _.:- (not starting with .:-)")
    return name


def zone(name: Any) -> zoneinfo.ZoneInfo:
    """The IANA time zone ``name`` (UsageError naming it if unknown)."""
    if not isinstance(name, str) or not name or len(name) > 100:
        raise UsageError(f"unknown time zone {name!r}: give an IANA name such as UTC or Europe/Paris")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise UsageError(f"unknown time zone {name[:100]!r}: give an IANA name such as UTC or Europe/Paris") from None


def check_cron(expr: Any) -> str:
    """``expr`` if cronsim reads it (UsageError saying what is wrong otherwise)."""
    if not isinstance(expr, str) or not expr.strip() or len(expr) > 200:
        raise UsageError(f"bad cron expression {expr!r}: expected 5 fields (minute hour day month weekday), "
                         "or 6 with seconds first")
    try:
        CronSim(expr, dt.datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise UsageError(f"bad cron expression {expr!r}: {exc} (expected 5 fields: minute hour day month weekday, "
                         "or 6 with seconds first)") from None
    return expr


def next_tick(expr: str, timezone: str, after: str) -> str:
    """The first tick of ``expr`` in ``timezone`` strictly after ``after`` (stored text), as stored text.
    UsageError if the expression never fires (``0 0 30 2 *``: February 30th)."""
    start = parse_ts(after).astimezone(zone(timezone))
    try:
        tick = next(CronSim(expr, start))
    except (StopIteration, CronSimError) as exc:
        raise UsageError(f"cron expression {expr!r} never fires: {exc or 'no date matches it'}") from None
    return format_ts(tick.timestamp())


@attrs.frozen
class Schedule:
    """A schedule as code or an operator declares it, checked: the job's payload is the canonical
    JSON of its type (``Registry.validate``)."""

    name: str
    cron: str
    job_type: str
    payload: str
    timezone: str = "UTC"

    def record(self, *, origin: str, now: str | None = None) -> ScheduleRecord:
        from .backends.base import ScheduleRecord

        now = now or now_ts()
        return ScheduleRecord(
            name=self.name, job_type=self.job_type, payload=self.payload, cron=self.cron, timezone=self.timezone,
            enabled=True, origin=origin, next_run=next_tick(self.cron, self.timezone, now), created_at=now, updated_at=now,
        )


def make_schedule(registry: Registry, name: Any, cron: Any, job_type: Any, payload: Any, timezone: Any = "UTC") -> Schedule:
    """Check every part of a schedule (UsageError, UnknownJobType or InvalidPayload naming the
    problem) and return it; nothing is written."""
    check_name(name)
    check_cron(cron)
    zone(timezone)
    if not isinstance(job_type, str):
        raise UsageError(f"job_type must be a string, got {type(job_type).__name__}")
    canonical = registry.validate(job_type, payload)
    schedule = Schedule(name, cron, job_type, canonical, timezone)
    next_tick(cron, timezone, now_ts())  # one that never fires is refused now, not at each start
    return schedule
