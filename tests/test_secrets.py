"""Secrets never appear where people and programs read (issue 15 item 3, issue 12's DATABASE_URL rule).

Each secret is set to a marker; then every output is collected and searched for the
markers: reprs of the config, start-up errors for bad values, the logs of a run in which
every job that touches a secret fails (so its error is recorded), every read of the admin
API (the dashboard shows only what the API gives it), /metrics, /openapi.json, the
dashboard's own files, and the CLI's ``--json`` output and messages. DATABASE_URL is a
Postgres URL with a password (trust auth here: any password connects) in one run, SQLite
in the other; CACHE_URL names Redis with a user and password, which fail AUTH (or, with no Redis,
the connection: either error is searched).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import logging
import socket
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from conftest import require_program, require_service
from test_admin_api import served

from pipeline import Config, ConfigError, cli
from pipeline.site import SendEmail, default_registry
from pipeline.site.jobs import InvalidateCache, WebhookNotify
from pipeline.site.settings import SECTIONS

ADMIN = "adm-M4RK3R-token"
SMTP = "smtp-M4RK3R-pass"
HOOK_KEY = base64.b64encode(b"hook-M4RK3R-key-bytes").decode()  # whsec_<this>: the marker is the base64 text
HOOK_URL_PASSWORD = "url-M4RK3R-hook"
CACHE = "cache-M4RK3R-pass"
DB = "db-M4RK3R-pass"


def encoded(password: str) -> str:
    """A password as a URL may carry it, percent-encoded (``M4RK%33R``: ``%33`` is ``3``). The
    driver decodes it, so the secret is both forms: neither may be shown."""
    return password.replace("3", "%33")


# The URL passwords are written percent-encoded: each marker is looked for as written and decoded.
MARKERS = (ADMIN, SMTP, HOOK_KEY, HOOK_URL_PASSWORD, CACHE, DB, encoded(HOOK_URL_PASSWORD), encoded(CACHE), encoded(DB))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _psql(sql: str) -> None:
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-qc", sql],
                   check=True, capture_output=True, timeout=30)


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'jobs.db'}"
        return
    require_service("PostgreSQL", "127.0.0.1", 5432)
    name = f"pipeline_secrets_{uuid.uuid4().hex[:12]}"
    _psql(f"CREATE DATABASE {name}")
    try:
        yield f"postgresql://postgres:{encoded(DB)}@127.0.0.1:5432/{name}"
    finally:
        _psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def environment(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Every secret set to its marker, in the process environment (the CLI reads it)."""
    monkeypatch.chdir(tmp_path)  # no .env; media, public and the site's content under tmp_path
    env = {
        "DATABASE_URL": database_url,
        "SITE_DATABASE_URL": f"sqlite:///{tmp_path / 'site.db'}",
        "ADMIN_TOKEN": ADMIN,
        "ADMIN_PORT": "0",
        "SMTP_HOST": "127.0.0.1",  # loopback: SMTP_SECURITY=none with credentials is allowed
        "SMTP_PORT": str(free_port()),  # nothing listens: the mail fails to connect
        "SMTP_USERNAME": "mailer",
        "SMTP_PASSWORD": SMTP,
        "MAIL_FROM": "noreply@example.com",
        "WEBHOOK_SECRET": f"whsec_{HOOK_KEY}",
        "WEBHOOK_URLS": f"http://hook:{encoded(HOOK_URL_PASSWORD)}@127.0.0.1:{free_port()}/in",
        "WEBHOOK_ALLOW_PRIVATE_NETWORKS": "true",
        "CACHE_URL": f"redis://cacheuser:{encoded(CACHE)}@127.0.0.1:6379/0",
        "WORKER_POLL_INTERVAL_MS": "20",
        "WORKER_BACKOFF_BASE_MS": "10",
        "SQLITE_SYNCHRONOUS": "normal",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def assert_no_marker(where: str, text: str) -> None:
    for marker in MARKERS:
        assert marker not in text, f"{where} shows a secret ({marker}):\n{text[:3000]}"


def test_config_reprs_and_errors_never_show_a_secret(environment: dict[str, str]) -> None:
    config = Config.from_env(env_file=None)
    sections = [config.section(section) for section in SECTIONS]
    assert_no_marker("repr(Config)", repr(config) + str(config))
    for section in sections:
        assert_no_marker(f"repr({type(section).__name__})", repr(section))
    # a bad value of each secret (or of a setting holding one) is named, not shown
    bad = {
        "WEBHOOK_SECRET": f"whsec_{HOOK_KEY}!",
        "WEBHOOK_URLS": f"ftp://hook:{encoded(HOOK_URL_PASSWORD)}@example.com/",
        "CACHE_URL": f"http://cacheuser:{encoded(CACHE)}@127.0.0.1/",
        "DATABASE_URL": f"mysql://root:{encoded(DB)}@127.0.0.1/db",
    }
    for name, value in bad.items():
        with pytest.raises(ConfigError) as caught:
            broken = Config.from_env({**environment, name: value}, env_file=None)
            for section in SECTIONS:
                broken.section(section)
        assert name in str(caught.value)
        assert_no_marker(f"the error for a bad {name}", str(caught.value))


async def test_no_output_shows_a_secret(environment: dict[str, str], caplog: pytest.LogCaptureFixture,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG)
    config = Config.from_env(env_file=None)
    seen: list[tuple[str, str]] = []

    async with served(config, default_registry(config), auth=True) as (p, client):
        ids = [
            await p.enqueue(WebhookNotify(url=config.environ["WEBHOOK_URLS"], payload={"post": 1}), max_attempts=1),
            await p.enqueue(InvalidateCache(keys=("post:1",)), max_attempts=1),
            await p.enqueue(SendEmail(to="a@example.org", subject="hi", body="x"), max_attempts=1),
        ]
        with trio.fail_after(30):
            for job_id in ids:
                while (job := await p.backend.get(job_id)) is None or job.status != "dead":
                    await trio.sleep(0.02)
        for path in ("/admin/jobs", "/admin/stats", "/healthz", "/metrics", "/openapi.json", "/admin",
                     "/admin/static/dashboard.js", "/admin/static/dashboard.css", *(f"/admin/jobs/{i}" for i in ids),
                     "/admin/jobs/nope"):
            r = await client.get(path)
            assert r.status_code in (200, 404), (path, r.text)
            seen.append((f"GET {path}", r.text + json.dumps(dict(r.headers))))
        wrong = await client.get("/admin/jobs", headers={"Authorization": f"Bearer {ADMIN}x"})
        seen.append(("a wrong token's 401", wrong.text))
        created = await client.post("/admin/jobs", json={"job_type": "webhook_notify",
                                                         "payload": {"url": config.environ["WEBHOOK_URLS"], "payload": {}}})
        assert created.status_code == 201
        seen.append(("POST /admin/jobs", created.text))
        errors = [(await p.backend.get(i)).error for i in ids]  # type: ignore[union-attr]

    hook = json.loads(seen[-1][1])["payload"]["url"]
    assert hook.startswith("http://hook:***@127.0.0.1:")  # shown masked, and stored whole for the handler
    assert all(errors), errors
    for error in errors:
        seen.append(("a job's error", error))

    def run(*argv: str) -> str:  # the CLI runs trio itself: in a thread of its own
        out = io.StringIO()
        code = cli.main(list(argv), stdout=out)
        assert code in (0, 1, 2), argv
        return out.getvalue()

    for argv in (["jobs", "--json"], ["jobs", "show", ids[0], "--json"], ["jobs", "show", ids[0]], ["stats", "--json"],
                 ["enqueue", "webhook_notify", "--payload", json.dumps({"url": config.environ["WEBHOOK_URLS"], "payload": {}}),
                  "--json"], ["jobs", "show", "nope", "--json"]):
        seen.append((f"pipeline {' '.join(argv)}", await trio.to_thread.run_sync(lambda: run(*argv))))  # noqa: B023 -- awaited at once
    captured = capsys.readouterr()
    seen.append(("the CLI's standard error and output", captured.err + captured.out))
    seen.append(("the logs", "\n".join(f"{r.name} {r.levelname} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records)))
    for where, text in seen:
        assert_no_marker(where, text)


def test_database_errors_never_show_the_password(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """libpq quotes what it cannot parse, the password too; the errors the CLI prints do not.
    (No server is needed: these fail as the URL is parsed.)"""
    monkeypatch.chdir(tmp_path)
    for url in (f"postgresql://postgres:{encoded(DB)}%zz@127.0.0.1:5432/postgres",  # a bad percent-escape
                f"postgresql://postgres:{encoded(DB)}@[127.0.0.1/postgres",  # an unclosed IPv6 bracket: libpq quotes the URI
                f"postgresql://postgres@[127.0.0.1/postgres?password={encoded(DB)}"):
        # (an unreachable server's error names it masked too, but only after the pool's 10 s of retries)
        monkeypatch.setenv("DATABASE_URL", url)
        assert cli.main(["stats", "--json"], stdout=io.StringIO()) in (1, 2)
        err = capsys.readouterr().err
        assert "error" in err
        assert_no_marker(f"the error for DATABASE_URL={url!r}", err)
        assert_no_marker(f"the logs for DATABASE_URL={url!r}", "\n".join(r.getMessage() for r in caplog.records))
        caplog.clear()


def test_a_server_that_refuses_the_connection_is_said_at_once_without_the_password(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A role that does not exist is the server's FATAL answer: waiting will not cure it, so the
    CLI says it at once (not after the pool's 10 s of retries), as a refusal, not "retry later"."""
    require_service("PostgreSQL", "127.0.0.1", 5432)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DATABASE_URL", f"postgresql://nobody_{uuid.uuid4().hex[:6]}:{encoded(DB)}@127.0.0.1:5432/postgres")
    started = time.monotonic()
    assert cli.main(["stats"], stdout=io.StringIO()) == 1
    assert time.monotonic() - started < 5
    err = capsys.readouterr().err
    assert "refused the connection" in err and "does not exist" in err and "retry later" not in err, err
    assert_no_marker("the error of a refused connection", err)


def test_the_cache_url_password_is_not_in_its_errors(tmp_path: Path) -> None:
    from pipeline.site.cache import open_cache_store

    async def main() -> str:
        try:
            async with open_cache_store(f"redis://cacheuser:{encoded(CACHE)}@127.0.0.1:6379/x") as store:
                await store.delete_many(["k"])
        except ConfigError as exc:
            return str(exc)
        raise AssertionError("a bad database number was accepted")

    assert_no_marker("CACHE_URL's error", trio.run(main))


class RefusingPostgres:
    """A TCP server speaking just enough of PostgreSQL's protocol to ask for the password in
    clear text, keep what the client sent, and refuse it with a FATAL answer quoting it, as a
    server or a pooler in front of it may word a refusal. What libpq sends is the password
    decoded: that is the form such an answer quotes."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.received: list[str] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with self.listener:
            while True:
                try:
                    conn, _ = self.listener.accept()
                except OSError:  # closed: the test is over
                    return
                with conn:
                    conn.settimeout(5)
                    with contextlib.suppress(OSError, struct.error):
                        self._refuse(conn)

    def _refuse(self, conn: socket.socket) -> None:
        def read(n: int) -> bytes:
            data = b""
            while len(data) < n:
                chunk = conn.recv(n - len(data))
                if not chunk:
                    raise OSError("closed")
                data += chunk
            return data

        while True:  # SSLRequest and GSSENCRequest are answered "N"; then the startup message
            length, code = struct.unpack("!ii", read(8))
            read(length - 8)
            if code in (80877103, 80877104):
                conn.sendall(b"N")
                continue
            break
        conn.sendall(b"R" + struct.pack("!ii", 8, 3))  # AuthenticationCleartextPassword
        kind, length = struct.unpack("!ci", read(5))
        password = read(length - 4).rstrip(b"\0").decode()
        self.received.append(password)
        fields = [b"SFATAL", b"VFATAL", b"C28P01", f'Mpassword authentication failed for user "postgres": got "{password}"'.encode()]
        body = b"".join(field + b"\0" for field in fields) + b"\0"
        conn.sendall(b"E" + struct.pack("!i", len(body) + 4) + body)

    def close(self) -> None:
        self.listener.close()


def test_a_refused_percent_encoded_password_is_shown_in_neither_form(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    """DATABASE_URL's password percent-encoded, the server refusing it: the CLI's error (said at
    once) and the logs show neither the password as written nor as the driver decoded it."""
    caplog.set_level(logging.DEBUG)
    monkeypatch.chdir(tmp_path)
    server = RefusingPostgres()
    try:
        monkeypatch.setenv("DATABASE_URL", f"postgresql://postgres:{encoded(DB)}@127.0.0.1:{server.port}/jobs")
        started = time.monotonic()
        assert cli.main(["stats"], stdout=io.StringIO()) == 1
        assert time.monotonic() - started < 5
    finally:
        server.close()
    assert server.received and set(server.received) == {DB}  # libpq sent it decoded
    err = capsys.readouterr().err
    assert "refused the connection" in err and "password authentication failed" in err, err
    assert f"postgresql://postgres:***@127.0.0.1:{server.port}/jobs" in err, err
    assert_no_marker("the error of a refused password", err)
    assert_no_marker("the logs of a refused password", "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records))


def test_a_wrong_percent_encoded_password_for_redis_is_shown_in_neither_form(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    """A redis-server of this test's own that wants another password (and, for the user form,
    has no such user): the error names the server, with the password masked in both forms."""
    server = require_program("redis-server", "Debian: apt-get install redis-server")
    caplog.set_level(logging.DEBUG)
    monkeypatch.chdir(tmp_path)
    port = free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path), "--save", "",
                             "--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction",
                             "--requirepass", "the-right-one"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.monotonic() < deadline and proc.poll() is None, "redis-server did not start"
            time.sleep(0.02)
        for userinfo in (f":{encoded(DB)}", f"someone:{encoded(DB)}"):
            url = f"redis://{userinfo}@127.0.0.1:{port}/0"
            monkeypatch.setenv("DATABASE_URL", url)
            assert cli.main(["stats"], stdout=io.StringIO()) == 1
            err = capsys.readouterr().err
            assert "invalid username-password pair" in err and "refused the credentials" in err and "retry later" not in err
            assert f"redis://{userinfo.split(':')[0]}:***@127.0.0.1:{port}/0" in err, err
            assert_no_marker(f"the error for {url}", err)
        assert_no_marker("the logs", "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records))
    finally:
        proc.kill()
        proc.wait()
