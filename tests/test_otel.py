"""pipeline.otel (issue 22, item 7): a span per attempt with the job's attributes, whose parent is
the span that enqueued the job, across processes, on each store. Real spans from
opentelemetry-sdk: the producer's exported in memory, the worker's (``python -m pipeline --app``
in a process of its own) written by a JSON-lines exporter in the application's module.

Retries: every attempt's span has the enqueue's span as its parent, so a job's attempts are
siblings (no span links)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from app_harness import Service, app_env
from backends.stores import on_each_store
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import pipeline
import pipeline.otel
import pipeline.testing
from pipeline import Config


@dataclasses.dataclass
class Greet:
    name: str


@dataclasses.dataclass
class Flaky:
    name: str


@dataclasses.dataclass
class Greeted:
    name: str


@dataclasses.dataclass
class Said:  # an event: routed to a Greeted job
    name: str


def greeted(event: Said, config: Config) -> list[pipeline.Routed]:
    return [pipeline.Routed(Greeted(event.name))]


@contextmanager
def exporting() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """A tracer provider whose finished spans are kept in memory, shut down at the end."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        yield provider, exporter
    finally:
        provider.shutdown()


@pytest.fixture
def exported() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    with exporting() as pair:
        yield pair


def hex_ids(span: ReadableSpan) -> tuple[str, str]:
    assert span.context is not None
    return format(span.context.trace_id, "032x"), format(span.context.span_id, "016x")


def parent_of(span: ReadableSpan) -> tuple[str, str] | None:
    return None if span.parent is None else (format(span.parent.trace_id, "032x"), format(span.parent.span_id, "016x"))


# -- in one process: pipeline.testing, the real engine -------------------------------------------


