"""The destination guard of webhook requests (SSRF): a transport that connects only to public addresses.

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
connection itself: the webhook client's transport is built on httpcore's connection pool with a
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

import ipaddress
import re
import ssl
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import httpcore
import httpx
import trio

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


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
    for network6, reason in _REFUSED_V6:
        if address in network6:
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
            scope = sockaddr[3] if len(sockaddr) == 4 else 0
            if family == trio.socket.AF_INET6 and scope:
                number = f"{number}%{scope}"  # link-local needs its interface (allowed mode only)
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
            content=request.stream,
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
