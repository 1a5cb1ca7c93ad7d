"""Cross-process wake-ups on the server backends: a due job inserted by another process nudges
this one's Poller at once (Postgres NOTIFY, Redis PUBLISH); a job not yet due wakes nobody.
(SQLite's WAL watch is tested through the running pipeline: tests/test_liveness_checks.py.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from pipeline.backends import Nudge, open_backend
from pipeline.backends.base import NUDGE_BUFFER

from .kit import job
from .stores import BACKENDS


@pytest.mark.parametrize("name", [name for name in ("postgres", "redis") if name in BACKENDS])
async def test_an_insert_by_another_process_nudges_the_poller_within_half_a_second(name: str, tmp_path: Path) -> None:
    async with BACKENDS[name](tmp_path) as config:
        nudge_send, nudge_recv = trio.open_memory_channel[Nudge](NUDGE_BUFFER)
        async with open_backend(config, nudge_send=nudge_send) as _listening, open_backend(config) as other:
            with trio.fail_after(5):
                await nudge_recv.receive()  # the listener's first nudge, once it listens
            while True:  # nothing else waits
                try:
                    nudge_recv.receive_nowait()
                except trio.WouldBlock:
                    break
            t0 = time.perf_counter()
            await other.insert([job()])
            with trio.fail_after(5):
                assert await nudge_recv.receive() is None
            assert time.perf_counter() - t0 < 1.5  # milliseconds; without the listener, no nudge at all

            await other.insert([job(delay=3600.0)])  # not due: nobody needs waking
            with trio.move_on_after(0.3) as waited:
                await nudge_recv.receive()
            assert waited.cancelled_caught
        nudge_recv.close()
