"""What an idle service costs: `python benchmarks/idle_cpu.py [--seconds 30]`.

Starts `python -m pipeline --processes 1` (no admin API) on an empty SQLite file, lets it settle, then
reads its CPU time from /proc (user + system) over the given seconds: the poll every
WORKER_POLL_INTERVAL_MS, the lease heartbeat and keeper, and the WAL watch (which waits on its inotify
descriptor and costs nothing while no one writes). Linux only.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ADMIN_", "WORKER_", "LOG_", "DATABASE_"))}
        env.update(DATABASE_URL=f"sqlite:///{tmp}/idle.db", ADMIN_ENABLED="false")
        service = subprocess.Popen([sys.executable, "-m", "pipeline", "--processes", "1"], env=env, cwd=tmp,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(5)  # start-up done
            before = cpu_seconds(service.pid)
            time.sleep(options.seconds)
            used = cpu_seconds(service.pid) - before
        finally:
            service.send_signal(signal.SIGTERM)
            service.wait(30)
    print(f"idle service: {used:.2f} s of CPU in {options.seconds:g} s = {used / options.seconds:.2%} of a core")


if __name__ == "__main__":
    main()
