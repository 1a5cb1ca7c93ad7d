"""The built-in handlers (seed 7), one module per subject, and the default registry.

A pipeline opened without a registry gets :func:`default_registry`: the design's ten
job types and five events, with every built-in handler attached.
"""

from __future__ import annotations

from ..config import Config
from ..registry import Registry
from . import cache, content, images, mail, webhook


def default_registry(config: Config) -> Registry:
    registry = Registry.with_builtins()
    # each built-in handler module attaches itself here, one line each
    mail.install(registry, config)
    cache.install(registry, config)
    images.install(registry, config)
    webhook.install(registry, config)
    content.install(registry, config)
    return registry
