"""docs/reliability.md points at tests and scripts that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_test_the_reliability_promise_names_exists() -> None:
    text = (ROOT / "docs" / "reliability.md").read_text()
    current = None
    named = 0
    for m in re.finditer(r"`(tests/[\w/]+\.py)?(?:::(\w+))?", text):
        path, name = m.group(1), m.group(2)
        if path:
            current = path
            assert (ROOT / path).exists(), path
        if name:
            assert current is not None, name
            source = (ROOT / current).read_text()
            assert re.search(rf"^(async )?def {name}\(|^{name} = |^class {name}\b", source, re.M), f"{current}::{name}"
            named += 1
    assert named >= 30
    for script in re.findall(r"`python (benchmarks/\w+\.py)", text):
        assert (ROOT / script).exists(), script
