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

The destination guard (SSRF)
----------------------------
A webhook URL is data that arrives with a job, so by default the pipeline refuses to send
to anything that is not a public unicast address: loopback, RFC 1918 and fc00::/7
private, link-local (169.254.0.0/16, where cloud metadata lives, and fe80::/10), CGNAT
100.64.0.0/10, multicast, unspecified, reserved, documentation and benchmark ranges, the
IPv6 transition forms that embed one of those (IPv4-mapped ``::ffff:a.b.c.d``, NAT64
``64:ff9b::/96``; the deprecated IPv4-compatible ``::/96`` and 6to4 ``2002::/16`` are
refused whole), and every IPv4 notation the C resolver accepts (``2130706433``,
``0177.0.0.1``, ``0x7f.1``, ``127.1``). WEBHOOK_ALLOW_PRIVATE_NETWORKS=true turns the
guard off (a receiver on the same LAN, tests).

Where the check happens decides whether it holds. Checking the URL's host and then
letting the HTTP client resolve it again is open to DNS rebinding (the name answers a
public address to the check and 127.0.0.1 to the connect). So the check lives in the
connection itself: the client's transport is built on httpcore's connection pool with a
network backend of ours (:class:`GuardedNetworkBackend`). When the pool opens a
connection it asks that backend to ``connect_tcp(host, port)``; the backend resolves the
host once with trio's ``getaddrinfo``, refuses if *any* address it got is not public (a
name that answers both a public and a private address is refused whole), and then opens
the TCP connection to those numeric, already-checked addresses, never to the name. TLS
is started afterwards on that stream by httpcore with the URL's host name as SNI and for
certificate verification, and the Host header is untouched, because the URL itself is
never rewritten; connections are pooled per origin (scheme, host name, port), so a
connection is only reused for the name it was checked for. A literal address in the
URL is also checked before the request is built, for a clearer message; that is a
convenience, the backend's check is the one that counts.

Why not a library: httpx-secure (the best-kept one found) installs its check into a
client's private attributes and picks the address by opening a TCP probe first
("may open and close a TCP probe, including to a denied address"): a SYN to 10.0.0.1 is
already traffic we must not send. drawbridge and egressweave resolve through asyncio
(``loop.run_in_executor``, ``asyncio.to_thread``), which does not run under trio. The
transport below uses only the public APIs of httpx (``AsyncBaseTransport``) and httpcore
(``AsyncConnectionPool(network_backend=...)``, ``TrioBackend``).
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
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

import httpcore
import httpx
import trio

from ..config import Config
from ..errors import PermanentError, RetryLater
from .jobs import WebhookNotify

if TYPE_CHECKING:
    from ..engine.actors.pools import JobContext
    from ..registry import Registry

RESOURCE = "http"
RETRY_AFTER_CAP = 3600.0  # seconds: a receiver asking for more is retried after an hour anyway
USER_AGENT = "pipeline-webhooks/0.1"
DRAIN_LIMIT_BYTES = 65_536  # a 2xx body up to this is read so that its connection can be reused
ERROR_SNIPPET_BYTES = 512  # of a refusing receiver's body, quoted in the job's error

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class WebhookNotDelivered(Exception):
    """The receiver did not take the webhook this time (5xx, 3xx, timeout, no connection): retried."""


class DestinationRefused(Exception):
    """The destination is not a public address and WEBHOOK_ALLOW_PRIVATE_NETWORKS is off.

    Raised by :class:`GuardedNetworkBackend` before any connection is attempted.
    """

    def __init__(self, host: str, address: str, reason: str) -> None:
        self.host, self.address, self.reason = host, address, reason
        shown = address if host == address else f"{host} resolves to {address}, which"
        super().__init__(f"{shown} is {reason} (set WEBHOOK_ALLOW_PRIVATE_NETWORKS=true to allow it)")


# -- which addresses are refused ------------------------------------------------------------

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

_REFUSED_V4: tuple[tuple[ipaddress.IPv4Network, str], ...] = (
    (_V4("0.0.0.0/8"), "an unspecified / 'this network' address (0.0.0.0/8)"),
    (_V4("10.0.0.0/8"), "a private address (RFC 1918, 10.0.0.0/8)"),
    (_V4("100.64.0.0/10"), "a carrier-grade NAT address (100.64.0.0/10)"),
    (_V4("127.0.0.0/8"), "a loopback address (127.0.0.0/8)"),
    (_V4("169.254.0.0/16"), "a link-local address (169.254.0.0/16, where cloud metadata services live)"),
    (_V4("172.16.0.0/12"), "a private address (RFC 1918, 172.16.0.0/12)"),
    (_V4("192.0.0.0/24"), "an IETF protocol assignment address (192.0.0.0/24)"),
    (_V4("192.0.2.0/24"), "a documentation address (TEST-NET-1, 192.0.2.0/24)"),
    (_V4("192.88.99.0/24"), "a deprecated 6to4 relay address (192.88.99.0/24)"),
    (_V4("192.168.0.0/16"), "a private address (RFC 1918, 192.168.0.0/16)"),
    (_V4("198.18.0.0/15"), "a benchmarking address (198.18.0.0/15)"),
    (_V4("198.51.100.0/24"), "a documentation address (TEST-NET-2, 198.51.100.0/24)"),
    (_V4("203.0.113.0/24"), "a documentation address (TEST-NET-3, 203.0.113.0/24)"),
    (_V4("224.0.0.0/4"), "a multicast address (224.0.0.0/4)"),
    (_V4("240.0.0.0/4"), "a reserved address (240.0.0.0/4, with the broadcast address)"),
)

