"""The example Django project (examples/django_project) on PipelineBackend, on SQLite and Postgres,
with the default Python's Django and the django-tasks backport (tests/test_django6.py: Django 6).

Every Django step runs in a process of its own (tests/django_scenarios.py, manage.py, the worker):
Django's settings are one per process, and the suite's own processes stay free of them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require_service

pytest.importorskip("django")

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "examples" / "django_project"
SCENARIOS = Path(__file__).resolve().parent / "django_scenarios.py"
POSTGRES = ("127.0.0.1", 5432)

pytestmark = pytest.mark.slow


def _admin(sql: str) -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(sql)


@pytest.fixture(params=["sqlite", "postgres"])
def project(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The project's environment on a fresh database of the store asked for (nothing made yet)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PIPELINE_APP")}
    env.update(DJANGO_SETTINGS_MODULE="mysite.settings", PYTHONPATH=str(PROJECT), ADMIN_ENABLED="false",
               WORKER_POLL_INTERVAL_MS="100")
    if request.param == "sqlite":
        env["EXAMPLE_SQLITE"] = str(tmp_path / "shop.sqlite3")
        yield env
        return
    require_service("PostgreSQL", *POSTGRES)
    name = f"django_{uuid.uuid4().hex[:12]}"
    env["EXAMPLE_POSTGRES_DB"] = name
    _admin(f"CREATE DATABASE {name}")
    try:
        yield env
    finally:
        _admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        _admin(f"DROP DATABASE IF EXISTS test_{name} WITH (FORCE)")


@pytest.fixture
def python() -> str:
    """The interpreter the project runs on: this one (Django 5.2 and the backport); tests/test_django6.py
    gives Django 6's."""
    return sys.executable


@pytest.fixture
def project_env(project: dict[str, str], python: str) -> dict[str, str]:
    return with_python(project, python)


def with_python(env: dict[str, str], python: str) -> dict[str, str]:
    """``env`` for the project run by ``python``: another interpreter's venv runs the checkout's pipeline
    (on its path ahead of the copy it installed), this one its own (installed in development mode)."""
    if python == sys.executable:
        return {**env, "EXAMPLE_PYTHON": python}
    return {**env, "EXAMPLE_PYTHON": python, "PYTHONPATH": f"{PROJECT}{os.pathsep}{ROOT}"}


