"""How many times trio runs a task per job: `python benchmarks/task_steps.py [--concurrency 32] [--jobs 20000]`.

Each time a task suspends and is resumed costs a pass of trio's scheduler (a few µs of the event
loop's CPU: see docs/performance.md, "What one job costs in CPU"). This counts those passes in
the drain of service.py (20,000 `invalidate_cache` jobs on SQLite, loaded with `enqueue
--from-file`, then `python -m pipeline --processes 1` with its default logging): a trio Instrument
counts each task step by task, and the Ledger's batches (its transactions) are counted beside
them. Prints steps per job by task, jobs per Ledger batch, and the CPU of the service per job
(start and stop included).
"""

from __future__ import annotations

import argparse
import atexit
import collections
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

JOB = json.dumps({"job_type": "invalidate_cache", "payload": {"keys": ["k"]}})


def serve(report: Path) -> None:
    """The service as `python -m pipeline --processes 1` runs it, counted."""
    import trio

    from pipeline.backends.sqlite import ledger
    from pipeline.cli import main

    steps: collections.Counter[str] = collections.Counter()
    batches = [0]

    class Count(trio.abc.Instrument):
        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            steps[task.name.rsplit(".", 1)[-1]] += 1

    run = trio.run

    def counted_run(*args: object, **kwargs: object) -> object:
        kwargs.setdefault("instruments", [])
        kwargs["instruments"].append(Count())  # type: ignore[attr-defined]
        return run(*args, **kwargs)  # type: ignore[arg-type]

    apply_batch = ledger._apply_batch

    def counted_batch(*args: object) -> object:
        batches[0] += 1
        return apply_batch(*args)  # type: ignore[arg-type]

    trio.run = counted_run  # type: ignore[assignment]
    ledger._apply_batch = counted_batch  # type: ignore[assignment]
    atexit.register(lambda: report.write_text(json.dumps({"steps": steps, "batches": batches[0]})))
    sys.argv = ["pipeline", "--processes", "1"]
    main()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=32, help="WORKER_CONCURRENCY (default 32)")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)  # (the counted service: where to report)
    options = parser.parse_args()
    if options.serve is not None:
        serve(options.serve)
        return
    from service import watch  # the drain of service.py, from the first job done to the last

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = folder / "pipeline.db"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("ADMIN_", "WORKER_", "LOG_", "DATABASE_", "SQLITE_", "PIPELINE_"))}
        env.update(DATABASE_URL=f"sqlite:///{path}", ADMIN_PORT="0", WORKER_CONCURRENCY=str(options.concurrency),
                   PYTHONPATH=str(Path(__file__).resolve().parent.parent))
        lines = folder / "jobs.jsonl"
        lines.write_text((JOB + "\n") * options.jobs)
        subprocess.run([sys.executable, "-m", "pipeline", "enqueue", "--from-file", str(lines)], env=env, cwd=folder,
                       check=True, stdout=subprocess.DEVNULL)

        def completed() -> int:
            import sqlite3

            with sqlite3.connect(path) as conn:
                return int(conn.execute("SELECT count(*) FROM jobs WHERE status = 'completed'").fetchone()[0])

        report = folder / "steps.json"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        rate, _ = watch([sys.executable, __file__, "--serve", str(report)], env, folder / "service.log", completed, options.jobs)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        counted = json.loads(report.read_text())
    cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / options.jobs * 1e6
    steps = collections.Counter(counted["steps"])
    n = options.jobs
    print(f"{n:,} jobs, WORKER_CONCURRENCY={options.concurrency}, --processes 1: {rate:,.0f} jobs/s, "
          f"{cpu:.0f} µs CPU per job (start and stop included)")
    print(f"trio task steps per job: {sum(steps.values()) / n:.2f}; jobs per Ledger batch: {n / max(counted['batches'], 1):.1f}")
    for name, count in steps.most_common(6):
        print(f"  {count / n:6.3f}  {name}")


if __name__ == "__main__":
    main()
