"""pipeline: durable background jobs for trio applications, on SQLite.

    async with pipeline.open_pipeline(config, registry) as p:
        job_id = await p.enqueue(SendEmail(to=..., subject=..., body=...))
        job_ids = await p.emit(UserRegistered(user_id=..., email=..., username=...))
"""

from .app import Pipeline, open_pipeline
from .cli import serve
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
from .outbox import enqueue_in_transaction
from .pools import JobContext
from .queue import JobQueue, Lease, NewJob, SqliteJobQueue
from .registry import Registry
from .states import Status

__all__ = [
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
    "JobQueue",
    "Lease",
    "MediaUploaded",
    "NewJob",
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
    "SqliteJobQueue",
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
