"""The README's embedding example runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_embedding_example_runs(tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text()
    code = re.search(r"## Embedding.*?```python\n(.*?)```", text, re.S).group(1)  # type: ignore[union-attr]
    script = tmp_path / "example.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "resizing u42 to 128px" in proc.stdout
    assert "status='completed'" in proc.stdout


def test_ci_runs_the_readmes_test_command_verbatim() -> None:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)\n```", text, re.S)
    start, test = blocks[0], blocks[1]
    assert "python -m pipeline" in start and "pytest" in test
    assert test in (ROOT / ".ci" / "run").read_text().splitlines()