async def test_each_attempt_is_a_child_of_the_enqueue_and_follow_ups_of_the_attempt(
    exported: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = exported
    registry = pipeline.Registry()
    seen: dict[str, Any] = {}

    @registry.job(max_attempts=3)
    def flaky(job: Flaky, ctx: pipeline.JobContext) -> None:  # a sync handler: in a worker thread
        if ctx.attempt < 3:
            raise RuntimeError(f"attempt {ctx.attempt} fails")

    @registry.job
    async def greet(job: Greet, ctx: pipeline.JobContext) -> None:
        seen.setdefault("traces", []).append(ctx.trace)
        if job.name == "g":
            await ctx.emit(Said(job.name))  # its job: a child of this attempt's span

    @registry.job
    async def log_greeting(job: Greeted, ctx: pipeline.JobContext) -> None:
        pass

    registry.add_event("said", Said, greeted)
    pipeline.otel.instrument(registry, tracer_provider=provider)
    tracer = provider.get_tracer("test")

    async with pipeline.testing.open_test_pipeline(registry) as p:
        with tracer.start_as_current_span("web request"):
            flaky_id = await p.enqueue(Flaky("f"))
            greet_id = await p.enqueue(Greet("g"))
        plain_id = await p.enqueue(Greet("no span"))
        records = {r.id: r for r in await p.drain()}
    assert records[flaky_id].status == records[greet_id].status == records[plain_id].status == "completed"

    spans = exporter.get_finished_spans()
    (request,) = [s for s in spans if s.name == "web request"]
    attempts = sorted((s for s in spans if s.attributes and s.attributes.get("pipeline.job.id") == flaky_id),
                      key=lambda s: s.attributes["pipeline.job.attempt"] if s.attributes else 0)
    assert [s.attributes["pipeline.job.attempt"] for s in attempts if s.attributes] == [1, 2, 3]
    assert {parent_of(s) for s in attempts} == {hex_ids(request)}  # siblings under the enqueue
    assert [s.status.status_code for s in attempts] == [StatusCode.ERROR, StatusCode.ERROR, StatusCode.UNSET]
    assert all(s.name == "process flaky" and s.kind == SpanKind.CONSUMER for s in attempts)
    assert attempts[0].attributes is not None
    assert {k: attempts[0].attributes[k] for k in ("pipeline.job.type", "pipeline.job.max_attempts",
                                                    "messaging.system", "messaging.message.id")} == {
        "pipeline.job.type": "flaky", "pipeline.job.max_attempts": 3, "messaging.system": "pipeline",
        "messaging.message.id": flaky_id}
    assert any(e.name == "exception" for e in attempts[0].events)

    (greet_span,) = [s for s in spans if s.attributes and s.attributes.get("pipeline.job.id") == greet_id]
    assert parent_of(greet_span) == hex_ids(request)
    (follow_up,) = [s for s in spans if s.name == "process log_greeting"]
    assert parent_of(follow_up) == hex_ids(greet_span)  # emitted by the attempt: its child
    # the handler sees the stored context (traceparent "00-<trace id>-<span id>-<flags>"), or None
    assert seen["traces"].count(None) == 1 and sorted(seen["traces"], key=str)[0].split("-")[1] == hex_ids(request)[0]
    (root,) = [s for s in spans if s.attributes and s.attributes.get("pipeline.job.id") == plain_id]
    assert root.parent is None  # enqueued with no span current: a root, not the worker's context


async def test_a_run_that_suspends_is_not_an_error_on_its_span(exported: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = exported
    registry = pipeline.Registry()

    @registry.job
    async def greet(job: Greet, ctx: pipeline.JobContext) -> str:
        await ctx.sleep(3600)  # (the test pipeline's drain skips it)
        return await ctx.wait_for("go")

    pipeline.otel.instrument(registry, tracer_provider=provider)
    async with pipeline.testing.open_test_pipeline(registry) as p:
        job_id = await p.enqueue(Greet("g"))
        await p.drain()
        await p.signal(job_id, "go", "ok")
        assert await p.result(job_id) == "ok"
    runs = [s for s in exporter.get_finished_spans() if s.attributes and s.attributes.get("pipeline.job.id") == job_id]
    assert [(s.status.status_code, s.attributes.get("pipeline.job.suspended")) for s in runs if s.attributes] == [
        (StatusCode.UNSET, "sleeping"), (StatusCode.UNSET, "awaiting go"), (StatusCode.UNSET, None)]
    assert not any(e.name == "exception" for s in runs for e in s.events)


async def test_an_emit_and_enqueue_many_carry_the_current_span(exported: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = exported
    registry = pipeline.Registry()

    @registry.job
    async def log_greeting(job: Greeted, ctx: pipeline.JobContext) -> None:
        pass

    registry.add_event("said", Said, greeted)
    pipeline.otel.instrument(registry, tracer_provider=provider)
    tracer = provider.get_tracer("test")
    async with pipeline.testing.open_test_pipeline(registry) as p:
        with tracer.start_as_current_span("emitter"):
            (emitted,) = await p.emit(Said("e"))  # routed by the Enqueuer, in a task of its own
        with tracer.start_as_current_span("batch"):
            many = await p.enqueue_many([Greeted("a"), Greeted("b")])
        with tracer.start_as_current_span("overridden"):  # trace= wins over the current span
            explicit = await p.enqueue(Greeted("x"), trace="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        await p.drain()
    spans = exporter.get_finished_spans()
    named = {s.name: s for s in spans if s.name in ("emitter", "batch")}
    parents = {s.attributes["pipeline.job.id"]: parent_of(s) for s in spans if s.attributes and "pipeline.job.id" in s.attributes}
    assert parents == {emitted: hex_ids(named["emitter"]), many[0]: hex_ids(named["batch"]), many[1]: hex_ids(named["batch"]),
                       explicit: ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")}


def test_a_registry_is_instrumented_once_and_a_stored_context_parses_back() -> None:
    registry = pipeline.Registry()
    registry.register("greet", Greet)
    pipeline.otel.instrument(registry)
    with pytest.raises(pipeline.UsageError, match="instrumented already"):
        pipeline.otel.instrument(registry)
    assert pipeline.otel.parse("00-a-b-01 k=v,l=w") == {"traceparent": "00-a-b-01", "tracestate": "k=v,l=w"}


def test_the_package_imports_without_opentelemetry() -> None:
    """The core never imports opentelemetry; pipeline.otel imports it only when instrument() is called."""
    code = textwrap.dedent("""
        import sys
        sys.modules["opentelemetry"] = None  # as if not installed: any import of it fails
        import pipeline, pipeline.client, pipeline.cli, pipeline.testing, pipeline.otel
        assert pipeline.Registry().trace_context is None
        try:
            pipeline.otel.instrument(pipeline.Registry())
        except ImportError:
            print("refused")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "refused"


# -- across processes, on each store ----------------------------------------------------------------

APP = textwrap.dedent('''
    """An application traced with pipeline.otel; its spans go to a file, one JSON object a line."""
    import dataclasses
    import json
    import os

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    import pipeline
    import pipeline.otel


    class JsonLines(SpanExporter):
        def export(self, spans):
            with open(os.environ["SPANS_FILE"], "a") as out:
                for span in spans:
                    out.write(json.dumps({
                        "name": span.name,
                        "trace_id": format(span.context.trace_id, "032x"),
                        "span_id": format(span.context.span_id, "016x"),
                        "parent": None if span.parent is None else [format(span.parent.trace_id, "032x"),
                                                                    format(span.parent.span_id, "016x")],
                        "attributes": dict(span.attributes),
                        "status": span.status.status_code.name,
                        "pid": os.getpid(),
                    }) + "\\n")
            return SpanExportResult.SUCCESS


    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLines()))
    registry = pipeline.Registry()


    @dataclasses.dataclass
    class Greet:
        name: str


    @dataclasses.dataclass
    class Flaky:
        name: str


    @registry.job
    async def greet(job: Greet, ctx: pipeline.JobContext) -> None:
        pass


    @registry.job(max_attempts=3)
    def flaky(job: Flaky, ctx: pipeline.JobContext) -> None:
        if ctx.attempt == 1:
            raise RuntimeError("the first attempt fails")


    pipeline.otel.instrument(registry, tracer_provider=provider)
''')


def read_spans(path: Path, wanted: int, timeout: float = 15.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        spans = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        if len(spans) >= wanted:
            return spans
        assert time.monotonic() < deadline, f"{len(spans)} job spans within {timeout} s, not {wanted}: {spans}"
        time.sleep(0.05)


@pytest.mark.slow
async def test_the_span_that_enqueued_a_job_is_the_parent_of_its_attempts_in_the_worker_process(tmp_path: Path) -> None:
    """On each store, the three side by side (each mostly waits for its worker process)."""
    await on_each_store(tmp_path, traced_across_processes)


async def traced_across_processes(name: str, config: Config, tmp_path: Path) -> None:
    with exporting() as (provider, exporter):
        await parent_across_processes(config, tmp_path, provider, exporter)


async def parent_across_processes(config: Config, tmp_path: Path, provider: TracerProvider,
                                  exporter: InMemorySpanExporter) -> None:
    folder = tmp_path / "traced-app"
    folder.mkdir()
    (folder / "otelapp.py").write_text(APP)
    spans_file = tmp_path / "spans.jsonl"
    env = app_env(folder, config.database_url, SPANS_FILE=str(spans_file), WORKER_BACKOFF_BASE_MS="20",
                  WORKER_SHUTDOWN_TIMEOUT="2", REDIS_ALLOW_NON_DURABLE="true", ADMIN_PORT="0")  # not 8000: side by side

    # the producer: this process, its own registry of the same types (no handlers), instrumented
    registry = pipeline.Registry()
    registry.register("greet", Greet)
    registry.register("flaky", Flaky)
    pipeline.otel.instrument(registry, tracer_provider=provider)
    tracer = provider.get_tracer("test")

    service = Service(folder, env, "--app", "otelapp:registry")
    try:
        await trio.to_thread.run_sync(service.ready, 1, "flaky, greet")

        def enqueue_from_sync_code() -> str:  # a thread of its own, as a web framework's: the span is current here
            with pipeline.Client(config.database_url, registry=registry, config=config) as client:
                with tracer.start_as_current_span("sync request"):
                    return client.enqueue(Greet("from sync code"))

        greet_id = await trio.to_thread.run_sync(enqueue_from_sync_code)
        async with pipeline.AsyncClient(config.database_url, registry=registry, config=config) as client:
            with tracer.start_as_current_span("async request"):
                flaky_id = await client.enqueue(Flaky("twice"))

        spans = await trio.to_thread.run_sync(read_spans, spans_file, 3)
        assert await trio.to_thread.run_sync(service.stop) == 0
    finally:
        service.kill()

    by_name = {s.name: s for s in exporter.get_finished_spans()}
    sync_request, async_request = hex_ids(by_name["sync request"]), hex_ids(by_name["async request"])
    (greeted,) = [s for s in spans if s["attributes"]["pipeline.job.id"] == greet_id]
    assert (greeted["trace_id"], tuple(greeted["parent"])) == (sync_request[0], sync_request)
    assert greeted["name"] == "process greet" and greeted["status"] == "UNSET"
    assert {k: greeted["attributes"][k] for k in ("pipeline.job.type", "pipeline.job.attempt", "messaging.message.id")} == {
        "pipeline.job.type": "greet", "pipeline.job.attempt": 1, "messaging.message.id": greet_id}

    attempts = sorted((s for s in spans if s["attributes"]["pipeline.job.id"] == flaky_id),
                      key=lambda s: s["attributes"]["pipeline.job.attempt"])
    assert [(s["attributes"]["pipeline.job.attempt"], s["status"]) for s in attempts] == [(1, "ERROR"), (2, "UNSET")]
    assert {tuple(s["parent"]) for s in attempts} == {async_request}  # the retry: a sibling, under the same parent
    assert {s["trace_id"] for s in attempts} == {async_request[0]}
    assert len({s["span_id"] for s in attempts}) == 2
    assert {s["pid"] for s in spans} != {__import__("os").getpid()}  # recorded by the worker, not here
