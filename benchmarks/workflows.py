"""What workflows cost: `python benchmarks/workflows.py [--backend sqlite|postgres|redis] [--jobs 10000] [--rounds 3]`.

Four loads of ``--jobs`` no-op jobs, each on a fresh store, drained by the service as a user
starts it (``python -m pipeline``, as benchmarks/service.py starts it: the default worker processes,
one per core, WORKER_CONCURRENCY=32, default logging, a line per job, to a file), with an app of one
no-op type (``--app flows_app:registry``, written to the run's folder):

* plain: ``--jobs`` jobs, no graph (``enqueue_many``);
* fan-in: one batch of ``--jobs`` jobs with a callback (``enqueue_batch(jobs, then=...)``), which
  runs once the last of them has ended: done when the callback is;
* serial: ``--jobs`` plain jobs run one at a time (the service with WORKER_PROCESSES=1 and
  WORKER_CONCURRENCY=1): each job its own claim and commit, as a chain's jobs are, which a plain
  drain shares among the workers of a batch: the chain's other baseline;
* chain: ``--jobs`` jobs in one chain (``enqueue_many([pipeline.chain(...)])``), each waiting for the
  one before: serial by nature, so its time per job is the latency of a link (the parent's outcome
  committed, the child woken, claimed and run). It is drained by the same service as the others
  (not in-process): what a user's chain costs, and the one CPU comparison with plain jobs.

The jobs are enqueued before the service starts, by this process (a pipeline that runs no jobs, one
call each, timed: wall and CPU µs per job). The drain is timed from the first job seen done to the
last (the store read from outside every 20 ms), and the CPU of the service's process tree (user +
system from /proc, the service and its worker processes) over the same window, per job; the whole
tree's CPU, start and stop included (getrusage of the waited children), is printed too. The no-op
handler notes its start and end times in memory and writes them at exit, in every load alike: the
chain's latency from a parent's end to its child's start (and that each started after its parent's
end), and the callback's from the last job's end, are read from them. The four loads alternate
within each round (their order turns), ``--rounds`` rounds, medians. The store server's own CPU (Postgres, Redis) is not counted: only the tree's.

Issue 24's bound: a job of a fan-in or a chain costs at most 2× a plain job (CPU per job). The
chain's jobs cannot share commits (each waits for the one before), so it is also set against the
serial load.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio

import pipeline

sys.path.insert(0, str(Path(__file__).parent))

from stores import BACKENDS, Stores, open_stores  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LOADS = ("plain", "fan-in", "chain", "serial")
SERIAL = {"WORKER_PROCESSES": "1", "WORKER_CONCURRENCY": "1"}  # the serial load's service: one job at a time
APP = '''
import atexit
import os
import time

import attrs

import pipeline

registry = pipeline.Registry()
TIMES = []  # (id, start, end) of every run here, written at exit


@attrs.frozen
class Noop:
    n: int


async def noop(job: Noop, ctx: pipeline.JobContext) -> None:
    start = time.time()
    TIMES.append((ctx.id, start, time.time()))


registry.register("noop", Noop, noop)


@atexit.register
def write_times() -> None:
    folder = os.environ.get("FLOWS_TIMES")
    if folder and TIMES:
        with open(os.path.join(folder, f"{os.getpid()}.txt"), "w") as f:
            f.writelines(f"{i} {s:.6f} {e:.6f}\\n" for i, s, e in TIMES)
'''


def tree_cpu(root: int) -> float:
    """CPU seconds (user + system) of ``root`` and its descendants now, from /proc."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        cpu[pid] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo += [child for child, parent in parents.items() if parent == pid]
    return total


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def enqueue(load: str, url: str, stores: Stores, jobs: int, folder: Path) -> tuple[list[str], str | None, float, float]:
    """The load's jobs, committed: (their ids in order, the callback's id, wall s, CPU s of this process)."""
    sys.path.insert(0, str(folder))
    try:
        import flows_app  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(folder))
    config = pipeline.Config.from_env({**stores.settings, "DATABASE_URL": url, "WORKER_ENABLED": "false",
                                       "ADMIN_ENABLED": "false", "LOG_LEVEL": "warning"}, env_file=None)
    job = flows_app.Noop

    async def main() -> tuple[list[str], str | None, float, float]:
        async with pipeline.open_pipeline(config, flows_app.registry) as p:
            wall, cpu = time.perf_counter(), time.process_time()
            callback = None
            if load in ("plain", "serial"):
                ids = await p.enqueue_many([job(i) for i in range(jobs)])
            elif load == "chain":
                ids = await p.enqueue_many([pipeline.chain(*(job(i) for i in range(jobs)))])
            else:
                batch = await p.enqueue_batch([job(i) for i in range(jobs)], then=job(-1))
                ids, callback = list(batch.job_ids), batch.callback_id
            return ids, callback, time.perf_counter() - wall, time.process_time() - cpu

    return trio.run(main)


