"""The mail handlers against a real SMTP server (aiosmtpd) on loopback.

aiosmtpd is asyncio: its Controller runs its own event loop in its own thread, next to
the test's trio loop; the two only meet through sockets.
"""

from __future__ import annotations

import email
import email.policy
import os
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trustme
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from conftest import fast_config, missing
from jobkit import wait_status

import pipeline
from pipeline import ConfigError, PermanentError, Registry, site
from pipeline.site import SendEmail, SendWelcomeEmail, UserRegistered, default_registry, mail
from pipeline.site.settings import MailSettings

SENDER = "Blog <noreply@example.com>"


@attrs.frozen
class Received:
    mail_from: str
    rcpt_tos: list[str]
    message: email.message.EmailMessage
    login: bytes | None  # who authenticated, if anyone


class Inbox:
    """An aiosmtpd handler that keeps what it accepts, and answers with scripted errors first."""

    def __init__(self, *, rcpt_replies: tuple[str, ...] = (), data_replies: tuple[str, ...] = ()) -> None:
        self.lock = threading.Lock()  # the server thread writes, the test reads
        self.messages: list[Received] = []
        self.connections = 0
        self.rcpt_replies = list(rcpt_replies)
        self.data_replies = list(data_replies)

    async def handle_EHLO(self, server: Any, session: Any, envelope: Any, hostname: str, responses: list[str]) -> list[str]:
        with self.lock:
            self.connections += 1
        session.host_name = hostname
        return responses

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: list[str]) -> str:
        with self.lock:
            if self.rcpt_replies:
                return self.rcpt_replies.pop(0)
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        with self.lock:
            if self.data_replies:
                return self.data_replies.pop(0)
            # as a mail client would read it: the wire's CRLF line ends become \n
            message = email.message_from_bytes(envelope.content.replace(b"\r\n", b"\n"), policy=email.policy.default)
            login = session.auth_data.login if isinstance(session.auth_data, LoginPassword) else None
            self.messages.append(Received(envelope.mail_from, list(envelope.rcpt_tos), message, login))  # type: ignore[arg-type]
        return "250 OK: queued"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def smtp_server() -> Iterator[Callable[..., tuple[Inbox, int]]]:
    """Start an aiosmtpd server on loopback: ``start(inbox, **smtp_options) -> (inbox, port)``."""
    controllers: list[Controller] = []

    def start(inbox: Inbox | None = None, **options: Any) -> tuple[Inbox, int]:
        inbox = inbox or Inbox()
        port = free_port()
        controller = Controller(inbox, hostname="127.0.0.1", port=port, **options)
        controller.start()
        controllers.append(controller)
        return inbox, port

    yield start
    for controller in controllers:
        controller.stop()


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def server_tls(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(ctx)
    return ctx


@pytest.fixture
def client_tls(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    return ctx


def mail_config(db_path: Path, port: int, **overrides: Any) -> pipeline.Config:
    values: dict[str, Any] = dict(smtp_host="127.0.0.1", smtp_port=port, mail_from=SENDER, smtp_timeout=5.0)
    values.update(overrides)
    return fast_config(db_path, **values)


def mail_registry(config: pipeline.Config, **options: Any) -> Registry:
    registry = site.types_registry()
    mail.install(registry, config, **options)
    return registry


async def run_job(config: pipeline.Config, registry: Registry, job: Any, *, max_attempts: int = 3) -> Any:
    """Enqueue one job into a running pipeline and return its record once settled."""
    async with pipeline.open_pipeline(config, registry) as p:
        job_id = await p.enqueue(job, max_attempts=max_attempts)
        return await settled(p, job_id)


async def settled(p: pipeline.Pipeline, job_id: str) -> Any:
    return await wait_status(p, job_id, "completed", "dead", timeout=15)


# -- delivery ---------------------------------------------------------------------------------


async def test_send_email_delivers_to_the_recipient(db_path: Path, smtp_server: Any) -> None:
    inbox, port = smtp_server()
    config = mail_config(db_path, port)
    job = SendEmail(to="Alice Example <alice@example.org>", subject="Your export is ready", body="Hi Alice,\n\nhere it is.\n")
    record = await run_job(config, mail_registry(config), job)

    assert (record.status, record.attempts) == ("completed", 1), record.error
    (got,) = inbox.messages
    assert got.mail_from == "noreply@example.com"
    assert got.rcpt_tos == ["alice@example.org"]
    msg = got.message
    assert msg["Subject"] == "Your export is ready"
    assert msg["To"] == "Alice Example <alice@example.org>"
    assert msg["From"] == SENDER
    assert msg["Message-ID"] == f"<{record.id}@example.com>"  # the same on every attempt of this job
    assert msg["Date"]
    assert msg.get_content_type() == "text/plain"
    assert msg.get_content() == "Hi Alice,\n\nhere it is.\n"


async def test_user_registered_sends_a_welcome_mail_with_text_and_html(db_path: Path, smtp_server: Any) -> None:
    """The route end to end: emit UserRegistered into the default pipeline, find the mail."""
    inbox, port = smtp_server()
    config = mail_config(db_path, port, site_url="https://blog.example.com")
    async with pipeline.open_pipeline(config, default_registry(config)) as p:
        (job_id,) = await p.emit(UserRegistered(user_id="u-1", email="bob@example.org", username='Zoë <b>"&'))
        record = await settled(p, job_id)

    assert (record.job_type, record.status) == ("send_welcome_email", "completed"), record.error
    (got,) = inbox.messages
    assert got.rcpt_tos == ["bob@example.org"]
    msg = got.message
    assert msg["Subject"] == "Welcome to blog.example.com"
    assert msg.get_content_type() == "multipart/alternative"
    text = msg.get_body(("plain",)).get_content()
    markup = msg.get_body(("html",)).get_content()
    assert 'Hello Zoë <b>"&,' in text
    assert "https://blog.example.com" in text
    assert "Hello <strong>Zoë &lt;b&gt;&quot;&amp;</strong>" in markup  # the name is escaped in HTML
    assert "<b>" not in markup
    assert '<a href="https://blog.example.com">' in markup


def test_welcome_template_can_be_replaced() -> None:
    template = mail.WelcomeTemplate(subject="Hi from $site", text="Dear $name", html="<p>Dear $name</p>")
    assert template.render("<Eve>", "http://x.test/") == ("Hi from x.test", "Dear <Eve>", "<p>Dear &lt;Eve&gt;</p>")


# -- replies from the server --------------------------------------------------------------------


async def test_4xx_reply_is_retried_and_then_delivered(db_path: Path, smtp_server: Any) -> None:
    inbox, port = smtp_server(Inbox(data_replies=("451 4.3.0 Mailbox busy, try again later",)))
    config = mail_config(db_path, port)
    record = await run_job(config, mail_registry(config), SendEmail(to="carol@example.org", subject="Hi", body="x"))

    assert (record.status, record.attempts) == ("completed", 2), record.error
    assert len(inbox.messages) == 1
    assert inbox.connections == 2


async def test_4xx_reply_is_a_transient_error(db_path: Path, smtp_server: Any) -> None:
    inbox, port = smtp_server(Inbox(rcpt_replies=("452 4.2.2 Mailbox full",) * 3))
    config = mail_config(db_path, port)
    record = await run_job(config, mail_registry(config), SendEmail(to="dan@example.org", subject="Hi", body="x"), max_attempts=2)

    assert (record.status, record.attempts) == ("dead", 2)  # retried until out of attempts
    assert record.error.startswith("MailNotSentYet: ")
    assert "refused recipient dan@example.org: 452 4.2.2 Mailbox full" in record.error
    assert inbox.messages == []


@pytest.mark.parametrize(
    ("inbox", "expected"),
    [
        (Inbox(data_replies=("554 5.7.1 Rejected as spam",)), "refused the mail: 554 5.7.1 Rejected as spam"),
        (Inbox(rcpt_replies=("550 5.1.1 No such user",)), "refused recipient erin@example.org: 550 5.1.1 No such user"),
    ],
    ids=["data", "rcpt"],
)
async def test_5xx_reply_is_dead_at_once(db_path: Path, smtp_server: Any, inbox: Inbox, expected: str) -> None:
    inbox, port = smtp_server(inbox)
    config = mail_config(db_path, port)
    record = await run_job(config, mail_registry(config), SendEmail(to="erin@example.org", subject="Hi", body="x"))

    assert (record.status, record.attempts) == ("dead", 1)
    assert record.error.startswith("permanent error: ")
    assert expected in record.error
    assert inbox.messages == []


async def test_connection_refused_is_retried(db_path: Path) -> None:
    config = mail_config(db_path, free_port())  # nothing listens there
    record = await run_job(config, mail_registry(config), SendEmail(to="a@example.org", subject="Hi", body="x"), max_attempts=2)

    assert (record.status, record.attempts) == ("dead", 2)
    assert record.error.startswith("MailNotSentYet: could not connect to SMTP server 127.0.0.1:")
    assert "Connection refused" in record.error


# -- bad input and missing settings: dead at once, nothing sent ------------------------------------


@pytest.mark.parametrize(
    ("to", "subject", "expected"),
    [
        ("alice@example.org", "Hi\r\nBcc: everyone@example.net", "subject 'Hi\\r\\nBcc: everyone@example.net' contains a line break"),
        ("alice@example.org", "Hi\u2028Bcc: everyone@example.net", "subject 'Hi\\u2028Bcc: everyone@example.net' contains a line break"),
        ("alice@example.org", "Hi\x85there", "subject 'Hi\\x85there' contains a line break"),
        ("alice@example.org\nBcc: everyone@example.net", "Hi", "recipient address 'alice@example.org\\nBcc: everyone@example.net' contains a line break"),
        ("alice@example.org\u2029", "Hi", "recipient address 'alice@example.org\\u2029' contains a line break"),
        ("not-an-address", "Hi", "recipient address 'not-an-address' is not a valid email address"),
        ("alice@", "Hi", "recipient address 'alice@' is not a valid email address"),
        ("a@example.org, b@example.org", "Hi", "must be exactly one address, found 2"),
        ("", "Hi", "recipient address is empty"),
    ],
    ids=["crlf-subject", "u2028-subject", "nel-subject", "lf-address", "u2029-address", "no-domain", "empty-domain",
         "two-addresses", "empty"],
)
async def test_bad_address_or_subject_is_dead_and_nothing_is_sent(
    db_path: Path, smtp_server: Any, to: str, subject: str, expected: str
) -> None:
    inbox, port = smtp_server()
    config = mail_config(db_path, port)
    record = await run_job(config, mail_registry(config), SendEmail(to=to, subject=subject, body="x"))

    assert (record.status, record.attempts) == ("dead", 1)
    assert expected in record.error
    assert inbox.connections == 0  # refused before connecting
    assert inbox.messages == []


@pytest.mark.parametrize(
    ("settings", "variable"),
    [({"smtp_host": ""}, "SMTP_HOST"), ({"mail_from": ""}, "MAIL_FROM"), ({"mail_from": "noreply"}, "MAIL_FROM")],
    ids=["no-host", "no-sender", "bad-sender"],
)
async def test_smtp_not_configured_is_dead_naming_the_variable(db_path: Path, settings: dict[str, str], variable: str) -> None:
    config = mail_config(db_path, free_port(), **settings)
    registry = default_registry(config)
    record = await run_job(config, registry, SendWelcomeEmail(user_id="u", email="a@example.org", username="A"))

    assert (record.status, record.attempts) == ("dead", 1)
    assert variable in record.error


# -- TLS and AUTH --------------------------------------------------------------------------------


def authenticator(server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any) -> AuthResult:
    ok = isinstance(auth_data, LoginPassword) and (auth_data.login, auth_data.password) == (b"mailer", b"s3cret")
    # handled=False: let aiosmtpd answer 535 itself (its default, True, means "I replied already")
    return AuthResult(success=ok, handled=False, auth_data=auth_data)


async def test_starttls_with_auth(db_path: Path, smtp_server: Any, server_tls: ssl.SSLContext, client_tls: ssl.SSLContext) -> None:
    inbox, port = smtp_server(tls_context=server_tls, require_starttls=True, auth_required=True, authenticator=authenticator)
    config = mail_config(db_path, port, smtp_security="starttls", smtp_username="mailer", smtp_password="s3cret")
    record = await run_job(config, mail_registry(config, ssl_context=client_tls), SendEmail(to="f@example.org", subject="TLS", body="x"))

    assert record.status == "completed", record.error
    (got,) = inbox.messages
    assert got.login == b"mailer"
    assert got.message["Subject"] == "TLS"


async def test_credentials_use_starttls_when_offered_even_with_security_none(
    db_path: Path, smtp_server: Any, server_tls: ssl.SSLContext, client_tls: ssl.SSLContext
) -> None:
    """SMTP_SECURITY=none (the default) with a username: the server offers STARTTLS, so the
    login happens only after it (aiosmtpd's auth_require_tls refuses AUTH on the plain
    connection: before the upgrade it does not even offer AUTH)."""
    inbox, port = smtp_server(tls_context=server_tls, auth_required=True, authenticator=authenticator)
    config = mail_config(db_path, port, smtp_username="mailer", smtp_password="s3cret")
    assert config.section(MailSettings).smtp_security == "none"
    record = await run_job(config, mail_registry(config, ssl_context=client_tls), SendEmail(to="f@example.org", subject="up", body="x"))

    assert record.status == "completed", record.error
    (got,) = inbox.messages
    assert got.login == b"mailer"


@pytest.mark.parametrize("host", ["mail.example.com", "10.0.0.5", "127.0.0.1.example.com", "[2001:db8::1]",
                                  "localhost.example.com", "localhost-mail.example.com", "0.0.0.0"])
def test_credentials_in_clear_text_to_a_remote_host_are_refused_at_start(db_path: Path, host: str) -> None:
    with pytest.raises(ConfigError) as caught:
        mail_config(db_path, 587, smtp_host=host, smtp_username="mailer", smtp_password="s3cret").section(MailSettings)
    message = str(caught.value)
    for name in ("SMTP_USERNAME", "SMTP_PASSWORD", "SMTP_SECURITY=none", "SMTP_HOST", "starttls", "tls"):
        assert name in message
    assert "s3cret" not in message
    for fine in ({"smtp_security": "starttls"}, {"smtp_security": "tls"}, {"smtp_host": "localhost"}, {"smtp_host": "127.0.0.1"},
                 {"smtp_host": "[::1]"}, {"smtp_host": "::1"}, {"smtp_host": "LocalHost."}, {"smtp_host": "mail.localhost"},
                 {"smtp_host": "127.8.9.10"}, {"smtp_username": "", "smtp_password": ""}):
        values = {"smtp_host": host, "smtp_username": "mailer", "smtp_password": "s3cret", **fine}
        mail_config(db_path, 587, **values).section(MailSettings)


def test_the_service_exits_2_naming_the_settings(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "DATABASE_URL": f"sqlite:///{tmp_path / 'p.db'}",
           "ADMIN_ENABLED": "false", "SMTP_HOST": "mail.example.com", "SMTP_USERNAME": "mailer", "SMTP_PASSWORD": "s3cret"}
    done = subprocess.run([sys.executable, "-m", "pipeline", "--env-file", str(tmp_path / "none.env")], env=env,
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "SMTP_SECURITY=none" in done.stderr and "SMTP_PASSWORD" in done.stderr and "s3cret" not in done.stderr


async def test_wrong_password_is_dead_naming_the_user(
    db_path: Path, smtp_server: Any, server_tls: ssl.SSLContext, client_tls: ssl.SSLContext
) -> None:
    inbox, port = smtp_server(tls_context=server_tls, require_starttls=True, auth_required=True, authenticator=authenticator)
    config = mail_config(db_path, port, smtp_security="starttls", smtp_username="mailer", smtp_password="wrong")
    record = await run_job(config, mail_registry(config, ssl_context=client_tls), SendEmail(to="f@example.org", subject="x", body="x"))

    assert (record.status, record.attempts) == ("dead", 1)
    assert "refused the login of SMTP_USERNAME='mailer': 535" in record.error
    assert inbox.messages == []


async def test_implicit_tls(db_path: Path, smtp_server: Any, server_tls: ssl.SSLContext, client_tls: ssl.SSLContext) -> None:
    inbox, port = smtp_server(ssl_context=server_tls)
    config = mail_config(db_path, port, smtp_security="tls")
    record = await run_job(config, mail_registry(config, ssl_context=client_tls), SendEmail(to="g@example.org", subject="TLS", body="x"))

    assert record.status == "completed", record.error
    assert [m.rcpt_tos for m in inbox.messages] == [["g@example.org"]]


async def test_untrusted_certificate_is_not_accepted(db_path: Path, smtp_server: Any, server_tls: ssl.SSLContext) -> None:
    """Without the test CA the system trust store is used, and the self-signed chain fails."""
    inbox, port = smtp_server(ssl_context=server_tls)
    config = mail_config(db_path, port, smtp_security="tls")
    record = await run_job(config, mail_registry(config), SendEmail(to="g@example.org", subject="x", body="x"), max_attempts=1)

    assert record.status == "dead"
    assert "CERTIFICATE_VERIFY_FAILED" in record.error
    assert inbox.messages == []


async def test_starttls_asked_but_not_offered_is_dead(db_path: Path, smtp_server: Any, client_tls: ssl.SSLContext) -> None:
    inbox, port = smtp_server()  # plain server, no STARTTLS
    config = mail_config(db_path, port, smtp_security="starttls")
    record = await run_job(config, mail_registry(config, ssl_context=client_tls), SendEmail(to="h@example.org", subject="x", body="x"))

    assert (record.status, record.attempts) == ("dead", 1)
    assert "(SMTP_SECURITY=starttls) does not support" in record.error
    assert "STARTTLS" in record.error


async def test_ssl_cert_file_points_the_default_check_at_a_private_ca(
    db_path: Path, tmp_path: Path, smtp_server: Any, server_tls: ssl.SSLContext, ca: trustme.CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ssl_context given: the system's default verification, which honours SSL_CERT_FILE."""
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    inbox, port = smtp_server(ssl_context=server_tls)
    config = mail_config(db_path, port, smtp_security="tls")
    record = await run_job(config, mail_registry(config), SendEmail(to="i@example.org", subject="x", body="x"))

    assert record.status == "completed", record.error
    assert len(inbox.messages) == 1


def _own_address() -> str | None:
    """This machine's address on its way out (no packet is sent), if it is not loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def test_credentials_in_clear_text_go_only_where_the_name_and_the_address_are_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Mailer built by hand (no start-time check) with a username, SMTP_SECURITY=none and a
    server offering AUTH but no STARTTLS: the password goes only to a host written as loopback
    that the connection reached at a loopback address. ``localhost.example.com`` is not loopback
    even where it resolves to 127.0.0.1; ``mail.localhost`` is refused where a DNS server answered
    it with another address. Names are resolved by a stand-in for DNS (the one part that cannot
    run here); the connections and the SMTP servers are real."""
    own = _own_address()
    if own is None:
        missing("this machine has no address besides loopback (the test needs one to stand for a remote SMTP server)")
    tried: list[bytes] = []

    def recording(server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any) -> AuthResult:
        tried.append(auth_data.password)
        return authenticator(server, session, envelope, mechanism, auth_data)

    resolved = {"localhost.example.com": "127.0.0.1", "mail.localhost": own}
    real_getaddrinfo = socket.getaddrinfo

    def dns(host: Any, *args: Any, **kwargs: Any) -> Any:
        return real_getaddrinfo(resolved.get(host, host), *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", dns)
    controllers = []
    try:
        servers = {}
        for address in ("127.0.0.1", own):
            inbox, port = Inbox(), free_port()
            controller = Controller(inbox, hostname=address, port=port, auth_require_tls=False, authenticator=recording)
            controller.start()
            controllers.append(controller)
            servers[address] = (inbox, port)

        def send(host: str, address: str) -> None:
            mailer = mail.Mailer(host=host, port=servers[address][1], username="mailer", password="s3cret", security="none",
                                 timeout=5.0, mail_from=SENDER, site_url="http://localhost", limiter=trio.CapacityLimiter(1),
                                 ssl_context=None, welcome=mail.WelcomeTemplate())
            mailer.send_blocking(mailer.compose("job-1", "a@example.org", "hi", "x"))

        for host, address, why in (("localhost.example.com", "127.0.0.1", "SMTP_HOST='localhost.example.com'"),
                                   ("mail.localhost", own, f"mail.localhost (reached at {own})"),
                                   (own, own, f"SMTP_HOST='{own}'")):
            with pytest.raises(PermanentError) as refused:
                send(host, address)
            assert f"not sending SMTP_PASSWORD in clear text to {why}, which is not loopback" in str(refused.value)
        assert tried == [] and all(inbox.messages == [] for inbox, _ in servers.values())

        send("localhost", "127.0.0.1")  # written and reached as loopback: the login goes in clear, on this machine only
        (got,) = servers["127.0.0.1"][0].messages
        assert got.login == b"mailer" and tried == [b"s3cret"]
    finally:
        for controller in controllers:
            controller.stop()
