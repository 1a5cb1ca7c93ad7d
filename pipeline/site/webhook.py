"""``webhook_notify``: POST a JSON payload to a URL, signed, without reaching inside the network.

One pooled ``httpx.AsyncClient`` is shared by every webhook job (the ``"http"`` resource,
closed when the pipeline stops): keep-alive connections are reused across jobs. It never
follows redirects and ignores proxy variables from the environment. Each request, from
resolving the name to the end of the answer, has WEBHOOK_TIMEOUT_SECONDS in all (a server
dripping bytes cannot hold a worker longer).

Signing (Standard Webhooks, https://www.standardwebhooks.com): when WEBHOOK_SECRET is
``whsec_<base64 key>``, every request carries ``webhook-id`` (the job id: the same on
every retry, so receivers can drop duplicates), ``webhook-timestamp`` (unix seconds of
this attempt) and ``webhook-signature: v1,<base64 HMAC-SHA256(key, "id.timestamp.body")>``
computed over exactly the bytes sent.

How the answer settles the job (the error names the URL and the status):

==========================================  ==============================================
2xx                                         completed
3xx                                         not followed; retried with backoff, the error
                                            names the Location (fix the configured URL)
410 Gone                                    dead at once: the receiver retired the endpoint
408, 429, 5xx                               retried; a Retry-After (seconds or HTTP-date)
                                            sets the delay, capped at RETRY_AFTER_CAP
other 4xx                                   dead at once
timeout, refused connection, DNS failure    retried with backoff
bad URL, not http(s), refused destination   dead at once, nothing is sent
==========================================  ==============================================

The destination guard against SSRF is egress.py's; the client below is built on it.
"""

from __future__ import annotations

import base64
import datetime as dt
import email.utils
import hashlib
import hmac
import ipaddress
import json
import re
import ssl
import time
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import httpx
import trio

from ..config import Config, masked_url, without_password
from ..errors import PermanentError, RetryLater
from .egress import DestinationRefused, GuardedTransport, IPAddress, parse_ip_literal, refusal_reason
from .jobs import WebhookNotify
from .settings import WebhookSettings

if TYPE_CHECKING:
    from ..context import JobContext
    from ..registry import Registry

RESOURCE = "http"
RETRY_AFTER_CAP = 3600.0  # seconds: a receiver asking for more is retried after an hour anyway
USER_AGENT = "pipeline-webhooks/0.1"
DRAIN_LIMIT_BYTES = 65_536  # a 2xx body up to this is read so that its connection can be reused
ERROR_SNIPPET_BYTES = 512  # of a refusing receiver's body, quoted in the job's error


class WebhookNotDelivered(Exception):
    """The receiver did not take the webhook this time (5xx, 3xx, timeout, no connection): retried."""


# -- the client -------------------------------------------------------------------------------


@asynccontextmanager
async def open_http_client(config: Config, *, ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """The ``"http"`` resource: one pooled, guarded client for the pipeline's lifetime."""
    if ssl_context is None:
        ssl_context = httpx.create_ssl_context()  # certifi's CAs, or SSL_CERT_FILE / SSL_CERT_DIR
    settings = config.section(WebhookSettings)
    transport = GuardedTransport(allow_private=settings.allow_private_networks, ssl_context=ssl_context)
    async with httpx.AsyncClient(
        transport=transport,
        follow_redirects=False,
        trust_env=False,  # no HTTP(S)_PROXY or .netrc: a proxy would connect where the guard cannot see
        timeout=httpx.Timeout(settings.timeout_seconds),
        headers={"user-agent": USER_AGENT},
    ) as client:
        yield client


# -- signing and Retry-After ---------------------------------------------------------------------


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The Standard Webhooks headers for ``body`` (``secret`` is ``whsec_<base64 key>``)."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": "v1," + base64.b64encode(mac).decode("ascii"),
    }


def retry_after_seconds(value: str | None, *, now: float) -> float | None:
    """A Retry-After header as seconds from ``now`` (delta-seconds or an HTTP-date), or None."""
    if value is None:
        return None
    value = value.strip()
    if re.fullmatch(r"[0-9]+", value):
        return float(int(value))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # HTTP-dates are GMT
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, when.timestamp() - now)


# -- the handler -------------------------------------------------------------------------------


def _shown(url: httpx.URL) -> str:
    """The URL for messages, with any password in it masked."""
    return masked_url(str(url))  # (httpx's copy_with(password=) drops the user name)


def _checked_url(raw: str, *, allow_private: bool) -> httpx.URL:
    """Parse and pre-check the job's URL; PermanentError when it can never be sent."""
    try:
        url = httpx.URL(raw)
    except httpx.InvalidURL as exc:
        # httpx refuses some IPv4 spellings outright (0177.0.0.1); say what they mean
        try:
            host = urllib.parse.urlsplit(raw).hostname or ""
        except ValueError:
            host = ""
        literal = None if allow_private else parse_ip_literal(host)
        reason = None if literal is None else refusal_reason(literal)
        if literal is not None and reason is not None:
            raise PermanentError(f"POST {masked_url(raw)} refused: {_literal_refusal(host, literal, reason)}") from None
        raise PermanentError(f"webhook URL {masked_url(raw)!r} is not a valid URL: {without_password(str(exc), raw)}") from None
    if url.scheme not in ("http", "https"):
        raise PermanentError(f"webhook URL {masked_url(raw)!r} must be http:// or https://, not {url.scheme or 'schemeless'}")
    if not url.host:
        raise PermanentError(f"webhook URL {masked_url(raw)!r} has no host")
    if not allow_private:
        literal = parse_ip_literal(url.host)
        reason = None if literal is None else refusal_reason(literal)
        if literal is not None and reason is not None:
            raise PermanentError(f"POST {_shown(url)} refused: {_literal_refusal(url.host, literal, reason)}")
    return url


