"""A small version of benchmarks/chaos.py: SIGKILLs during a burst lose nothing."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def load_chaos():
    spec = importlib.util.spec_from_file_location("chaos", ROOT / "benchmarks" / "chaos.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_kill_9_during_a_burst_loses_nothing(tmp_path: Path) -> None:
    chaos = load_chaos()
    out = io.StringIO()
    result = chaos.run_chaos(jobs=2000, workers=3, duration=8.0, kill_every=1.0, folder=tmp_path, out=out)
    print(out.getvalue())
    assert result["kills"] >= 4
    assert result["lost"] == 0, out.getvalue()
    assert result["not_completed"] == 0, out.getvalue()
    assert result["never_ran"] == 0, out.getvalue()
    assert result["unexplained_duplicates"] == 0, out.getvalue()
