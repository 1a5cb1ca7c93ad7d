"""The package's annotations hold: mypy on pipeline/, with pyproject.toml's settings."""

from __future__ import annotations

import sys
from pathlib import Path

import early
import pytest

ROOT = Path(__file__).resolve().parent.parent
MYPY = "test_types.py::test_mypy_finds_nothing_in_the_package"
# started as the run begins (early.py)
early.command(MYPY, lambda folder: [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                                    str(ROOT / "pipeline")], cwd=ROOT)


@pytest.mark.slow
def test_mypy_finds_nothing_in_the_package() -> None:
    result, _ = early.result(MYPY, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_package_says_it_is_typed() -> None:
    assert (ROOT / "pipeline" / "py.typed").is_file()
