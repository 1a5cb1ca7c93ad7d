"""What a claim costs Postgres as a backlog drains: `python benchmarks/pg_claim_growth.py [--jobs N]`.

A fresh database (as cluster.py makes them) is loaded with N pending no-op jobs; then one connection
drains them with the store's own statements, as a service does at WORKER_CONCURRENCY=32: the claim
(store._CLAIM, 32 jobs, started) and the Ledger's batch of their SUCCEEDs (store.BATCH_SETTLE), each
prepared, in autocommit. It prints, for each fifth of the drain, the server backend's CPU per job
(/proc/<pid>/schedstat: nanoseconds on the CPU, so a Postgres on this machine) in each statement.

Every claimed row leaves its entry in the claim's index (jobs_claim, over the pending rows) dead, at
the index's head, where the next claim starts: until a VACUUM removes them, each claim walks past
every job claimed before it. `--vacuum-every K` runs `VACUUM jobs` after every K jobs, to compare;
`--drop-index NAME` (as cluster.py's) drops an index of the jobs table once loaded: what the two
statements cost the server without it; `--one-transaction` writes each batch of outcomes and the next
claim in one transaction (one commit, one WAL flush, instead of two).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import cluster  # noqa: E402
from pipeline.backends.base import Settlement  # noqa: E402
from pipeline.backends.postgres import store  # noqa: E402
from pipeline.states import Transition  # noqa: E402

BATCH = 32


def on_cpu(pid: int) -> float:
    """Seconds the process has run on a CPU (the scheduler's count, in ns)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--vacuum-every", type=int, default=0, help="VACUUM jobs after every K jobs (0: never)")
    parser.add_argument("--one-transaction", action="store_true",
                        help="each batch of outcomes and the next claim in one transaction, as a Ledger that took the "
                             "Poller's offer would write them (default: each statement a transaction of its own)")
    parser.add_argument("--drop-index", action="append", default=[], metavar="NAME",
                        help="drop this index of the jobs table once loaded (a what-if)")
    parser.add_argument("--postgres-url", default=cluster.POSTGRES_URL)
    args = parser.parse_args()
    import psycopg

    server = cluster.PostgresServer(args.postgres_url, {}, args.drop_index)
    url = server.stores.fresh("growth")
    try:
        server.stores.build(url, pending=args.jobs)
        conn = psycopg.connect(url, autocommit=True)
        server.reshape(conn)
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        print(f"{args.jobs:,} pending jobs, claims of {BATCH} and their outcomes on one connection"
              f"{f', VACUUM every {args.vacuum_every:,} jobs' if args.vacuum_every else ', no VACUUM'}"
              f"{''.join(f', without {name}' for name in args.drop_index)}"
              f"{', each batch of outcomes and the next claim in one transaction' if args.one_transaction else ''}; "
              "the backend's CPU per job:")
        part = max(args.jobs // 5, 1)
        done = in_part = 0
        claim = settle = vacuum = 0.0
        since_vacuum = 0
        params = {"types": [cluster.JOB_TYPE], "limits": [BATCH], "starts": [BATCH], "owner": "growth", "lease": 30.0}
        t0 = on_cpu(pid)
        rows = conn.execute(store._CLAIM, params, prepare=True).fetchall()  # noqa: SLF001
        claim += on_cpu(pid) - t0
        while rows:
            outcomes = [Settlement(row[0], row[5], Transition.SUCCEED) for row in rows]
            with conn.transaction() if args.one_transaction else contextlib.nullcontext():
                t0 = on_cpu(pid)
                conn.execute(store.BATCH_SETTLE, {**store.outcome_params(outcomes), "notify": False}, prepare=True)
                t1 = on_cpu(pid)
                following = conn.execute(store._CLAIM, params, prepare=True).fetchall()  # noqa: SLF001
            t2 = on_cpu(pid)  # (the COMMIT of --one-transaction counted in the claim)
            settle, claim = settle + t1 - t0, claim + t2 - t1
            done, in_part, since_vacuum = done + len(rows), in_part + len(rows), since_vacuum + len(rows)
            if args.vacuum_every and since_vacuum >= args.vacuum_every:
                conn.execute("VACUUM jobs")  # (in this backend: its CPU counted apart)
                vacuum += on_cpu(pid) - t2
                since_vacuum = 0
            if in_part >= part or not following:
                print(f"  jobs {done - in_part:>9,}–{done:<9,} claim {claim / in_part * 1e6:6.1f} µs, "
                      f"outcomes {settle / in_part * 1e6:5.1f} µs"
                      f"{f', VACUUM {vacuum / in_part * 1e6:5.1f} µs' if args.vacuum_every else ''}", flush=True)
                claim = settle = vacuum = 0.0
                in_part = 0
            rows = following
        conn.close()
    finally:
        server.stores.drop(url)
        server.stores.close()


if __name__ == "__main__":
    main()
