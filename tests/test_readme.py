"""The README's embedding example runs as written."""

from __future__ import annotations

import json
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


def test_your_own_app_as_the_readme_shows_it_enqueues_from_the_cli(tmp_path: Path) -> None:
    """The README's first example: myapp/jobs.py as written, and its enqueue command as written."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Your jobs, your app"):]
    code = re.search(r"```python\n(# myapp/jobs.py\n.*?)```", section, re.S).group(1)  # type: ignore[union-attr]
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "jobs.py").write_text(code)
    commands = re.search(r"```sh\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]
    enqueue = next(line.split("  #")[0].strip() for line in commands.splitlines() if " enqueue " in line)
    env = {"PATH": "/usr/bin:/bin", "DATABASE_URL": f"sqlite:///{tmp_path / 'app.db'}", "HOME": str(tmp_path)}
    proc = subprocess.run(enqueue.replace("python", sys.executable, 1), shell=True, cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import sqlite3

    with sqlite3.connect(tmp_path / "app.db") as conn:
        rows = conn.execute("SELECT id, job_type, payload, status FROM jobs").fetchall()
    assert [(i, t, json.loads(p), s) for i, t, p, s in rows] == [(proc.stdout.strip(), "resize_avatar", {"user_id": "u42", "size": 128}, "pending")]
