"""The package's annotations hold: mypy on pipeline/, with pyproject.toml's settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_mypy_finds_nothing_in_the_package() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), str(ROOT / "pipeline")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_package_says_it_is_typed() -> None:
    assert (ROOT / "pipeline" / "py.typed").is_file()
