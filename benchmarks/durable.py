"""What durable functions cost: `python benchmarks/durable.py [--backend sqlite|postgres|redis] [--jobs 5000] [--rounds 3]`.

Issue 35's figures (docs/durable.md, docs/performance.md#durable-functions):

* **Steps.** CPU per job of a job of ten no-op steps (``await ctx.step(f"s{i}", nothing)``) against a
  job of one: a step is one write riding the Ledger's batches, so the ten-step job should cost at
  most 3× the one-step job.
* **A resume.** CPU per job of a job that does ``await ctx.sleep(0)`` once (it is suspended, woken,
  claimed again and run again from the top, where the sleep is found done) against a plain no-op job:
  at most 2×.

Each load is ``--jobs`` jobs of one type on a fresh store, loaded with ``python -m pipeline --app
durable_app:registry enqueue --from-file`` and drained by ``python -m pipeline --app
durable_app:registry`` as a user starts it (as benchmarks/service.py starts it: one worker process per
core unless ``--processes``, WORKER_CONCURRENCY=32, default logging, a line per job to a file). The CPU
is service.py's ``--cpu`` figure: the whole process tree's (the service and the worker processes it
waits for: getrusage of the waited-for children) from start to stop, less the same start and stop on
an empty store kept up as long, per job; on Postgres and Redis the server's CPU over the same runs is
printed besides (Postgres: every process of the server on this machine, so other work on it shows).
The four loads alternate within each round (their order turns), ``--rounds`` rounds, medians; the
ratios are the medians' and, in brackets, the range of the rounds' own.

* **Suspended jobs** (``--suspended 100000``; 0 to leave out). That many jobs that wait for a signal
  with no timeout (``await ctx.wait_for("never")``), loaded as above and run by ``python -m pipeline
  --processes 1`` until the store counts them all suspended. Then, with nothing to do but wait: the
  worker process's CPU from /proc over ``--idle-seconds`` (after ``--settle`` seconds) and its RSS; the
  same for a process that ran as many plain jobs (the control: the same work, nothing left waiting), for
  a fresh ``--processes 1`` on the store holding them (what a restart holds), and for one on an empty
  store (an idle service today). Targets: no more idle CPU than with none; at most 50 MB per process.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import service  # noqa: E402
from idle_cpu import cpu_seconds  # noqa: E402
from service import LAST_TREE, watch  # noqa: E402
from stores import BACKENDS, Stores, open_stores  # noqa: E402

APP = '''
import dataclasses

import pipeline

registry = pipeline.Registry()


@dataclasses.dataclass
class Plain:
    n: int = 0


@dataclasses.dataclass
class OneStep:
    n: int = 0


@dataclasses.dataclass
class TenSteps:
    n: int = 0


@dataclasses.dataclass
class Resume:
    n: int = 0


@dataclasses.dataclass
class Waiting:
    n: int = 0


def nothing() -> None:
    return None


@registry.job
async def plain(job: Plain, ctx: pipeline.JobContext) -> None:
    return None


@registry.job
async def one_step(job: OneStep, ctx: pipeline.JobContext) -> None:
    await ctx.step("s0", nothing)


@registry.job
async def ten_steps(job: TenSteps, ctx: pipeline.JobContext) -> None:
    for i in range(10):
        await ctx.step(f"s{i}", nothing)


@registry.job
async def resume(job: Resume, ctx: pipeline.JobContext) -> None:
    await ctx.sleep(0)


@registry.job
async def waiting(job: Waiting, ctx: pipeline.JobContext) -> None:
    await ctx.wait_for("never")
'''
LOADS = ("plain", "resume", "one_step", "ten_steps")  # (each is its job type's name)
TARGETS = (("ten_steps", "one_step", 3.0), ("resume", "plain", 2.0))  # (load, against, at most × its CPU per job)
MB = 1024 * 1024


def app_env(stores: Stores, url: str, concurrency: int, folder: Path) -> dict[str, str]:
    env = service.settings(stores, url, concurrency)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))
    return env


def app_command(folder: Path) -> list[str]:
    (folder / "durable_app.py").write_text(APP)
    return [sys.executable, "-m", "pipeline", "--app", "durable_app:registry"]


def enqueue(app: list[str], env: dict[str, str], folder: Path, job_type: str, jobs: int) -> None:
    lines = folder / f"{job_type}.jsonl"
    lines.write_text(f'{{"job_type": "{job_type}", "payload": {{}}}}\n' * jobs)
    subprocess.run([*app, "enqueue", "--from-file", str(lines)], env=env, cwd=folder, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def drain(stores: Stores, folder: Path, load: str, jobs: int, concurrency: int, processes: int | None) -> dict[str, float]:
    """One load on a fresh store: its rate, and the CPU µs per job of the service's tree (and of the
    store's server, where it can be read), less an empty store's start and stop kept up as long."""
    app = app_command(folder)
    run = [*app] + (["--processes", str(processes)] if processes else [])
    url = stores.fresh("durable")
    try:
        env = app_env(stores, url, concurrency, folder)
        enqueue(app, env, folder, load, jobs)
        rate, _ = watch(run, env, folder / f"{load}.log", lambda: stores.completed(url), jobs)
        full, full_server = LAST_TREE["cpu"], LAST_TREE.get("server")
    finally:
        stores.drop(url)
    url = stores.fresh("durable")
    try:
        watch(run, app_env(stores, url, concurrency, folder), folder / f"{load}-empty.log", lambda: 0, 0)
    finally:
        stores.drop(url)
    figures = {"rate": rate, "cpu": (full - LAST_TREE["cpu"]) / jobs * 1e6}
    if full_server is not None and "server" in LAST_TREE:
        figures["server"] = (full_server - LAST_TREE["server"]) / jobs * 1e6
    return figures


def profile(stores: Stores, folder: Path, load: str, jobs: int, concurrency: int, top: int) -> list[tuple[str, float]]:
    """One more drain of ``load`` with ``--processes 1`` under py-spy (service.py's profiler, from the first
    job done to the last): the ``top`` functions by the share of the samples they are on the stack of
    (inclusive), of the pipeline's own code and the store's client, waits left out (service.WAITS)."""
    app = app_command(folder)
    raw = folder / "samples.txt"
    url = stores.fresh("durable")
    try:
        env = app_env(stores, url, concurrency, folder)
        enqueue(app, env, folder, load, jobs)
        watch([*app, "--processes", "1"], env, folder / f"{load}-profiled.log", lambda: stores.completed(url), jobs,
              service.profiler(raw))
    finally:
        stores.drop(url)
    counts: dict[str, int] = {}
    total = 0
    for text in raw.read_text().splitlines():
        stack, _, n = text.rpartition(" ")
        frames = stack.split(";")[1:]
        if not frames or frames[-1].startswith(service.WAITS):
            continue
        total += int(n)
        for frame in set(frames):
            if "pipeline/" in frame or "sqlite3" in frame or "psycopg" in frame or "redis/" in frame:
                counts[frame] = counts.get(frame, 0) + int(n)
    ranked = sorted(counts.items(), key=lambda item: -item[1])[:top]
    return [(frame, n / total) for frame, n in ranked]


# -- suspended jobs -----------------------------------------------------------------------------------


def rss_bytes(pid: int) -> int:
    for text in Path(f"/proc/{pid}/status").read_text().splitlines():
        if text.startswith("VmRSS:"):
            return int(text.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def idle(pid: int, settle: float, seconds: float) -> tuple[float, int]:
    """(share of a core, RSS in bytes) of a running process with nothing to do: its CPU from /proc over
    ``seconds``, after ``settle`` seconds; its RSS at the end."""
    time.sleep(settle)
    before = cpu_seconds(pid)
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / seconds, rss_bytes(pid)


def serving(app: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*app, "--processes", "1"], env=env, cwd=log.parent, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait(60)


def suspended(stores: Stores, folder: Path, count: int, concurrency: int, settle: float, seconds: float) -> dict[str, float]:
    """``count`` jobs suspended in a wait without a timeout: the idle CPU and RSS of the process that
    suspended them; of one that ran as many plain jobs (the same work, nothing left waiting: what the
    first one holds because of the jobs it suspended, and not of the jobs it ran, is the difference); of
    a fresh one on the store holding them; and of one on an empty store."""
    app = app_command(folder)
    figures: dict[str, float] = {}
    url = stores.fresh("suspended")
    try:
        env = app_env(stores, url, concurrency, folder)
        started = time.perf_counter()
        enqueue(app, env, folder, "waiting", count)
        figures["enqueue_s"] = time.perf_counter() - started
        process = serving(app, env, folder / "suspending.log")
        try:
            started = time.perf_counter()
            while stores.counts(url).get("suspended", 0) < count:
                if process.poll() is not None:
                    raise RuntimeError(f"the service exited with {process.returncode}: see {folder / 'suspending.log'}")
                time.sleep(0.5)
            figures["suspend_s"] = time.perf_counter() - started
            figures["after_cpu"], figures["after_rss"] = idle(process.pid, settle, seconds)
        finally:
            stop(process)
        process = serving(app, env, folder / "restarted.log")
        try:
            figures["fresh_cpu"], figures["fresh_rss"] = idle(process.pid, settle + 3, seconds)  # (+ its start-up)
        finally:
            stop(process)
        figures["left_suspended"] = stores.counts(url).get("suspended", 0)
    finally:
        stores.drop(url)
    url = stores.fresh("suspended")  # the control: as many plain jobs run by one process, none left waiting
    try:
        env = app_env(stores, url, concurrency, folder)
        enqueue(app, env, folder, "plain", count)
        process = serving(app, env, folder / "plain.log")
        try:
            while stores.completed(url) < count:
                if process.poll() is not None:
                    raise RuntimeError(f"the service exited with {process.returncode}: see {folder / 'plain.log'}")
                time.sleep(0.5)
            figures["plain_cpu"], figures["plain_rss"] = idle(process.pid, settle, seconds)
        finally:
            stop(process)
    finally:
        stores.drop(url)
    url = stores.fresh("suspended")
    try:
        process = serving(app, app_env(stores, url, concurrency, folder), folder / "empty.log")
        try:
            figures["empty_cpu"], figures["empty_rss"] = idle(process.pid, settle + 3, seconds)
        finally:
            stop(process)
    finally:
        stores.drop(url)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=BACKENDS, default="sqlite")
    parser.add_argument("--jobs", type=int, default=5_000, help="jobs of each load (default 5,000)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32, help="WORKER_CONCURRENCY (default 32, as service.py)")
    parser.add_argument("--processes", type=int, help="worker processes of the loads (default: the service's, one per core)")
    parser.add_argument("--suspended", type=int, default=100_000, help="jobs suspended for the idle figures (0: none)")
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="seconds of idle CPU measured (default 10)")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds before the idle measure (default 3)")
    parser.add_argument("--no-loads", action="store_true", help="only the suspended jobs' figures")
    parser.add_argument("--profile", choices=LOADS, help="then one more drain of this load with --processes 1 under "
                        "py-spy: the functions most often on the stack (pip install py-spy)")
    options = parser.parse_args()
    # this process opens the store to count its jobs many times: not a line each time (Redis's warning that
    # the shared server keeps nothing on disk, which the run allows)
    logging.getLogger("pipeline").setLevel(logging.ERROR)
    results: dict[str, list[dict[str, float]]] = {load: [] for load in LOADS}
    with tempfile.TemporaryDirectory() as tmp:
        stores = open_stores(options.backend, Path(tmp))
        service.SERVER_CPU = stores.server_cpu
        try:
            for i in range(0 if options.no_loads else options.rounds):
                for load in LOADS[i % len(LOADS):] + LOADS[:i % len(LOADS)]:
                    with tempfile.TemporaryDirectory(dir=tmp) as work:
                        figures = drain(stores, Path(work), load, options.jobs, options.concurrency, options.processes)
                    results[load].append(figures)
                    server = f" (the server's besides: {figures['server']:.0f} µs)" if "server" in figures else ""
                    print(f"round {i + 1} {load:9}: {figures['rate']:7,.0f} jobs/s, {figures['cpu']:6.0f} µs CPU per job{server}",
                          flush=True)
            hot: list[tuple[str, float]] = []
            if options.profile:
                with tempfile.TemporaryDirectory(dir=tmp) as work:
                    hot = profile(stores, Path(work), options.profile, options.jobs, options.concurrency, 40)
            held = None
            if options.suspended:
                with tempfile.TemporaryDirectory(dir=tmp) as work:
                    held = suspended(stores, Path(work), options.suspended, options.concurrency, options.settle,
                                     options.idle_seconds)
        finally:
            stores.close()
    processes = f"--processes {options.processes}" if options.processes else f"one worker process per core ({os.cpu_count()})"
    if not options.no_loads:
        print(f"backend {options.backend}, {options.jobs:,} jobs a load, {processes}, WORKER_CONCURRENCY={options.concurrency}, "
              f"medians of {options.rounds} rounds (CPU per job of the whole tree, less an empty start and stop):")
        cpu = {load: statistics.median(r["cpu"] for r in rounds) for load, rounds in results.items()}
        print("| load | jobs/s | CPU per job | the server's besides |")
        print("|---|---|---|---|")
        for load, rounds in results.items():
            servers = [r["server"] for r in rounds if "server" in r]
            server = f"{statistics.median(servers):.0f} µs" if servers else "(none)"
            print(f"| {load} | {statistics.median(r['rate'] for r in rounds):,.0f} | {cpu[load]:.0f} µs "
                  f"({min(r['cpu'] for r in rounds):.0f} to {max(r['cpu'] for r in rounds):.0f}) | {server} |")
        for load, against, bound in TARGETS:
            ratios = [a["cpu"] / b["cpu"] for a, b in zip(results[load], results[against]) if b["cpu"] > 0]
            ratio = cpu[load] / cpu[against] if cpu[against] > 0 else float("inf")
            spread = f" (rounds {min(ratios):.2f} to {max(ratios):.2f})" if ratios else ""
            verdict = "within" if ratio <= bound else f"OVER by {ratio / bound - 1:.0%}"
            print(f"{load} / {against}: {ratio:.2f}× CPU per job{spread}: {verdict} the {bound:g}× target")
    if hot:
        print(f"{options.profile}, --processes 1: the functions most often on the stack (share of py-spy's samples of "
              f"the process's threads, waits left out):")
        for frame, share in hot:
            print(f"  {share:6.1%}  {frame}")
    if held is not None:
        print(f"{options.suspended:,} jobs suspended in a wait without a timeout ({options.backend}; enqueued in "
              f"{held['enqueue_s']:.1f} s, all suspended {held['suspend_s']:.1f} s after the service started; "
              f"{held['left_suspended']:,.0f} still suspended at the end), --processes 1, idle CPU over "
              f"{options.idle_seconds:g} s and RSS of the worker process:")
        print("| the worker process | idle CPU | RSS |")
        print("|---|---|---|")
        for name, key in (("the one that suspended them, once all were", "after"),
                          (f"one that ran {options.suspended:,} plain jobs, once done (none left waiting)", "plain"),
                          ("a fresh one on the store holding them", "fresh"), ("a fresh one on an empty store", "empty")):
            print(f"| {name} | {held[key + '_cpu']:.2%} of a core | {held[key + '_rss'] / MB:.1f} MB |")


if __name__ == "__main__":
    main()
