"""The bundled site: a small blog's job types, events and handlers, built on the engine the
way any application would be (seed 7). ``python -m pipeline`` runs it by default: it is the app
``pipeline.site:registry`` (``--app``), and its commands ``demo`` and ``search`` are there then.

    registry = pipeline.site.default_registry(config)   # the ten job types, five events, handlers
    async with pipeline.open_pipeline(config, registry) as p:
        await p.emit(pipeline.site.UserRegistered(user_id="u1", email="a@example.com", username="ann"))

Its content (users, posts, media, the search index) lives in its own tables, created where
the site runs (schema.py, SITE_DATABASE_URL), reached by handlers as the ``"content"``
resource. The handler modules import their libraries (httpx, Pillow, redis) only when
:func:`default_registry` installs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..registry import Registry
from .events import BUILTIN_EVENTS, MediaUploaded, PostCreated, PostPublished, PostScheduled, UserRegistered
from .jobs import (
    BUILTIN_JOB_TYPES,
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
    register_hooks,
)

if TYPE_CHECKING:
    from ..config import Config

__all__ = [
    "Compress", "ConvertWebP", "GenerateSitemap", "GenerateThumbnail", "InvalidateCache", "MediaUploaded",
    "PostCreated", "PostPublished", "PostScheduled", "ProcessImage", "RebuildSearchIndex", "Resize",
    "ScheduledPublish", "SendEmail", "SendWelcomeEmail", "UserRegistered", "WebhookNotify",
    "default_registry", "registry", "require_demo", "types_registry",
]


def types_registry(**options: Any) -> Registry:
    """The site's ten job types and five events, no handlers attached: what the CLI checks
    jobs against, and what a process that only enqueues needs."""
    registry = Registry(**options)
    register_hooks(registry.converter)
    for name, job_cls in BUILTIN_JOB_TYPES.items():
        registry.register(name, job_cls)
    for name, (event_cls, route) in BUILTIN_EVENTS.items():
        registry.add_event(name, event_cls, route)
    return registry


def default_registry(config: Config) -> Registry:
    """The site's types with every handler attached, and their resources."""
    require_demo("the bundled demo app (pipeline.site:registry, what python -m pipeline runs without --app)",
                 otherwise="or run your own application with --app MODULE:ATTR (or PIPELINE_APP)")
    from . import cache, content, images, mail, webhook
    from .settings import SECTIONS

    for section in SECTIONS:  # a bad SMTP_PORT or WEBHOOK_URLS is refused now, not at the first job
        config.section(section)
    registry = types_registry()
    # each handler module attaches itself here, one line each
    mail.install(registry, config)
    cache.install(registry, config)
    images.install(registry, config)
    webhook.install(registry, config)
    content.install(registry, config)
    return registry


def require_demo(needed_by: str, *, otherwise: str = "") -> None:
    """The site's handlers need the ``demo`` extra (Pillow, httpx): without it, say so (its types
    alone, :func:`types_registry`, need nothing more than the core)."""
    from ..extras import require

    require("demo", needed_by, otherwise=otherwise)


def registry(config: Config) -> Registry:
    """The site as an app, ``python -m pipeline --app pipeline.site:registry`` (the default):
    what :func:`default_registry` gives."""
    return default_registry(config)
