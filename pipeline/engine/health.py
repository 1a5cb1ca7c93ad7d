"""What ``/healthz`` reports besides the store's own answer: the parts of the engine that
cannot do their work right now, and why.

Actors write it on the trio thread; the admin API reads it. A part that cannot work at
all (an actor that died) does not report here: it takes the process down instead.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

# a claim that has waited this long for the store makes the process unhealthy: past the
# SQLite Ledger's own patience with a locked database (30 s), so only a store that stopped
# answering reaches it
CLAIM_PATIENCE = 45.0


@attrs.define
class Health:
    problems: dict[str, str] = attrs.field(factory=dict)  # part → why it cannot work now
    claiming_since: float | None = None  # trio time the Poller's claim in flight was sent
    # the reasons of the processes this one answers for (a supervisor: its worker processes', each named)
    others: Callable[[], list[str]] | None = None

    def report(self, part: str, reason: str) -> None:
        self.problems[part] = reason

    def clear(self, part: str) -> None:
        self.problems.pop(part, None)

    def reasons(self, now: float) -> list[str]:
        found = [f"{part}: {reason}" for part, reason in sorted(self.problems.items())]
        if self.claiming_since is not None and now - self.claiming_since > CLAIM_PATIENCE:
            found.append(f"poller: its claim has waited {now - self.claiming_since:.0f} s for the job store to answer")
        if self.others is not None:
            found.extend(self.others())
        return found
