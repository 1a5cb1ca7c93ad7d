"""Helpers of the conformance suite: NewJob rows with UUID7 ids and ISO times, lease
renewals from a thread (as the heartbeat does), and time arithmetic on stored text."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

import pipeline
from pipeline.backends import Backend, JobRecord, Lease, NewJob, Settlement
from pipeline.backends.base import NewBatch, snoozed_too_often
from pipeline.clock import format_ts, to_epoch
from pipeline.ids import UUID7Factory
from pipeline.states import Transition

new_id = UUID7Factory()

PAST = -60.0  # a run_after offset that is due
FUTURE = 3600.0  # one that is not, during a test
LONG = 3600.0  # a lease that does not expire during a test
SHORT = 0.05  # one that does, after a short real wait


def ts(offset: float = 0.0) -> str:
    """Now + ``offset`` seconds, as stored."""
    return format_ts(time.time() + offset)


def epoch(text: str) -> float:
    return to_epoch(text)


def job(
    job_type: str = "t", *, delay: float = PAST, priority: int = 5, max_attempts: int = 3,
    payload: dict[str, object] | None = None, job_id: str | None = None, run_after: str | None = None,
    unique_key: str | None = None, expires_at: str | None = None, limit_key: str | None = None,
    unique_while: str | None = None,
) -> NewJob:
    """A row as the engine inserts it: due ``delay`` seconds from now (due a minute ago by default);
    never started after ``expires_at`` if given (stored text: ``ts(offset)``); counted under
    ``limit_key`` by a claim's key_limits; its unique key held only while pending if ``unique_while``
    is "pending" (None: the default, pending or running)."""
    created = ts()
    return NewJob(
        id=job_id or new_id(),
        job_type=job_type,
        payload=json.dumps(payload if payload is not None else {"n": 1}, sort_keys=True, separators=(",", ":")),
        max_attempts=max_attempts,
        run_after=run_after if run_after is not None else ts(delay),
        priority=priority,
        created_at=created,
        unique_key=unique_key,
        expires_at=expires_at,
        limit_key=limit_key,
        unique_while=unique_while,
    )


async def insert(backend: Backend, *rows: NewJob) -> list[str]:
    await backend.insert(list(rows))
    return [r.id for r in rows]


async def add(backend: Backend, n: int = 1, job_type: str = "t", **fields: object) -> list[str]:
    return await insert(backend, *(job(job_type, **fields) for _ in range(n)))  # type: ignore[arg-type]


async def record(backend: Backend, job_id: str) -> JobRecord:
    found = await backend.get(job_id)
    assert found is not None, f"job {job_id} is gone"
    return found


async def claim_one(backend: Backend, job_type: str = "t", *, owner: str = "owner-a", lease_seconds: float = LONG) -> Lease:
    (lease,) = await backend.claim({job_type: 1}, owner=owner, lease_seconds=lease_seconds)
    return lease


async def settle_one(backend: Backend, settlement: Settlement) -> bool:
    (held,) = await backend.settle([settlement])
    return held


def succeed(lease: Lease, result: str | None = None) -> Settlement:
    """``result``: the handler's return value as JSON text, as the engine writes it."""
    return Settlement(lease.id, lease.token, Transition.SUCCEED, result=result)


def retry(lease: Lease, delay: float, error: str = "boom") -> Settlement:
    return Settlement(lease.id, lease.token, Transition.RETRY, error=error, delay=delay)


def bury(lease: Lease, error: str = "fatal") -> Settlement:
    return Settlement(lease.id, lease.token, Transition.BURY, error=error)


def release(lease: Lease) -> Settlement:
    return Settlement(lease.id, lease.token, Transition.RELEASE)


def stop(lease: Lease, error: str = "cancelled while running: stopped by its worker") -> Settlement:
    """The CANCEL outcome a worker writes once it stopped a job whose cancel was requested."""
    return Settlement(lease.id, lease.token, Transition.CANCEL, error=error)


def snooze(lease: Lease, delay: float, *, limit: int = 10, error: str | None = None) -> Settlement:
    """A SNOOZE outcome, with the error the engine gives it (written if it exceeds ``limit``)."""
    return Settlement(lease.id, lease.token, Transition.SNOOZE, delay=delay, snooze_limit=limit,
                      error=error if error is not None else snoozed_too_often(limit))


