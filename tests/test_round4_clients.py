"""Issue 32 (correctness, round four), the clients' items: ``result()`` waits that a caller abandons or
``close()`` ends (3, 11), ``result()``'s timeout at 0 and below (14), lone surrogates refused at the door
(6), naive datetimes refused everywhere (10), a chain handed to ``enqueue`` (new user), pausing a type
from a client (new user), and two promises a mutation slipped past: the stored trace context keeps its
``tracestate``, and ``pipeline.testing``'s ``drain()`` answers oldest first.

Every store where the item names them (a fresh one per test, tests/backends/stores.py); real asyncio
loops (``asyncio.run`` in a thread) and real threads for the clients."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import json
import math
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from backends.stores import BACKENDS
from jobkit import Echo, Tick, registry, wait_status

import pipeline
import pipeline.testing
from pipeline import Config, Registry
from pipeline.backends import open_backend


@pytest.fixture(params=sorted(BACKENDS))
async def store_config(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Config]:
    """A fresh store of each backend."""
    async with BACKENDS[request.param](tmp_path) as config:
        yield config


@attrs.frozen
class Double:
    n: int


async def double(job: Double, ctx: pipeline.JobContext) -> int:
    return job.n * 2


def doubling_registry() -> Registry:
    reg = registry()
    reg.register("double", Double, double)
    return reg


def waits_on_the_loop(client: pipeline.Client) -> int:
    """How many calls are running as tasks on the client's own loop (from any thread but its own)."""
    nursery, token = client._nursery, client._token
    assert nursery is not None and token is not None
    return trio.from_thread.run_sync(lambda: len(nursery.child_tasks), trio_token=token)


def waiting_for(client: pipeline.Client, job_id: str) -> int:
    """How many result() waits on ``job_id`` are asleep on the client's loop right now."""
    pipe, token = client._pipeline, client._token
    assert pipe is not None and token is not None

    def count() -> int:
        finished = pipe._finished.get(job_id)
        return 0 if finished is None else finished.statistics().tasks_waiting

    return trio.from_thread.run_sync(count, trio_token=token)


