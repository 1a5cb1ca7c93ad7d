"""docs/reliability.md points at tests and scripts that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_test_the_reliability_promise_names_exists() -> None:
    text = (ROOT / "docs" / "reliability.md").read_text()
    assert _named_tests_exist(text) >= 30
    for script in re.findall(r"`python (benchmarks/\w+\.py)", text):
        assert (ROOT / script).exists(), script


def test_every_test_the_security_page_names_exists() -> None:
    assert _named_tests_exist((ROOT / "docs" / "security.md").read_text()) >= 25


def _named_tests_exist(text: str) -> int:
    """Check every `tests/...py::name` (or `::name` after one) in ``text``; how many there were."""
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
    return named


def test_every_setting_is_documented_with_its_default() -> None:
    import attrs

    from pipeline.config import ENGINE_SECTIONS, Config, variables
    from pipeline.site.settings import SECTIONS

    text = (ROOT / "docs" / "configuration.md").read_text()
    sections = [Config, *ENGINE_SECTIONS.values(), *SECTIONS]
    documented = 0
    for section in sections:
        for env, field in variables(section):
            row = re.search(rf"^\| `{env}` \| ([^|]+) \|", text, re.M)
            assert row, f"{env} is not in docs/configuration.md"
            default = field.default
            if default not in (None, "", ()) and not isinstance(default, bool):
                shown = f"{default:.15g}" if isinstance(default, float) else str(default)
                assert shown in row.group(1).replace(",", ""), f"{env}: the docs say {row.group(1).strip()}, the code {default!r}"
            documented += 1
    assert documented >= 35 and attrs.has(Config)
