"""The conformance suite's fixtures: every test here runs against each backend of
stores.BACKENDS, opened only through the public factory ``open_backend(config)``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pipeline import Config
from pipeline.backends import Backend, open_backend

from .stores import BACKENDS


@pytest.fixture(params=sorted(BACKENDS))
async def store_config(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Config]:
    """The Config of a fresh store of each backend: for tests that open a second backend on
    the same store, or hand its DATABASE_URL to other processes."""
    async with BACKENDS[request.param](tmp_path) as config:
        yield config


@pytest.fixture
async def backend(store_config: Config) -> AsyncIterator[Backend]:
    """The backend open on a fresh store."""
    async with open_backend(store_config) as opened:
        yield opened