def run(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    python = env.get("EXAMPLE_PYTHON", sys.executable)
    return subprocess.run([python, *args], cwd=PROJECT, env=env, capture_output=True, text=True, timeout=timeout)


def scenario(env: dict[str, str], name: str, *args: str) -> dict:
    done = run(env, str(SCENARIOS), name, *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def migrate(env: dict[str, str]) -> None:
    done = run(env, "manage.py", "migrate", "-v0")
    assert done.returncode == 0, done.stderr


def start_worker(env: dict[str, str], log: Path, *command: str) -> subprocess.Popen[bytes]:
    command = command or ("-m", "pipeline", "--app", "pipeline.contrib.django:registry", "--processes", "1")
    return subprocess.Popen([env.get("EXAMPLE_PYTHON", sys.executable), *command], cwd=PROJECT, env=env, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def stop(worker: subprocess.Popen[bytes]) -> int:
    worker.send_signal(signal.SIGTERM)
    try:
        return worker.wait(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()


def test_the_tasks_run_under_the_worker_and_report_through_get_result(project_env: dict[str, str], tmp_path: Path) -> None:
    """@task functions enqueue through PipelineBackend, run under `python -m pipeline --app
    pipeline.contrib.django:registry` (no shim in the project), and report SUCCESSFUL / FAILED and their
    return values through get_result; an atomic() rolled back leaves no job; the worker's log times are UTC
    whatever TIME_ZONE is (America/New_York here)."""
    migrate(project_env)
    ids = scenario(project_env, "enqueue")
    assert ids["receipt_status"] == "READY" and ids["orders"] == 1
    assert ids["rolled_back_lookup"].startswith("TaskResultDoesNotExist")  # no job: the transaction took it along
    log = tmp_path / "worker.log"
    worker = start_worker({**project_env, "WORKER_CONCURRENCY": "1"}, log)
    try:
        wanted = {name: ids[name] for name in ("receipt", "add", "async", "context", "charge", "count")}
        wanted.update({f"fresh{i}": job_id for i, job_id in enumerate(ids["fresh"])})
        found = scenario(project_env, "results", json.dumps(wanted))
    finally:
        assert stop(worker) == 0, log.read_text()
    text = log.read_text()
    assert found["receipt"]["status"] == "SUCCESSFUL", text
    assert found["receipt"]["return_value"] == {"order": ids["order"], "email": "ada@example.com", "total": "12.50"}
    assert found["receipt"]["task"] == ["shop.tasks.send_receipt", 10, "emails"]
    assert found["receipt_sent"] == 1  # the task saw the order committed with it
    assert found["add"]["return_value"] == 5 and found["async"]["return_value"] == 9
    assert found["context"]["return_value"] == {"id": ids["context"], "attempt": 1}
    assert found["count"]["return_value"] == 1
    # one worker thread at a time (WORKER_CONCURRENCY=1): each task found the connection the one before
    # opened closed again, as after a request
    assert [found[f"fresh{i}"]["return_value"] for i in range(4)] == [True] * 4
    charge = found["charge"]
    assert charge["status"] == "FAILED" and charge["attempts"] == 1  # MAX_ATTEMPTS 1: Django's "raised, failed"
    ((path, traceback),) = charge["errors"]
    assert path == "shop.tasks.PaymentDeclined" and charge["error_class"] == "PaymentDeclined"
    assert "card declined for order 7" in traceback and 'shop/tasks.py", line' in traceback
    for name in ("receipt", "add"):
        enqueued, started, finished = found[name]["times"]
        assert enqueued <= started <= finished and found[name]["worker_ids"][0].endswith(f":{worker.pid}")
    assert scenario(project_env, "status", ids["deferred"])["status"] == "READY"  # run_after an hour from now
    # the worker's lines: UTC with its Z, never New York's local time; the task's own log line with its job
    stamps = re.findall(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})(\S*) ", text, re.M)
    assert stamps and {zone for _, zone in stamps} == {"Z"}, text
    assert re.search(rf"INFO shop\.tasks: receipt sent for order {ids['order']} \[job {ids['receipt']} django.emails", text)


def test_the_projects_own_testcase_tests_pass_with_run_tasks(project_env: dict[str, str]) -> None:
    """`python manage.py test shop`: Django's TestCase (never committed), the tasks run by run_tasks()."""
    done = run(project_env, "manage.py", "test", "shop", "--noinput")
    assert done.returncode == 0, done.stderr
    assert re.search(r"Ran 4 tests.*\n\nOK", done.stderr, re.S), done.stderr


def test_client_connection_takes_djangos_connection_and_refuses_none(project_env: dict[str, str]) -> None:
    """pipeline.Client(...).enqueue(job, connection=django.db.connection) inside atomic() commits with
    it, and a rollback leaves no job; connection=None (connection.connection before the first query) and
    Django's connection outside atomic() are refused, never a silent commit of their own."""
    migrate(project_env)
    answers = scenario(project_env, "client_connection")
    assert answers["raw_before_first_query"] == "None"
    assert answers["none"].startswith("UsageError: connection=None")
    assert answers["outside_atomic"].startswith("UsageError: connection= is Django's connection 'default' outside")
    assert answers["kept"] == "pending" and answers["gone"] is None


def test_aenqueue_and_aget_result_and_the_refusals(project_env: dict[str, str]) -> None:
    migrate(project_env)
    answers = scenario(project_env, "asynchronous")
    assert answers["status"] == "READY" and answers["same"]
    errors = scenario(project_env, "errors")
    assert errors["unknown_id"].startswith("TaskResultDoesNotExist")
    assert errors["not_an_id"].startswith("TaskResultDoesNotExist")
    assert errors["bad_queue"].startswith("InvalidTask") and "nowhere" in errors["bad_queue"]
    assert errors["bad_priority"].startswith("InvalidTask")
    assert errors["naive_run_after"].startswith("InvalidTask")
    assert errors["not_json"].startswith("TypeError")
    assert errors["wrong_task"].startswith("TaskResultMismatch")


def test_manage_py_pipeline_runs_the_worker(tmp_path: Path, python: str) -> None:
    """`python manage.py pipeline` (the app in INSTALLED_APPS) runs the same worker, its store taken
    from the settings."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PIPELINE_APP")}
    env.update(PYTHONPATH=str(PROJECT), ADMIN_ENABLED="false", EXAMPLE_SQLITE=str(tmp_path / "shop.sqlite3"),
               DJANGO_SETTINGS_MODULE="mysite.settings")
    env = with_python(env, python)
    migrate(env)
    ids = scenario(env, "enqueue")
    log = tmp_path / "worker.log"
    worker = start_worker(env, log, "manage.py", "pipeline", "--processes", "1")
    try:
        found = scenario(env, "results", json.dumps({"add": ids["add"]}))
    finally:
        assert stop(worker) == 0, log.read_text()
    assert found["add"]["status"] == "SUCCESSFUL" and found["add"]["return_value"] == 5, log.read_text()
    listed = run(env, "manage.py", "pipeline", "jobs", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert ids["add"] in listed.stdout


def test_a_worker_pointed_at_another_store_is_refused(tmp_path: Path, python: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PIPELINE_APP"}
    env.update(PYTHONPATH=str(PROJECT), ADMIN_ENABLED="false", EXAMPLE_SQLITE=str(tmp_path / "shop.sqlite3"),
               DJANGO_SETTINGS_MODULE="mysite.settings", DATABASE_URL=f"sqlite:///{tmp_path / 'other.db'}")
    env = with_python(env, python)
    done = run(env, "-m", "pipeline", "--app", "pipeline.contrib.django:registry", "--processes", "1")
    assert done.returncode == 2
    assert "is not the store of TASKS" in done.stderr and "shop.sqlite3" in done.stderr
    del env["DJANGO_SETTINGS_MODULE"]
    done = run(env, "-m", "pipeline", "--app", "pipeline.contrib.django:registry")
    assert done.returncode == 2 and "DJANGO_SETTINGS_MODULE is not set" in done.stderr


def test_an_in_memory_sqlite_test_database_is_refused_with_the_fix(tmp_path: Path, python: str) -> None:
    """Django's default SQLite test database is in memory, which the pipeline's processes cannot share:
    `manage.py test` stops at once, saying to give it a file."""
    (tmp_path / "memsettings.py").write_text('from mysite.settings import *  # noqa: F403\nDATABASES["default"].pop("TEST")\n')
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PIPELINE_APP")}
    env.update(ADMIN_ENABLED="false", EXAMPLE_SQLITE=str(tmp_path / "shop.sqlite3"), DJANGO_SETTINGS_MODULE="memsettings")
    env = with_python(env, python)
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env.get('PYTHONPATH', PROJECT)}"
    done = run(env, "manage.py", "test", "shop", "--noinput")
    assert done.returncode != 0
    assert "is an in-memory SQLite database" in done.stderr and "'TEST'] = {'NAME'" in done.stderr