def drain(args: list[str], env: dict[str, str], log: Path, done: Callable[[], int], jobs: int,
          timeout: float) -> dict[str, float]:
    """Start the service; wait until ``done()`` reaches ``jobs``. The window from the first job seen done
    to the last: its seconds, jobs and the tree's CPU; and the whole tree's CPU, start and stop included."""
    before = children_cpu()
    with log.open("w") as out:
        process = subprocess.Popen(args, env=env, cwd=log.parent, stdout=out, stderr=out)
        try:
            first: tuple[float, int, float] | None = None
            deadline = time.perf_counter() + timeout
            while True:
                n = done()
                now = time.perf_counter()
                if n and first is None:
                    first = (now, n, tree_cpu(process.pid))
                if n >= jobs:
                    cpu = tree_cpu(process.pid)
                    break
                if process.poll() is not None:
                    raise RuntimeError(f"the service exited with {process.returncode}: see {log}")
                if now > deadline:
                    raise RuntimeError(f"{n} of {jobs} jobs done after {timeout:.0f} s: see {log}")
                time.sleep(0.02)
        finally:
            process.terminate()
            process.wait(60)
    assert first is not None
    return {"seconds": now - first[0], "jobs": jobs - first[1], "cpu": cpu - first[2], "total": jobs,
            "tree_cpu": children_cpu() - before}


def read_times(folder: Path) -> dict[str, tuple[float, float]]:
    times: dict[str, tuple[float, float]] = {}
    for path in folder.glob("*.txt"):
        for line in path.read_text().splitlines():
            job_id, start, end = line.split()
            times[job_id] = (float(start), float(end))
    return times


def one_load(load: str, stores: Stores, folder: Path, jobs: int, concurrency: int, timeout: float,
             processes: int | None = None) -> dict[str, float]:
    url = stores.fresh("flows")
    try:
        stores.migrate(url)
        ids, callback, enqueue_wall, enqueue_cpu = enqueue(load, url, stores, jobs, folder)
        times_dir = folder / f"times-{load}"
        times_dir.mkdir()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("ADMIN_", "WORKER_", "LOG_", "DATABASE_", "SQLITE_", "REDIS_", "PIPELINE_"))}
        env.update(stores.settings, DATABASE_URL=url, ADMIN_PORT="0", WORKER_CONCURRENCY=str(concurrency),
                   PYTHONPATH=os.pathsep.join([str(folder), str(ROOT)]), FLOWS_TIMES=str(times_dir))
        if processes is not None:
            env["WORKER_PROCESSES"] = str(processes)
        if load == "serial":
            env.update(SERIAL)
        total = jobs + (callback is not None)
        figures = drain([sys.executable, "-m", "pipeline", "--app", "flows_app:registry"], env, folder / f"{load}.log",
                        lambda: stores.completed(url), total, timeout)
        figures.update(enqueue_us=enqueue_wall / total * 1e6, enqueue_cpu_us=enqueue_cpu / total * 1e6)
        times = read_times(times_dir)
        if load == "chain":
            gaps = sorted(times[child][0] - times[parent][1] for parent, child in zip(ids, ids[1:])
                          if parent in times and child in times)
            figures["chain_out_of_order"] = sum(gap <= 0 for gap in gaps) + len(ids) - 1 - len(gaps)
            if gaps:
                figures.update(link_p50_ms=statistics.median(gaps) * 1000, link_p99_ms=gaps[int(len(gaps) * 0.99)] * 1000)
        if callback is not None and callback in times and all(i in times for i in ids):
            figures["callback_after_ms"] = (times[callback][0] - max(times[i][1] for i in ids)) * 1000
        return figures
    finally:
        stores.drop(url)


