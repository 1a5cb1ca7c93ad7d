"""Configuration, the state table, backoff, ids, migrations, diagrams and the public namespace."""

from __future__ import annotations

import collections
import importlib
import random
import re
import sqlite3
import subprocess
import sys
from collections import abc
from pathlib import Path
from typing import Any

import cattrs
import pytest
from conftest import config_of
from hypothesis import given
from hypothesis import strategies as st

import pipeline
import pipeline.site
from pipeline import Config, ConfigError, cli, states
from pipeline.backends.sqlite import migrations, store
from pipeline.config import AdminSettings, WorkerSettings
from pipeline.engine import diagrams
from pipeline.ids import UUID7Factory
from pipeline.site.settings import SECTIONS, CacheSettings, MailSettings, SiteSettings, WebhookSettings

ROOT = Path(__file__).resolve().parent.parent


# -- configuration ----------------------------------------------------------------------------


def test_defaults_follow_the_seed() -> None:
    config = Config.from_env({}, env_file=None)
    worker = config.worker
    assert (worker.enabled, worker.concurrency, worker.poll_interval_ms, worker.default_max_attempts) == (True, 2, 500, 3)
    assert config.database_path == Path("pipeline.db")
    assert worker.lease_seconds == 30 and worker.backoff_base_ms == 10_000
    assert config.section(MailSettings).smtp_port == 25 and config.section(SiteSettings).url == "http://localhost:8000"


