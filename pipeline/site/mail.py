"""Mail handlers: ``send_email`` and ``send_welcome_email`` over SMTP (seed 7).

smtplib is blocking, so each send runs in a thread behind the mailer's own
CapacityLimiter (a resource named ``"mail"``), never on the trio loop and never in the
threads the database or the image handlers use. One SMTP connection per mail: jobs are
independent and a connection held open between jobs would go stale between bursts.

How a failure settles the job (the error recorded on the job says which case it was):

=============================================  =========================================
connection refused, timeout, TLS handshake,    retried with backoff (``MailNotSentYet``)
dropped connection, 4xx reply
5xx reply (refused sender, recipient, data,    dead at once (``PermanentError``)
login), server lacks STARTTLS/AUTH/SMTPUTF8
CR or LF in an address or the subject,         dead at once, nothing is sent
an address that does not parse
SMTP_HOST or MAIL_FROM empty                   dead at once, the error names the variable
=============================================  =========================================

Every mail carries ``Message-ID: <job id@sender's domain>``: a retried send (say the
server accepted the data but the connection dropped before we read its reply) is the
same message, which receiving servers and clients can recognise as a duplicate.
"""

from __future__ import annotations

import email.policy
import email.utils
import html
import ipaddress
import logging
import smtplib
import ssl
import string
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from email.headerregistry import Address
from email.message import EmailMessage
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..config import Config
from ..errors import PermanentError
from .jobs import SendEmail, SendWelcomeEmail
from .settings import MailSettings, SiteSettings, is_loopback_host

if TYPE_CHECKING:
    from ..context import JobContext
    from ..registry import Registry

log = logging.getLogger("pipeline.mail")

RESOURCE = "mail"
MAIL_JOB_TYPES = ("send_email", "send_welcome_email")
# what str.splitlines() breaks at: the email package folds a header at any of them, so none
# can ever be sent in one (CR and LF would inject headers; NEL and U+2028 fail at send time)
LINE_BREAKS = frozenset("\r\n\v\f\x1c\x1d\x1e\x85\u2028\u2029")


class MailNotSentYet(Exception):
    """The mail was not accepted this time (no connection, a 4xx reply); the job is retried."""


@attrs.frozen
class WelcomeTemplate:
    """The welcome mail. ``$name`` is the username (HTML-escaped in ``html``), ``$site_url`` SITE_URL."""

    subject: str = "Welcome to $site"
    text: str = (
        "Hello $name,\n"
        "\n"
        "welcome aboard! Your account is ready: $site_url\n"
        "\n"
        "If you did not sign up, you can ignore this mail.\n"
    )
    html: str = (
        "<!doctype html>\n"
        '<html><body style="font-family: sans-serif">\n'
        "<p>Hello <strong>$name</strong>,</p>\n"
        '<p>welcome aboard! Your account is ready: <a href="$site_url">$site_url</a></p>\n'
        "<p>If you did not sign up, you can ignore this mail.</p>\n"
        "</body></html>\n"
    )

    def render(self, username: str, site_url: str) -> tuple[str, str, str]:
        """(subject, text, html) for one user. The subject never carries the username."""
        site = urllib.parse.urlsplit(site_url).netloc or site_url
        subject = string.Template(self.subject).safe_substitute(site=site)
        text = string.Template(self.text).safe_substitute(name=username, site_url=site_url, site=site)
        markup = string.Template(self.html).safe_substitute(
            name=html.escape(username), site_url=html.escape(site_url), site=html.escape(site)
        )
        return subject, text, markup


