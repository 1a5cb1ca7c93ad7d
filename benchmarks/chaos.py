"""Chaos on one job store: kill -9 workers at random while a producer enqueues, then check the books.

    python benchmarks/chaos.py [--backend sqlite|postgres|redis] [--jobs 20000] [--workers 3] [--duration 60] [--kill-every 2]
                               [--runtime trio|asyncio|uvloop]

The store is a fresh one made for the run and removed after it (benchmarks/stores.py): a
SQLite file, a Postgres database (CREATE/DROP DATABASE on ``--postgres-url``), or a Redis key
prefix (on ``--redis-url``, with REDIS_ALLOW_NON_DURABLE=true: the shared server keeps nothing
on disk); every process gets its DATABASE_URL.

One producer enqueues the jobs (in small committed batches, spread over the run) while
``--workers`` worker processes run them. Every ``--kill-every`` seconds a random worker
gets SIGKILL and is started again. Each job's handler appends ``start``/``end`` lines with
its id, attempt and pid to a side file (O_APPEND), and each worker appends a ``settled``
line once the run's outcome is committed (an outcome observer). At the end every job must
be completed (none lost, none stuck running, none dead), and every duplicate execution must
be explained by a kill that came while the repeated run was in flight: its worker was
killed after the run started, before its outcome was committed (the handler's ``end``
line is not the end: a kill between it and the commit repeats the job too), and before
the job's next run started. Prints a one-line summary; exit 0 when the books balance, 1
when they do not.

``--runtime asyncio`` (or ``uvloop``) runs the same handlers as asyncio handlers
(``Registry(runtime="asyncio")``, docs/jobs.md): each worker process's trio run is the guest of
an asyncio loop (asyncio's own, or uvloop's: WORKER_ASYNCIO_LOOP), the handlers sleep with
``asyncio.sleep`` and append their side-file lines through ``asyncio.to_thread``; the books are
the same. The default, ``trio``, runs them as trio handlers.

    python benchmarks/chaos.py --workflows [--backend B] [--fan-out 1000] [--chains 100] [--duration 30] [--kill-every 2]

Workflows (docs/workflows.md) under the same kills: a producer (a pipeline that runs no jobs)
enqueues one batch of ``--fan-out`` jobs with a callback (``enqueue_batch(jobs, then=...)``) at
the start, and ``--chains`` three-step chains spread over the run (``enqueue_many(pipeline.chain(a,
b, c))``, and every other one ``enqueue_many([pipeline.chain(a, b, c)])``). The batch's jobs sleep
long enough to spread over about a third of the run; the callback reads its batch
(``ctx.batch()``) and each chain step after the first its parent's result
(``ctx.parent_results()``), both noted in the side file; the callback's first run is killed on
purpose (the driver watches the side file for its start), so that its repeat is always
exercised. The books, from the side file and the stored records: the plain books above for every
job; every chain in order (a step's first start after the end of the run of its parent that
completed it: the last run of the parent's that reached its handler's end, whose attempt must be
the one the store recorded), each stored with its one parent, every run of a step having read its
parent's result; the callback stored waiting for every member, its first start after the last
member's completing run ended, every run of it having read a batch whose every member was final
(completed), its repeats all explained by kills; the batch's record all completed; nothing left
waiting, pending or running; and, watched every half second during the run, no job seen waiting
after every parent of it was seen final (a parent's end wakes or cancels its children in its own
transaction or script: the repair sweep, once a minute, must find nothing to do).

    python benchmarks/chaos.py --durable [--backend B] [--flows 300] [--duration 30] [--kill-every 2] [--runtime R]

Durable functions (docs/durable.md) under the same kills: a producer enqueues ``--flows`` flows spread
over the first 80% of the run, each a job that runs step "a", a durable sleep (0.05 to 0.5 s), step
"b", (every third one) a wait for a signal no one sends with a 0.2 s timeout (SignalTimeout), a wait
for the signal "go" (no timeout), and step "c"; every fifth one is a plain ``def`` handler (the same
calls from its thread). The driver sends each flow's "go" once, with a key: half right after the
enqueue (before the job can reach its wait: answered "kept"), half once the store lists the job
suspended awaiting "go" (answered "woken"); alternately through a ``pipeline.Client`` and the store's
own ``Backend.signal``. Each step's function appends a line (job, step, pid, a token it draws) before
it returns its value, then lingers a little, so that kills land before and after that line; the
handler notes the value each ``ctx.step`` gave it. The books (``check_durable``): every flow
completed, nothing left suspended, running or pending; its stored steps as the handler makes them;
each step's stored value one its function drew, no line of that step after it (a committed step never
ran again), every earlier run of it repeated because its process was killed after its line and
before the step's next run began (between its line and its commit); every value the handler got is
the stored one; step "b" after the sleep's end, step "c" after the signal was sent, the wait's value
the signal's payload, the result the stored values; the answers as above.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import trio

import pipeline
from pipeline.backends import Backend, open_backend
from pipeline.backends.base import BatchRecord
from pipeline.clock import to_epoch
from pipeline.durable import encode_signal_payload
from pipeline.engine import asyncio_host
from pipeline.requests import JobRequest, prepare_rows

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stores import BACKENDS, POSTGRES_URL, REDIS_URL, open_stores  # noqa: E402

LEASE_SECONDS = 2.0
MAX_ATTEMPTS = 10  # a job can be hit by several kills in a row; dead would be correct, just not what we test


FINAL = ("completed", "dead", "cancelled")
MEMBER_CONCURRENCY = 16  # per worker process, for the batch's jobs
CALLBACK_SECONDS = 0.5  # the callback's run
# its first run, which the driver kills as soon as the side file says it started: long enough that the kill
# lands in it on a loaded machine (with 0.5 s it once came after the run had ended: one run, no repeat)
CALLBACK_FIRST_SECONDS = 5.0


@attrs.frozen
class Chaos:
    n: int


@attrs.frozen
class Member:
    """One job of the batch (the fan-out)."""

    n: int


@attrs.frozen
class Step:
    """Step ``step`` (1, 2, 3) of chain ``chain``."""

    chain: int
    step: int


@attrs.frozen
class FanIn:
    """The batch's callback."""

    size: int


@attrs.frozen
class Flow:
    """A durable job of the --durable run (docs/durable.md): steps "a" and "b" around a durable sleep of
    ``sleep`` seconds, a wait for the signal "go" (no timeout), then step "c"; ``timeout_wait``: also a wait
    for "never" (no one sends it) with a short timeout, before "go", which ends in SignalTimeout."""

    n: int
    sleep: float
    timeout_wait: bool


@attrs.frozen
class SyncFlow:
    """The same flow in a plain ``def`` handler: ctx.step, ctx.sleep, ctx.wait_for as plain calls from its thread."""

    n: int
    sleep: float
    timeout_wait: bool


FLOW_STEPS = ("a", "b", "c")  # the user's steps of a flow, in order
NEVER_TIMEOUT = 0.2  # seconds a flow's wait for "never" lasts


RUNTIMES = ("trio", "asyncio", "uvloop")  # --runtime: the handlers' (uvloop: asyncio handlers on uvloop's loop)


