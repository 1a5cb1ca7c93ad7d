"""OpenTelemetry for jobs (the ``[otel]`` extra: ``pip install 'trio-pipeline[otel]'``).

    import pipeline.otel
    pipeline.otel.instrument(registry)                     # or tracer_provider=your_provider

Two things, on one registry, for every producer and worker that uses it:

* **The producer's trace context travels with the job.** Every enqueue and emit (``Pipeline``,
  ``pipeline.Client``, ``pipeline.AsyncClient``, a handler's ``ctx.emit``) captures the current
  span's W3C trace context (``traceparent``, and ``tracestate`` if any) and the store keeps it with
  the job, on SQLite, Postgres and Redis alike; a job enqueued with no span current has none.
* **A span per attempt.** A middleware opens a span (kind CONSUMER, named ``process <job type>``)
  around each handler call, sync or async, whose parent is that stored context: in the process
  that runs the job, however far from the one that enqueued it. Every attempt of one job has the
  same parent, so a job's retries are siblings under the enqueue's span, told apart by their
  ``pipeline.job.attempt``; no span links. A job without a stored context gets a root span.
  The handler's exception is recorded on the span and sets its status to ERROR (a run that leaves
  in ``ctx.sleep`` or ``ctx.wait_for`` is not an error: its span says ``pipeline.job.suspended``); jobs
  the handler enqueues or emits are children of its attempt's span.

Only this module imports ``opentelemetry`` (its API: the application brings the SDK and an
exporter); the rest of the package reaches it through ``Registry.trace_context`` and a middleware.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from .context import JobContext
from .engine.steps import Suspended
from .errors import UsageError
from .registry import Registry

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["instrument", "parse", "SYSTEM"]

SYSTEM = "pipeline"  # messaging.system: the attribute naming this job system on every span


def parse(trace: str) -> dict[str, str]:
    """A stored trace context as the W3C carrier it came from: ``traceparent``, and ``tracestate``
    when one was stored after the space (a traceparent has no space)."""
    parent, _, state = trace.partition(" ")
    return {"traceparent": parent, "tracestate": state} if state else {"traceparent": parent}


def _suspension(exc: BaseException) -> Suspended | None:
    """The suspension ``exc`` is, alone or in a group of the handler's nursery or TaskGroup; else None."""
    if isinstance(exc, Suspended):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        found, rest = exc.split(Suspended)
        if found is not None and rest is None:
            leaf: BaseException = found
            while isinstance(leaf, BaseExceptionGroup):
                leaf = leaf.exceptions[0]
            return leaf if isinstance(leaf, Suspended) else None
    return None


def instrument(registry: Registry, *, tracer_provider: TracerProvider | None = None) -> None:
    """Trace ``registry``'s jobs: store each producer's trace context with its jobs, and record a
    span per attempt under it (see the module's docstring). ``tracer_provider``: where the spans
    go (default: OpenTelemetry's global one). Call it once, before the pipeline or client opens,
    in every process that enqueues or runs the jobs (the service's ``--app`` module is one place
    for both). ImportError if opentelemetry-api is not installed (the ``otel`` extra, named in its message)."""
    from .extras import require

    require("otel", "pipeline.otel.instrument()")
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if registry.trace_context is not None:
        raise UsageError("this registry is instrumented already (its trace_context hook is set)")
    tracer = trace.get_tracer("pipeline", tracer_provider=tracer_provider)
    propagator = TraceContextTextMapPropagator()

    def trace_context() -> str | None:
        carrier: dict[str, str] = {}
        propagator.inject(carrier)
        parent = carrier.get("traceparent")
        if parent is None:  # no span is current (or it is not sampled in, as the propagator says)
            return None
        state = carrier.get("tracestate")
        return f"{parent} {state}" if state else parent

    @contextlib.asynccontextmanager
    async def span_per_attempt(ctx: JobContext) -> AsyncIterator[Any]:
        # the enqueuer's context, or none at all: a job's span never takes the worker's own
        # context (whatever span was current when the service started) as its parent
        parent = propagator.extract(parse(ctx.trace) if ctx.trace else {}, context=otel_context.Context())
        attributes: dict[str, str | int] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.destination.name": ctx.job_type,
            "messaging.message.id": ctx.id,
            "pipeline.job.id": ctx.id,
            "pipeline.job.type": ctx.job_type,
            "pipeline.job.attempt": ctx.attempt,
            "pipeline.job.max_attempts": ctx.max_attempts,
        }
        with tracer.start_as_current_span(f"process {ctx.job_type}", context=parent, kind=trace.SpanKind.CONSUMER,
                                          attributes=attributes, record_exception=False,
                                          set_status_on_exception=False) as span:
            try:
                yield span
            except BaseException as exc:
                how = _suspension(exc)
                if how is not None:  # ctx.sleep / ctx.wait_for: the run ends, not in error
                    span.set_attribute("pipeline.job.suspended", f"awaiting {how.awaiting}" if how.awaiting else "sleeping")
                else:  # what the SDK would record by default
                    span.record_exception(exc)
                    span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                raise

    registry.trace_context = trace_context
    registry.middleware(span_per_attempt)