@attrs.frozen
class Mailer:
    """The ``"mail"`` resource: SMTP settings, the thread limiter, the TLS context."""

    host: str
    port: int
    username: str
    password: str = attrs.field(repr=False)  # kept out of logs and tracebacks
    security: str  # none | starttls | tls
    timeout: float  # per socket operation; also bounds how long a shutdown waits for a send
    mail_from: str
    site_url: str
    limiter: trio.CapacityLimiter  # mail threads only: a slow SMTP server cannot take others' threads
    ssl_context: ssl.SSLContext | None  # None when security is none and there are no credentials
    welcome: WelcomeTemplate

    def sender(self) -> Address:
        """MAIL_FROM as an address; PermanentError naming the variable if it is missing or bad."""
        if not self.host:
            raise PermanentError("SMTP is not configured: SMTP_HOST is empty; set SMTP_HOST (and MAIL_FROM) to send mail")
        if not self.mail_from:
            raise PermanentError("SMTP is not configured: MAIL_FROM is empty; set it to the sender address, e.g. noreply@example.com")
        return parse_address(self.mail_from, "MAIL_FROM")

    def compose(self, job_id: str, to: str, subject: str, text: str, html_body: str | None = None) -> EmailMessage:
        """The message for one job; PermanentError for a bad address or a subject with CR/LF."""
        sender = self.sender()
        recipient = parse_address(to, "recipient address")
        if not LINE_BREAKS.isdisjoint(subject):
            raise PermanentError(f"subject {subject[:200]!r} contains a line break (CR, LF, NEL, U+2028...; header injection?); not sent")
        msg = EmailMessage(policy=email.policy.SMTP)
        msg["From"] = sender
        msg["To"] = recipient
        msg["Subject"] = subject
        msg["Date"] = email.utils.formatdate(usegmt=True)
        msg["Message-ID"] = f"<{job_id}@{sender.domain}>"
        msg.set_content(text)
        if html_body is not None:
            msg.add_alternative(html_body, subtype="html")
        return msg

    async def send(self, msg: EmailMessage) -> None:
        # Not abandon_on_cancel: a thread left running could deliver the mail after the job
        # was released and so send it twice. SMTP_TIMEOUT bounds each blocking step instead.
        await trio.to_thread.run_sync(self.send_blocking, msg, limiter=self.limiter)

    def send_blocking(self, msg: EmailMessage) -> None:
        """Deliver ``msg`` on a fresh connection; runs in a mail thread."""
        where = f"SMTP server {self.host}:{self.port} (SMTP_SECURITY={self.security})"
        try:
            if self.security == "tls":
                smtp: smtplib.SMTP = smtplib.SMTP_SSL(self.host, self.port, timeout=self.timeout, context=self.ssl_context)
            else:
                smtp = smtplib.SMTP(self.host, self.port, timeout=self.timeout)
        except smtplib.SMTPResponseException as exc:  # the greeting was an error reply
            raise _classify(exc, f"{where} refused the connection") from None
        except (OSError, smtplib.SMTPException) as exc:  # refused, unreachable, timeout, handshake
            raise MailNotSentYet(f"could not connect to {where}: {_describe(exc)}") from None
        try:
            try:
                smtp.ehlo()
                if self.security == "starttls" or (self.username and smtp.has_extn("starttls")):
                    # SMTP_SECURITY=none with credentials: upgrade whenever the server offers it
                    smtp.starttls(context=self.ssl_context)
                    smtp.ehlo()
                elif self.username and self.security == "none" and (reached := _not_loopback(smtp, self.host)):
                    # (the settings refuse a host not written as loopback at start; here what the
                    # name led to decides, for a Mailer built by hand too)
                    raise PermanentError(f"{where} offers no STARTTLS: not sending SMTP_PASSWORD in clear text "
                                         f"to {reached}, which is not loopback; set SMTP_SECURITY=starttls or tls")
                if self.username:
                    smtp.login(self.username, self.password)
                smtp.send_message(msg)
            except smtplib.SMTPNotSupportedError as exc:
                raise PermanentError(f"{where} does not support what the settings ask for: {exc}") from None
            except smtplib.SMTPAuthenticationError as exc:
                raise _classify(exc, f"{where} refused the login of SMTP_USERNAME={self.username!r}") from None
            except smtplib.SMTPRecipientsRefused as exc:  # one recipient per mail, so it is that one
                rcpt, (code, reply) = next(iter(exc.recipients.items()))
                raise _classify(smtplib.SMTPResponseException(code, reply), f"{where} refused recipient {rcpt}") from None
            except smtplib.SMTPSenderRefused as exc:
                raise _classify(exc, f"{where} refused sender {exc.sender}") from None
            except smtplib.SMTPResponseException as exc:  # data refused, STARTTLS refused, ...
                raise _classify(exc, f"{where} refused the mail") from None
            except smtplib.SMTPException as exc:  # disconnected, unexpected reply, no usable AUTH
                raise MailNotSentYet(f"{where}: {_describe(exc)}") from None
            except OSError as exc:  # timeout or reset mid-conversation, TLS failure on STARTTLS
                raise MailNotSentYet(f"{where}: connection failed: {_describe(exc)}") from None
        finally:
            try:
                smtp.quit()
            except (OSError, smtplib.SMTPException):
                smtp.close()  # the mail is accepted (or we already fail): a failed QUIT changes nothing
        log.info("mail %s sent to %s", msg["Message-ID"], msg["To"])


def _not_loopback(smtp: smtplib.SMTP, host: str) -> str | None:
    """Where the connection went when that is not loopback; None when both the host as written
    (localhost, *.localhost, 127.0.0.0/8, ::1: is_loopback_host, the rule the settings apply at
    start) and the address the connection reached are. The address decides what the name only
    promises: ``mail.localhost`` answered by a DNS server, a ``localhost`` that /etc/hosts sends
    elsewhere."""
    if not is_loopback_host(host):
        return f"SMTP_HOST={host!r}"
    try:
        peer = ipaddress.ip_address(str(smtp.sock.getpeername()[0]).partition("%")[0])  # type: ignore[union-attr]
    except (AttributeError, OSError, IndexError, ValueError):  # no socket (closed), or not an IP address
        return f"{host} (reached at an address that could not be read)"
    if isinstance(peer, ipaddress.IPv6Address) and peer.ipv4_mapped is not None:
        peer = peer.ipv4_mapped
    return None if peer.is_loopback else f"{host} (reached at {peer})"


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


