"""Shared test fixtures. Tests use real SQLite files in pytest's tmp_path; no mock of the store."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import early
import pytest
from hypothesis import settings

from pipeline import Config

# tests/user_project is a user's own project, run by tests/test_testing_any_loop.py in processes of its
# own under each async plugin: not a part of this suite
collect_ignore = ["user_project"]

# No per-example deadline (hypothesis's 200 ms): a loaded machine's pause in one example is not a defect
settings.register_profile("pipeline", deadline=None)
settings.load_profile("pipeline")


def pytest_configure(config: pytest.Config) -> None:
    if not _xdist_worker(config):
        early.root()  # before xdist's workers start: they inherit its folder (early.py)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The slow one-process checks of the collected tests start now, beside the run (early.py):
    under xdist, by the first worker to reach them."""
    early.start_for(item.nodeid for item in session.items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not _xdist_worker(session.config):
        early.stop_all()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under PIPELINE_REQUIRE_SERVICES=1 (.ci/run) a skip is a failure, whatever raised it (a skipif
    mark, pytest.skip, a store left out): a test that guards a promise never passes CI by not running.
    Tests that need something name it through ``missing`` or ``require_service``, which fail there with
    the fix; this catches the rest."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if REQUIRE_SERVICES and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped ({reason}), and PIPELINE_REQUIRE_SERVICES=1 says nothing may skip"


def _xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")

REQUIRE_SERVICES = os.environ.get("PIPELINE_REQUIRE_SERVICES") == "1"


def fast_config(db_path: Path, **overrides: object) -> Config:
    """A config with short timings, so retries and polls happen within a test."""
    values: dict[str, object] = dict(
        database_url=f"sqlite:///{db_path}",
        worker_poll_interval_ms=20,
        worker_backoff_base_ms=10,
        worker_lease_seconds=2.0,
        worker_shutdown_timeout=2.0,
        worker_concurrency=4,
        sqlite_synchronous="normal",
    )
    values.update(overrides)
    if "sqlite_busy_timeout_ms" not in overrides:  # below two thirds of the lease (the config refuses more)
        values["sqlite_busy_timeout_ms"] = min(1000, int(float(values["worker_lease_seconds"]) * 1000 / 3))  # type: ignore[arg-type]
    return config_of(**values)


def config_of(**settings: object) -> Config:
    """A config from settings named as their variables in lower case (``worker_concurrency=4``
    is WORKER_CONCURRENCY), read as ``Config.from_env`` reads text: sections included."""
    return Config.from_env({name.upper(): _as_text(value) for name, value in settings.items()}, env_file=None)


def _as_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    return "" if value is None else str(value)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "pipeline.db"


@pytest.fixture
def config(db_path: Path) -> Config:
    return fast_config(db_path)


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """For the CLI's tests: DATABASE_URL points at a fresh file; the working folder has no .env."""
    path = tmp_path / "cli.db"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{path}")
    return path


def service_available(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def require_service(name: str, host: str, port: int) -> None:
    """Skip with a clear reason when a service does not answer, unless CI demands it."""
    if service_available(host, port):
        return
    message = f"{name} does not answer on {host}:{port}"
    if REQUIRE_SERVICES:
        pytest.fail(f"{message}, and PIPELINE_REQUIRE_SERVICES=1 says it must")
    pytest.skip(f"{message}; start it to run this test (CI sets PIPELINE_REQUIRE_SERVICES=1)")


def missing(what: str) -> NoReturn:
    """What a test needs is not on this machine: skip, saying what and how to get it; but under
    PIPELINE_REQUIRE_SERVICES=1 (.ci/run) fail, so that no test guarding a promise skips quietly in CI."""
    if REQUIRE_SERVICES:
        pytest.fail(f"{what}, and PIPELINE_REQUIRE_SERVICES=1 says it must be there")
    pytest.skip(what)


def require_program(name: str, install: str) -> str:
    """The path of the program ``name`` on PATH; without it, ``missing`` (skip, or fail in CI)."""
    path = shutil.which(name)
    if path is None:
        missing(f"no {name} on PATH ({install}; .ci/run installs it)")
    return path


@pytest.fixture
def redis_server_binary() -> str:
    """A redis-server of a test's own (AOF, a server stopped or cut mid-test): tests/backends/test_redis.py's
    ``needs_server_binary`` mark asks for this."""
    return require_program("redis-server", "Debian: apt-get install redis-server")
