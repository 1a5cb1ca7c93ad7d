"""pipeline: durable background jobs for trio applications, on SQLite.

    async with pipeline.open_pipeline(config, registry) as p:
        job_id = await p.enqueue(SendEmail(to=..., subject=..., body=...))
        job_ids = await p.emit(UserRegistered(user_id=..., email=..., username=...))
"""

# Names are imported on first use (PEP 562), so that `python -m pipeline enqueue --from-file`
# and the other commands that work on the database file do not pay for trio and the actors
# at start-up (measured: 0.2 s of a 2 s run).

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from .app import Pipeline, open_pipeline
    from .backends import Backend, JobRecord
    from .backends.sqlite.outbox import enqueue_in_transaction
    from .config import Config
    from .errors import (
        ConfigError,
        DatabaseUnavailable,
        InvalidPayload,
        JobError,
        PermanentError,
        PipelineClosed,
        PipelineError,
        RetryLater,
        SchemaTooNew,
        StoreError,
        UnknownEvent,
        UnknownJobType,
        UsageError,
    )
    from .events import MediaUploaded, PostCreated, PostPublished, PostScheduled, Routed, UserRegistered
    from .jobs import (
        Compress,
        ConvertWebP,
        GenerateSitemap,
        GenerateThumbnail,
        InvalidateCache,
        ProcessImage,
        RebuildSearchIndex,
        Resize,
        ScheduledPublish,
        SendEmail,
        SendWelcomeEmail,
        WebhookNotify,
    )
    from .pools import JobContext
    from .registry import Registry
    from .service import serve
    from .states import Status

_MODULE_OF = {
    "Backend": "backends",
    "Compress": "jobs",
    "Config": "config",
    "ConfigError": "errors",
    "ConvertWebP": "jobs",
    "DatabaseUnavailable": "errors",
    "GenerateSitemap": "jobs",
    "GenerateThumbnail": "jobs",
    "InvalidPayload": "errors",
    "InvalidateCache": "jobs",
    "JobContext": "pools",
    "JobError": "errors",
    "JobRecord": "backends",
    "MediaUploaded": "events",
    "PermanentError": "errors",
    "Pipeline": "app",
    "PipelineClosed": "errors",
    "PipelineError": "errors",
    "PostCreated": "events",
    "PostPublished": "events",
    "PostScheduled": "events",
    "ProcessImage": "jobs",
    "RebuildSearchIndex": "jobs",
    "Registry": "registry",
    "Resize": "jobs",
    "RetryLater": "errors",
    "Routed": "events",
    "ScheduledPublish": "jobs",
    "SchemaTooNew": "errors",
    "SendEmail": "jobs",
    "SendWelcomeEmail": "jobs",
    "Status": "states",
    "StoreError": "errors",
    "UnknownEvent": "errors",
    "UnknownJobType": "errors",
    "UsageError": "errors",
    "UserRegistered": "events",
    "WebhookNotify": "jobs",
    "enqueue_in_transaction": "backends.sqlite.outbox",
    "open_pipeline": "app",
    "serve": "service",
}

__all__ = [
    "Backend",
    "Compress",
    "Config",
    "ConfigError",
    "ConvertWebP",
    "DatabaseUnavailable",
    "GenerateSitemap",
    "GenerateThumbnail",
    "InvalidPayload",
    "InvalidateCache",
    "JobContext",
    "JobError",
    "JobRecord",
    "MediaUploaded",
    "PermanentError",
    "Pipeline",
    "PipelineClosed",
    "PipelineError",
    "PostCreated",
    "PostPublished",
    "PostScheduled",
    "ProcessImage",
    "RebuildSearchIndex",
    "Registry",
    "Resize",
    "RetryLater",
    "Routed",
    "ScheduledPublish",
    "SchemaTooNew",
    "SendEmail",
    "SendWelcomeEmail",
    "Status",
    "StoreError",
    "UnknownEvent",
    "UnknownJobType",
    "UsageError",
    "UserRegistered",
    "WebhookNotify",
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
