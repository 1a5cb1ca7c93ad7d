"""The registry a pipeline gets when the caller passes none: the design's job types and
events. Handlers for the built-in types attach here as they land."""

from __future__ import annotations

from .config import Config
from .registry import Registry


def default_registry(config: Config) -> Registry:
    return Registry.with_builtins()