def append(line: str) -> None:
    """One short O_APPEND line of the side file."""
    with open(os.environ["CHAOS_LOG"], "a") as f:
        f.write(line + "\n")


def line(ctx: pipeline.JobContext, kind: str, *figures: int | str) -> str:
    """A side file's line: kind, id, attempt, pid, time, then any figures (--durable: a step's name and token)."""
    return " ".join([kind, ctx.id, str(ctx.attempt), str(os.getpid()), f"{time.time():.6f}", *map(str, figures)])


def registry(runtime: str = "trio") -> pipeline.Registry:
    """The chaos run's job types, their handlers on ``runtime``: trio handlers (trio.sleep, the side
    file written in place), or asyncio handlers (asyncio.sleep, the side file written through
    asyncio.to_thread: the loop's executor, its end reported back to the loop from another thread)."""
    on_trio = runtime == "trio"

    sleep: Callable[[float], Awaitable[Any]] = trio.sleep if on_trio else asyncio.sleep

    async def note(ctx: pipeline.JobContext, kind: str, *figures: int | str) -> None:
        text = line(ctx, kind, *figures)  # the time it is noted, not when a thread gets to write it
        if on_trio:
            append(text)  # one short O_APPEND line, on purpose synchronous
        else:
            await asyncio.to_thread(append, text)

    async def run(job: Chaos, ctx: pipeline.JobContext) -> None:
        await note(ctx, "start")
        await sleep(random.uniform(0.01, 0.1))  # long enough that kills catch jobs mid-run
        await note(ctx, "end")

    async def member(job: Member, ctx: pipeline.JobContext) -> Any:  # a result (Registry's Handler type says None)
        await note(ctx, "start")
        await sleep(random.uniform(0.5, 1.5) * float(os.environ.get("CHAOS_MEMBER_SLEEP", "0.05")))
        await note(ctx, "end")
        return {"n": job.n}

    async def step(job: Step, ctx: pipeline.JobContext) -> Any:  # as above
        await note(ctx, "start")
        if job.step > 1:  # its parent's result is its parent's id: read, and counted right
            parents = await ctx.parent_results()
            await note(ctx, "parents", sum(isinstance(r, dict) and r.get("id") == p for p, r in parents.items()), len(parents))
        await sleep(random.uniform(0.01, 0.1))
        await note(ctx, "end")
        return {"id": ctx.id, "step": job.step}

    async def fan_in(job: FanIn, ctx: pipeline.JobContext) -> None:
        await note(ctx, "start")
        outcome = await ctx.batch()  # the counts; the jobs with their results a page at a time
        jobs = [j async for j in outcome.members()]
        await note(ctx, "batch", len(jobs), sum(j.status in FINAL for j in jobs), sum(j.status == "completed" for j in jobs))
        await sleep(CALLBACK_FIRST_SECONDS if ctx.attempt == 1 else CALLBACK_SECONDS)
        await note(ctx, "end")

    # --durable: a step's function writes its line (with a token no other run can draw) before it returns
    # its value, then lingers, so that kills land inside steps, before and after their line (a kill after
    # the line and before the commit is the one case where a step may run again); "got" is the value
    # ctx.step gave the handler, its own or the one stored by an earlier run
    async def work(ctx: pipeline.JobContext, name: str) -> Any:
        await sleep(random.uniform(0.005, 0.04))
        token = uuid.uuid4().hex[:16]
        await note(ctx, "step", name, token)
        await sleep(random.uniform(0.0, 0.03))
        return {"token": token}

    def work_sync(ctx: pipeline.JobContext, name: str) -> Any:
        time.sleep(random.uniform(0.005, 0.04))
        token = uuid.uuid4().hex[:16]
        append(line(ctx, "step", name, token))
        time.sleep(random.uniform(0.0, 0.03))
        return {"token": token}

    async def flow(job: Flow, ctx: pipeline.JobContext) -> Any:
        await note(ctx, "start")
        tokens: dict[str, Any] = {}
        tokens["a"] = (await ctx.step("a", work, ctx, "a"))["token"]
        await note(ctx, "got", "a", tokens["a"])
        await ctx.sleep(job.sleep)
        tokens["b"] = (await ctx.step("b", work, ctx, "b"))["token"]
        await note(ctx, "got", "b", tokens["b"])
        if job.timeout_wait:
            try:
                await ctx.wait_for("never", timeout=NEVER_TIMEOUT)
            except pipeline.SignalTimeout:
                tokens["timed_out"] = True
        await note(ctx, "wait")
        tokens["go"] = await ctx.wait_for("go")
        tokens["c"] = (await ctx.step("c", work, ctx, "c"))["token"]
        await note(ctx, "got", "c", tokens["c"])
        await note(ctx, "end")
        return tokens

    def sync_flow(job: SyncFlow, ctx: pipeline.JobContext) -> Any:
        append(line(ctx, "start"))
        tokens: dict[str, Any] = {}
        tokens["a"] = ctx.step("a", work_sync, ctx, "a")["token"]
        append(line(ctx, "got", "a", tokens["a"]))
        ctx.sleep(job.sleep)
        tokens["b"] = ctx.step("b", work_sync, ctx, "b")["token"]
        append(line(ctx, "got", "b", tokens["b"]))
        if job.timeout_wait:
            try:
                ctx.wait_for("never", timeout=NEVER_TIMEOUT)
            except pipeline.SignalTimeout:
                tokens["timed_out"] = True
        append(line(ctx, "wait"))
        tokens["go"] = ctx.wait_for("go")
        tokens["c"] = ctx.step("c", work_sync, ctx, "c")["token"]
        append(line(ctx, "got", "c", tokens["c"]))
        append(line(ctx, "end"))
        return tokens

    reg = pipeline.Registry(runtime="trio" if on_trio else "asyncio")
    reg.register("chaos", Chaos, run, concurrency=16, max_attempts=MAX_ATTEMPTS)
    reg.register("flow", Flow, flow, concurrency=16, max_attempts=MAX_ATTEMPTS)
    reg.register("sync_flow", SyncFlow, sync_flow, concurrency=8, max_attempts=MAX_ATTEMPTS)
    reg.register("member", Member, member, concurrency=MEMBER_CONCURRENCY, max_attempts=MAX_ATTEMPTS)
    reg.register("step", Step, step, concurrency=16, max_attempts=MAX_ATTEMPTS)
    reg.register("fan_in", FanIn, fan_in, concurrency=1, max_attempts=MAX_ATTEMPTS)
    return reg