async def renew(
    backend: Backend, owner: str, job_types: Sequence[str], held: Sequence[tuple[str, int]], *, lease_seconds: float = LONG
) -> list[str]:
    """One heartbeat, from a thread as the lease keeper runs it; the ids whose lease is lost."""
    renewer = backend.lease_renewer()
    try:
        return await trio.to_thread.run_sync(lambda: renewer.renew(owner, job_types, held, lease_seconds=lease_seconds))
    finally:
        renewer.close()


async def forget(backend: Backend, owner: str) -> None:
    renewer = backend.lease_renewer()
    try:
        await trio.to_thread.run_sync(renewer.forget, owner)
    finally:
        renewer.close()


async def outlive(lease_seconds: float) -> None:
    """Sleep past a lease of this many seconds taken before the call (real time: leases are
    wall-clock times in the store, with millisecond resolution)."""
    await trio.sleep(lease_seconds + 0.03)


def released_together(commands: list[list[str]], env: dict[str, str]) -> list[list[str]]:
    """Start one process per command; once each has printed "ready", tell them all "go" at once,
    and return each one's output lines (before its final "done")."""
    procs = [subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
             for command in commands]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.strip() == "ready", f"{command_name(proc)} did not start: {line!r}"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = []
        for proc in procs:
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0, f"{command_name(proc)} failed with {proc.returncode}"
            lines = out.splitlines()
            assert lines[-1] == "done", lines[-3:]
            outputs.append(lines[:-1])
        return outputs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def command_name(proc: subprocess.Popen[str]) -> str:
    return Path(str(proc.args[1])).stem  # type: ignore[index]


def max_in_window(times: list[float], window: float) -> int:
    """The most of ``times`` (seconds) that fit in any window of ``window`` seconds: sliding, not calendar."""
    times = sorted(times)
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= window:
            first += 1
        most = max(most, last - first + 1)
    return most


# -- workflows (issue 24) ---------------------------------------------------------------------------


def flow_job(
    job_type: str = "t", *, after: Sequence[str] = (), on_parent_failure: str | None = None,
    batch_id: str | None = None, **fields: Any,
) -> NewJob:
    """A row of :func:`job` (``fields`` as its) that waits for the jobs ``after`` (its parents, in
    that order), with ``on_parent_failure`` (None: "cancel"; "run"), in batch ``batch_id``."""
    return job(job_type, **fields)._replace(after=tuple(after), on_parent_failure=on_parent_failure, batch_id=batch_id)


def batch_rows(
    members: Sequence[NewJob], *, callback_type: str | None = "callback", batch_id: str | None = None,
) -> tuple[list[NewJob], NewBatch]:
    """The rows and the batch record of one batch, as the engine builds them for enqueue_batch:
    each member with the batch's id, then (unless ``callback_type`` is None) the callback, which
    waits for every member with on_parent_failure="run"."""
    batch_id = batch_id or new_id()
    rows = [member._replace(batch_id=batch_id) for member in members]
    callback = None
    if callback_type is not None:
        callback = flow_job(callback_type, after=[row.id for row in rows], on_parent_failure="run", batch_id=batch_id)
        rows.append(callback)
    return rows, NewBatch(batch_id, callback.id if callback else None, ts())


async def statuses(backend: Backend, ids: Sequence[str]) -> list[str | None]:
    """Each job's status, None for one that is gone."""
    return [None if (found := await backend.get(job_id)) is None else found.status for job_id in ids]


async def store_state(backend: Backend) -> tuple[object, ...]:
    """What an operator sees of the whole store (every job's record, the total, the counts by status
    and type), to compare before and after a call that must write nothing."""
    records, total = await backend.list(limit=10_000)
    stats = await backend.stats()
    return (sorted(records, key=lambda r: r.id), total, stats["total"], stats["by_status"], stats["by_type"])


@attrs.frozen
class Link:
    n: int


async def drain_chain(store_config: pipeline.Config, n: int) -> list[int]:
    """A chain of ``n`` Link jobs, enqueued and drained by one pipeline that polls once a minute (so a
    link starts only because its parent's end said so); the order the links ran in."""
    reg = pipeline.Registry()
    ran: list[int] = []

    async def link(job: Link, ctx: pipeline.JobContext) -> None:
        ran.append(job.n)

    reg.register("link", Link, link)
    config = attrs.evolve(store_config, worker=attrs.evolve(store_config.worker, poll_interval_ms=60_000))
    async with pipeline.open_pipeline(config, reg) as p:
        assert len(await p.enqueue_many(pipeline.chain(*(Link(k) for k in range(n))))) == n
        with trio.fail_after(20):
            while (await p.backend.stats())["by_status"].get("completed", 0) < n:
                await trio.sleep(0.01)
    return ran
