"""Text every store can hold: the one check an id, a key, a name or a payload's text passes before it is
queued for a write. A module of its own, beneath everything that writes (requests, durable, engine/steps)."""

from __future__ import annotations

from typing import Any

from .errors import UsageError


def check_name(value: Any, what: str, max_chars: int) -> str:
    """A name as a caller gives it (a step's, a signal's): non-empty text of at most ``max_chars``
    characters that every store can hold; UsageError naming ``what`` ("a step's name") otherwise."""
    if type(value) is not str:
        raise UsageError(f"{what} must be text, got {type(value).__name__}")
    if not value.strip():
        raise UsageError(f"{what} must not be empty")
    if len(value) > max_chars:
        raise UsageError(f"{what} must be at most {max_chars} characters, got {len(value)}")
    return check_text(value, what.replace("a ", "the ", 1))


def check_text(value: str, what: str) -> str:
    """``value`` if every store can hold it as text: no NUL, no unpaired UTF-16 surrogate. A Python str
    holds both (a JSON "\\ud800" escape, bytes decoded with surrogateescape), and no store does: SQLite's
    driver, Postgres and Redis fail to encode it, and in the Ledger or a Redis pipeline that failure ended
    the write loop for everyone. So every id, key and trace context a job is written with is checked here,
    before it is queued for a write (UsageError naming ``what``)."""
    if "\x00" in value:
        raise UsageError(f"{what} must not contain a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UsageError(f"{what} contains an unpaired UTF-16 surrogate ({value[exc.start]!r} at character {exc.start}), "
                         "which is not text: decode bytes before passing them") from None
    return value
