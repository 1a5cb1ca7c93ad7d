"""The SQL a drained job costs on SQLite, alone: `python benchmarks/sql_floor.py [--batch 256] [--rounds 5]`.

What the database thread cannot spend less on per job without other statements: the store's own
functions (store.claim_leases, store.settle) run in one process on a fresh file, no trio, no threads,
no fsync (synchronous=OFF), in the shape of a drain: 20,000 jobs inserted, then one transaction per
round that claims ``--batch`` jobs ahead (their attempts counted when they start) and writes the
outcomes of the round before (SUCCEED) with the STARTs of the jobs just claimed, as a worker's outcome
carries the next job's START. ``--counted`` claims them started instead (no START: the claim counts
the attempt). Prints the CPU µs per job of the claim, the outcomes and the whole round, medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.backends.base import Lease, NewJob, Settlement  # noqa: E402
from pipeline.backends.sqlite import migrations, store  # noqa: E402
from pipeline.clock import now_ts  # noqa: E402
from pipeline.ids import UUID7Factory  # noqa: E402
from pipeline.sqlite_files import connect  # noqa: E402
from pipeline.states import Transition  # noqa: E402

JOBS = 20_000
TYPE = "invalidate_cache"


def drain(folder: Path, batch: int, counted: bool) -> tuple[float, float, float]:
    """(claim, outcomes, whole round) CPU µs per job of one drain on a fresh file."""
    path = folder / f"floor-{time.monotonic_ns()}.db"
    conn = connect(path, synchronous="off")
    conn.isolation_level = None
    migrations.migrate(conn, path)
    new_id, now = UUID7Factory(), now_ts()
    conn.execute("BEGIN IMMEDIATE")
    store.insert_jobs(conn, [NewJob(new_id(), TYPE, '{"keys":["k"]}', 3, now, 100, now) for _ in range(JOBS)])
    conn.execute("COMMIT")
    claim = outcomes = 0.0
    started = time.process_time()
    held: list[Lease] = []
    while True:
        conn.execute("BEGIN IMMEDIATE")
        now = now_ts()
        a = time.process_time()
        leases = store.claim_leases(conn, now, wants={TYPE: batch}, owner="floor", lease_seconds=30,
                                    start={TYPE: batch if counted else 0})
        b = time.process_time()
        items = [Settlement(lease.id, lease.token, Transition.SUCCEED) for lease in held]
        if not counted:
            items += [Settlement(lease.id, lease.token, Transition.START) for lease in leases]
        if items:
            store.settle(conn, items, now=now)
        c = time.process_time()
        conn.execute("COMMIT")
        claim, outcomes = claim + b - a, outcomes + c - b
        held = leases
        if not leases:
            break
    whole = time.process_time() - started
    conn.close()
    return claim / JOBS * 1e6, outcomes / JOBS * 1e6, whole / JOBS * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256, help="jobs claimed per transaction (a worker process's room)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--counted", action="store_true", help="claim the jobs started: no START per job")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [drain(Path(tmp), options.batch, options.counted) for _ in range(options.rounds)]
    claim, outcomes, whole = (statistics.median(run[i] for run in runs) for i in range(3))
    what = "SUCCEED" if options.counted else "SUCCEED + the next job's START"
    print(f"SQLite, {JOBS:,} jobs, {options.batch} a transaction, medians of {options.rounds}: "
          f"claim {claim:.1f} µs, outcomes ({what}) {outcomes:.1f} µs, whole round {whole:.1f} µs CPU per job")


if __name__ == "__main__":
    main()
