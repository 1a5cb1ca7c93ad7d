"""UUID version 7 job ids (RFC 9562): time-ordered, so new rows append to the primary-key b-tree.

Python gains ``uuid.uuid7`` only in 3.14; these few lines stand in until that is the
minimum. Within one millisecond the 12-bit ``rand_a`` field is a counter (RFC 9562
method 1), so ids made by one process are strictly increasing.
"""

from __future__ import annotations

import os
import random
import threading
import time


class UUID7Factory:
    """Makes increasing UUIDv7 strings. One per pipeline; safe to share between threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # seeded from the OS: unpredictable enough for ids (not secrets), no syscall per id
        self._random = random.Random(os.urandom(16))
        self._last_ms = 0
        self._counter = 0

    def __call__(self) -> str:
        with self._lock:
            ms = time.time_ns() // 1_000_000
            if ms <= self._last_ms:
                ms = self._last_ms
                self._counter += 1
                if self._counter > 0xFFF:  # counter exhausted: borrow the next millisecond
                    ms += 1
                    self._counter = 0
            else:
                self._counter = 0
            self._last_ms = ms
            counter = self._counter
        rand_b = self._random.getrandbits(62)
        value = (ms & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | rand_b
        h = f"{value:032x}"  # what str(uuid.UUID(int=value)) gives, at a third of the cost
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def many(self, n: int) -> list[str]:
        return [self() for _ in range(n)]