def worker_main(url: str) -> None:
    runtime = os.environ.get("CHAOS_RUNTIME", "trio")
    config = pipeline.Config.from_env({
        **json.loads(os.environ.get("CHAOS_SETTINGS", "{}")),  # the store's own (REDIS_ALLOW_NON_DURABLE)
        "WORKER_ASYNCIO_LOOP": "uvloop" if runtime == "uvloop" else "asyncio", "DATABASE_URL": url, "WORKER_LEASE_SECONDS": str(LEASE_SECONDS), "WORKER_POLL_INTERVAL_MS": "50",
        "WORKER_BACKOFF_BASE_MS": "50", "WORKER_SHUTDOWN_TIMEOUT": "5", "SQLITE_SYNCHRONOUS": "full", "LOG_LEVEL": "error",
        "ADMIN_ENABLED": "false", "SQLITE_BUSY_TIMEOUT_MS": "500",  # below two thirds of the lease
    }, env_file=None)
    log = os.environ["CHAOS_LOG"]

    def settled(fields: dict[str, object]) -> None:
        # called once the outcome's transaction committed (or was found stale): the run is over
        with open(log, "a") as f:
            f.write(f"settled {fields['job_id']} {fields['attempt']} {os.getpid()} {time.time():.6f}\n")

    def ready(p: pipeline.Pipeline) -> None:
        p.add_observer(settled)
        print("ready", flush=True)

    serve = functools.partial(pipeline.serve, config, registry(runtime), ready=ready)
    if runtime == "trio":
        trio.run(serve)
    else:  # as python -m pipeline runs a registry with asyncio handlers: trio the guest of the process's loop
        asyncio_host.run(serve, loop=config.worker.asyncio_loop)


