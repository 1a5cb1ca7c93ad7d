"""Text every store can hold: the one check an id, a key, a name or a payload's text passes before it is
queued for a write. A module of its own, beneath everything that writes (requests, durable, engine/steps)."""

from __future__ import annotations

from .errors import UsageError


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
