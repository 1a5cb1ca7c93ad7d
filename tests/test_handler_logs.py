"""Issue 34, item 3: an application's own log records come out through the pipeline's logging.

Real services (``python -m pipeline --app logapp:registry`` on SQLite) run a throw-away app whose
handler module logs with ``logging.getLogger(__name__)``: in an async handler, in a task it starts,
in a sync handler's thread and in a middleware. Under ``LOG_FORMAT=json`` every line the service,
its supervisor and its worker processes write is one JSON object, and the records made inside a job
carry its ``job_id``, ``job_type`` and ``attempt``; text lines end with ``[job ID TYPE attempt N]``;
times are UTC with their offset whatever TZ (or a ``time.tzset()`` in the app, as Django's
TIME_ZONE does) makes local time; ``LOG_LEVEL=WARNING`` drops the app's info; ``LOG_CONFIGURE=false``
keeps the format an app's ``logging.basicConfig`` chose. Embedding (``open_pipeline``) never
touches the root logger, and the job's fields are on the records an app's own handlers get.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from app_harness import Service, app_env

from pipeline import Client, Registry, open_pipeline
from pipeline.config import Config, WorkerSettings

LOGAPP = textwrap.dedent('''
    """An application's jobs that log the way any Python module does."""
    import asyncio
    import contextlib
    import logging
    import os
    import time
    import warnings

    import attrs
    import trio

    import pipeline

    if os.environ.get("APP_TZ"):  # what django.setup() does with TIME_ZONE
        os.environ["TZ"] = os.environ["APP_TZ"]
        time.tzset()

    log = logging.getLogger(__name__)


    @contextlib.asynccontextmanager
    async def announce(ctx):
        log.info("middleware enters %s", ctx.id)
        yield


    @attrs.frozen
    class Greet:
        name: str


    async def greet(job: Greet, ctx) -> None:
        log.info("info from %s", job.name)
        log.warning("warning from %s", job.name)
        if job.name == "bob":
            warnings.warn(f"a warning of Python's from {job.name}", UserWarning)

        async def side_task():
            log.info("side task of %s", job.name)

        async with trio.open_nursery() as tn:
            tn.start_soon(side_task)


    @attrs.frozen
    class GreetSync:
        name: str


    def greet_sync(job: GreetSync, ctx) -> None:
        log.info("thread of %s", job.name)


    @attrs.frozen
    class GreetAio:
        name: str


    async def greet_aio(job: GreetAio, ctx) -> None:
        log.info("asyncio of %s", job.name)

        async def side_task():
            log.info("asyncio task of %s", job.name)

        await asyncio.create_task(side_task())


    def build(*, with_asyncio: bool) -> pipeline.Registry:
        registry = pipeline.Registry()
        registry.middleware(announce)
        registry.register("greet", Greet, greet)
        registry.register("greet_sync", GreetSync, greet_sync)
        if with_asyncio:  # its worker processes run on an asyncio loop, trio its guest
            registry.register("greet_aio", GreetAio, greet_aio, runtime="asyncio")
        return registry


    registry = build(with_asyncio=False)
    with_asyncio = build(with_asyncio=True)
''')

# an application that sets up logging itself, in its module, as a script or a framework does; the
# filter is the recipe docs/operating.md gives for %(job_id)s in its own format
OWNLOGS = textwrap.dedent('''
    import logging


    class JobOrDash(logging.Filter):
        def filter(self, record):
            record.__dict__.setdefault("job_id", "-")
            return True


    logging.basicConfig(level=logging.INFO, format="APP %(levelname)s %(name)s [%(job_id)s]: %(message)s")
    logging.getLogger().handlers[0].addFilter(JobOrDash())

    from logapp import registry  # noqa: E402
