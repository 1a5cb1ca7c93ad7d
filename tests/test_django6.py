"""tests/test_django_example.py again, on Django 6's own ``django.tasks`` (Python >= 3.12): the example
project's tasks through PipelineBackend under the worker, its TestCase tests with run_tasks(), on
SQLite and Postgres.

Django 6 needs Python >= 3.12 and the suite runs on 3.11, so this makes a venv of the machine's 3.12
(or 3.13) and installs the project there with its ``django`` and ``postgres`` extras, as a user would
(``pip install 'trio-pipeline[django,postgres]'``: Django 6 there, no backport). It is kept under the
system's temporary folder, keyed by what it installs (the project's dependencies and those extras, the
interpreter), so a run pays for it once (about a minute) and later runs reuse it. The processes run
the checkout's code (PYTHONPATH), ahead of the copy the install made, so a change is tested at once.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import tomllib
from pathlib import Path

import pytest
from conftest import missing

# the scenarios of the backport's file, collected here once more with this file's `python` fixture
from test_django_example import (  # noqa: F401
    ROOT,
    project,
    project_env,
    test_aenqueue_and_aget_result_and_the_refusals,
    test_an_in_memory_sqlite_test_database_is_refused_with_the_fix,
    test_client_connection_takes_djangos_connection_and_refuses_none,
    test_manage_py_pipeline_runs_the_worker,
    test_the_projects_own_testcase_tests_pass_with_run_tasks,
    test_the_tasks_run_under_the_worker_and_report_through_get_result,
)

pytestmark = pytest.mark.slow
EXTRAS = ("django", "postgres")


def _interpreter() -> str:
    """A Python >= 3.12 on this machine: PIPELINE_PYTHON312, else python3.12 / python3.13 on PATH or pyenv's."""
    candidates = [os.environ.get("PIPELINE_PYTHON312", ""), shutil.which("python3.12") or "", shutil.which("python3.13") or "",
                  *sorted(glob.glob("/root/.pyenv/versions/3.1[23].*/bin/python3"))]
    for candidate in filter(None, candidates):
        try:
            version = subprocess.run([candidate, "-c", "import sys; print(sys.version_info >= (3, 12))"],
                                     capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if version.stdout.strip() == "True":
            return candidate
    missing("no Python >= 3.12 on this machine for Django 6 (set PIPELINE_PYTHON312, or install python3.12)")


def _wanted() -> list[str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [*meta["dependencies"], *(req for extra in EXTRAS for req in meta["optional-dependencies"][extra])]


@pytest.fixture(scope="session")
def django6_python() -> str:
    """The venv's interpreter, made once per set of requirements (under a lock: xdist's workers share it)."""
    interpreter = _interpreter()
    real = subprocess.run([interpreter, "-c", "import sys; print(sys.executable, sys.version)"], capture_output=True,
                          text=True, check=True).stdout
    key = hashlib.sha256(json.dumps([real, _wanted()]).encode()).hexdigest()[:16]
    venv = Path(tempfile.gettempdir()) / f"pipeline-django6-{key}"
    python = venv / "bin" / "python"
    with open(f"{venv}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / "ready").exists():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([interpreter, "-m", "venv", str(venv)], check=True, timeout=300)
            done = subprocess.run([str(python), "-m", "pip", "install", "-q", f"{ROOT}[{','.join(EXTRAS)}]"],
                                  capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                pytest.fail(f"pip install of the project with its django extra on {interpreter} failed:\n{done.stderr}")
            (venv / "ready").write_text(" ".join(_wanted()))
    return str(python)


@pytest.fixture
def python(django6_python: str) -> str:
    return django6_python


def test_the_venv_has_django_6_and_no_backport(django6_python: str) -> None:
    """What the scenarios above ran on: Django's own Tasks framework, the backport not installed."""
    probe = ("import importlib.util, django, django.tasks, sys; "
             "print(django.VERSION[0], importlib.util.find_spec('django_tasks') is None, sys.version_info[:2] >= (3, 12))")
    done = subprocess.run([django6_python, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    major, no_backport, new_python = done.stdout.split()
    assert int(major) >= 6 and no_backport == "True" and new_python == "True"


def test_the_backend_takes_djangos_own_framework(django6_python: str) -> None:
    probe = ("import django; from django.conf import settings; settings.configure(); django.setup(); "
             "from pipeline.contrib.django import compat, PipelineBackend; import django.tasks.backends.base as b; "
             "print(compat.PRIMARY.package, issubclass(PipelineBackend, b.BaseTaskBackend))")
    done = subprocess.run([django6_python, "-c", probe], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tempfile.gettempdir())
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["django.tasks", "True"]