def _classify(exc: smtplib.SMTPResponseException, what: str) -> Exception:
    """A reply code as a job outcome: 5xx is permanent, anything else is retried."""
    reply = exc.smtp_error.decode("utf-8", "replace") if isinstance(exc.smtp_error, bytes) else str(exc.smtp_error)
    message = f"{what}: {exc.smtp_code} {reply}"
    if 500 <= exc.smtp_code <= 599:
        return PermanentError(message)
    return MailNotSentYet(message)


def parse_address(text: str, what: str) -> Address:
    """One mailbox (``a@example.com`` or ``Name <a@example.com>``); PermanentError saying why not."""
    if not isinstance(text, str) or not text.strip():
        raise PermanentError(f"{what} is empty")
    if not LINE_BREAKS.isdisjoint(text):
        raise PermanentError(f"{what} {text[:200]!r} contains a line break (CR, LF, NEL, U+2028...; header injection?); not sent")
    try:
        header = email.policy.SMTP.header_factory("To", text)
        addresses = header.addresses
        defects = header.defects
    except Exception as exc:  # the header parser raises odd errors (IndexError on "a@")
        raise PermanentError(f"{what} {text!r} is not a valid email address ({type(exc).__name__})") from None
    if len(addresses) != 1:
        raise PermanentError(f"{what} {text!r} must be exactly one address, found {len(addresses)}")
    (address,) = addresses
    if defects or not address.username or not address.domain:
        why = "; ".join(str(d) for d in defects) or "expected local-part@domain"
        raise PermanentError(f"{what} {text!r} is not a valid email address: {why}")
    return address


# -- handlers ------------------------------------------------------------------------------


async def send_email(job: SendEmail, ctx: JobContext) -> None:
    mailer: Mailer = ctx.resources[RESOURCE]
    await mailer.send(mailer.compose(ctx.id, job.to, job.subject, job.body))


async def send_welcome_email(job: SendWelcomeEmail, ctx: JobContext) -> None:
    mailer: Mailer = ctx.resources[RESOURCE]
    subject, text, markup = mailer.welcome.render(job.username, mailer.site_url)
    await mailer.send(mailer.compose(ctx.id, job.email, subject, text, markup))


# -- wiring ----------------------------------------------------------------------------------


@asynccontextmanager
async def open_mailer(
    config: Config, registry: Registry, *, ssl_context: ssl.SSLContext | None = None, welcome: WelcomeTemplate | None = None
) -> AsyncIterator[Mailer]:
    # as many threads as the two mail pools have workers: the limiter never throttles
    # them further, it only keeps mail off the threads everybody else shares
    threads = sum(_concurrency(config, registry, name) for name in MAIL_JOB_TYPES)
    mail = config.section(MailSettings)
    tls = mail.smtp_security != "none" or bool(mail.smtp_username)  # credentials: STARTTLS whenever offered
    if tls and ssl_context is None:
        ssl_context = ssl.create_default_context()  # verifies the certificate and host name
    if not mail.smtp_host or not mail.mail_from:
        log.info("SMTP is not configured (SMTP_HOST / MAIL_FROM empty): mail jobs will fail permanently")
    yield Mailer(
        host=mail.smtp_host,
        port=mail.smtp_port,
        username=mail.smtp_username,
        password=mail.smtp_password,
        security=mail.smtp_security,
        timeout=mail.smtp_timeout,
        mail_from=mail.mail_from,
        site_url=config.section(SiteSettings).url,
        limiter=trio.CapacityLimiter(max(1, threads)),
        ssl_context=ssl_context if tls else None,
        welcome=welcome or WelcomeTemplate(),
    )


def _concurrency(config: Config, registry: Registry, name: str) -> int:
    handled = registry.handled()
    if name not in handled:
        return 0
    return handled[name].concurrency or config.worker.concurrency


def install(
    registry: Registry, config: Config, *, ssl_context: ssl.SSLContext | None = None, welcome: WelcomeTemplate | None = None
) -> None:
    """Attach the mail handlers and the ``"mail"`` resource.

    ``ssl_context``: how to verify the SMTP server under SMTP_SECURITY=starttls|tls
    (default: the system's trusted CAs, which SSL_CERT_FILE can point elsewhere).
    ``welcome``: the welcome mail's templates.
    """

    def factory(config: Config, registry: Registry) -> Any:
        return open_mailer(config, registry, ssl_context=ssl_context, welcome=welcome)

    registry.add_resource(RESOURCE, factory)
    registry.register("send_email", SendEmail, send_email)
    registry.register("send_welcome_email", SendWelcomeEmail, send_welcome_email)
