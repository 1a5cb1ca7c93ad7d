"""A separate process that claims from a shared store until nothing is left (for test_processes.py).

    python claimer.py DATABASE_URL JOB_TYPE BATCH

Prints "ready" once its backend is open, waits for a line on stdin (so that every process
starts claiming at once), then prints each id it claimed, one a line, and "done".
"""

from __future__ import annotations

import os
import socket
import sys

import trio

from pipeline import Config
from pipeline.backends import open_backend


async def main(url: str, job_type: str, batch: int) -> None:
    owner = f"{socket.gethostname()}:{os.getpid()}"
    # the environment's settings (REDIS_ALLOW_NON_DURABLE for the test server), this URL
    config = Config.from_env({**os.environ, "DATABASE_URL": url}, env_file=None)
    async with open_backend(config) as backend:
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)
        while True:
            leases = await backend.claim({job_type: batch}, owner=owner, lease_seconds=600.0)
            if not leases:
                break
            print("\n".join(f"{lease.id} {lease.token} {owner}" for lease in leases), flush=True)
            await trio.sleep(0.002)  # let the others in: the point is claims that interleave
    print("done", flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
