"""Cron ticks around the clock changes (pipeline/schedules.py: next_tick), the pure function, in
zones that move by an hour (America/New_York, Europe/Paris) and by half an hour
(Australia/Lord_Howe). The rules (docs/scheduling.md):

- a tick is always strictly after the moment it is computed from;
- a fixed time of day that occurs twice (clocks go back) fires once, at its first occurrence;
  an expression that fires every so often goes on by the clock through both occurrences;
- a wall time that does not exist (clocks go forward) fires once, at the first moment after the gap;
- a schedule added, resumed or declared during the repeated hour fires each tick once.

The hypothesis tests check next_tick against a brute force that walks the UTC timeline, around
those changes and London's and Sydney's.
(The Scheduler and the stores end to end: tests/backends/test_cron_dst_stores.py.)"""

from __future__ import annotations

import datetime as dt
import zoneinfo

import attrs
import pytest
from cronsim import CronSim
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.backends.base import ScheduleRecord, with_enabled
from pipeline.clock import format_ts, to_epoch
from pipeline.schedules import Schedule, fixed_time, next_tick

UTC = dt.UTC
NY, PARIS, LORD_HOWE = "America/New_York", "Europe/Paris", "Australia/Lord_Howe"

# the changes of 2024, in UTC: (zone, instant, what the clock does)
CHANGES = [
    (NY, "2024-03-10T07:00:00.000Z", "02:00 EST -> 03:00 EDT"),
    (NY, "2024-11-03T06:00:00.000Z", "02:00 EDT -> 01:00 EST"),
    (PARIS, "2024-03-31T01:00:00.000Z", "02:00 CET -> 03:00 CEST"),
    (PARIS, "2024-10-27T01:00:00.000Z", "03:00 CEST -> 02:00 CET"),
    (LORD_HOWE, "2024-04-06T15:00:00.000Z", "02:00 +11 -> 01:30 +10:30"),
    (LORD_HOWE, "2024-10-05T15:30:00.000Z", "02:00 +10:30 -> 02:30 +11"),
    # and two more the issue saw storm: London, and Sydney (the southern hemisphere's seasons)
    ("Europe/London", "2024-03-31T01:00:00.000Z", "01:00 GMT -> 02:00 BST"),
    ("Europe/London", "2024-10-27T01:00:00.000Z", "02:00 BST -> 01:00 GMT"),
    ("Australia/Sydney", "2024-04-06T16:00:00.000Z", "03:00 AEDT -> 02:00 AEST"),
    ("Australia/Sydney", "2024-10-05T16:00:00.000Z", "02:00 AEST -> 03:00 AEDT"),
]


def ticks(expr: str, zone: str, start: str, end: str) -> list[str]:
    """Every tick in (start, end], by next_tick from each to the next."""
    found: list[str] = []
    at = start
    while (at := next_tick(expr, zone, at)) <= end:
        found.append(at)
    return found


# -- the storm of issue 21: a tick computed inside the repeated hour ---------------------------------


def test_a_tick_fired_late_in_the_repeated_hour_is_followed_by_the_next_day_s() -> None:
    # 30 1 * * * in New York: 01:30 EDT (05:30Z) is due; fired at 06:10Z (01:10 EST, the second pass)
    assert next_tick("30 1 * * *", NY, "2024-11-03T06:10:00.000Z") == "2024-11-04T06:30:00.000Z"
    # (cronsim read 06:10Z as 01:10 and answered 01:30 EDT, 05:30Z: the past, fired again each round)


@pytest.mark.parametrize(("zone", "expr", "repeated"), [
    (NY, "30 1 * * *", ("2024-11-03T05:30:00.000Z", "2024-11-03T06:30:00.000Z")),
    (PARIS, "30 2 * * *", ("2024-10-27T00:30:00.000Z", "2024-10-27T01:30:00.000Z")),
    (LORD_HOWE, "45 1 * * *", ("2024-04-06T14:45:00.000Z", "2024-04-06T15:15:00.000Z")),
])
def test_a_fixed_time_that_occurs_twice_fires_once_at_its_first_occurrence(
    zone: str, expr: str, repeated: tuple[str, str],
) -> None:
    first, second = repeated
    day_before = format_ts(to_epoch(first) - 86400)
    assert ticks(expr, zone, day_before, format_ts(to_epoch(first) + 86400 * 2 - 3600)) == [
        first, format_ts(to_epoch(second) + 86400)]  # that day once (not `second`), the next day once
    # from anywhere in the repeated hour, including its second pass: ahead, and not `second`
    for minute in range(0, 91, 5):
        at = format_ts(to_epoch(first) - 1800 + minute * 60 + 0.25)
        tick = next_tick(expr, zone, at)
        assert tick > at and tick != second, (at, tick)


