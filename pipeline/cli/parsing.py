"""What every command's parsing shares: the parser that exits 2 with the program's name, the options
read before the command, arguments checked as text and as JSON objects."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from ..errors import UsageError


class CliError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's own exit 2, with our prefix
        self.print_usage(sys.stderr)
        raise CliError(f"{self.prog}: {message}", 2)


def global_options(argv: Sequence[str]) -> argparse.Namespace:
    """The options before the command that decide what the parser shows: --app and --env-file
    (parsed again, with everything else, by the full parser)."""
    pre = Parser(prog="python -m pipeline", add_help=False)
    pre.add_argument("--app")
    pre.add_argument("--env-file", default=".env")
    pre.add_argument("--processes")
    pre.add_argument("--json", action="store_true")
    pre.add_argument("rest", nargs=argparse.REMAINDER)  # the command and its own arguments, untouched
    return pre.parse_known_args(argv)[0]


def check_text(arg: str, position: int) -> None:
    """Arguments that are not UTF-8 (Python keeps their bytes as lone surrogates) can be
    neither stored nor looked up: refuse them here, naming which one, not deep in sqlite3."""
    try:
        arg.encode("utf-8")
    except UnicodeEncodeError:
        shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")[:80]
        raise UsageError(f"argument {position} ({shown!r}) is not valid UTF-8 text") from None


def json_object(text: str, what: str) -> dict[str, Any]:
    from ..admin import inputs

    return inputs.object_of(inputs.loads(text, what), what)


DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
DURATION_FORMS = "a number of seconds, or a number with a unit: 90s, 30m, 2h, 2d, 1w"


def duration(text: str, what: str) -> float:
    """``30m``, ``2h``, ``2d``, ``1w`` or plain seconds (``600``, as ``enqueue --expires-in`` takes) → seconds;
    UsageError naming ``what`` otherwise (or for a duration that is not more than 0)."""
    raw = text.strip().lower()
    unit = raw[-1:] if raw[-1:] in DURATION_UNITS else "s"
    number = raw[:-1] if raw[-1:] in DURATION_UNITS else raw
    try:
        value = float(number) * DURATION_UNITS[unit]
    except ValueError:
        raise UsageError(f"{what} must be {DURATION_FORMS}; got {text!r}") from None
    if not 0 < value < float("inf"):
        raise UsageError(f"{what} must be more than 0 ({DURATION_FORMS}); got {text!r}")
    return value
