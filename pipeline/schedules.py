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
import math
import re
import zoneinfo
from collections.abc import Mapping
from typing import Any, Protocol

import attrs
from cronsim import CronSim, CronSimError

from .clock import UTC, format_ts, now_ts, parse_ts
from .errors import UsageError

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


# Clocks that go back (the hour repeated in autumn) and forward (the hour skipped in spring).
# cronsim is only asked for wall times (naive datetimes: no zone, no DST); which instant each
# wall time fires at is decided here, so that the ticks of a schedule are one increasing
# sequence of instants and "the first tick strictly after a moment" is always ahead of it.
# (cronsim's own zone handling reads a moment in the repeated hour by its wall time alone:
# from 06:10Z, 01:10 EST, it answered 01:30 EDT, 05:30Z, 40 minutes in the past, and the
# Scheduler fired that tick again every round; its six-field expressions skip a spring day's
# missing time and fire twice in the repeated hour.)
_LOOK_AHEAD = dt.timedelta(hours=3)  # the longest clock change back this looks for around a moment


def fixed_time(expr: str) -> bool:
    """Whether ``expr`` fires at fixed times of day (its minute and hour fields name them:
    ``30 1 * * *``, ``0 9-17 * * 1-5``) rather than every so often (``*/15 * * * *``, ``0 * * * *``):
    the split cron makes (Debian's cron) for the hour repeated when clocks go back."""
    parts = expr.split()
    minute, hour = parts[-5], parts[-4]
    return not minute.startswith("*") and not hour.startswith("*")


def next_tick(expr: str, timezone: str, after: str) -> str:
    """The first tick of ``expr`` in ``timezone`` strictly after ``after`` (stored text), as stored
    text. UsageError if the expression never fires (``0 0 30 2 *``: February 30th).

    Each matching wall time fires at one instant, except in the hour repeated when clocks go
    back: a wall time that does not exist (skipped when clocks go forward) fires at the first
    moment after the gap (``30 2 * * *`` at 03:00 on that day); one that occurs twice fires at
    its first occurrence only for a fixed time of day (:func:`fixed_time`), at both for an
    expression that fires every so often (it goes on by the clock through the repeated hour)."""
    tz = zone(timezone)
    moment = parse_ts(after).astimezone(UTC)
    try:
        tick = _next_moment(expr, tz, moment)
    except CronSimError as exc:
        raise UsageError(f"bad cron expression {expr!r}: {exc}") from None
    if tick is None:
        raise UsageError(f"cron expression {expr!r} never fires: no date matches it")
    return format_ts(tick.timestamp())


def _next_moment(expr: str, tz: zoneinfo.ZoneInfo, moment: dt.datetime) -> dt.datetime | None:
    wall = _wall(moment, tz)
    walls = CronSim(expr, wall)  # (CronSimError for a bad expression)
    both = not fixed_time(expr)
    found: dt.datetime | None = None
    # the wall times after moment's: the first of them whose instant is ahead (in the repeated
    # hour's second pass, those of that hour already fired at their first occurrence)
    for candidate in walls:
        first, second = _moments(candidate, tz)
        if first > moment:
            found = first
            break
        if both and second is not None and second > moment:
            found = second
            break
    if not both:
        return found
    # an expression firing every so often, before the clock goes back: a wall time before
    # moment's (01:10 at 01:50 EDT) comes again after it (01:10 EST), maybe before `found`
    offset = _offset(moment, tz)
    if found is not None and found - moment <= _LOOK_AHEAD and _offset(found, tz) == offset:
        return found  # no change of the clock in between: a second occurrence comes after `found`
    drop = offset - min(_offset(moment + _LOOK_AHEAD, tz), _offset(found or moment, tz))
    if drop > dt.timedelta(0):
        for candidate in CronSim(expr, wall - drop - dt.timedelta(seconds=1)):
            if candidate > wall:
                break
            second = _moments(candidate, tz)[1]
            if second is not None and second > moment:
                return second if found is None else min(found, second)
    return found


def _wall(moment: dt.datetime, tz: zoneinfo.ZoneInfo) -> dt.datetime:
    return moment.astimezone(tz).replace(tzinfo=None)


def _offset(moment: dt.datetime, tz: zoneinfo.ZoneInfo) -> dt.timedelta:
    return moment.astimezone(tz).utcoffset() or dt.timedelta(0)


def _moments(wall: dt.datetime, tz: zoneinfo.ZoneInfo) -> tuple[dt.datetime, dt.datetime | None]:
    """The instant(s) of a wall time in ``tz``: (its only or first occurrence, its second one or
    None); for one in a gap, (the first moment after the gap, None)."""
    early = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    late = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    if _wall(early, tz) == wall:
        return (early, late) if late != early and _wall(late, tz) == wall else (early, None)
    # in a gap: fold=0 reads it with the offset before the change, fold=1 with the one after;
    # the change itself lies between the two (a bisection on whole seconds finds it)
    lo, hi = int(min(early, late).timestamp()), math.ceil(max(early, late).timestamp())
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _wall(dt.datetime.fromtimestamp(mid, UTC), tz) > wall:
            hi = mid
        else:
            lo = mid
    return dt.datetime.fromtimestamp(hi, UTC), None


def check_advance(name: str, *, tick: str, next_run: str) -> None:
    """UsageError unless ``next_run`` is after ``tick``: every store's fire refuses to write a next
    run that is not, since the Scheduler would find that tick due again and fire it every round."""
    if parse_ts(next_run) <= parse_ts(tick):
        raise UsageError(f"schedule {name!r}: next run {next_run} is not after the tick {tick} it fires; "
                         "refused (it would fire again at once)")


@attrs.frozen
class Schedule:
    """A schedule as code or an operator declares it, checked: the job's payload is the canonical
    JSON of its type (``Registry.validate``)."""

    name: str
    cron: str
    job_type: str
    payload: str
    timezone: str = "UTC"



class Validates(Protocol):
    """What :func:`make_schedule` needs of a registry: a payload checked against its job type."""

    def validate(self, name: str, payload: str | Mapping[str, Any]) -> str: ...


def make_schedule(registry: Validates, name: Any, cron: Any, job_type: Any, payload: Any, timezone: Any = "UTC") -> Schedule:
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
