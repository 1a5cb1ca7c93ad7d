"""The service as started, before and after a change: `python benchmarks/before_after.py --before REV`.

For the same drain as benchmarks/service.py (20,000 `invalidate_cache` jobs of the bundled site
loaded with `enqueue --from-file`, then `python -m pipeline` with WORKER_CONCURRENCY=32 and its
default logging, a line per job, until every job is completed), runs the code of git revision REV (a
worktree of it, made in a scratch folder) and the code of this checkout in turns, A B A B ..., ROUNDS
times each (default 5), each on a fresh store. Prints per round and as medians:

* the drain rate, jobs/s from the first job done to the last (what service.py prints);
* the CPU time of the whole process tree per job, in µs: user + system of the service and every
  process it started (getrusage of the waited children, taken around each run), including its start
  and stop, which are the same in both arms, so that the difference between the arms is the change's;
* on Postgres and Redis, the server's CPU per job over the same span (stores.py's server_cpu: the
  Postgres processes from /proc, Redis's INFO cpu), the enqueue left out; and each figure's ratio,
  before / after. Redis is a redis-server of the script's own with AOF on (appendfsync everysec),
  the durability the store requires, unless --redis-url names another.

Wall-clock rates move with the machine; CPU per job is the arbiter (docs/performance.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from cluster import own_redis  # noqa: E402
from service import watch  # noqa: E402 - the same drain as service.py, from the first job done to the last
from stores import BACKENDS, RedisStores, open_stores  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
JOB = json.dumps({"job_type": "invalidate_cache", "payload": {"keys": ["k"]}})


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_run(tree: Path, stores: object, directory: Path, jobs: int, concurrency: int,
            processes: int | None = None) -> tuple[float, float, float | None]:
    """(jobs/s, CPU µs per job, the server's CPU µs per job or None) of one drain by the code in ``tree``."""
    url = stores.fresh("before_after")  # type: ignore[attr-defined]
    try:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("ADMIN_", "WORKER_", "LOG_", "DATABASE_", "SQLITE_", "REDIS_", "PIPELINE_"))}
        env.update(stores.settings, DATABASE_URL=url, ADMIN_PORT="0", WORKER_CONCURRENCY=str(concurrency),  # type: ignore[attr-defined]
                   PYTHONPATH=str(tree))
        if processes is not None:
            env["WORKER_PROCESSES"] = str(processes)
        lines = directory / "jobs.jsonl"
        lines.write_text((JOB + "\n") * jobs)
        subprocess.run([sys.executable, "-m", "pipeline", "enqueue", "--from-file", str(lines)], env=env, cwd=directory,
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        before, server_before = children_cpu(), stores.server_cpu()  # type: ignore[attr-defined]
        rate, _ = watch([sys.executable, "-m", "pipeline"], env, directory / "service.log",
                        lambda: stores.completed(url), jobs)  # type: ignore[attr-defined]
        server_after = stores.server_cpu()  # type: ignore[attr-defined]
        server = None if server_before is None or server_after is None else (server_after - server_before) / jobs * 1e6
        return rate, (children_cpu() - before) / jobs * 1e6, server  # (watch waits for the service's exit)
    finally:
        stores.drop(url)  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the git revision to compare against (e.g. a commit id)")
    parser.add_argument("--backend", choices=BACKENDS, default="sqlite")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--processes", type=int, help="WORKER_PROCESSES (default: the service's, one per core)")
    parser.add_argument("--redis-url", help="--backend redis: this server instead of one of the script's own with AOF on")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as stack:
        directory = Path(scratch)
        old = directory / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), args.before], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if args.backend == "redis":
            url = args.redis_url or stack.enter_context(own_redis(directory, {}))
            stores = RedisStores(url)
            stores.settings = {} if args.redis_url is None else stores.settings  # its own server keeps AOF: no waiver
        else:
            stores = open_stores(args.backend, directory)
        figures: dict[str, list[tuple[float, float, float | None]]] = {"before": [], "after": []}
        try:
            for i in range(args.rounds):
                for arm, tree in (("before", old), ("after", ROOT)) if i % 2 == 0 else (("after", ROOT), ("before", old)):
                    rate, cpu, server = one_run(tree, stores, directory, args.jobs, args.concurrency, args.processes)
                    figures[arm].append((rate, cpu, server))
                    shown = "" if server is None else f", the server {server:6.1f} µs per job"
                    print(f"round {i + 1} {arm:6}: {rate:8,.0f} jobs/s, {cpu:6.1f} µs CPU per job (whole tree){shown}",
                          flush=True)
        finally:
            stores.close()
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False)
    medians: dict[str, tuple[float, float, float | None]] = {}
    for arm in ("before", "after"):
        servers = [v for _, _, v in figures[arm] if v is not None]
        medians[arm] = (statistics.median(r for r, _, _ in figures[arm]), statistics.median(c for _, c, _ in figures[arm]),
                        statistics.median(servers) if servers else None)
        rate, cpu, server = medians[arm]
        shown = "" if server is None else f", the server {server:.1f} µs per job"
        print(f"{arm:6} ({args.before if arm == 'before' else 'this checkout'}): median {rate:,.0f} jobs/s, "
              f"{cpu:.1f} µs CPU per job{shown} ({args.backend}, {args.jobs:,} jobs, {args.rounds} rounds)")
    (_, cpu_b, server_b), (_, cpu_a, server_a) = medians["before"], medians["after"]
    ratios = f"before / after: the service's CPU per job {cpu_b / cpu_a:.2f}×"
    if server_b is not None and server_a:
        ratios += f", the server's {server_b / server_a:.2f}×"
    print(ratios)


if __name__ == "__main__":
    main()