''')


# the payload classes, as the app declares them (jobs travel as JSON under their type's name)
@attrs.frozen
class Greet:
    name: str


@attrs.frozen
class GreetSync:
    name: str


@attrs.frozen
class GreetAio:
    name: str


def types() -> Registry:
    reg = Registry()
    reg.register("greet", Greet)
    reg.register("greet_sync", GreetSync)
    reg.register("greet_aio", GreetAio)
    return reg


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "logapp.py").write_text(LOGAPP)
    (tmp_path / "ownlogs.py").write_text(OWNLOGS)
    return tmp_path


def enqueue(folder: Path, names: list[str]) -> dict[str, str]:
    """Enqueue greet NAME for each name (greet_sync for one starting with 'sync', greet_aio with 'aio'): {name: job id}."""
    client = Client(f"sqlite:///{folder / 'jobs.db'}", registry=types())
    kinds = {"sync": GreetSync, "aio": GreetAio}
    try:
        return {name: client.enqueue(kinds.get(name.partition("-")[0], Greet)(name)) for name in names}
    finally:
        client.close()


def run_service(folder: Path, app: str, ids: dict[str, str], outcome: str, *, processes: int = 1, **settings: str) -> list[str]:
    """Run ``python -m pipeline --app APP`` until each job's outcome line (``outcome`` with the job's
    id in it) is in its log, then stop it (SIGINT): its log lines."""
    env = app_env(folder, f"sqlite:///{folder / 'jobs.db'}", ADMIN_ENABLED="false", WORKER_POLL_INTERVAL_MS="100", **settings)
    service = Service(folder, env, "--app", app, "--processes", str(processes))
    try:
        def done(lines: list[str]) -> bool:
            return all(any(job_id in line and outcome in line for line in lines) for job_id in ids.values())

        service.wait_for(done, f"the outcome of jobs {sorted(ids.values())}", timeout=60)
        assert service.stop() == 0, "\n".join(service.lines)
    finally:
        service.kill()
    return service.lines


def near_now(text: str) -> bool:
    """A logged time within 10 minutes of now: UTC mislabelled local time would be hours off."""
    return abs(dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() - time.time()) < 600


UTC_TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}(Z|\+00:00)"


def test_json_lines_of_the_supervisor_its_workers_and_the_apps_loggers(folder: Path) -> None:
    """TZ=Asia/Tokyo, two worker processes under a supervisor: every line of the log is one JSON
    object with a UTC time; the app's info and warning records are there, each carrying the job it
    was made in, from the handler, a task it started, the middleware, a sync handler's thread, an
    asyncio handler (runtime="asyncio") and an asyncio task it created; and a warnings.warn."""
    ids = enqueue(folder, ["ada", "bob", "sync-cy", "aio-di"])
    lines = run_service(folder, "logapp:with_asyncio", ids, "completed", processes=2, LOG_FORMAT="json", TZ="Asia/Tokyo")
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            pytest.fail(f"a line that is not JSON: {line!r}\nthe log:\n" + "\n".join(lines))
    assert all(isinstance(r, dict) and re.fullmatch(UTC_TIME, r["time"]) and near_now(r["time"]) for r in records), lines
    assert {r["logger"] for r in records} >= {"pipeline", "pipeline.supervisor", "logapp"}

    def made_in(message: str) -> dict[str, Any]:
        (record,) = [r for r in records if r["message"] == message]
        assert record["logger"] == "logapp"
        return record

    for name in ("ada", "bob"):
        job = {"job_id": ids[name], "job_type": "greet", "attempt": 1}
        assert made_in(f"info from {name}").items() >= {**job, "level": "info"}.items()
        assert made_in(f"warning from {name}").items() >= {**job, "level": "warning"}.items()
        assert made_in(f"side task of {name}").items() >= job.items()
        assert made_in(f"middleware enters {ids[name]}").items() >= job.items()
    (warned,) = [r for r in records if r["logger"] == "py.warnings"]  # warnings.warn: a record, not a bare line
    assert "UserWarning: a warning of Python's from bob" in warned["message"] and warned["job_id"] == ids["bob"]
    assert made_in("thread of sync-cy").items() >= {"job_id": ids["sync-cy"], "job_type": "greet_sync", "attempt": 1}.items()
    assert made_in(f"middleware enters {ids['sync-cy']}")["job_type"] == "greet_sync"
    aio = {"job_id": ids["aio-di"], "job_type": "greet_aio", "attempt": 1}
    assert made_in("asyncio of aio-di").items() >= aio.items()  # an asyncio handler, and a task it creates
    assert made_in("asyncio task of aio-di").items() >= aio.items()
    # the records made outside a job carry none (the worker's next job, the service's own lines)
    outside = [r for r in records if r["logger"].startswith("pipeline") and "outcome" not in r]
    assert outside and not any("job_id" in r for r in outside)


def test_text_lines_in_utc_with_the_job_at_the_end(folder: Path) -> None:
    """The text format, in an app that moves local time at import (time.tzset, as Django's
    TIME_ZONE does): UTC times with Z, and the job at the end of the app's lines."""
    ids = enqueue(folder, ["ada", "sync-cy"])
    lines = run_service(folder, "logapp:registry", ids, "completed", APP_TZ="America/New_York", TZ="Asia/Tokyo")
    line_shape = re.compile(rf"({UTC_TIME}) (DEBUG|INFO|WARNING|ERROR) [\w.]+: .*")
    for line in lines:
        match = line_shape.fullmatch(line)
        assert match and near_now(match.group(1)), f"{line!r}\nthe log:\n" + "\n".join(lines)
    ada = f"[job {ids['ada']} greet attempt 1]"
    for message in ("INFO logapp: info from ada", "WARNING logapp: warning from ada", "INFO logapp: side task of ada",
                    f"INFO logapp: middleware enters {ids['ada']}"):
        assert any(line.endswith(f" {message} {ada}") for line in lines), (message, lines)
    assert any(line.endswith(f" INFO logapp: thread of sync-cy [job {ids['sync-cy']} greet_sync attempt 1]") for line in lines)
    # the outcome line names its job in its own words, once
    (done,) = [line for line in lines if f"job {ids['ada']} greet attempt 1/3 ok → completed" in line]
    assert "[job" not in done


def test_log_level_warning_drops_the_apps_info(folder: Path) -> None:
    ids = enqueue(folder, ["ada", "bob"])
    # at WARNING a completed job logs no line: the jobs are known done by their warnings, then by the store
    lines = run_service(folder, "logapp:registry", ids, "warning from", LOG_FORMAT="json", LOG_LEVEL="WARNING")
    records = [json.loads(line) for line in lines]
    assert all(r["level"] in ("warning", "error") for r in records), lines
    assert {r["job_id"] for r in records if r["logger"] == "logapp"} == set(ids.values())
    assert not any("info from" in r["message"] for r in records)


def test_log_configure_false_keeps_the_apps_own_format(folder: Path) -> None:
    """LOG_CONFIGURE=false with an app that calls logging.basicConfig in its module: every line
    in the app's format (LOG_FORMAT=json is not used), the pipeline's own records included, and
    the job's fields are record attributes its format can name."""
    ids = enqueue(folder, ["ada"])
    lines = run_service(folder, "ownlogs:registry", ids, "completed", LOG_CONFIGURE="false", LOG_FORMAT="json")
    assert lines and all(line.startswith("APP ") for line in lines), lines
    ada = ids["ada"]
    assert f"APP INFO logapp [{ada}]: info from ada" in lines
    assert f"APP WARNING logapp [{ada}]: warning from ada" in lines
    assert any(line.startswith(f"APP INFO pipeline [{ada}]: job {ada} greet attempt 1/3 ok → completed") for line in lines)
    assert any(line.startswith("APP INFO pipeline [-]: pipeline running on") for line in lines)


def test_log_configure_true_replaces_an_apps_basic_config_and_says_so(folder: Path) -> None:
    ids = enqueue(folder, ["ada"])
    lines = run_service(folder, "ownlogs:registry", ids, "completed", LOG_FORMAT="json")
    records = [json.loads(line) for line in lines]  # the app's format is gone: every line is JSON
    assert any("LOG_CONFIGURE=false keeps" in r["message"] and "StreamHandler" in r["message"] for r in records)
    assert any(r["message"] == "info from ada" and r["job_id"] == ids["ada"] for r in records)


# -- embedding: open_pipeline in someone else's program -------------------------------------------------


class Kept(logging.Handler):
    """An application's own handler: the records it gets, with their job attributes if any."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def app_logging() -> Iterator[Kept]:
    """The application's logging: its handler on the root logger, at INFO; put back afterwards."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    kept = Kept()
    root.handlers[:] = [kept]
    root.setLevel(logging.INFO)
    yield kept
    root.handlers[:], root.level = saved


async def test_embedding_leaves_logging_alone_and_tags_the_records_made_in_a_job(tmp_path: Path, app_logging: Kept) -> None:
    log = logging.getLogger("embedder.jobs")
    reg = types()

    async def greet(job: Greet, ctx: Any) -> None:
        log.info("async %s", job.name)

    def greet_sync(job: GreetSync, ctx: Any) -> None:
        log.info("sync %s", job.name)

    reg.register("greet", Greet, greet)
    reg.register("greet_sync", GreetSync, greet_sync)
    before = logging.getLogger().handlers[:], logging.getLogger().level, logging.getLogger("pipeline").handlers[:]
    config = Config(database_url=f"sqlite:///{tmp_path / 'jobs.db'}", worker=WorkerSettings(poll_interval_ms=50))
    async with open_pipeline(config, reg) as p:
        ids = {"a": await p.enqueue(Greet("a")), "s": await p.enqueue(GreetSync("s"))}
        with trio.fail_after(30):
            for job_id in ids.values():
                await p.result(job_id)
    log.info("after the jobs")
    assert (logging.getLogger().handlers[:], logging.getLogger().level, logging.getLogger("pipeline").handlers[:]) == before

    by_message = {record.getMessage(): record for record in app_logging.records}
    for message, job_id, job_type in (("async a", ids["a"], "greet"), ("sync s", ids["s"], "greet_sync")):
        record = by_message[message]
        assert (record.job_id, record.job_type, record.attempt) == (job_id, job_type, 1)  # type: ignore[attr-defined]
    assert not hasattr(by_message["after the jobs"], "job_id")
    # the pipeline's outcome record reaches the app's handler with the same attributes
    (outcome,) = [r for r in app_logging.records
                  if r.name == "pipeline" and f"job {ids['a']} greet attempt 1/3 ok" in r.getMessage()]
    assert (outcome.job_id, outcome.job_type, outcome.attempt) == (ids["a"], "greet", 1)  # type: ignore[attr-defined]
