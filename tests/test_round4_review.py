"""Issue 32's review (R1): defects found in the round-four fixes, each with the test that failed on
f2de4d0. Real stores; a store "far away" is the real one behind a loopback TCP proxy that delays
every chunk it forwards."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import attrs
import pytest
import trio
from backends.stores import BACKENDS

import pipeline
from pipeline import Config
from pipeline.states import Transition


@dataclasses.dataclass
class Tick:
    n: int = 0


# -- a store far away: a proxy that delays what it forwards ---------------------------------------


async def _pump(src: trio.SocketStream, dst: trio.SocketStream, delay: float) -> None:
    try:
        while data := await src.receive_some(65536):
            await trio.sleep(delay)
            await dst.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        with trio.move_on_after(1):
            await dst.aclose()


@asynccontextmanager
async def far_away(config: Config, delay: float) -> AsyncIterator[Config]:
    """``config`` with its DATABASE_URL through a proxy adding ``delay`` seconds each way (a round
    trip ``2 * delay`` longer, as a store in another region)."""
    parts = urlsplit(config.database_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 0

    async def handle(client: trio.SocketStream) -> None:
        upstream = await trio.open_tcp_stream(host, port)
        async with trio.open_nursery() as tn:
            tn.start_soon(_pump, client, upstream, delay)
            tn.start_soon(_pump, upstream, client, delay)

    async with trio.open_nursery() as tn:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        mine = listeners[0].socket.getsockname()[1]
        tn.start_soon(trio.serve_listeners, handle, listeners)
        netloc = parts.netloc.replace(f"{host}:{port}", f"127.0.0.1:{mine}")
        yield config.replace(database_url=urlunsplit(parts._replace(netloc=netloc)))
        tn.cancel_scope.cancel()


# -- 1. rate limits: a store farther than the start margin starved the type (a3a2184) --------------


@pytest.mark.parametrize("store, delay", [("redis", 0.03), ("postgres", 0.015)])
async def test_a_rate_limited_type_runs_on_a_store_farther_away_than_the_start_margin(
    store: str, delay: float, tmp_path: Path,
) -> None:
    """a3a2184 handed back a rate-limited job that reached its worker more than 40 ms after its claim
    was sent; a store 40 ms or more away (a claim's round trip) then made every job late, for ever:
    0 of 3 jobs ran in 15 s. The process now widens the margin its claims count to what it sees
    (up to half the window), and the starts still keep the rate."""
    reg = pipeline.Registry()
    starts: list[float] = []

    @reg.job(rate_limit="4/s")
    async def tick(job: Tick, ctx: pipeline.JobContext) -> None:
        starts.append(trio.current_time())

    async with BACKENDS[store](tmp_path) as near, far_away(near, delay) as config:
        async with pipeline.open_pipeline(config, reg) as p:
            ids = [await p.enqueue(Tick(n)) for n in range(6)]
            for job_id in ids:
                await p.result(job_id, timeout=30)
    assert len(starts) == 6
    for i, start in enumerate(starts):  # no window of a second holds more than four starts
        assert sum(1 for other in starts[i:] if other - start < 1.0) <= 4, starts


# -- 2. pause: a process that saw a pause handed back the type's jobs after a resume elsewhere (a0743f9) --


@dataclasses.dataclass
class Slow:
    n: int = 0


@pytest.mark.parametrize("store", sorted(BACKENDS))
async def test_a_resume_made_elsewhere_starts_the_types_jobs_without_handing_them_back(store: str, tmp_path: Path) -> None:
    """A process learns a pause of its type only at its canceller's look, which runs while it holds
    jobs. Once it had seen one and let its held jobs go, a resume made by another process (the CLI,
    the admin API) was not seen until it held jobs again: every job its claims then got was handed
    back as 'paused', claimed again at once and handed back again, a few hundred times (commits and
    outcome lines) until the look. A claim sent after this process learned of the pause that gets
    the type's jobs proves the store resumed it (a claim skips a paused type in its own transaction)."""
    reg = pipeline.Registry()
    started, go = trio.Event(), trio.Event()
    ran: list[int] = []

    @reg.job(concurrency=1)
    async def slow(job: Slow, ctx: pipeline.JobContext) -> None:
        ran.append(job.n)
        if job.n == 0:
            started.set()
            await go.wait()

    async with BACKENDS[store](tmp_path) as config:
        config = attrs.evolve(config, worker=attrs.evolve(config.worker, prefetch=1))
        async with pipeline.open_pipeline(config, reg) as p, pipeline.backends.open_backend(config) as other:
            first = await p.enqueue(Slow(0))
            with trio.fail_after(15):
                await started.wait()
            ahead = await p.enqueue(Slow(1))
            with trio.fail_after(15):
                while (await p.backend.get(ahead)).status != "running":  # type: ignore[union-attr]
                    await trio.sleep(0.01)  # held here, behind the busy worker
            await other.set_type_paused("slow", True)  # another process pauses the type...
            with trio.fail_after(15):
                while not p.pools["slow"].paused:
                    await trio.sleep(0.01)  # ...and this one acknowledges it at its look
            go.set()
            await p.result(first, timeout=15)
            with trio.fail_after(15):
                while (await p.backend.get(ahead)).status != "pending":  # type: ignore[union-attr]
                    await trio.sleep(0.01)  # handed back, unstarted: this process holds nothing now
            released: list[str] = []
            real = p.backend.settle

            async def counted(settlements: Any) -> Any:
                released.extend(s.id for s in settlements if s.transition is Transition.RELEASE)
                return await real(settlements)

            p.backend.settle = counted  # type: ignore[method-assign,assignment]  # the store's own call, counted
            await other.set_type_paused("slow", False)  # another process resumes it
            await p.result(ahead, timeout=15)
    assert ran == [0, 1]
    assert released == [], f"handed back {len(released)} times after the resume"
