"""Answers between tasks: a one-shot slot the Ledgers, the EventBus and the Enqueuer fill.

Beneath both the engine and the stores, which share it (the stores import nothing from the engine)."""

from __future__ import annotations

import copy
from typing import Any

import attrs
import trio


@attrs.define(eq=False)
class Reply:
    """A one-shot answer slot. (A trio.Event plus a value: lighter than a memory channel
    pair per call on the hot path, and like a size-1 reply channel it can never block
    the Ledger: setting it never waits.)"""

    _done: trio.Event = attrs.field(factory=trio.Event)
    _value: Any = None
    _error: BaseException | None = None

    @property
    def answered(self) -> bool:
        return self._done.is_set()

    def set(self, value: Any) -> None:
        self._value = value
        self._done.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._done.set()

    async def wait(self) -> Any:
        await self._done.wait()
        if self._error is not None:
            raise _own_copy(self._error)
        return self._value


def _own_copy(error: BaseException) -> BaseException:
    """The failure of a batch, for one of its waiters: every caller of a failed batch gets
    the same error, but raising one shared object from many tasks would pile each raise's
    traceback and context onto it. ``copy.copy`` keeps what built-in errors hold outside
    ``__dict__`` (errno, filename); where it rebuilds a different message (an ``__init__``
    that formats its arguments), the copy is made without calling ``__init__``; failing
    both, the waiters share the original."""
    try:
        mine = copy.copy(error)
        if type(mine) is not type(error) or str(mine) != str(error):
            raise TypeError("not the same error")
    except Exception:
        try:
            mine = type(error).__new__(type(error))
            mine.args = error.args
            mine.__dict__.update(vars(error))
            if str(mine) != str(error):
                return error
        except Exception:
            return error
    if "__notes__" in vars(error):
        mine.__notes__ = list(error.__notes__)
    mine.__cause__, mine.__suppress_context__ = error.__cause__, error.__suppress_context__
    return mine.with_traceback(None)


