"""Retention on Redis: whose turn it is (a key that expires after the interval), the bounded
deletes of finished jobs (the cleanup script, ``limit`` per call) and of the worker-registry
entries of processes long gone (one script: a worker that beats meanwhile is kept)."""

from __future__ import annotations

from typing import Any

from ...errors import UsageError
from ...states import TERMINAL
from .db import run_script
from .scripts import ALL, Script

# ARGV: prefix, age in ms. Removes the entries of ``workers`` whose lease ran out more than that
# long ago by the server's clock; returns how many.
PRUNE_WORKERS = Script.of("prune_workers", r"""
local cutoff = now_ms() - tonumber(ARGV[2])
local entries = redis.call('HGETALL', P .. 'workers')
local n = 0
for i = 1, #entries, 2 do
  local beat, lease = string.match(entries[i + 1], '^(%d+)|(%d+)|')
  if beat and tonumber(beat) + tonumber(lease) < cutoff then
    redis.call('HDEL', P .. 'workers', entries[i])
    n = n + 1
  end
end
return n
""")


def take_turn(client: Any, prefix: str, interval_seconds: float) -> bool:
    """True for one caller per interval: SET NX of a key that expires when the interval ends."""
    return bool(client.set(prefix + "upkeep:retention", "1", nx=True, px=max(1, round(interval_seconds * 1000))))


def prune(client: Any, prefix: str, status: str, older_than_seconds: float, limit: int) -> int:
    """Up to ``limit`` jobs of the final ``status`` finished more than ``older_than_seconds`` ago,
    oldest first (``done:<status>`` is scored by when they finished), in one script call."""
    if status not in TERMINAL:
        raise UsageError(f"retention removes only finished jobs, not {status!r}")
    return int(run_script(client, ALL["cleanup"], [prefix, round(older_than_seconds * 1000), limit, status]))


def prune_workers(client: Any, prefix: str, older_than_seconds: float) -> int:
    return int(run_script(client, PRUNE_WORKERS, [prefix, round(older_than_seconds * 1000)]))
