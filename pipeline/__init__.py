"""pipeline: durable background jobs for trio applications.

    registry = pipeline.Registry()
    registry.register("resize_avatar", ResizeAvatar, resize_avatar, concurrency=4)
    async with pipeline.open_pipeline(config, registry) as p:
        job_id = await p.enqueue(ResizeAvatar("u42"))

The engine's public names are here; the bundled site (its job types, events and handlers)
is ``pipeline.site``; the job backends are ``pipeline.backends``; the pipeline inside an asyncio
app (a FastAPI lifespan) is ``pipeline.aio.open_pipeline``.
"""

# Names are imported on first use (PEP 562), so that `python -m pipeline enqueue --from-file`
# and the other commands on the job store do not pay for the actors at start-up.

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from .backends import Backend, JobRecord
    from .backends.sqlite.outbox import enqueue_in_transaction
    from .client import AsyncClient, Client
    from .config import AdminSettings, Config, LogSettings, RedisSettings, RetentionSettings, SqliteSettings, WorkerSettings
    from .context import JobContext
    from .engine.wiring import Enqueued, Pipeline, open_pipeline
    from .errors import (
        ClientClosed,
        CommitUnknown,
        ConfigError,
        DatabaseUnavailable,
        InvalidPayload,
        JobCancelled,
        JobError,
        JobFailed,
        PermanentError,
        PipelineClosed,
        PipelineError,
        RetryLater,
        SchemaTooNew,
        SignalKeyUsed,
        SignalTimeout,
        Snooze,
        StoreError,
        UnknownEvent,
        UnknownJobType,
        UsageError,
    )
    from .registry import Registry, Routed
    from .service import serve
    from .states import Status
    from .workflows import Batch, BatchJob, BatchOutcome, Chain, chain

_MODULE_OF = {
    "AdminSettings": "config",
    "AsyncClient": "client",
    "Backend": "backends",
    "Batch": "workflows",
    "BatchJob": "workflows",
    "BatchOutcome": "workflows",
    "Chain": "workflows",
    "Client": "client",
    "ClientClosed": "errors",
    "CommitUnknown": "errors",
    "Config": "config",
    "ConfigError": "errors",
    "DatabaseUnavailable": "errors",
    "Enqueued": "engine.wiring",
    "InvalidPayload": "errors",
    "JobCancelled": "errors",
    "JobContext": "context",
    "JobError": "errors",
    "JobFailed": "errors",
    "JobRecord": "backends",
    "LogSettings": "config",
    "PermanentError": "errors",
    "Pipeline": "engine.wiring",
    "PipelineClosed": "errors",
    "PipelineError": "errors",
    "RedisSettings": "config",
    "Registry": "registry",
    "RetentionSettings": "config",
    "RetryLater": "errors",
    "Routed": "registry",
    "SchemaTooNew": "errors",
    "SignalKeyUsed": "errors",
    "SignalTimeout": "errors",
    "Snooze": "errors",
    "SqliteSettings": "config",
    "Status": "states",
    "StoreError": "errors",
    "UnknownEvent": "errors",
    "UnknownJobType": "errors",
    "UsageError": "errors",
    "WorkerSettings": "config",
    "chain": "workflows",
    "enqueue_in_transaction": "backends.sqlite.outbox",
    "open_pipeline": "engine.wiring",
    "serve": "service",
}

__all__ = [
    "AdminSettings",
    "AsyncClient",
    "Backend",
    "Batch",
    "BatchJob",
    "BatchOutcome",
    "Chain",
    "Client",
    "ClientClosed",
    "CommitUnknown",
    "Config",
    "ConfigError",
    "DatabaseUnavailable",
    "Enqueued",
    "InvalidPayload",
    "JobCancelled",
    "JobContext",
    "JobError",
    "JobFailed",
    "JobRecord",
    "LogSettings",
    "PermanentError",
    "Pipeline",
    "PipelineClosed",
    "PipelineError",
    "RedisSettings",
    "Registry",
    "RetentionSettings",
    "RetryLater",
    "Routed",
    "SchemaTooNew",
    "SignalKeyUsed",
    "SignalTimeout",
    "Snooze",
    "SqliteSettings",
    "Status",
    "StoreError",
    "UnknownEvent",
    "UnknownJobType",
    "UsageError",
    "WorkerSettings",
    "chain",
    "enqueue_in_transaction",
    "open_pipeline",
    "serve",
]


def __getattr__(name: str) -> _typing.Any:
    try:
        module = _MODULE_OF[name]
    except KeyError:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}") from None
    value = getattr(_importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # once found, a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