@pytest.mark.parametrize(("zone", "expr", "start", "expected"), [
    # 02:30 does not exist: the first moment after the gap, 03:00 EDT; the day after as usual
    (NY, "30 2 * * *", "2024-03-09T12:00:00.000Z", ["2024-03-10T07:00:00.000Z", "2024-03-11T06:30:00.000Z"]),
    (NY, "0 30 2 * * *", "2024-03-09T12:00:00.000Z", ["2024-03-10T07:00:00.000Z", "2024-03-11T06:30:00.000Z"]),
    (PARIS, "15 2 * * *", "2024-03-30T12:00:00.000Z", ["2024-03-31T01:00:00.000Z", "2024-04-01T00:15:00.000Z"]),
    # Lord Howe skips 02:00-02:30 (+10:30 -> +11): 02:15 fires at 02:30 +11
    (LORD_HOWE, "15 2 * * *", "2024-10-05T00:00:00.000Z", ["2024-10-05T15:30:00.000Z", "2024-10-06T15:15:00.000Z"]),
    # a time that exists on the spring day, read with that day's offset (not the evening before's):
    # 03:00 EDT is 07:00Z (stepped in a fixed UTC offset of -5 it fired at 08:00Z, an hour late)
    (NY, "0 3 * * *", "2024-03-09T12:00:00.000Z", ["2024-03-10T07:00:00.000Z", "2024-03-11T07:00:00.000Z"]),
    (PARIS, "0 9 * * *", "2024-03-30T12:00:00.000Z", ["2024-03-31T07:00:00.000Z", "2024-04-01T07:00:00.000Z"]),
    (LORD_HOWE, "0 9 * * *", "2024-10-05T00:00:00.000Z", ["2024-10-05T22:00:00.000Z", "2024-10-06T22:00:00.000Z"]),
    # and in autumn: 09:00 EST is 14:00Z, not 13:00Z
    (NY, "0 9 * * *", "2024-11-02T13:30:00.000Z", ["2024-11-03T14:00:00.000Z", "2024-11-04T14:00:00.000Z"]),
])
def test_a_time_that_does_not_exist_fires_once_after_the_gap_and_the_others_at_their_wall_time(
    zone: str, expr: str, start: str, expected: list[str],
) -> None:
    assert ticks(expr, zone, start, format_ts(to_epoch(start) + 2 * 86400 + 3600)) == expected


def test_an_expression_that_fires_every_so_often_goes_on_by_the_clock() -> None:
    quarter = 900
    # New York, autumn: every 15 minutes of elapsed time through both passes of 01:00-02:00
    fall = ticks("*/15 * * * *", NY, "2024-11-03T04:50:00.000Z", "2024-11-03T07:30:00.000Z")
    assert fall == [format_ts(to_epoch("2024-11-03T05:00:00.000Z") + quarter * n) for n in range(11)]
    # spring: 01:45 EST, then 03:00 EDT (the 02:xx ticks do not exist: the first moment after, once)
    assert ticks("*/15 * * * *", NY, "2024-03-10T06:40:00.000Z", "2024-03-10T07:20:00.000Z") == [
        "2024-03-10T06:45:00.000Z", "2024-03-10T07:00:00.000Z", "2024-03-10T07:15:00.000Z"]
    assert ticks("30 * * * *", NY, "2024-03-10T06:00:00.000Z", "2024-03-10T08:00:00.000Z") == [
        "2024-03-10T06:30:00.000Z", "2024-03-10T07:00:00.000Z", "2024-03-10T07:30:00.000Z"]
    # Lord Howe, autumn: 01:30-02:00 occurs twice; hourly at :45 fires at both 01:45s
    assert ticks("45 * * * *", LORD_HOWE, "2024-04-06T13:00:00.000Z", "2024-04-06T17:00:00.000Z") == [
        "2024-04-06T13:45:00.000Z", "2024-04-06T14:45:00.000Z", "2024-04-06T15:15:00.000Z",
        "2024-04-06T16:15:00.000Z"]
    # a wall time before the moment's that comes again after it: at 01:50 EDT, 01:10 EST is next
    assert next_tick("10 * * * *", NY, "2024-11-03T05:50:00.000Z") == "2024-11-03T06:10:00.000Z"
    # every second, through a change: one tick a second, none skipped, none twice
    assert next_tick("* * * * * *", NY, "2024-11-03T05:59:59.500Z") == "2024-11-03T06:00:00.000Z"
    assert next_tick("* * * * * *", NY, "2024-03-10T06:59:59.000Z") == "2024-03-10T07:00:00.000Z"


def test_fixed_time_is_cron_s_split() -> None:
    assert fixed_time("30 1 * * *") and fixed_time("0 9-17 * * 1-5") and fixed_time("0 30 1 * * *")
    assert not fixed_time("*/15 * * * *") and not fixed_time("0 * * * *") and not fixed_time("*/5 * * * * *")