def per_job(f: dict[str, float]) -> tuple[float, float, float]:
    """(wall µs, CPU µs over the window, whole tree's CPU µs) per job."""
    return f["seconds"] / f["jobs"] * 1e6, f["cpu"] / f["jobs"] * 1e6, f["tree_cpu"] / f["total"] * 1e6


def describe(load: str, f: dict[str, float], plain_cpu: float | None = None) -> str:
    wall, cpu, tree = per_job(f)
    text = (f"{load:6}: {f['jobs'] / f['seconds']:8,.0f} jobs/s ({wall:7.1f} µs per job), {cpu:6.1f} µs CPU per job "
            f"(the tree, first to last job; {tree:6.1f} with start and stop); enqueue {f['enqueue_us']:5.1f} µs per job "
            f"({f['enqueue_cpu_us']:5.1f} µs CPU)")
    if "link_p50_ms" in f:
        text += f"; parent's end to child's start p50 {f['link_p50_ms']:.2f} ms, p99 {f['link_p99_ms']:.2f} ms"
    if f.get("chain_out_of_order"):
        text += f"; {f['chain_out_of_order']:.0f} jobs of the chain did NOT start after their parent's end"
    if "callback_after_ms" in f:
        text += f"; callback started {f['callback_after_ms']:.1f} ms after the last job's end"
    if plain_cpu:
        text += f"; {cpu / plain_cpu:.2f}× plain's CPU per job"
    return text


def medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    keys = set.intersection(*(set(r) for r in rounds))
    out = {key: statistics.median(r[key] for r in rounds) for key in keys}
    # per-job figures as medians of the rounds' own ratios
    for name, index in (("wall_us", 0), ("cpu_us", 1), ("tree_us", 2)):
        out[name] = statistics.median(per_job(r)[index] for r in rounds)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=BACKENDS, default="sqlite")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32, help="WORKER_CONCURRENCY (default 32, as service.py)")
    parser.add_argument("--processes", type=int, help="WORKER_PROCESSES of the plain, fan-in and chain loads "
                        "(default: the service's, one per core)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a drain may take before the run fails")
    options = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {load: [] for load in LOADS}
    with tempfile.TemporaryDirectory() as tmp:
        stores = open_stores(options.backend, Path(tmp))
        try:
            for i in range(options.rounds):
                order = LOADS[i % len(LOADS):] + LOADS[:i % len(LOADS)]
                for load in order:
                    with tempfile.TemporaryDirectory(dir=tmp) as work:
                        (Path(work) / "flows_app.py").write_text(APP)
                        sys.modules.pop("flows_app", None)
                        figures = one_load(load, stores, Path(work), options.jobs, options.concurrency, options.timeout,
                                           options.processes)
                    results[load].append(figures)
                    print(f"round {i + 1} {describe(load, figures)}", flush=True)
        finally:
            stores.close()
    summary = {load: medians(rounds) for load, rounds in results.items()}
    plain = summary["plain"]["cpu_us"]
    print(f"backend {options.backend}, {options.jobs:,} jobs a load, medians of {options.rounds} rounds:")
    for load in LOADS:
        s = summary[load]
        line = (f"{load:6}: {s['wall_us']:7.1f} µs per job ({1e6 / s['wall_us']:,.0f} jobs/s), {s['cpu_us']:6.1f} µs CPU "
                f"per job ({s['tree_us']:6.1f} with start and stop), enqueue {s['enqueue_us']:.1f} µs per job "
                f"({s['enqueue_cpu_us']:.1f} CPU)")
        if load != "plain":
            ratio = s["cpu_us"] / plain
            line += f": {ratio:.2f}× plain's CPU per job ({'within' if ratio <= 2 else 'OVER'} the 2× bound)"
        if load == "chain":
            line += f", {s['cpu_us'] / summary['serial']['cpu_us']:.2f}× serial's"
        if "link_p50_ms" in s:
            line += f"; parent's end to child's start p50 {s['link_p50_ms']:.2f} ms, p99 {s['link_p99_ms']:.2f} ms"
        if "callback_after_ms" in s:
            line += f"; callback {s['callback_after_ms']:.1f} ms after the last job's end"
        print(line)


if __name__ == "__main__":
    main()