def start_worker(url: str, log: Path, settings: dict[str, str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--role", "worker", "--url", url],
        env={**os.environ, "CHAOS_LOG": str(log), "CHAOS_SETTINGS": json.dumps(settings), **(env or {})},
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


async def produce(backend: Backend, ids: list[str], n: int, reg: pipeline.Registry) -> None:
    """``n`` jobs in one insert, committed when it returns (the store's own insert, as a
    service's enqueue_many or the CLI writes them)."""
    rows = prepare_rows(reg, [JobRequest("chaos", {"n": len(ids) + k}, MAX_ATTEMPTS) for k in range(n)])
    await backend.insert(rows)
    ids.extend(row.id for row in rows)


async def statuses(backend: Backend) -> dict[str, str]:
    """Every job's status, through the operators' listing (newest first, page by page)."""
    found: dict[str, str] = {}
    offset = 0
    while True:
        page, total = await backend.list(limit=1000, offset=offset)
        found.update((job.id, job.status) for job in page)
        offset += len(page)
        if not page or offset >= total:
            return found


def run_chaos(jobs: int, workers: int, duration: float, kill_every: float, folder: Path, out: Any = sys.stdout,
              *, backend: str = "sqlite", postgres_url: str = POSTGRES_URL, redis_url: str = REDIS_URL,
              runtime: str = "trio") -> dict[str, int]:
    stores = open_stores(backend, folder, postgres_url=postgres_url, redis_url=redis_url)
    try:
        url = stores.fresh("chaos")
        stores.migrate(url)
        return trio.run(functools.partial(_drive, url, stores.settings, jobs, workers, duration, kill_every, folder, out,
                                          backend, runtime))
    finally:
        stores.close()


def labelled(backend: str, runtime: str) -> str:
    """The store, and the handlers' runtime unless trio's: what a summary line names."""
    return backend if runtime == "trio" else f"{backend}, asyncio handlers{' on uvloop' if runtime == 'uvloop' else ''}"


async def _drive(url: str, settings: dict[str, str], jobs: int, workers: int, duration: float, kill_every: float,
                 folder: Path, out: Any, backend: str, runtime: str) -> dict[str, int]:
    log = folder / "runs.log"
    start = functools.partial(start_worker, url, log, settings, {"CHAOS_RUNTIME": runtime})
    procs = [await trio.to_thread.run_sync(start) for _ in range(workers)]
    killed: list[tuple[int, float, float]] = []  # (pid, signal sent at, process reaped at)
    ids: list[str] = []
    reg = registry()
    rng = random.Random()
    started = time.monotonic()
    next_kill = started + kill_every
    config = pipeline.Config.from_env({**settings, "DATABASE_URL": url, "LOG_LEVEL": "error", "SQLITE_SYNCHRONOUS": "full"},
                                      env_file=None)
    try:
        async with open_backend(config) as store:
            while time.monotonic() - started < duration:
                # spread the enqueues over the first 90% of the run
                due = min(jobs, int(jobs * (time.monotonic() - started) / (duration * 0.9)) + 1)
                if len(ids) < due:
                    await produce(store, ids, due - len(ids), reg)
                if time.monotonic() >= next_kill:
                    await kill_worker(procs, rng.randrange(len(procs)), killed, start)
                    next_kill += kill_every * rng.uniform(0.5, 1.5)
                await trio.sleep(0.05)
            if len(ids) < jobs:
                await produce(store, ids, jobs - len(ids), reg)
            # no more kills: wait for leases to expire and the backlog to drain
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                counts = (await store.stats())["by_status"]
                if sum(n for status, n in counts.items() if status != "completed") == 0:
                    break
                await trio.sleep(0.2)
            found = await statuses(store)
    finally:
        await stop_workers(procs)
    return check(found, log, ids, killed, time.monotonic() - started, out, backend=labelled(backend, runtime))


async def kill_worker(procs: list[subprocess.Popen[str]], i: int, killed: list[tuple[int, float, float]],
                      start: Callable[[], subprocess.Popen[str]]) -> None:
    """SIGKILL worker ``i``, note (pid, signal sent at, process reaped at), start another in its place."""
    sent = time.time()
    procs[i].send_signal(signal.SIGKILL)
    await trio.to_thread.run_sync(procs[i].wait)
    killed.append((procs[i].pid, sent, time.time()))
    procs[i] = await trio.to_thread.run_sync(start)


async def stop_workers(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            await trio.to_thread.run_sync(p.wait, 15)
        except subprocess.TimeoutExpired:
            p.kill()


@attrs.define
class Run:
    """One execution of a job, from the side file."""

    pid: int
    attempt: int
    started: float
    ended: float | None = None  # the handler's last line
    settled: float | None = None  # its outcome committed (or found stale): the run is over
    notes: dict[str, list[int]] = attrs.Factory(dict)  # what the handler noted (--workflows): kind -> figures


def read_runs(log: Path) -> dict[str, list[Run]]:
    runs: dict[str, list[Run]] = {}  # id -> runs, in start order
    for line in log.read_text().splitlines():
        kind, job_id, attempt_text, pid_text, when_text, *figures = line.split()
        attempt, pid, when = int(attempt_text), int(pid_text), float(when_text)
        if kind == "start":
            runs.setdefault(job_id, []).append(Run(pid, attempt, when))
            continue
        run = next((r for r in reversed(runs.get(job_id, [])) if (r.pid, r.attempt) == (pid, attempt)), None)
        if run is None:
            continue  # settled without starting here: released at shutdown, or lost before it started
        if kind == "end":
            run.ended = when
        elif kind == "settled":
            run.settled = when
        else:
            run.notes[kind] = [int(f) for f in figures]
    for entries in runs.values():
        entries.sort(key=lambda r: r.started)
    return runs


def explained(run: Run, next_start: float, kills: list[tuple[float, float]]) -> tuple[bool, bool]:
    """Was ``run`` repeated because its process was killed while it was in flight: after it
    started, before its outcome was committed, and before the next run began? And if so,
    did that kill land after the handler's own end (between its end and the commit)?"""
    for sent, reaped in kills:
        # [sent, reaped] brackets the moment the kill landed: give the check the benefit of it
        if reaped >= run.started and sent <= next_start and (run.settled is None or sent < run.settled):
            return True, run.ended is not None and reaped > run.ended
    return False, False


def kills_by_pid(killed: list[tuple[int, float, float]]) -> dict[int, list[tuple[float, float]]]:
    kills: dict[int, list[tuple[float, float]]] = {}
    for pid, sent, reaped in killed:
        kills.setdefault(pid, []).append((sent, reaped))
    return kills


def books(rows: dict[str, str], runs: dict[str, list[Run]], ids: list[str],
          killed: list[tuple[int, float, float]]) -> dict[str, int]:
    """Lost, not completed, never ran, and the duplicate executions with how many a kill explains."""
    lost = [i for i in ids if i not in rows]
    not_done = {i: s for i, s in rows.items() if s != "completed"}
    kills = kills_by_pid(killed)
    duplicates = unexplained = after_end = 0
    for entries in runs.values():
        for run, following in zip(entries, entries[1:]):  # every run but the last was repeated
            duplicates += 1
            ok, late = explained(run, following.started, kills.get(run.pid, []))
            unexplained += not ok
            after_end += late
    never_ran = [i for i in ids if i not in runs]
    return {
        "jobs": len(ids), "kills": len(killed), "lost": len(lost), "not_completed": len(not_done),
        "never_ran": len(never_ran), "duplicates": duplicates, "unexplained_duplicates": unexplained,
        "killed_between_end_and_commit": after_end,
    }


def check(rows: dict[str, str], log: Path, ids: list[str], killed: list[tuple[int, float, float]], elapsed: float,
          out: Any, *, backend: str = "sqlite") -> dict[str, int]:
    """The books: ``rows`` is every job's status in the store, ``ids`` every job enqueued."""
    result = books(rows, read_runs(log), ids, killed)
    print(
        f"chaos ({backend}): {result['jobs']} jobs, {len(killed)} SIGKILLs in {elapsed:.0f} s: "
        f"{result['lost']} lost, {result['not_completed']} not completed, {result['never_ran']} never ran, "
        f"{duplicate_line(result)}",
        file=out,
    )
    return result


def duplicate_line(result: dict[str, int]) -> str:
    unexplained = result["unexplained_duplicates"]
    return (f"{result['duplicates']} duplicate executions ({result['killed_between_end_and_commit']} killed between the "
            f"handler's end and the commit), all from workers killed mid-run: {'yes' if unexplained == 0 else f'NO ({unexplained} not)'}")


# -- workflows (--workflows) -------------------------------------------------------------------


@attrs.frozen
class Flows:
    """What the producer enqueued: the batch (its members and callback) and the chains, in order."""

    batch: pipeline.Batch
    chains: list[list[str]]

    @property
    def ids(self) -> list[str]:
        assert self.batch.callback_id is not None
        return [*self.batch.job_ids, self.batch.callback_id, *(i for ids in self.chains for i in ids)]


class Tail:
    """The side file's lines as they are written (the driver watches for the callback's start)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.rest = b""

    def lines(self) -> list[str]:
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = self.rest + f.read()
            self.offset = f.tell()
        *lines, self.rest = data.split(b"\n")
        return [line.decode() for line in lines]


def run_workflows(fan_out: int, chains: int, workers: int, duration: float, kill_every: float, folder: Path,
                  out: Any = sys.stdout, *, backend: str = "sqlite", postgres_url: str = POSTGRES_URL,
                  redis_url: str = REDIS_URL, runtime: str = "trio") -> dict[str, int]:
    """The --workflows run on a fresh store: its books (``check_workflows``), printed on ``out``."""
    stores = open_stores(backend, folder, postgres_url=postgres_url, redis_url=redis_url)
    try:
        url = stores.fresh("chaos_flows")
        stores.migrate(url)
        return trio.run(functools.partial(_drive_workflows, url, stores.settings, fan_out, chains, workers, duration,
                                          kill_every, folder, out, backend, runtime))
    finally:
        stores.close()


class Workers:
    """The worker processes of a --workflows run: killed and replaced without holding up the driver
    (each kill and restart in its own task, shielded so that no process is left behind)."""

    def __init__(self, start: Callable[[], subprocess.Popen[str]]) -> None:
        self.start = start
        self.procs: list[subprocess.Popen[str]] = []
        self.killed: list[tuple[int, float, float]] = []  # (pid, signal sent at, process reaped at)
        self.last_kill = 0.0  # trio's clock

    async def add(self, n: int = 1) -> None:
        async def one() -> None:
            with trio.CancelScope(shield=True):
                self.procs.append(await trio.to_thread.run_sync(self.start))

        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(one)

    async def kill(self, proc: subprocess.Popen[str]) -> None:
        """SIGKILL ``proc``, note the kill, start another worker in its place."""
        self.procs.remove(proc)
        with trio.CancelScope(shield=True):
            sent = time.time()
            proc.send_signal(signal.SIGKILL)
            await trio.to_thread.run_sync(proc.wait)
            self.killed.append((proc.pid, sent, time.time()))
            self.last_kill = trio.current_time()
        await self.add()

    async def kill_at_random(self, until: float, every: float, rng: random.Random) -> None:
        """A random worker about every ``every`` seconds (0.5 to 1.5 times), until ``until`` (a kill
        comes no sooner than the restart of the one before is done, and none after ``until``)."""
        next_kill = trio.current_time() + every
        while next_kill < until:
            await trio.sleep_until(next_kill)
            if self.procs and trio.current_time() < until:
                await self.kill(rng.choice(self.procs))
            next_kill += every * rng.uniform(0.5, 1.5)

    async def kill_first_run(self, log: Path, job_id: str) -> tuple[int, float, float] | None:
        """Watch the side file for ``job_id``'s first start and kill the worker running it: that kill
        (None if its worker was killed already, at random)."""
        tail = Tail(log)
        while True:
            for line in tail.lines():
                if line.startswith(f"start {job_id} "):
                    pid = int(line.split()[3])
                    proc = next((p for p in self.procs if p.pid == pid), None)
                    if proc is None:
                        return None
                    await self.kill(proc)
                    return next(k for k in self.killed if k[0] == pid)
            await trio.sleep(0.02)


async def watch_waiting(backend: Backend, parents_of: dict[str, tuple[str, ...]], stuck: dict[str, float]) -> None:
    """Every half second: the jobs listed final, then the jobs listed waiting; a job still waiting after
    every parent of it was seen final is stuck (a parent's end wakes or cancels its children in the same
    transaction or script): noted in ``stuck`` (id -> when first seen), for as long as the run lasts."""
    while True:
        final = {job_id for job_id, job in (await listed(backend)).items() if job.status in FINAL}
        for job in (await backend.list(status="waiting", limit=10_000))[0]:
            parents = parents_of.get(job.id)
            if parents and all(parent in final for parent in parents):
                stuck.setdefault(job.id, time.time())
        await trio.sleep(0.5)


async def _drive_workflows(url: str, settings: dict[str, str], fan_out: int, chains: int, workers: int, duration: float,
                           kill_every: float, folder: Path, out: Any, backend: str, runtime: str) -> dict[str, int]:
    log = folder / "runs.log"
    log.touch()
    # the batch's jobs take about a third of the run at the workers' concurrency (kills land among them), and
    # the callback's run (killed once, so that it runs again after its lease expires) comes well before the end
    member_sleep = min(2.0, duration / 3 * workers * MEMBER_CONCURRENCY / fan_out)
    pool = Workers(functools.partial(start_worker, url, log, settings, {"CHAOS_MEMBER_SLEEP": f"{member_sleep:.4f}",
                                                                         "CHAOS_RUNTIME": runtime}))
    producer = pipeline.Config.from_env({
        **settings, "DATABASE_URL": url, "LOG_LEVEL": "error", "SQLITE_SYNCHRONOUS": "full", "WORKER_ENABLED": "false",
        "ADMIN_ENABLED": "false",
    }, env_file=None)
    callback_kill: list[tuple[int, float, float] | None] = []  # once the callback's first run was seen (and killed)
    stuck: dict[str, float] = {}  # jobs seen waiting after all their parents were seen final
    _quiet_logs(+1)  # its rescues
    try:
        await pool.add(workers)
        async with pipeline.open_pipeline(producer, registry(runtime)) as p:  # it runs no job: trio's run will do
            started, started_at = trio.current_time(), time.time()
            flows = Flows(await p.enqueue_batch([Member(i) for i in range(fan_out)], then=FanIn(fan_out)), [])
            callback = flows.batch.callback_id
            assert callback is not None

            async def watch_callback() -> None:
                callback_kill.append(await pool.kill_first_run(log, callback))

            parents_of: dict[str, tuple[str, ...]] = {callback: flows.batch.job_ids}  # chains' added as enqueued
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch_callback)
                nursery.start_soon(watch_waiting, p.backend, parents_of, stuck)
                nursery.start_soon(pool.kill_at_random, started + duration, kill_every, random.Random())
                # the chains spread over the first 90% of the run, each one enqueue_many call: the chain
                # itself, or (every other one) a list holding it
                for k in range(chains):
                    await trio.sleep_until(started + duration * 0.9 * k / chains)
                    steps = pipeline.chain(Step(k, 1), Step(k, 2), Step(k, 3))
                    flows.chains.append(await p.enqueue_many(steps if k % 2 == 0 else [steps]))
                    parents_of.update((child, (parent,)) for parent, child in zip(flows.chains[-1], flows.chains[-1][1:]))
                await trio.sleep_until(started + duration)
                with trio.move_on_after(120):  # no more kills: wait for leases to expire and the rest to run
                    while True:
                        counts = (await p.backend.stats())["by_status"]
                        if callback_kill and not any(counts.get(status) for status in ("waiting", "pending", "running")):
                            break
                        await trio.sleep(0.05)
                ended = trio.current_time()
                nursery.cancel_scope.cancel()
            records = await listed(p.backend)
            details = {i: await p.backend.get(i) for i in [callback, *(i for ids in flows.chains for i in ids)]}
            batch = await p.batch(flows.batch.id)
    finally:
        _quiet_logs(-1)
        await stop_workers(pool.procs)
    figures = {"elapsed": ended - started, "drain": ended - max(pool.last_kill, started + duration), "started_at": started_at}
    return check_workflows(records, details, batch, read_runs(log), flows, pool.killed,
                           callback_kill[0] if callback_kill else None, figures, out, backend=labelled(backend, runtime),
                           stuck=stuck)


_quieted: list[int] = []  # the "pipeline" logger's level before the first of the runs in this process quieted it


def _quiet_logs(step: int) -> None:
    """The "pipeline" logger at ERROR while any run of this process drives its producer (several run side
    by side in the test): the level it had is given back when the last one ends, whatever their order."""
    logger = logging.getLogger("pipeline")
    if step > 0:
        _quieted.append(logger.level)
        logger.setLevel(logging.ERROR)
    else:
        level = _quieted.pop()
        if not _quieted:
            logger.setLevel(level)


async def listed(backend: Backend) -> dict[str, pipeline.JobRecord]:
    """Every job as the operators' listing shows it (newest first, page by page)."""
    found: dict[str, pipeline.JobRecord] = {}
    offset = 0
    while True:
        page, total = await backend.list(limit=1000, offset=offset)
        found.update((job.id, job) for job in page)
        offset += len(page)
        if not page or offset >= total:
            return found


def completing(entries: list[Run]) -> Run | None:
    """The run that completed a job: the last to start that reached its handler's end. (A later run
    of a completed job cannot have started; an earlier run that ended was repeated, so its outcome
    was not the success: it was killed between its end and the commit.)"""
    return next((run for run in reversed(entries) if run.ended is not None), None)


def check_workflows(records: dict[str, pipeline.JobRecord], details: dict[str, pipeline.JobRecord | None],
                    batch: BatchRecord | None, runs: dict[str, list[Run]], flows: Flows,
                    killed: list[tuple[int, float, float]], callback_kill: tuple[int, float, float] | None,
                    figures: dict[str, float], out: Any, *, backend: str = "sqlite",
                    stuck: dict[str, float] | None = None) -> dict[str, int]:
    """The workflow books (see the module's docstring): ``records`` every job as listed, ``details``
    the chain steps and the callback as ``get`` reads them (parents), ``runs`` the side file, ``stuck``
    the jobs seen waiting after all their parents were seen final (``watch_waiting``)."""
    ids = flows.ids
    result = books({i: r.status for i, r in records.items()}, runs, ids, killed)
    result["left_waiting_pending_or_running"] = sum(r.status in ("waiting", "pending", "running") for r in records.values())
    result["seen_waiting_after_its_parents_ended"] = len(stuck or {})
    # the run that completed each job is the one whose attempt the store recorded
    result["completing_run_not_the_recorded_attempt"] = sum(
        1 for i in ids if i in records and records[i].status == "completed"
        and ((done := completing(runs.get(i, []))) is None or done.attempt != records[i].attempts)
    )
    # chains: in order, stored with their parent, each run read its parent's result
    links = out_of_order = wrong_parents = misread = 0
    gaps: list[float] = []  # parent's completing end -> child's first start
    for chain_ids in flows.chains:
        for parent, child in zip(chain_ids, chain_ids[1:]):
            links += 1
            record = details.get(child)
            wrong_parents += record is None or record.parents != (parent,)
            done, child_runs = completing(runs.get(parent, [])), runs.get(child, [])
            if not child_runs:
                continue  # counted as never ran
            if done is None or done.ended is None or child_runs[0].started <= done.ended:
                out_of_order += 1
            else:
                gaps.append(child_runs[0].started - done.ended)
            misread += sum(run.notes.get("parents", [1, 1]) != [1, 1] for run in child_runs)
            last = completing(child_runs)
            misread += last is not None and "parents" not in last.notes
    result.update(chain_links=links, chains_out_of_order=out_of_order, chain_parents_not_stored=wrong_parents,
                  parents_results_misread=misread)
    # the callback: stored waiting for every member, started after the last member's completing end, read a
    # final batch in every run, repeated only by kills
    callback = flows.batch.callback_id
    assert callback is not None
    size = len(flows.batch.job_ids)
    record = details.get(callback)
    callback_runs = runs.get(callback, [])
    member_ends = [done.ended for m in flows.batch.job_ids if (done := completing(runs.get(m, []))) and done.ended]
    last_member_end = max(member_ends) if len(member_ends) == size else None
    early = bool(callback_runs) and (last_member_end is None or callback_runs[0].started <= last_member_end)
    reads = [run.notes.get("batch") for run in callback_runs]
    kills = kills_by_pid(killed)
    result.update(
        callback_runs=len(callback_runs),
        callback_repeats_unexplained=sum(not explained(run, following.started, kills.get(run.pid, []))[0]
                                         for run, following in zip(callback_runs, callback_runs[1:])),
        callback_not_stored_waiting_for_the_batch=int(record is None or record.parent_count != size
                                                      or record.batch_id != flows.batch.id),
        callback_started_early=int(early),
        callback_read_unfinished_batch=sum(read is not None and read != [size, size, size] for read in reads)
        + int(not callback_runs or reads[-1] is None),
        batch_record_wrong=int(batch is None or batch.total != size or dict(batch.counts) != {"completed": size}
                               or batch.callback_status != "completed"),
    )
    failures = ("lost", "not_completed", "never_ran", "unexplained_duplicates", "left_waiting_pending_or_running",
                "seen_waiting_after_its_parents_ended", "completing_run_not_the_recorded_attempt", "chains_out_of_order", "chain_parents_not_stored",
                "parents_results_misread", "callback_repeats_unexplained", "callback_not_stored_waiting_for_the_batch",
                "callback_started_early", "callback_read_unfinished_batch", "batch_record_wrong")
    result["failures"] = sum(result[name] for name in failures)
    wrong = [f"{name.replace('_', ' ')}: {result[name]}" for name in failures[4:] if result[name]]
    after_member = "" if early or not callback_runs or last_member_end is None \
        else (f", first start {callback_runs[0].started - last_member_end:.2f} s after the last member's completing end "
              f"({callback_runs[0].started - figures.get('started_at', 0.0):.1f} s into the run)")
    gaps.sort()
    gap = (f", parent's end to child's start p50 {gaps[len(gaps) // 2] * 1000:.0f} ms, p90 {gaps[len(gaps) * 9 // 10] * 1000:.0f} ms, "
           f"max {gaps[-1] * 1000:.0f} ms") if gaps else ""
    print(
        f"chaos --workflows ({backend}): {result['jobs']} jobs (a batch of {size} with its callback, "
        f"{len(flows.chains)} chains of 3), {len(killed)} SIGKILLs ({int(callback_kill is not None)} of them the callback's "
        f"first run) in {figures['elapsed']:.0f} s (drained {figures['drain']:.1f} s after the last): "
        f"{result['lost']} lost, {result['not_completed']} not completed, {result['never_ran']} never ran, "
        f"{duplicate_line(result)}; chains in order: {links - out_of_order} of {links} links{gap}; callback: "
        f"{len(callback_runs)} run(s), {result['callback_repeats_unexplained']} repeat(s) not from a kill{after_member}, "
        f"read {reads[-1][1] if callback_runs and reads[-1] else 0} of {size} final; "
        f"books balance: {'yes' if not result['failures'] else 'NO (' + '; '.join(wrong) + ')'}",
        file=out,
    )
    for job_id, seen in sorted((stuck or {}).items(), key=lambda item: item[1])[:5]:  # what a defect looks like
        started = runs.get(job_id, [])
        print(f"  waiting after its parents ended: {job_id} ({'the callback' if job_id == callback else 'a chain step'}), "
              f"seen {seen - figures.get('started_at', 0.0):.1f} s into the run, first started "
              f"{f'{started[0].started - seen:.1f} s later' if started else 'never'}", file=out)
    return result


# -- durable functions (--durable) ------------------------------------------------------------------


@attrs.define
class Sent:
    """The "go" signal of one flow: sent right after its enqueue (``early``: before the job can reach its
    wait) or once the store lists it suspended awaiting "go"; through a ``pipeline.Client`` or the
    store's own ``Backend.signal`` (``via``); when, and the answer ("woken", "kept", or the error)."""

    n: int
    early: bool
    via: str
    payload: Any
    at: float = 0.0
    answer: str | None = None


def flow_job(n: int, rng: random.Random) -> Flow | SyncFlow:
    """Flow ``n``: every fifth one a sync handler's, every third one with a wait that times out; its
    durable sleep 0.05 to 0.5 s."""
    kind = SyncFlow if n % 5 == 4 else Flow
    return kind(n, round(rng.uniform(0.05, 0.5), 3), n % 3 == 0)


def run_durable(flows: int, workers: int, duration: float, kill_every: float, folder: Path, out: Any = sys.stdout, *,
                backend: str = "sqlite", postgres_url: str = POSTGRES_URL, redis_url: str = REDIS_URL,
                runtime: str = "trio") -> dict[str, int]:
    """The --durable run on a fresh store: its books (``check_durable``), printed on ``out``."""
    stores = open_stores(backend, folder, postgres_url=postgres_url, redis_url=redis_url)
    try:
        url = stores.fresh("chaos_durable")
        stores.migrate(url)
        return trio.run(functools.partial(_drive_durable, url, stores.settings, flows, workers, duration, kill_every,
                                          folder, out, backend, runtime))
    finally:
        stores.close()


async def _drive_durable(url: str, settings: dict[str, str], flows: int, workers: int, duration: float,
                         kill_every: float, folder: Path, out: Any, backend: str, runtime: str) -> dict[str, int]:
    log = folder / "runs.log"
    log.touch()
    pool = Workers(functools.partial(start_worker, url, log, settings, {"CHAOS_RUNTIME": runtime}))
    producer = pipeline.Config.from_env({
        **settings, "DATABASE_URL": url, "LOG_LEVEL": "error", "SQLITE_SYNCHRONOUS": "full", "WORKER_ENABLED": "false",
        "ADMIN_ENABLED": "false",
    }, env_file=None)
    reg = registry(runtime)
    rng = random.Random()
    jobs: dict[str, Flow | SyncFlow] = {}
    sent: dict[str, Sent] = {}
    late: dict[str, Sent] = {}  # sent once the store lists the job suspended awaiting "go"
    client: pipeline.Client | None = None
    _quiet_logs(+1)  # its rescues
    try:
        await pool.add(workers)
        client = await trio.to_thread.run_sync(functools.partial(pipeline.Client, config=producer, registry=reg))
        async with pipeline.open_pipeline(producer, reg) as p:  # it runs no job: trio's run will do
            started, started_at = trio.current_time(), time.time()

            async def send(job_id: str, signal_: Sent) -> None:
                # a key per flow: a send is made once (a retried send would be refused, SignalKeyUsed)
                signal_.at = time.time()
                try:
                    if signal_.via == "client":
                        assert client is not None
                        signal_.answer = await trio.to_thread.run_sync(
                            functools.partial(client.signal, job_id, "go", signal_.payload, key=f"go-{signal_.n}"))
                    else:
                        signal_.answer = await p.backend.signal(job_id, "go", encode_signal_payload(signal_.payload),
                                                                key=f"go-{signal_.n}")
                except Exception as exc:  # counted as a broken promise, with its text
                    signal_.answer = f"{type(exc).__name__}: {exc}"

            async def send_late() -> None:
                while True:
                    if late:
                        for job in (await p.backend.list(status="suspended", limit=10_000))[0]:
                            if job.awaiting_signal == "go" and job.id in late:
                                await send(job.id, late.pop(job.id))
                    await trio.sleep(0.05)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send_late)
                nursery.start_soon(pool.kill_at_random, started + duration, kill_every, random.Random())
                # the flows spread over the first 80% of the run (each takes about a second unkilled)
                for n in range(flows):
                    await trio.sleep_until(started + duration * 0.8 * n / flows)
                    job = flow_job(n, rng)
                    job_id = await p.enqueue(job)
                    jobs[job_id] = job
                    sent[job_id] = Sent(n, n % 2 == 0, "client" if n // 2 % 2 == 0 else "store", {"n": n, "pick": rng.random()})
                    if sent[job_id].early:
                        await send(job_id, sent[job_id])
                    else:
                        late[job_id] = sent[job_id]
                await trio.sleep_until(started + duration)
                with trio.move_on_after(120):  # no more kills: wait for leases to expire and the rest to run
                    while True:
                        counts = (await p.backend.stats())["by_status"]
                        if not late and not any(counts.get(status) for status in ("pending", "running", "suspended")):
                            break
                        await trio.sleep(0.05)
                ended = trio.current_time()
                nursery.cancel_scope.cancel()
            records = {job_id: await p.backend.get(job_id) for job_id in jobs}
    finally:
        _quiet_logs(-1)
        await stop_workers(pool.procs)
        if client is not None:
            await trio.to_thread.run_sync(client.close)
    figures = {"elapsed": ended - started, "drain": ended - max(pool.last_kill, started + duration), "started_at": started_at}
    return check_durable(records, jobs, sent, read_lines(log), pool.killed, figures, out, backend=labelled(backend, runtime))


@attrs.frozen
class Line:
    """One line of the --durable side file: ``name`` and ``token`` on a step's lines ("step": its function
    ran and drew ``token``; "got": ctx.step gave the handler ``token``)."""

    kind: str
    job_id: str
    attempt: int
    pid: int
    at: float
    name: str | None = None
    token: str | None = None


def read_lines(log: Path) -> dict[str, list[Line]]:
    """The side file's lines by job, in time order."""
    lines: dict[str, list[Line]] = {}
    for text in log.read_text().splitlines():
        kind, job_id, attempt, pid, at, *rest = text.split()
        lines.setdefault(job_id, []).append(Line(kind, job_id, int(attempt), int(pid), float(at), *rest))
    for entries in lines.values():
        entries.sort(key=lambda entry: entry.at)
    return lines


# what breaks a promise of the --durable run (each a count; the summary names those that are not 0)
DURABLE_FAILURES = (
    "lost", "not_completed", "left_suspended_running_or_pending", "steps_not_as_recorded", "committed_steps_run_again",
    "handler_got_an_uncommitted_value", "step_repeats_unexplained", "resumed_before_its_sleep_ended",
    "passed_its_wait_before_the_signal", "wait_got_the_wrong_payload", "result_not_the_steps", "signals_failed",
    "signal_answer_wrong",
)


def expected_steps(job: Flow | SyncFlow) -> list[tuple[str, str]]:
    """(name, status) of a completed flow's stored steps, in order."""
    never = [("@wait:never#1", "timed_out")] if job.timeout_wait else []
    return [("a", "completed"), ("@sleep#1", "completed"), ("b", "completed"), *never, ("@wait:go#1", "completed"),
            ("c", "completed")]


def check_durable(records: dict[str, pipeline.JobRecord | None], jobs: dict[str, Flow | SyncFlow], sent: dict[str, Sent],
                  lines: dict[str, list[Line]], killed: list[tuple[int, float, float]], figures: dict[str, float],
                  out: Any, *, backend: str = "sqlite") -> dict[str, int]:
    """The --durable books. For each flow, from the store (``records``: its status, stored steps and
    result) and the side file (``lines``):

    * it completed, its steps stored as the handler made them (names, order, statuses);
    * for each of its steps, the stored value's token is one its function drew (a "step" line); no
      "step" line of that step comes after that one (a committed step never ran again); every earlier
      one was repeated because its process was killed after the line and before the next run of the
      step began (the kill landed between the line and the commit: the one way a step runs twice); and
      every value the handler got from ctx.step ("got") is the stored one;
    * step "b" ran only after its durable sleep's end, step "c" only after the "go" signal was sent, and
      the wait got that signal's payload; the result is the stored tokens and the payload;
    * its signal was answered "woken" when sent once the job was listed suspended in its wait, and "kept"
      when sent before it (or "woken" only if the job's "wait" line came first).
    """
    kills = kills_by_pid(killed)
    t0 = figures.get("started_at", 0.0)  # times are shown from the run's start
    r = dict.fromkeys(DURABLE_FAILURES, 0)
    r.update(jobs=len(jobs), kills=len(killed), runs=0, steps_run=0, steps_run_twice=0, timed_out=0,
             early_kept=0, early_woken=0, late_woken=0)
    problems: dict[str, list[str]] = {}  # job id -> what broke

    def broke(job_id: str, what: str, why: str, n: int = 1) -> None:
        r[what] += n
        problems.setdefault(job_id, []).append(f"{what.replace('_', ' ')}: {why}")

    for job_id, job in jobs.items():
        record, mine, signal_ = records.get(job_id), lines.get(job_id, []), sent[job_id]
        r["runs"] += sum(entry.kind == "start" for entry in mine)
        answer = signal_.answer or "never sent"
        if answer not in ("woken", "kept"):
            broke(job_id, "signals_failed", answer)
        elif not signal_.early:
            r["late_woken"] += answer == "woken"
            if answer != "woken":
                broke(job_id, "signal_answer_wrong", f"sent once listed suspended in its wait, answered {answer!r}")
        else:
            r["early_kept" if answer == "kept" else "early_woken"] += 1
            waited = [entry.at for entry in mine if entry.kind == "wait"]
            if answer == "woken" and not (waited and waited[0] < signal_.at):
                broke(job_id, "signal_answer_wrong", "sent before its wait was reached, answered 'woken'")
        if record is None:
            broke(job_id, "lost", "not in the store")
            continue
        if record.status != "completed":
            broke(job_id, "not_completed", f"{record.status} (error: {record.error})")
            if record.status in ("suspended", "running", "pending"):
                r["left_suspended_running_or_pending"] += 1
        stored = {step.name: step for step in record.steps}
        shape = [(step.name, step.status) for step in record.steps]
        if record.status == "completed" and shape != expected_steps(job):
            broke(job_id, "steps_not_as_recorded", f"stored {shape}")
        r["timed_out"] += stored.get("@wait:never#1") is not None and stored["@wait:never#1"].status == "timed_out"
        tokens: dict[str, Any] = {}
        for name in FLOW_STEPS:
            ran = [entry for entry in mine if entry.kind == "step" and entry.name == name]
            got = [entry for entry in mine if entry.kind == "got" and entry.name == name]
            r["steps_run"] += len(ran)
            step = stored.get(name)
            if step is None or step.value is None:
                if record.status == "completed":
                    broke(job_id, "steps_not_as_recorded", f"step {name!r} not stored")
                continue
            token = tokens[name] = json.loads(step.value)["token"]
            at = next((i for i, entry in enumerate(ran) if entry.token == token), None)
            if at is None:
                broke(job_id, "steps_not_as_recorded", f"step {name!r} stored a token its function never drew ({token})")
                continue
            if at + 1 < len(ran):
                broke(job_id, "committed_steps_run_again", f"step {name!r} ran {len(ran) - at - 1} time(s) after the run "
                      f"whose value was committed", len(ran) - at - 1)
            others = [entry.token for entry in got if entry.token != token]
            if others:
                broke(job_id, "handler_got_an_uncommitted_value", f"step {name!r}: {others}", len(others))
            for before, following in zip(ran[:at], ran[1:at + 1]):
                r["steps_run_twice"] += 1
                if not any(reaped >= before.at and sent_at <= following.at for sent_at, reaped in kills.get(before.pid, [])):
                    broke(job_id, "step_repeats_unexplained", f"step {name!r} ran at {before.at - t0:.3f} s in pid "
                          f"{before.pid} and again at {following.at - t0:.3f} s in pid {following.pid}, no kill of "
                          f"{before.pid} between")
        sleep, wait = stored.get("@sleep#1"), stored.get("@wait:go#1")
        first_b = next((entry.at for entry in mine if entry.kind == "step" and entry.name == "b"), None)
        # (a stored time is cut to the millisecond)
        if sleep is not None and sleep.ended_at and first_b is not None and first_b < to_epoch(sleep.ended_at) - 0.001:
            broke(job_id, "resumed_before_its_sleep_ended", f"step 'b' at {first_b - t0:.3f} s, the sleep until {sleep.ended_at}")
        first_c = next((entry.at for entry in mine if entry.kind == "step" and entry.name == "c"), None)
        if first_c is not None and (not signal_.at or first_c < signal_.at):
            broke(job_id, "passed_its_wait_before_the_signal", f"step 'c' at {first_c - t0:.3f} s, the signal sent at "
                  f"{signal_.at - t0:.3f} s")
        if wait is not None and wait.status == "completed" and json.loads(wait.value or "null") != signal_.payload:
            broke(job_id, "wait_got_the_wrong_payload", f"{wait.value} for {signal_.payload}")
        if record.status == "completed":
            want = {**tokens, "go": signal_.payload, **({"timed_out": True} if job.timeout_wait else {})}
            if json.loads(record.result or "null") != want:
                broke(job_id, "result_not_the_steps", f"{record.result} for {json.dumps(want)}")
    r["failures"] = sum(r[name] for name in DURABLE_FAILURES)
    wrong = [f"{name.replace('_', ' ')}: {r[name]}" for name in DURABLE_FAILURES if r[name]]
    early, late = sum(s.early for s in sent.values()), sum(not s.early for s in sent.values())
    n_sync = sum(isinstance(job, SyncFlow) for job in jobs.values())
    print(
        f"chaos --durable ({backend}): {r['jobs']} flows ({r['jobs'] - n_sync} async, {n_sync} sync handlers), "
        f"{len(killed)} SIGKILLs in {figures['elapsed']:.0f} s (drained {figures['drain']:.1f} s after the last): "
        f"{r['lost']} lost, {r['not_completed']} not completed, {r['left_suspended_running_or_pending']} left suspended, "
        f"running or pending; {r['runs']} handler runs, {r['steps_run']} step runs for {3 * len(jobs)} steps, "
        f"{r['steps_run_twice']} run twice (all after a kill between the step's line and its commit: "
        f"{'yes' if not r['step_repeats_unexplained'] else 'NO'}), {r['committed_steps_run_again']} committed steps run "
        f"again; signals: {early} sent before the wait ({r['early_kept']} kept, {r['early_woken']} woken), {late} "
        f"once it waited ({r['late_woken']} woken), {r['timed_out']} waits timed out; books balance: "
        f"{'yes' if not r['failures'] else 'NO (' + '; '.join(wrong) + ')'}",
        file=out,
    )
    for job_id, what in list(problems.items())[:5]:  # what a broken promise looks like, with the job's lines
        print(f"  {job_id} ({type(jobs[job_id]).__name__} {jobs[job_id].n}): {'; '.join(what)}", file=out)
        for entry in lines.get(job_id, [])[:40]:
            print(f"    {entry.kind} attempt {entry.attempt} pid {entry.pid} at {entry.at - t0:.3f} s"
                  f"{f' {entry.name} {entry.token}' if entry.name else ''}", file=out)
    return r


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["chaos", "worker"], default="chaos")
    parser.add_argument("--url", help=argparse.SUPPRESS)  # a worker's DATABASE_URL
    parser.add_argument("--backend", choices=BACKENDS, default="sqlite", help="the job store (default sqlite)")
    parser.add_argument("--postgres-url", default=POSTGRES_URL, help="the server for --backend postgres")
    parser.add_argument("--redis-url", default=REDIS_URL, help="the server for --backend redis")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--duration", type=float, help="seconds of kills (default 60; 30 with --workflows or --durable)")
    parser.add_argument("--kill-every", type=float, default=2.0)
    parser.add_argument("--workflows", action="store_true", help="a batch with a callback and chains instead of --jobs")
    parser.add_argument("--fan-out", type=int, default=1000, help="--workflows: the batch's jobs (default 1000)")
    parser.add_argument("--chains", type=int, default=100, help="--workflows: three-step chains (default 100)")
    parser.add_argument("--durable", action="store_true",
                        help="durable flows (steps, sleeps, signals) instead of --jobs: see the module's docstring")
    parser.add_argument("--flows", type=int, default=300, help="--durable: the flows (default 300)")
    parser.add_argument("--runtime", choices=RUNTIMES, default="trio",
                        help="the handlers': trio (default), asyncio, or uvloop (asyncio handlers on uvloop's loop)")
    args = parser.parse_args(argv)
    if args.role == "worker":
        worker_main(args.url)
        return 0
    if args.durable:
        with tempfile.TemporaryDirectory() as tmp:
            r = run_durable(args.flows, args.workers, args.duration or 30.0, args.kill_every, Path(tmp), backend=args.backend,
                            postgres_url=args.postgres_url, redis_url=args.redis_url, runtime=args.runtime)
        return 0 if r["failures"] == 0 else 1
    if args.workflows:
        with tempfile.TemporaryDirectory() as tmp:
            r = run_workflows(args.fan_out, args.chains, args.workers, args.duration or 30.0, args.kill_every, Path(tmp),
                              backend=args.backend, postgres_url=args.postgres_url, redis_url=args.redis_url,
                              runtime=args.runtime)
        return 0 if r["failures"] == 0 else 1
    args.duration = args.duration or 60.0
    with tempfile.TemporaryDirectory() as tmp:
        r = run_chaos(args.jobs, args.workers, args.duration, args.kill_every, Path(tmp), backend=args.backend,
                      postgres_url=args.postgres_url, redis_url=args.redis_url, runtime=args.runtime)
    ok = r["lost"] == r["not_completed"] == r["never_ran"] == r["unexplained_duplicates"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