@pytest.mark.parametrize(("zone", "expr", "first", "second"), [
    (NY, "30 1 * * *", "2024-11-03T05:30:00.000Z", "2024-11-03T06:30:00.000Z"),
    (LORD_HOWE, "45 1 * * *", "2024-04-06T14:45:00.000Z", "2024-04-06T15:15:00.000Z"),
])
def test_a_schedule_added_or_resumed_in_the_repeated_hour_fires_that_time_once(
    zone: str, expr: str, first: str, second: str,
) -> None:
    for minutes in range(-25, 50, 5):  # from before the first occurrence to after the second
        now = format_ts(to_epoch(first) + minutes * 60)
        added = ScheduleRecord.of(Schedule("s", expr, "t", "{}", zone), origin="operator", now=now)
        resumed = with_enabled(attrs.evolve(added, enabled=False), True, now=now)
        for record in (added, resumed):
            assert record.next_run > now
            assert record.next_run != second  # that wall time fired (or was passed) at `first`
            assert record.next_run == (first if now < first else format_ts(to_epoch(second) + 86400))


# -- against a brute force ------------------------------------------------------------------------

EXPRESSIONS = [
    # fixed times of day
    "30 1 * * *", "45 1 * * *", "59 1 * * *", "0 2 * * *", "15 2 * * *", "30 2 * * *", "0 3 * * *",
    "0 1,2,3 * * *", "30 1-3 * * *", "0 30 1 * * *", "20 45 1 * * *",
    # every so often
    "*/15 * * * *", "0 * * * *", "30 * * * *", "10 * * * *", "* * * * *", "0 */2 * * *", "*/20 * * * * *",
]


def brute_next(expr: str, zone: str, after: dt.datetime) -> dt.datetime:
    """The first tick after ``after``, walking UTC in steps of a minute, or 20 s for the
    six-field expressions (every instant the expressions above and the changes fall on): an instant whose wall time matches, if it is
    the only or first occurrence of that wall time or the expression fires every so often; or
    the first instant after a jump forward over a matching wall time."""
    tz = zoneinfo.ZoneInfo(zone)
    spec = CronSim(expr, dt.datetime(2000, 1, 1))
    seconds = 60 if len(expr.split()) == 5 else 20
    step = dt.timedelta(seconds=seconds)

    def matches(wall: dt.datetime) -> bool:
        return (wall.second in spec.seconds and wall.minute in spec.minutes and wall.hour in spec.hours
                and wall.month in spec.months and spec.match_day(wall.date()))

    fixed = fixed_time(expr)
    t = dt.datetime.fromtimestamp((int(after.timestamp()) // seconds + 1) * seconds, UTC)
    before = (t - step).astimezone(tz)
    while True:
        local = t.astimezone(tz)
        wall, was = local.replace(tzinfo=None, fold=0), before.replace(tzinfo=None, fold=0)
        if matches(wall) and not (fixed and local.fold == 1):
            return t
        skipped = was + step
        while skipped < wall:  # the clock jumped forward over these
            if matches(skipped):
                return t
            skipped += step
        before, t = local, t + step


@settings(max_examples=250, deadline=None)
@given(change=st.sampled_from(CHANGES), expr=st.sampled_from(EXPRESSIONS),
       seconds=st.integers(-6 * 3600, 6 * 3600), millis=st.integers(0, 999))
def test_next_tick_is_the_brute_force_s_around_every_change(
    change: tuple[str, str, str], expr: str, seconds: int, millis: int,
) -> None:
    zone, instant, _ = change
    after = format_ts(to_epoch(instant) + seconds + millis / 1000)
    tick = next_tick(expr, zone, after)
    assert tick > after
    assert tick == format_ts(brute_next(expr, zone, dt.datetime.fromtimestamp(to_epoch(after), UTC)).timestamp())


@settings(max_examples=60, deadline=None)
@given(change=st.sampled_from(CHANGES), expr=st.sampled_from([e for e in EXPRESSIONS if fixed_time(e)]),
       seconds=st.integers(-26 * 3600, -3600))
def test_each_fixed_time_fires_once_a_day_across_a_change(change: tuple[str, str, str], expr: str, seconds: int) -> None:
    zone, instant, _ = change
    start = format_ts(to_epoch(instant) + seconds)
    found = ticks(expr, zone, start, format_ts(to_epoch(start) + 3 * 86400))
    assert found == sorted(set(found))  # strictly increasing
    tz = zoneinfo.ZoneInfo(zone)
    walls = [dt.datetime.fromtimestamp(to_epoch(t), tz).replace(tzinfo=None) for t in found]
    assert len(walls) == len(set(walls)), walls  # no wall time twice (01:30 EDT and 01:30 EST)
    spec = CronSim(expr, dt.datetime(2000, 1, 1))
    times_a_day = len(spec.hours) * len(spec.minutes) * len(spec.seconds)
    for day in sorted({w.date() for w in walls})[1:-1]:  # the whole days: each time once (two that
        # fall in one gap fire together at its end: "0 1,2,3" on New York's spring day)
        assert times_a_day - 1 <= len([w for w in walls if w.date() == day]) <= times_a_day, (day, walls)
