"""The wheel a user builds (`python -m build`) carries everything the service needs: installed
on its own, away from this source tree, `python -m pipeline` starts from it and serves the
dashboard with its static files (issue 22, item 8). Slow: the build fetches setuptools."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import early
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


WHEEL = "test_wheel.py::test_the_built_wheel_installs_on_its_own_and_serves_the_dashboard"
# The build, started as the run begins (early.py): the package's files copied away from this tree
# (the build writes its egg-info beside them), then `python -m build`: the sdist, and the wheel built
# from the unpacked sdist, as a user's build does (so this wheel proves the sdist carries what it
# needs). tests/test_publish.py checks the same two files for an upload.
_BUILD = """
import shutil, subprocess, sys
from pathlib import Path
root, folder = Path(sys.argv[1]), Path(sys.argv[2])
shutil.copytree(root / "pipeline", folder / "source" / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
for name in ("pyproject.toml", "README.md", "LICENSE"):
    shutil.copy(root / name, folder / "source" / name)
sys.exit(subprocess.call([sys.executable, "-m", "build", "--outdir", str(folder / "dist"), str(folder / "source")]))
"""
early.command(WHEEL, lambda folder: [sys.executable, "-c", _BUILD, str(ROOT), str(folder)])


@pytest.mark.slow
def test_the_built_wheel_installs_on_its_own_and_serves_the_dashboard(tmp_path: Path) -> None:
    built, folder = early.result(WHEEL, timeout=300)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = (folder / "dist").glob("trio_pipeline-*.whl")
    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]

    work = tmp_path / "work"  # a folder of its own: neither this tree nor its editable install is imported first
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "ADMIN_PORT": str(port := _free_port()), "WORKER_PROCESSES": "1",
           "DATABASE_URL": f"sqlite:///{work / 'wheel.db'}"}
    where = subprocess.run([sys.executable, "-c", "import pipeline; print(pipeline.__file__)\n"
                            "from pipeline.backends.redis.scripts import ALL; print(sorted(ALL))"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=60)
    assert where.stdout.strip().startswith(str(site)), where.stdout + where.stderr
    assert "'claim'" in where.stdout and "'schedule_fire'" in where.stdout, where.stdout + where.stderr  # the Lua files
    service = subprocess.Popen([sys.executable, "-m", "pipeline"], cwd=work, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin", timeout=2) as page:
                    html = page.read().decode()
                break
            except OSError:
                assert service.poll() is None and time.monotonic() < deadline, "the service from the wheel did not serve"
                time.sleep(0.2)
        assert "dashboard.js" in html
        for name in ("dashboard.js", "dashboard.css"):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/static/{name}", timeout=5) as static:
                assert static.status == 200 and len(static.read()) > 1000
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as health:
            assert health.status == 200
    finally:
        service.terminate()
        output, _ = service.communicate(timeout=60)
    assert service.returncode == 0, output[-3000:]