def eventually(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Wait (in a thread) until ``check()`` holds; AssertionError naming ``what`` after ``timeout``."""
    done = threading.Event()
    deadline = timeout
    while not check():
        if deadline <= 0:
            raise AssertionError(f"not so after {timeout} s: {what}")
        done.wait(0.02)
        deadline -= 0.02


async def cancel_for_good(config: Config, job_id: str) -> None:
    """Cancel a job through a backend of its own: ends any wait a broken client still runs on it."""
    async with open_backend(config) as backend:
        await backend.cancel([job_id], reason="the test is over")


# -- item 14: result(id, timeout=0) on a finished job; a negative timeout ------------------------------


async def test_result_with_timeout_zero_answers_a_finished_job_and_a_bad_timeout_is_named(store_config: Config) -> None:
    reg = doubling_registry()
    async with pipeline.open_pipeline(store_config, reg) as service:
        job_id = await service.enqueue(Double(21))
        await wait_status(service, job_id, "completed")
        assert await service.result(job_id, timeout=0) == 42
        pending = await service.enqueue(Tick(1), run_after=4e9)  # due in 2096
        with pytest.raises(TimeoutError, match="did not finish within 0 s"):
            await service.result(pending, timeout=0)
        for bad in (-1, -0.001, math.nan, "5", True):
            with pytest.raises(pipeline.UsageError, match=r"timeout must be a number of seconds >= 0"):
                await service.result(job_id, timeout=bad)  # type: ignore[arg-type]

        def from_a_thread() -> None:
            with pipeline.Client(registry=reg, config=store_config) as client:
                assert client.result(job_id, timeout=0) == 42
                with pytest.raises(pipeline.UsageError, match=r"timeout must be a number of seconds >= 0 .*got -1"):
                    client.result(job_id, timeout=-1)

        await trio.to_thread.run_sync(from_a_thread)

        async def from_asyncio() -> None:
            async with pipeline.AsyncClient(registry=reg, config=store_config) as client:
                assert await client.result(job_id, timeout=0) == 42
                with pytest.raises(pipeline.UsageError, match="timeout must be a number of seconds >= 0"):
                    await client.result(job_id, timeout=-1)

        await trio.to_thread.run_sync(lambda: asyncio.run(from_asyncio()))


# -- items 3 and 11: waits abandoned by their caller, waits close() ends ------------------------------


async def test_an_abandoned_async_result_wait_stops_at_once_and_close_ends_the_others(store_config: Config) -> None:
    reg = registry()

    async def app() -> BaseException | None:
        client = await pipeline.AsyncClient(registry=reg, config=store_config).open()
        sync = client._client
        assert sync is not None
        job_id = await client.enqueue(Tick(1), delay=3600)  # nobody runs it: every wait on it would last an hour
        try:
            for _ in range(50):  # callers that give up
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(client.result(job_id), 0.01)
            await asyncio.to_thread(eventually, lambda: waits_on_the_loop(sync) == 0,
                                    "the 50 abandoned result() waits have stopped")
            waiter = asyncio.create_task(client.result(job_id))  # one still waiting when the client closes
            await asyncio.to_thread(eventually, lambda: waits_on_the_loop(sync) == 1, "the wait is running")
            await asyncio.wait_for(client.close(), 20)  # (it waited for the job: an hour)
            try:
                await waiter
            except Exception as exc:  # noqa: BLE001 - what a caller's `except Exception` gets
                caught: BaseException | None = exc
            else:
                caught = None
            with pytest.raises(pipeline.ClientClosed, match="closed"):
                await client.enqueue(Tick(2))
            return caught
        finally:
            if sync._thread.is_alive():  # it did not close: end the waits that hold it
                await cancel_for_good_async(store_config, job_id)
                await asyncio.to_thread(sync.close)

    caught = await trio.to_thread.run_sync(lambda: asyncio.run(app()))
    assert isinstance(caught, pipeline.ClientClosed), caught
    assert isinstance(caught, pipeline.PipelineClosed)  # the documented family of "takes no more calls"


async def cancel_for_good_async(config: Config, job_id: str) -> None:
    """cancel_for_good from an asyncio loop: a trio loop of its own in a thread."""
    await asyncio.to_thread(lambda: trio.run(cancel_for_good, config, job_id))


async def test_a_trio_caller_cancelled_in_async_result_stops_the_wait(store_config: Config) -> None:
    reg = registry()
    async with pipeline.AsyncClient(registry=reg, config=store_config) as client:
        job_id = await client.enqueue(Tick(1), delay=3600)
        sync = client._client
        assert sync is not None
        try:
            for _ in range(20):
                with trio.move_on_after(0.01):
                    await client.result(job_id)
            await trio.to_thread.run_sync(lambda: eventually(lambda: waits_on_the_loop(sync) == 0,
                                                             "the 20 abandoned result() waits have stopped"))
        finally:
            await cancel_for_good(store_config, job_id)


async def test_sync_close_hands_a_thread_waiting_in_result_client_closed(store_config: Config) -> None:
    reg = registry()

    def scenario() -> list[BaseException]:
        client = pipeline.Client(registry=reg, config=store_config)
        job_id = client.enqueue(Tick(1), delay=3600)
        got: list[BaseException] = []

        def wait() -> None:
            try:
                client.result(job_id)
            except Exception as exc:  # noqa: BLE001 - a caller's ordinary handler must be enough
                got.append(exc)
            except BaseException as exc:  # noqa: BLE001 - trio.Cancelled before: recorded, the test fails
                got.append(exc)

        waiters = [threading.Thread(target=wait) for _ in range(3)]
        for t in waiters:
            t.start()
        try:
            eventually(lambda: waiting_for(client, job_id) == 3, "the three waits are running")
            closing = threading.Thread(target=client.close)
            closing.start()
            closing.join(20)
            assert not closing.is_alive(), "close() waited for the result() waits"
            for t in waiters:
                t.join(20)
            for call in (lambda: client.enqueue(Tick(2)), lambda: client.result(job_id, timeout=0)):
                try:
                    call()
                except Exception as exc:  # noqa: BLE001 - compared below, after the waits' own
                    got.append(exc)
            return got
        finally:
            trio.run(cancel_for_good, store_config, job_id)
            client.close()

    got = await trio.to_thread.run_sync(scenario)
    assert [type(exc).__name__ for exc in got] == ["ClientClosed"] * 5, got  # 3 waits, then 2 calls after close
    assert all("closed" in str(exc) for exc in got)


# -- item 10: naive datetimes refused, one rule at every door ------------------------------------------

NAIVE = dt.datetime.now() + dt.timedelta(minutes=30)  # "now + 30 min" on the caller's wall clock: which zone?
AWARE = (dt.datetime.now(dt.timezone(dt.timedelta(hours=9))) + dt.timedelta(minutes=30)).replace(microsecond=0)  # Tokyo's


def naive_error(error: BaseException, what: str) -> None:
    message = str(error)
    assert isinstance(error, pipeline.UsageError), repr(error)
    assert message.startswith(f"{what} ") and "naive datetime" in message, message
    assert "datetime.now(timezone.utc)" in message, message


async def test_a_naive_datetime_is_refused_by_pipeline_clients_and_testing_and_nothing_is_written(store_config: Config) -> None:
    reg = registry()
    errors: list[tuple[BaseException, str]] = []

    async def refused(what: str, call: Callable[[], Any]) -> None:
        with pytest.raises(pipeline.UsageError) as caught:
            await call()
        errors.append((caught.value, what))

    async with pipeline.open_pipeline(store_config.replace(worker=attrs.evolve(store_config.worker, enabled=False)),
                                      reg) as p:
        await refused("run_after", lambda: p.enqueue(Tick(1), run_after=NAIVE))
        await refused("expires_at", lambda: p.enqueue(Tick(1), expires_at=NAIVE))
        await refused("expires_at", lambda: p.enqueue_many([Tick(1), Tick(2)], expires_at=NAIVE))
        await refused("run_after", lambda: p.enqueue(Tick(1), run_after=NAIVE.isoformat() + "x"))  # not a time at all
        errors.pop()  # (that one says "not an ISO 8601 time": checked below)
        aware = await p.enqueue(Tick(3), run_after=AWARE, expires_at=AWARE + dt.timedelta(hours=1))
        stored = await p.backend.get(aware)
        assert stored is not None
        assert stored.run_after == AWARE.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")  # the instant meant

    def from_a_thread() -> list[tuple[BaseException, str]]:
        found = []
        with pipeline.Client(registry=reg, config=store_config) as client:
            for what, call in (("run_after", lambda: client.enqueue(Tick(1), run_after=NAIVE)),
                               ("expires_at", lambda: client.enqueue(Tick(1), expires_at=NAIVE))):
                with pytest.raises(pipeline.UsageError) as caught:
                    call()
                found.append((caught.value, what))
        return found

    errors += await trio.to_thread.run_sync(from_a_thread)

    async def from_asyncio() -> list[tuple[BaseException, str]]:
        found = []
        async with pipeline.AsyncClient(registry=reg, config=store_config) as client:
            for what, call in (("run_after", lambda: client.enqueue(Tick(1), run_after=NAIVE)),
                               ("expires_at", lambda: client.enqueue(Tick(1), expires_at=NAIVE))):
                with pytest.raises(pipeline.UsageError) as caught:
                    await call()
                found.append((caught.value, what))
        return found

    errors += await trio.to_thread.run_sync(lambda: asyncio.run(from_asyncio()))
    async with pipeline.testing.open_test_pipeline(reg) as tp:
        await refused("run_after", lambda: tp.enqueue(Tick(1), run_after=NAIVE))
        assert await tp.drain() == []
    assert len(errors) == 8
    for error, what in errors:
        naive_error(error, what)
    async with open_backend(store_config) as backend:
        assert sum((await backend.stats())["by_status"].values()) == 1  # the aware one alone


def test_iso_text_without_an_offset_is_refused_by_the_cli_naming_the_fix(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline.cli import main

    code = main(["enqueue", "generate_sitemap", "--run-after", "2030-01-02T03:04:05"], stdout=io.StringIO())
    err = capsys.readouterr().err
    assert code == 2, err
    assert "run_after '2030-01-02T03:04:05' has no UTC offset" in err and "'2030-01-02T03:04:05Z'" in err, err
    line = json.dumps({"job_type": "generate_sitemap", "payload": {}, "expires_at": "2031-01-01 00:00"})
    (db.parent / "jobs.jsonl").write_text(line + "\n")
    code = main(["enqueue", "--from-file", str(db.parent / "jobs.jsonl")], stdout=io.StringIO())
    err = capsys.readouterr().err
    assert code == 2 and "expires_at '2031-01-01 00:00' has no UTC offset" in err, err
    assert main(["enqueue", "generate_sitemap", "--run-after", "2030-01-02T03:04:05+09:00"], stdout=io.StringIO()) == 0
    capsys.readouterr()


async def test_iso_text_without_an_offset_is_refused_by_the_admin_api(db_path: Path) -> None:
    from admin_harness import seed_registry
    from test_admin_api import api_config, assert_error, served

    async with served(api_config(db_path), seed_registry()) as (p, client):
        for field in ("run_after", "expires_at"):
            r = await client.post("/admin/jobs", json={"job_type": "generate_sitemap", field: "2030-01-02T03:04:05"})
            assert_error(r, 422, f"{field} '2030-01-02T03:04:05' has no UTC offset", "2030-01-02T03:04:05Z")
        r = await client.post("/admin/jobs", json={"job_type": "generate_sitemap", "run_after": "2030-01-02T03:04:05Z"})
        assert r.status_code in (200, 201), r.text
        assert sum((await p.backend.stats())["by_status"].values()) == 1  # the one with an offset alone


# -- item 6: a lone surrogate refused at the door; one bad request never harms the others -------------

LONE = "a\ud800b"  # a str holds it (a JSON "\ud800" escape, bytes decoded with surrogateescape); no store's text does


@attrs.frozen
class Tenanted:
    tenant: str


async def tenanted(job: Tenanted, ctx: pipeline.JobContext) -> None:
    await trio.lowlevel.checkpoint()


def text_registry() -> Registry:
    reg = registry()
    # a key made from the payload (here: a byte string decoded with surrogateescape), not the payload itself
    reg.register("tenanted", Tenanted, tenanted, limit_key=lambda job: job.tenant.encode().decode("ascii", "surrogateescape"),
                 key_limit=1)
    return reg


def refused_as_not_text(error: BaseException, what: str) -> None:
    assert isinstance(error, pipeline.UsageError), repr(error)
    assert what in str(error) and "surrogate" in str(error), str(error)


async def test_a_lone_surrogate_is_refused_naming_its_field_and_the_store_goes_on(store_config: Config) -> None:
    reg = text_registry()
    quiet = store_config.replace(worker=attrs.evolve(store_config.worker, enabled=False))
    async with pipeline.open_pipeline(quiet, reg) as p:
        parent = await p.enqueue(Tick(1), run_after=4e9)
        calls: list[tuple[str, Callable[[], Any]]] = [
            ("trace", lambda: p.enqueue(Tick(1), trace=f"00-{LONE}")),
            ("trace", lambda: p.enqueue_many([Tick(1), Tick(2)], trace=LONE)),
            ("trace", lambda: p.emit(pipeline_event(), trace=LONE)),
            ("after", lambda: p.enqueue(Tick(1), after=[LONE])),
            ("after", lambda: p.enqueue(Tick(1), after=[parent, LONE])),
            ("unique_key", lambda: p.enqueue(Tick(1), unique_key=LONE)),
            ("unique_key", lambda: p.enqueue_many([Tick(1)], unique_keys=[LONE])),
            ("limit key", lambda: p.enqueue(Tenanted("é"))),
            ("job id", lambda: p.cancel(LONE)),
            ("job id", lambda: p.result(LONE, timeout=0)),
            ("batch id", lambda: p.batch(LONE)),
        ]
        for what, call in calls:
            with pytest.raises(pipeline.UsageError) as caught:
                await call()
            refused_as_not_text(caught.value, what)
            assert await p.enqueue(Tick(2), run_after=4e9)  # the store (its write loop) still answers

    def from_a_thread() -> list[tuple[BaseException, str]]:
        found = []
        with pipeline.Client(registry=reg, config=store_config) as client:
            for what, call in (("after", lambda: client.enqueue(Tick(1), after=[LONE])),
                               ("after", lambda: client.enqueue(Tick(1), after=[parent, LONE])),
                               ("unique_key", lambda: client.enqueue(Tick(1), unique_key=LONE)),
                               ("limit key", lambda: client.enqueue_many([Tenanted("é")])),
                               ("job id", lambda: client.get(LONE)),
                               ("job id", lambda: client.cancel(LONE)),
                               ("job id", lambda: client.result(LONE))):
                with pytest.raises(pipeline.UsageError) as caught:
                    call()
                found.append((caught.value, what))
                assert client.enqueue(Tick(3), delay=3600)  # the client still works
            reg.trace_context = lambda: f"00-{LONE}"  # the caller's trace context, as a propagator gave it
            try:
                with pytest.raises(pipeline.UsageError) as caught:
                    client.enqueue(Tick(1))
                found.append((caught.value, "trace"))
            finally:
                reg.trace_context = None
            assert client.enqueue(Tick(3), delay=3600)
        return found

    refusals = await trio.to_thread.run_sync(from_a_thread)

    async def from_asyncio() -> list[tuple[BaseException, str]]:
        found = []
        async with pipeline.AsyncClient(registry=reg, config=store_config) as client:
            for what, call in (("after", lambda: client.enqueue(Tick(1), after=[LONE])),
                               ("job id", lambda: client.get(LONE))):
                with pytest.raises(pipeline.UsageError) as caught:
                    await call()
                found.append((caught.value, what))
                assert await client.enqueue(Tick(3), delay=3600)
        return found

    refusals += await trio.to_thread.run_sync(lambda: asyncio.run(from_asyncio()))
    assert len(refusals) == 10
    for error, what in refusals:
        refused_as_not_text(error, what)
    async with open_backend(store_config) as backend:  # what was written: the parent and the good jobs, nothing else
        assert (await backend.stats())["by_status"].get("pending") == 1 + len(calls) + 7 + 1 + 2


def pipeline_event() -> Any:
    from jobkit import KeyedWork

    return KeyedWork("k")


async def test_a_lone_surrogate_is_refused_by_the_admin_api_and_the_cli(store_config: Config, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from admin_harness import seed_registry
    from conftest import fast_config
    from test_admin_api import assert_error, served

    from pipeline.cli import main

    api = store_config.replace(admin=fast_config(Path("x.db"), admin_port=0).admin,
                               worker=attrs.evolve(store_config.worker, enabled=False))
    async with served(api, seed_registry()) as (p, client):
        for body in ({"job_type": "generate_sitemap", "after": ["a\ud800b"]},
                     {"job_type": "generate_sitemap", "unique_key": "a\ud800b"}):
            r = await client.post("/admin/jobs", content=json.dumps(body).encode())  # the \ud800 escape, as JSON sends it
            assert_error(r, 400, "unpaired UTF-16 surrogate")  # the whole body refused, before any field is read
        r = await client.post("/admin/jobs", json={"job_type": "generate_sitemap"})
        assert r.status_code in (200, 201), r.text
    monkeypatch.setenv("DATABASE_URL", store_config.database_url)
    monkeypatch.setenv("REDIS_ALLOW_NON_DURABLE", "true")  # as the test store's config says (a throw-away server)
    lines = tmp_path / "jobs.jsonl"  # JSON lines carry a lone surrogate as an escape, which json.loads keeps
    for field, value in (("after", ["a\ud800b"]), ("unique_key", "a\ud800b")):
        lines.write_text(json.dumps({"job_type": "generate_sitemap", "payload": {}, field: value}) + "\n")
        code = await trio.to_thread.run_sync(lambda: main(["enqueue", "--from-file", str(lines)], stdout=io.StringIO()))
        err = capsys.readouterr().err
        assert code == 2 and "unpaired UTF-16 surrogate" in err, err  # the whole line refused, before its fields
    async with open_backend(store_config) as backend:
        assert sum((await backend.stats())["by_status"].values()) == 1


# -- what a new user tripped over: a chain handed to enqueue; pausing a type from a client -------------


async def test_a_chain_handed_to_enqueue_points_at_enqueue_many(store_config: Config) -> None:
    reg = registry()
    quiet = store_config.replace(worker=attrs.evolve(store_config.worker, enabled=False))

    def says_enqueue_many(error: BaseException) -> None:
        assert isinstance(error, pipeline.UsageError), repr(error)
        assert "enqueue_many(chain)" in str(error) and "not a registered job type" not in str(error), str(error)

    async with pipeline.open_pipeline(quiet, reg) as p:
        with pytest.raises(pipeline.UsageError) as caught:
            await p.enqueue(pipeline.chain(Tick(1), Tick(2)))
        says_enqueue_many(caught.value)
        assert len(await p.enqueue_many(pipeline.chain(Tick(1), Tick(2)))) == 2  # what the message says works

    def from_a_thread() -> BaseException:
        with pipeline.Client(registry=reg, config=store_config) as client, pytest.raises(pipeline.UsageError) as caught:
            client.enqueue(pipeline.chain(Tick(1), Tick(2)))
        return caught.value

    says_enqueue_many(await trio.to_thread.run_sync(from_a_thread))

    async def from_asyncio() -> BaseException:
        async with pipeline.AsyncClient(registry=reg, config=store_config) as client:
            with pytest.raises(pipeline.UsageError) as caught:
                await client.enqueue(pipeline.chain(Tick(1), Tick(2)))
            return caught.value

    says_enqueue_many(await trio.to_thread.run_sync(lambda: asyncio.run(from_asyncio())))
    async with open_backend(store_config) as backend:
        assert sum((await backend.stats())["by_status"].values()) == 2  # the enqueue_many's two alone


async def test_clients_pause_and_resume_a_type(store_config: Config) -> None:
    reg = registry()

    def from_a_thread() -> None:
        with pipeline.Client(registry=reg, config=store_config) as client:
            client.pause_type("tick")
            with pytest.raises(pipeline.UsageError, match="unknown job type 'nope'"):
                client.pause_type("nope")

    await trio.to_thread.run_sync(from_a_thread)
    async with pipeline.open_pipeline(store_config, reg) as service:
        assert await service.backend.paused_types() == {"tick"}
        paused = await service.enqueue(Tick(1))
        done = await service.enqueue(Echo("not paused"))
        await wait_status(service, done, "completed")
        assert (await service.backend.get(paused)).status == "pending"  # type: ignore[union-attr]

        async def from_asyncio() -> None:
            async with pipeline.AsyncClient(registry=reg, config=store_config) as client:
                await client.resume_type("tick")

        await trio.to_thread.run_sync(lambda: asyncio.run(from_asyncio()))
        assert await service.backend.paused_types() == set()
        await wait_status(service, paused, "completed")  # the service takes it up once resumed

    async def pause_from_asyncio() -> None:
        async with pipeline.AsyncClient(registry=reg, config=store_config) as client:
            await client.pause_type("echo")

    await trio.to_thread.run_sync(lambda: asyncio.run(pause_from_asyncio()))

    def resume_from_a_thread() -> None:
        with pipeline.Client(registry=reg, config=store_config) as client:
            client.resume_type("echo")

    async with open_backend(store_config) as backend:
        assert await backend.paused_types() == {"echo"}
        await trio.to_thread.run_sync(resume_from_a_thread)
        assert await backend.paused_types() == set()


# -- promises a mutation slipped past: tracestate travels; drain() answers oldest first ---------------


@attrs.frozen
class Traced:
    n: int


async def test_the_enqueuers_tracestate_is_stored_with_the_job_and_the_handlers_span_sees_it(store_config: Config) -> None:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    import pipeline.otel

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    seen: list[tuple[str, TraceState]] = []
    reg = Registry()

    async def traced(job: Traced, ctx: pipeline.JobContext) -> None:
        seen.append((ctx.trace or "", trace.get_current_span().get_span_context().trace_state))

    reg.register("traced", Traced, traced)
    pipeline.otel.instrument(reg, tracer_provider=provider)
    # the request's incoming context, as a propagator extracts it from traceparent and tracestate headers
    state = TraceState([("vendor", "a1b2"), ("other", "t61rcWkgMzE")])
    incoming = SpanContext(trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736, span_id=0x00F067AA0BA902B7, is_remote=True,
                           trace_flags=TraceFlags(TraceFlags.SAMPLED), trace_state=state)
    try:
        async with pipeline.open_pipeline(store_config, reg) as p:
            token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(incoming)))
            try:
                with provider.get_tracer("test").start_as_current_span("handle request"):
                    job_id = await p.enqueue(Traced(1))
            finally:
                otel_context.detach(token)
            await wait_status(p, job_id, "completed")
    finally:
        provider.shutdown()
    ((stored, handler_state),) = seen  # ctx.trace: the job's trace context as the store gave it back with the job
    traceparent, _, tracestate = stored.partition(" ")
    assert traceparent.startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-"), stored
    assert tracestate == state.to_header() == "vendor=a1b2,other=t61rcWkgMzE", stored
    assert handler_state == state, handler_state  # the attempt's span continues the enqueuer's vendors' state


@attrs.frozen
class Step:
    name: str
    spawn: bool = False


async def test_drain_answers_every_record_oldest_first_follow_ups_last() -> None:
    reg = Registry()

    async def step(job: Step, ctx: pipeline.JobContext) -> None:
        if job.spawn:
            await ctx.emit(Spawned(job.name))

    reg.register("step", Step, step)
    reg.add_event("spawned", Spawned, lambda event, config: [pipeline.Routed(Step(f"{event.name}'s follow-up"))])
    async with pipeline.testing.open_test_pipeline(reg) as p:
        # enqueued in this order, run in another (priority), so only the enqueue order explains the answer
        ids = [await p.enqueue(Step("first"), priority=9), await p.enqueue(Step("second", spawn=True), priority=1),
               await p.enqueue(Step("third"), priority=5)]
        records = await p.drain()
    assert [r.id for r in records][:3] == ids, [r.payload for r in records]  # oldest first, as docs/testing.md says
    assert len(records) == 4 and "second's follow-up" in records[3].payload  # made last, listed last
    assert [r.status for r in records] == ["completed"] * 4


@attrs.frozen
class Spawned:
    name: str
