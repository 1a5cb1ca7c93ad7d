"""Retention on Redis: whose turn it is (a key that expires after the interval), the bounded
deletes of finished jobs (the cleanup script, ``limit`` per call) and of the worker-registry
entries of processes long gone (one script: a worker that beats meanwhile is kept)."""

from __future__ import annotations

from typing import Any

from ...states import check_finished
from .db import run_script
from .scripts import ALL

PRUNE_WORKERS = ALL["prune_workers"]  # lua/prune_workers.lua


def take_turn(client: Any, prefix: str, interval_seconds: float) -> bool:
    """True for one caller per interval: SET NX of a key that expires when the interval ends."""
    return bool(client.set(prefix + "upkeep:retention", "1", nx=True, px=max(1, round(interval_seconds * 1000))))


# Entries of done:<status> one prune call looks at, at most: the ``limit`` it deletes, and the jobs it
# passes over because their batch's callback has not finished (a batch with a callback holds at most
# 10,000 jobs: one such batch never stops a call; several larger than that wait for their callbacks)
LOOK_PAST_KEPT = 10_000


def prune(client: Any, prefix: str, status: str, older_than_seconds: float, limit: int) -> int:
    """Up to ``limit`` jobs of the final ``status`` finished more than ``older_than_seconds`` ago,
    oldest first (``done:<status>`` is scored by when they finished), in one script call
    (lua/prune.lua); a job of a batch whose callback has not finished is kept, and passed over."""
    check_finished([status], "retention removes")
    return int(run_script(client, ALL["prune"], [prefix, round(older_than_seconds * 1000), limit, status,
                                                 limit + LOOK_PAST_KEPT]))


def prune_workers(client: Any, prefix: str, older_than_seconds: float) -> int:
    return int(run_script(client, PRUNE_WORKERS, [prefix, round(older_than_seconds * 1000)]))