_MAPPED = _V6("::ffff:0:0/96")  # IPv4-mapped: the socket talks IPv4 to the embedded address
_NAT64 = _V6("64:ff9b::/96")  # well-known NAT64 prefix: the gateway talks IPv4 to the embedded address
_GLOBAL_UNICAST = _V6("2000::/3")  # every public IPv6 address is in here; the rest is special

_REFUSED_V6: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_V6("::/128"), "the unspecified IPv6 address (::)"),
    (_V6("::1/128"), "the IPv6 loopback address (::1)"),
    (_V6("::/96"), "a deprecated IPv4-compatible IPv6 address (::/96)"),
    (_V6("fc00::/7"), "a unique-local (private) IPv6 address (fc00::/7)"),
    (_V6("fe80::/10"), "a link-local IPv6 address (fe80::/10)"),
    (_V6("fec0::/10"), "a deprecated site-local IPv6 address (fec0::/10)"),
    (_V6("ff00::/8"), "a multicast IPv6 address (ff00::/8)"),
    # special-purpose blocks inside 2000::/3
    (_V6("2001:db8::/32"), "a documentation IPv6 address (2001:db8::/32)"),
    (_V6("2001::/23"), "an IETF protocol assignment IPv6 address (2001::/23, with Teredo)"),
    (_V6("2002::/16"), "a deprecated 6to4 IPv6 address (2002::/16, embeds an IPv4 address)"),
    (_V6("3fff::/20"), "a documentation IPv6 address (3fff::/20)"),
)


def refusal_reason(address: IPAddress) -> str | None:
    """Why the guard refuses to connect to ``address`` ("a loopback address (...)"), or None."""
    if isinstance(address, ipaddress.IPv4Address):
        for network, reason in _REFUSED_V4:
            if address in network:
                return reason
        return None
    address = ipaddress.IPv6Address(address.packed)  # drop a %scope: it changes nothing here
    for prefix, form in ((_MAPPED, "an IPv4-mapped"), (_NAT64, "a NAT64")):
        if address in prefix:
            embedded = ipaddress.IPv4Address(address.packed[-4:])
            inner = refusal_reason(embedded)
            return None if inner is None else f"{form} form of {embedded}, {inner}"
    for network, reason in _REFUSED_V6:
        if address in network:
            return reason
    if address not in _GLOBAL_UNICAST:
        return "a reserved IPv6 address (outside global unicast 2000::/3)"
    return None


_V4_PART = {
    16: re.compile(r"0[xX]([0-9a-fA-F]*)"),
    8: re.compile(r"0([0-7]+)"),
    10: re.compile(r"([1-9][0-9]*|0)"),
}


def _parse_ipv4_loose(text: str) -> ipaddress.IPv4Address | None:
    """An IPv4 address in any notation inet_aton(3) (glibc's resolver) or a browser accepts.

    One to four dot-separated parts, each decimal, octal (leading 0) or hex (0x); the last
    part fills the remaining bytes: ``127.1``, ``0x7f.1``, ``0177.0.0.1``, ``2130706433``.
    A single trailing dot is allowed, as browsers allow it.
    """
    if text.endswith("."):
        text = text[:-1]
    parts = text.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    numbers = []
    for part in parts:
        for base, pattern in _V4_PART.items():
            match = pattern.fullmatch(part)  # ASCII digits only: int() would take '١٢٧' too
            if match:
                numbers.append(int(match.group(1) or "0", base))
                break
        else:
            return None
    *leading, last = numbers
    if any(n > 255 for n in leading) or last >= 256 ** (4 - len(leading)):
        return None
    value = last
    for i, n in enumerate(leading):
        value += n << (8 * (3 - i))
    return ipaddress.IPv4Address(value)


def parse_ip_literal(host: str) -> IPAddress | None:
    """The address ``host`` denotes if it is an IP literal in any notation, else None (a name)."""
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            return None
    return _parse_ipv4_loose(host)


# -- the connection layer: resolve once, check every address, connect to what was checked ----


