"""Timestamps as the jobs table stores them: ISO 8601 UTC text with milliseconds.

The format is the one SQLite's ``strftime('%Y-%m-%dT%H:%M:%fZ', 'now')`` produces, so
that rows written by the host application's own SQL (the outbox pattern) and rows
written here compare correctly as text, and the claim index can range-scan them.
"""

from __future__ import annotations

import datetime as dt
import time

UTC = dt.UTC


def format_ts(epoch: float) -> str:
    """Epoch seconds to the stored text, rounded to the nearest millisecond (so that
    parsing a stored time and formatting it again gives the same text)."""
    seconds, millis = divmod(round(epoch * 1000), 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def now_ts() -> str:
    return format_ts(time.time())


def parse_ts(text: str) -> dt.datetime:
    """Parse an ISO 8601 timestamp; naive values are taken as UTC."""
    value = dt.datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


MAX_EPOCH = 253_402_300_799.999  # 9999-12-31T23:59:59.999Z: past it the text no longer sorts as time


def to_ts(value: dt.datetime | str | float) -> str:
    """Normalise a datetime, ISO string or epoch seconds to the stored format.

    ValueError for a time that the stored text cannot order correctly (before 1970 or
    after the year 9999), or that is not a number.
    """
    if isinstance(value, str):
        value = parse_ts(value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        epoch = value.timestamp()
    else:
        epoch = float(value)
    if not 0 <= epoch <= MAX_EPOCH:
        raise ValueError(f"{value!r} is outside 1970-01-01 .. 9999-12-31")
    return format_ts(epoch)


def to_epoch(text: str) -> float:
    return parse_ts(text).timestamp()
