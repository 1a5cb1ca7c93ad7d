"""What an empty Redis claim costs beside priorities that wait: `python benchmarks/redis_claim.py`.

For each count of priorities (default 1, 10,000 and 50,000), a fresh key prefix holds one job per
priority, each due in an hour, and the store's claim (store.claim: one script) asks for 32 jobs
of the type again and again: none is due, so each claim comes back empty. Prints the median and
p90 of a claim's round trip. The server is a redis-server of the script's own on a free port,
nothing on disk (``--url`` names another; its keys under the prefix are deleted afterwards).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import socket
import statistics
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import redis

from pipeline.backends.base import NewJob
from pipeline.backends.redis import db, store
from pipeline.backends.redis.scripts import ALL

ROUNDS = 50


@contextlib.contextmanager
def own_server() -> Iterator[str]:
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("redis-server is not installed: pass --url")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", ""],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait()


def measure(url: str, priorities: int) -> list[float]:
    client = redis.Redis.from_url(url)
    prefix = f"{{bench-claim-{uuid.uuid4().hex[:8]}}}:"
    try:
        db.run_script(client, ALL["schema"], [prefix, db.SCHEMA_VERSION])
        due = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        rows = [NewJob(id=str(uuid.uuid4()), job_type="t", payload="{}", max_attempts=3, run_after=due, priority=p,
                       created_at=created) for p in range(priorities)]
        for i in range(0, len(rows), 5000):
            store.insert(client, prefix, rows[i : i + 5000])
        times = []
        for _ in range(ROUNDS):
            start = time.perf_counter()
            assert store.claim(client, prefix, wants={"t": 32}, owner="bench", lease_seconds=60) == []
            times.append((time.perf_counter() - start) * 1000)
        return times
    finally:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for i in range(0, len(keys), 1000):
            client.unlink(*keys[i : i + 1000])
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a Redis server to use (default: one of the script's own)")
    parser.add_argument("--priorities", type=int, nargs="+", default=[1, 10_000, 50_000])
    options = parser.parse_args()
    with contextlib.ExitStack() as stack:
        url = options.url or stack.enter_context(own_server())
        print(f"empty claim of 32 jobs, {ROUNDS} rounds each (layout {db.SCHEMA_VERSION})")
        for n in options.priorities:
            times = sorted(measure(url, n))
            print(f"{n:>7,} priorities waiting: median {statistics.median(times):8.3f} ms, "
                  f"p90 {times[int(len(times) * 0.9)]:8.3f} ms")


if __name__ == "__main__":
    main()