class GuardedNetworkBackend(httpcore.AsyncNetworkBackend):
    """httpcore network backend that connects only to resolved, checked, numeric addresses.

    With ``allow_private`` it still resolves once and connects to the numbers, only
    without refusing any.
    """

    def __init__(self, inner: httpcore.AsyncNetworkBackend, *, allow_private: bool) -> None:
        self._inner = inner
        self._allow_private = allow_private

    async def resolve(self, host: str, port: int) -> list[str]:
        """The numeric addresses to try for ``host``; DestinationRefused if any is not public."""
        try:
            infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
        except OSError as exc:  # socket.gaierror: no such name, resolver down
            raise httpcore.ConnectError(f"cannot resolve {host!r}: {exc}") from exc
        addresses: list[str] = []
        for family, _type, _proto, _canon, sockaddr in infos:
            if family not in (trio.socket.AF_INET, trio.socket.AF_INET6):
                continue
            number = str(sockaddr[0]).split("%", 1)[0]
            if not self._allow_private:
                reason = refusal_reason(ipaddress.ip_address(number))
                if reason is not None:
                    raise DestinationRefused(host, number, reason)
            if family == trio.socket.AF_INET6 and sockaddr[3]:
                number = f"{number}%{sockaddr[3]}"  # link-local needs its interface (allowed mode only)
            if number not in addresses:
                addresses.append(number)
        if not addresses:
            raise httpcore.ConnectError(f"{host!r} has no IPv4 or IPv6 address")
        return addresses

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        with trio.move_on_after(float("inf") if timeout is None else timeout) as deadline:
            failure: httpcore.ConnectError | None = None
            for address in await self.resolve(host, port):
                left = deadline.deadline - trio.current_time()
                try:
                    return await self._inner.connect_tcp(
                        address,
                        port,
                        timeout=None if timeout is None else max(left, 0.0),
                        local_address=local_address,
                        socket_options=socket_options,
                    )
                except httpcore.ConnectError as exc:  # refused on this address: try the next one
                    failure = exc
            assert failure is not None
            raise failure
        raise httpcore.ConnectTimeout(f"connecting to {host}:{port} took longer than {timeout:g} s")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


# httpcore's exceptions as httpx's, most specific first (what httpx's own transport does)
_HTTPCORE_TO_HTTPX: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


@contextmanager
def _as_httpx_errors() -> Iterator[None]:
    try:
        yield
    except httpcore.ProxyError as exc:  # not a subclass in the table; no proxies here anyway
        raise httpx.ProxyError(str(exc)) from exc
    except Exception as exc:
        for core, mapped in _HTTPCORE_TO_HTTPX:
            if isinstance(exc, core):
                raise mapped(str(exc)) from exc
        raise  # DestinationRefused and anything else pass through as they are


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _as_httpx_errors():
            async for chunk in self._stream:
                yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


class GuardedTransport(httpx.AsyncBaseTransport):
    """An httpx transport over an httpcore pool whose connections go through the guard."""

    def __init__(self, *, allow_private: bool, ssl_context: ssl.SSLContext, limits: httpx.Limits = httpx.Limits()) -> None:
        self.backend = GuardedNetworkBackend(httpcore.TrioBackend(), allow_private=allow_private)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=self.backend,
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"only http and https URLs are sent, not {request.url.scheme!r}")
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,  # type: ignore[arg-type]
            extensions=request.extensions,
        )
        with _as_httpx_errors():
            response = await self._pool.handle_async_request(core_request)
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_ResponseStream(response.stream),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()


@asynccontextmanager
async def open_http_client(config: Config, *, ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """The ``"http"`` resource: one pooled, guarded client for the pipeline's lifetime."""
    if ssl_context is None:
        ssl_context = httpx.create_ssl_context()  # certifi's CAs, or SSL_CERT_FILE / SSL_CERT_DIR
    transport = GuardedTransport(allow_private=config.webhook_allow_private_networks, ssl_context=ssl_context)
    async with httpx.AsyncClient(
        transport=transport,
        follow_redirects=False,
        trust_env=False,  # no HTTP(S)_PROXY or .netrc: a proxy would connect where the guard cannot see
        timeout=httpx.Timeout(config.webhook_timeout_seconds),
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
    return str(url.copy_with(password="***")) if url.password else str(url)


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
        if reason is not None:
            raise PermanentError(f"POST {raw} refused: {_literal_refusal(host, literal, reason)}") from None
        raise PermanentError(f"webhook URL {raw!r} is not a valid URL: {exc}") from None
    if url.scheme not in ("http", "https"):
        raise PermanentError(f"webhook URL {raw!r} must be http:// or https://, not {url.scheme or 'schemeless'}")
    if not url.host:
        raise PermanentError(f"webhook URL {raw!r} has no host")
    if not allow_private:
        literal = parse_ip_literal(url.host)
        reason = None if literal is None else refusal_reason(literal)
        if reason is not None:
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
    config: Config = ctx.config
    client: httpx.AsyncClient = ctx.resources[RESOURCE]
    url = _checked_url(job.url, allow_private=config.webhook_allow_private_networks)
    shown = _shown(url)
    body = encode_body(job.payload)
    headers = {"content-type": "application/json", "accept-encoding": "identity"}
    if config.webhook_secret:
        headers.update(sign(config.webhook_secret, ctx.id, int(time.time()), body))
    timeout = config.webhook_timeout_seconds
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