def _literal_refusal(host: str, literal: IPAddress, reason: str) -> str:
    plain = isinstance(literal, ipaddress.IPv6Address) or host.rstrip(".") == str(literal)
    what = host if plain else f"{host} (that is {literal})"  # 0x7f.1, 2130706433: say what they mean
    return f"{what} is {reason} (set WEBHOOK_ALLOW_PRIVATE_NETWORKS=true to allow it)"


def encode_body(payload: Any) -> bytes:
    """The exact bytes sent (and signed): compact JSON, UTF-8."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _cause(exc: BaseException) -> str:
    """The first non-empty message down the exception's chain.

    httpcore wraps a TLS failure as a ConnectError with no text; the reason
    ("certificate verify failed: ...") is on the ssl error underneath.
    """
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 8:
        if str(current):
            return str(current)
        current = current.__cause__ or current.__context__
        seen += 1
    return "(no detail)"


async def _drain(response: httpx.Response) -> None:
    """Read a small answer to its end, so that its connection goes back to the pool."""
    size = 0
    async for chunk in response.aiter_raw():
        size += len(chunk)
        if size > DRAIN_LIMIT_BYTES:
            break  # a big body is not worth reading: the connection is closed instead


async def _snippet(response: httpx.Response) -> str:
    """The start of a refusing receiver's body, for the job's error (raw: no decompression)."""
    if response.headers.get("content-encoding", "identity").lower() != "identity":
        return ""
    data = b""
    async for chunk in response.aiter_raw():
        data += chunk
        if len(data) >= ERROR_SNIPPET_BYTES:
            break
    text = " ".join(data[:ERROR_SNIPPET_BYTES].decode("utf-8", "replace").split())
    return f": {text[:200]}" if text else ""


async def webhook_notify(job: WebhookNotify, ctx: JobContext) -> None:
    settings = ctx.config.section(WebhookSettings)
    client: httpx.AsyncClient = ctx.resources[RESOURCE]
    url = _checked_url(job.url, allow_private=settings.allow_private_networks)
    shown = _shown(url)
    body = encode_body(job.payload)
    headers = {"content-type": "application/json", "accept-encoding": "identity"}
    if settings.secret:
        headers.update(sign(settings.secret, ctx.id, int(time.time()), body))
    timeout = settings.timeout_seconds
    try:
        with trio.fail_after(timeout):
            async with client.stream("POST", url, content=body, headers=headers) as response:
                status = response.status_code
                if 200 <= status < 300:
                    await _drain(response)
                    return
                label = f"POST {shown} answered {status} {response.reason_phrase}".rstrip()
                detail = "" if 300 <= status < 400 else await _snippet(response)
    except DestinationRefused as exc:
        raise PermanentError(f"POST {shown} refused: {exc}") from None
    except trio.TooSlowError:
        raise WebhookNotDelivered(f"POST {shown}: no complete answer within WEBHOOK_TIMEOUT_SECONDS={timeout:g}") from None
    except httpx.TimeoutException as exc:
        raise WebhookNotDelivered(f"POST {shown} timed out ({type(exc).__name__}, WEBHOOK_TIMEOUT_SECONDS={timeout:g})") from None
    except httpx.TransportError as exc:
        raise WebhookNotDelivered(f"POST {shown} failed: {type(exc).__name__}: {_cause(exc)}") from None

    if 300 <= status < 400:
        location = response.headers.get("location", "(no Location header)")
        raise WebhookNotDelivered(f"{label} to {location}: redirects are not followed; point the webhook at the final URL")
    if status == 410:
        raise PermanentError(f"{label}: the receiver retired this endpoint{detail}")
    if status in (408, 429) or 500 <= status < 600:
        delay = retry_after_seconds(response.headers.get("retry-after"), now=time.time())
        if delay is not None:
            delay = min(delay, RETRY_AFTER_CAP)
            raise RetryLater(f"{label}; retrying in {delay:g} s as its Retry-After asks{detail}", delay=delay)
        raise WebhookNotDelivered(f"{label}{detail}")
    if 400 <= status < 500:
        raise PermanentError(f"{label}: the receiver refuses this request{detail}")
    raise WebhookNotDelivered(f"{label}: not a success status{detail}")


def install(registry: Registry, config: Config, *, ssl_context: ssl.SSLContext | None = None) -> None:
    """Attach ``webhook_notify`` and the ``"http"`` resource (its shared client).

    ``ssl_context``: how to verify https receivers (default: certifi's CAs, or
    SSL_CERT_FILE / SSL_CERT_DIR when set).
    """

    def factory(config: Config, registry: Registry) -> Any:
        return open_http_client(config, ssl_context=ssl_context)

    registry.add_resource(RESOURCE, factory)
    registry.register("webhook_notify", WebhookNotify, webhook_notify)