def test_env_file_then_environment(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text("WORKER_CONCURRENCY=7\nWORKER_ENABLED=false\n# a comment\nDATABASE_URL=sqlite:////tmp/x.db\n")
    config = Config.from_env({"WORKER_CONCURRENCY": "9"}, env_file=env)
    assert (config.worker.concurrency, config.worker.enabled, config.database_path) == (9, False, Path("/tmp/x.db"))


@pytest.mark.parametrize(
    ("var", "value", "accepts"),
    [
        ("WORKER_CONCURRENCY", "zero", "an integer >= 1"),
        ("WORKER_CONCURRENCY", "0", "an integer >= 1"),
        ("WORKER_ENABLED", "maybe", "true or false"),
        ("WORKER_POLL_INTERVAL_MS", "-5", "an integer >= 1"),
        ("WORKER_SHUTDOWN_TIMEOUT", "soon", "seconds"),
        ("WORKER_LEASE_SECONDS", "0", "seconds > 0"),
        ("DATABASE_URL", "mysql://x", "postgresql://"),
        ("SQLITE_SYNCHRONOUS", "off", "full, normal"),
        ("WEBHOOK_URLS", "ftp://x", "http(s)"),
    ],
)
def test_a_bad_value_names_the_variable_and_what_it_accepts(var: str, value: str, accepts: str) -> None:
    with pytest.raises(ConfigError) as info:
        config = Config.from_env({var: value}, env_file=None)
        for section in SECTIONS:  # the site's, read when first asked for (default_registry asks for all)
            config.section(section)
    assert var in str(info.value) and accepts in str(info.value)


def test_the_site_reads_its_sections_when_its_registry_is_built() -> None:
    config = Config.from_env({"SMTP_PORT": "smtp"}, env_file=None)  # the engine needs none of it
    with pytest.raises(ConfigError, match="SMTP_PORT='smtp' is not valid"):
        pipeline.site.default_registry(config)


def test_cli_exits_2_on_bad_configuration(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("WORKER_CONCURRENCY", "lots")
    assert cli.main(["--env-file", "/nonexistent", "stats"]) == 2
    assert "WORKER_CONCURRENCY" in capsys.readouterr().err


# -- state machine and backoff -----------------------------------------------------------------


def test_every_status_is_reachable_and_terminal_ones_only_leave_by_admin_retry() -> None:
    targets = {dst for _, dst in states.TRANSITIONS.values()}
    assert targets | {states.Status.PENDING, states.Status.WAITING} == set(states.Status)  # (inserted as either)
    for transition, (src, _) in states.TRANSITIONS.items():
        if src in states.TERMINAL:
            assert transition in (states.Transition.REVIVE, states.Transition.REVIVE_CANCELLED, states.Transition.REPLAY)


@given(attempts=st.integers(1, 40), seed=st.integers(0, 2**32))
def test_backoff_doubles_with_bounded_jitter(attempts: int, seed: int) -> None:
    delay = states.backoff_seconds(attempts, 10.0, random.Random(seed))
    nominal = 10.0 * 2 ** min(attempts - 1, 30)
    assert nominal * 0.85 <= delay <= nominal * 1.15


def test_backoff_is_about_10_20_40_seconds_by_default() -> None:
    rng = random.Random(1)
    for attempts, nominal in [(1, 10), (2, 20), (3, 40)]:
        assert abs(states.backoff_seconds(attempts, 10.0, rng) - nominal) <= nominal * 0.15


@given(attempts=st.integers(1, 10), max_attempts=st.integers(1, 10), permanent=st.booleans())
def test_failure_decision(attempts: int, max_attempts: int, permanent: bool) -> None:
    decision = states.settle_failure(attempts=attempts, max_attempts=max_attempts, permanent=permanent, base_seconds=1.0)
    dead = permanent or attempts >= max_attempts
    assert decision.transition is (states.Transition.BURY if dead else states.Transition.RETRY)


# -- ids ------------------------------------------------------------------------------------------


def test_uuid7_ids_are_version_7_and_strictly_increasing() -> None:
    import uuid

    ids = UUID7Factory().many(10_000)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(uuid.UUID(i).version == 7 for i in ids[:100])


# -- migrations -----------------------------------------------------------------------------------


def test_migrations_are_recorded_and_idempotent(tmp_path: Path) -> None:
    conn = store.connect(tmp_path / "m.db")
    assert migrations.migrate(conn) == [n for n, _, _ in migrations.MIGRATIONS]
    schema = conn.execute("SELECT sql FROM sqlite_master ORDER BY name").fetchall()
    assert migrations.migrate(conn) == []
    assert conn.execute("SELECT sql FROM sqlite_master ORDER BY name").fetchall() == schema
    assert conn.execute("SELECT version FROM schema_migrations").fetchall() == [(n,) for n, _, _ in migrations.MIGRATIONS]
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_a_file_that_is_not_a_database_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "garbage.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{bad}")
    assert cli.main(["--env-file", "/nonexistent", "stats"]) == 1
    assert "garbage.db" in capsys.readouterr().err
    assert bad.read_bytes() == b"this is not sqlite" * 100
    with pytest.raises(pipeline.DatabaseUnavailable, match="garbage.db"):
        store.connect(bad)


# -- diagrams and the public namespace -----------------------------------------------------------


async def test_diagrams_match_the_code(tmp_path: Path) -> None:
    from pipeline.service import record_wiring

    wiring = await record_wiring(None)
    expected = {"states.mmd": diagrams.state_diagram(), "actors.mmd": diagrams.topology_diagram(wiring)}
    architecture = (ROOT / "docs" / "architecture.md").read_text()
    for name, text in expected.items():
        assert (ROOT / "diagrams" / name).read_text() == text, f"diagrams/{name} is stale: run python -m pipeline diagrams"
        assert diagrams.readme_block(architecture, name) == text, (
            f"docs/architecture.md's copy of {name} is stale: run python -m pipeline diagrams --readme docs/architecture.md"
        )


def test_public_names_are_exported_and_exist() -> None:
    assert sorted(pipeline.__all__) == pipeline.__all__
    for name in pipeline.__all__:
        assert hasattr(pipeline, name), name
    public = {n for n in dir(pipeline) if not n.startswith("_") and not isinstance(getattr(pipeline, n), type(pipeline))}
    assert public == set(pipeline.__all__), public ^ set(pipeline.__all__)
    assert set(pipeline._MODULE_OF) == set(pipeline.__all__)
    for name, module in pipeline._MODULE_OF.items():  # each name comes from the module it is said to
        assert getattr(pipeline, name) is getattr(importlib.import_module(f"pipeline.{module}"), name), name
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        pipeline.nonesuch  # noqa: B018


def test_commands_on_the_job_store_import_neither_the_actors_nor_the_handlers() -> None:
    # `enqueue --from-file` and friends open the backend alone: the actors and the handlers'
    # libraries (httpx, Pillow, redis) would only slow every command's start-up down
    code = ("import sys, pipeline.cli, pipeline.admin.inputs; "
            "print(sorted(m for m in ('pipeline.engine.wiring', 'httpx', 'PIL', 'redis') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout


def test_schema_from_a_newer_pipeline_is_refused_by_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "future.db"
    conn = sqlite3.connect(path)
    migrations.migrate(conn)
    conn.execute("INSERT INTO schema_migrations VALUES (999, 'future', 'x')")
    conn.commit()
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{path}")
    assert cli.main(["--env-file", "/nonexistent", "stats"]) == 1
    err = capsys.readouterr().err
    assert "future.db has schema version 999" in err


def test_the_service_refuses_a_corrupt_database_with_a_message(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    bad = tmp_path / "corrupt.db"
    bad.write_bytes(b"\x00garbage" * 512)
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{bad}", "ADMIN_PORT": "0"}
    proc = subprocess.run([sys.executable, "-m", "pipeline"], env=env, capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert proc.returncode == 1
    assert "corrupt.db" in proc.stderr and "not a SQLite database" in proc.stderr
    assert "Traceback" not in proc.stderr


@given(st.floats(min_value=0, max_value=4_000_000_000, allow_nan=False))
def test_stored_times_survive_a_round_trip(epoch: float) -> None:
    from pipeline.clock import format_ts, to_epoch, to_ts

    text = format_ts(epoch)
    assert to_ts(text) == text
    assert abs(to_epoch(text) - epoch) <= 0.0005 + 1e-6


def test_oversized_payloads_and_events_are_refused_naming_the_limit() -> None:
    from pipeline.registry import MAX_PAYLOAD_BYTES

    registry = pipeline.site.types_registry()
    big = "é" * (MAX_PAYLOAD_BYTES // 2 + 1)  # two bytes each in UTF-8: just over the limit
    with pytest.raises(pipeline.InvalidPayload, match=r"over the limit of 1,048,576"):
        registry.encode(pipeline.site.SendEmail(to="a@example.com", subject="s", body=big))
    with pytest.raises(pipeline.InvalidPayload, match="over the limit"):
        registry.validate("send_email", '{"to": "a@example.com", "subject": "s", "body": "' + "x" * MAX_PAYLOAD_BYTES + '"}')
    with pytest.raises(pipeline.InvalidPayload, match="data of event 'UserRegistered'.*over the limit"):
        registry.decode_event("UserRegistered", {"user_id": "x" * MAX_PAYLOAD_BYTES, "email": "e", "username": "u"})
    small = pipeline.site.types_registry(max_payload_bytes=100)
    small.encode(pipeline.site.SendEmail(to="a@example.com", subject="s", body="fits"))
    with pytest.raises(pipeline.InvalidPayload):
        small.encode(pipeline.site.SendEmail(to="a@example.com", subject="s", body="x" * 100))


@pytest.mark.parametrize("when", ["10000-01-01T00:00:00Z", "0001-01-01T00:00:00Z", 1e12 * 1000, -5.0, "soon", float("nan")])
async def test_run_after_outside_what_sorts_as_text_is_refused(tmp_path: Path, when: object) -> None:
    import attrs as attrs_mod

    @attrs_mod.frozen
    class Tick:
        n: int

    registry = pipeline.Registry()
    registry.register("tick", Tick)
    config = config_of(database_url=f"sqlite:///{tmp_path}/t.db", worker_enabled=False, admin_enabled=False)
    async with pipeline.open_pipeline(config, registry) as p:
        with pytest.raises(pipeline.UsageError, match="run_after"):
            await p.enqueue(Tick(1), run_after=when)
        assert (await p.backend.stats())["total"] == 0
    with pytest.raises(pipeline.InvalidPayload, match="publish_at 'someday'"):
        pipeline.site.types_registry().decode_event("PostScheduled", {"id": "1", "publish_at": "someday"})


def test_text_sqlite_cannot_store_and_deep_nesting_are_invalid_payloads() -> None:
    registry = pipeline.site.types_registry()
    with pytest.raises(pipeline.InvalidPayload, match="lone surrogate"):
        registry.encode(pipeline.site.SendEmail(to="a@example.com", subject="photo-\udcff.jpg", body="b"))
    with pytest.raises(pipeline.InvalidPayload, match="lone surrogate"):
        registry.decode_event("UserRegistered", {"user_id": "1", "email": "e@example.com", "username": "J\udcf6rg"})
    deep = '{"keys": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(pipeline.InvalidPayload, match="nested too deeply"):
        registry.decode("invalidate_cache", deep)


def test_payloads_that_are_not_strict_json_are_refused_by_name() -> None:
    import attrs as attrs_mod

    @attrs_mod.frozen
    class Reading:
        value: float
        tags: list

    registry = pipeline.Registry()
    registry.register("reading", Reading)
    assert registry.encode(Reading(1.5, ["é", {"a": None}])) == ("reading", '{"value":1.5,"tags":["é",{"a":null}]}')
    for bad in (float("nan"), float("inf")):  # stored, they would be JSON no other reader accepts
        with pytest.raises(pipeline.InvalidPayload, match="payload of 'reading' cannot be stored as JSON: Out of range"):
            registry.encode(Reading(bad, []))
    with pytest.raises(pipeline.InvalidPayload, match="cannot be stored as JSON: Object of type object"):
        registry.encode(Reading(1.0, [object()]))
    loop: list = []
    loop.append(loop)
    with pytest.raises(pipeline.InvalidPayload, match="refers to itself"):
        registry.encode(Reading(1.0, loop))


def test_sequence_fields_take_json_arrays_only() -> None:
    # cattrs takes any iterable: {"keys": "post:1"} was the six keys "p", "o", "s", "t", ":", "1"
    import attrs as attrs_mod

    @attrs_mod.frozen
    class Shapes:
        seq: tuple[str, ...] = ()
        items: list[int] = attrs_mod.field(factory=list)
        pair: tuple[int, str] = (0, "")
        tags: frozenset[str] = frozenset()
        nested: list[list[str]] = attrs_mod.field(factory=list)

    registry = pipeline.Registry()
    registry.register("shapes", Shapes)
    ok = registry.decode("shapes", {"seq": ["a"], "items": [1], "pair": [2, "b"], "tags": ["t"], "nested": [["n"]]})
    assert ok == Shapes(("a",), [1], (2, "b"), frozenset({"t"}), [["n"]])
    for field, value, where in [("seq", "post:1", "$.seq"), ("seq", {"a": 1}, "$.seq"), ("items", "12", "$.items"),
                                ("pair", "ab", "$.pair"), ("tags", "ab", "$.tags"), ("nested", ["ab"], "$.nested[0]")]:
        with pytest.raises(pipeline.InvalidPayload, match=rf"expected an array, got \w+ @ {re.escape(where)}$"):
            registry.decode("shapes", {field: value})
    with pytest.raises(pipeline.InvalidPayload, match=r"InvalidateCache: expected an array, got str @ \$\.keys"):
        pipeline.site.types_registry().validate("invalidate_cache", {"keys": "post:1"})


@pytest.mark.parametrize(
    "kind",
    [tuple, tuple, tuple[int, ...], tuple[int, ...], tuple[int, int], collections.deque[int], collections.deque,
     abc.Sequence[int], abc.MutableSequence[int], list, list[int], list[int], set[int], set,
     abc.Set[int], abc.MutableSet[int], frozenset[int], frozenset],
)
def test_the_arrays_only_guard_builds_what_cattrs_builds(kind: object) -> None:
    import attrs as attrs_mod

    Holder = attrs_mod.make_class("Holder", {"value": attrs_mod.field(type=kind)}, frozen=True)
    registry = pipeline.Registry()
    registry.register("holder", Holder)
    got = registry.decode("holder", {"value": [1, 2]}).value
    expected = cattrs.Converter().structure({"value": [1, 2]}, Holder).value
    assert (type(got), got) == (type(expected), expected)
    with pytest.raises(pipeline.InvalidPayload, match="expected an array, got str"):
        registry.decode("holder", {"value": "12"})


@pytest.mark.parametrize("delay", [float("inf"), float("nan"), 1e300, -1.0])
def test_retry_later_delays_are_finite_and_capped(delay: float) -> None:
    if not delay >= 0:
        with pytest.raises(ValueError, match="RetryLater delay"):
            pipeline.RetryLater("x", delay=delay)
    else:
        assert pipeline.RetryLater("x", delay=delay).delay == pipeline.RetryLater.MAX_DELAY
    decision = states.settle_failure(attempts=1, max_attempts=5, permanent=False, base_seconds=1.0, retry_delay=delay)
    assert 0 <= decision.delay <= states.MAX_DELAY


async def test_an_emit_the_store_cannot_take_fails_alone(config: Config) -> None:
    async with pipeline.open_pipeline(config, pipeline.site.types_registry()) as p:
        with pytest.raises(pipeline.InvalidPayload, match="lone surrogate"):
            await p.emit(pipeline.site.UserRegistered(user_id="1", email="e@example.com", username="J\udcf6rg"))
        ids = await p.emit(pipeline.site.UserRegistered(user_id="2", email="f@example.com", username="Jörg"))
        assert len(ids) == 1


@pytest.mark.parametrize(
    ("build", "says"),
    [
        (lambda: WorkerSettings(concurrency=0), "WORKER_CONCURRENCY): expected an integer >= 1"),
        (lambda: WorkerSettings(concurrency=True), "expected an integer, got bool"),
        (lambda: WorkerSettings(lease_seconds="30"), "expected a number, got str"),
        (lambda: MailSettings(smtp_security="ssl"), "expected one of none, starttls, tls"),
        (lambda: AdminSettings(port=70_000), "expected a TCP port 1-65535"),
        (lambda: WebhookSettings(urls=("ftp://example.com",)), "http(s) URLs"),
        (lambda: Config(database_url="sqlite:///"), "DATABASE_URL"),
    ],
)
def test_settings_built_in_code_are_checked_as_the_environment_is(build: Any, says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        build()


def test_secrets_are_masked_in_reprs() -> None:
    config = Config(database_url="sqlite:///x.db", admin=AdminSettings(token="MARKER"))
    mail = MailSettings(smtp_password="MARKER")
    assert "MARKER" not in repr(config) and "MARKER" not in repr(mail) and "'***'" in repr(mail)


def test_secrets_and_url_passwords_are_not_echoed_by_config_errors() -> None:
    with pytest.raises(ConfigError) as caught:
        Config.from_env({"WEBHOOK_SECRET": "whsec_MARKER"}, env_file=None).section(WebhookSettings)
    assert "MARKER" not in str(caught.value) and "WEBHOOK_SECRET='***'" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        Config.from_env({"CACHE_URL": "ftp://user:MARKER@host/"}, env_file=None).section(CacheSettings)
    assert "MARKER" not in str(caught.value) and "user:***@host" in str(caught.value)


def test_text_given_in_code_is_stored_as_the_environment_would_store_it() -> None:
    from pipeline.config import LogSettings, SqliteSettings

    assert SqliteSettings(synchronous="FULL").synchronous == "full"  # not a silent NORMAL
    assert SqliteSettings(synchronous="").synchronous == "full"  # empty: the default
    assert LogSettings(level="DEBUG").level == "debug"
    assert SiteSettings(url="https://example.com/").url == "https://example.com"
    assert Config(database_url=" sqlite:///x.db ").database_path == Path("x.db")
    assert WebhookSettings(urls=["https://example.com/hook"]).urls == ("https://example.com/hook",)
    with pytest.raises(ConfigError, match="WORKER_ENABLED"):
        WorkerSettings(enabled=1)
    hash(Config())  # frozen, and usable as a key
