"""The checks in front of every admin route: who may ask, from where, and how much.

* **Bearer token.** With ADMIN_TOKEN set, every ``/admin/...`` API route and ``/metrics``
  need ``Authorization: Bearer <token>``, compared in constant time. The dashboard's page
  and its static files (``/admin``, ``/admin/static/...``) hold no data and stay public,
  so a browser can load the page, which then asks for the token.
* **Same origin for writes (CSRF), three ways.** A write whose ``Origin`` is not this
  server is refused; so is one whose ``Sec-Fetch-Site`` says ``cross-site`` or
  ``same-site``; and a POST must say ``Content-Type: application/json``, which no HTML form
  can send and which makes a browser ask first (a CORS preflight this server never
  approves). Current browsers send Origin on every cross-origin write, so the first check
  is the one that bites; the other two hold if a browser ever fails to send it. (DELETE,
  PUT and PATCH always need a preflight, so the content type is asked of POST only.)
* **Signed links** (``/signal-links/...``, link_page.py) need no token (the link is the credential) and
  their page's button is a plain HTML form: its POST may say ``application/x-www-form-urlencoded``.
  Everything else holds for them: the same-origin checks (a page elsewhere cannot press the button
  for a visitor), the Host check, the body size.
* **Host.** Every request needs a ``Host`` header of the form name-or-address[:digits]
  (``localhost:1@evil.example`` is not one). A token-less server listens on loopback only
  (see ``server.check_bind``) and also refuses a Host that is not a loopback name, which
  defeats DNS rebinding (a foreign name resolved to 127.0.0.1).
* **Every scope.** A WebSocket handshake gets the same checks as a write (a browser sends
  it cross-origin without asking first); there is no WebSocket route, and a refused one
  is closed before it is accepted. Only ``lifespan`` passes unchecked.
* **Body size.** A declared Content-Length over ADMIN_MAX_BODY_BYTES is refused at once
  with 413; bodies without one are counted as they are read (``AdminApi._body``), which
  also stops waiting for a body that does not arrive (408).
* **Responses** all carry ``X-Content-Type-Options: nosniff``, and ``Cache-Control:
  no-store`` unless the route set its own (the dashboard's files).
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .api import error_response
from .links import PATH as LINKS

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
CROSS_SITE = frozenset({"cross-site", "same-site"})  # Sec-Fetch-Site values a write is refused with
# a Host header: a DNS name or IPv4 address, or an IPv6 address in brackets, then an optional port of digits
_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9_.])?|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")


def needs_token(path: str) -> bool:
    return path == "/metrics" or (path.startswith("/admin/") and path != "/admin/" and not path.startswith("/admin/static/"))


def is_loopback_name(host: str) -> bool:
    """localhost, *.localhost, 127.0.0.0/8 or ::1 (brackets allowed)."""
    host = host.strip().lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _hostname(host_header: str) -> str:
    """The host part of a Host header: ``[::1]:8000`` → ``[::1]``, ``a:80`` → ``a``."""
    if host_header.startswith("["):
        return host_header.split("]", 1)[0] + "]"
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


def _netloc(origin: str) -> str | None:
    try:
        return urlsplit(origin).netloc.lower() or None  # "null" (sandboxed pages, file://) has none
    except ValueError:
        return None


def _is_json(content_type: str | None) -> bool:
    return content_type is not None and content_type.split(";", 1)[0].strip().lower() == "application/json"


def _is_form(content_type: str | None) -> bool:
    return content_type is not None and content_type.split(";", 1)[0].strip().lower() == "application/x-www-form-urlencoded"


class AdminGuard:
    def __init__(self, app: ASGIApp, *, token: str, max_body: int, admin_host: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode() if token else None
        self.max_body = max_body
        self.admin_host = admin_host.strip().lower()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        refusal = self.refuse(scope)
        if scope["type"] == "websocket":
            if refusal is None:
                await self.app(scope, receive, send)
            else:  # before websocket.accept: the server answers the handshake with 403
                await send({"type": "websocket.close", "code": 1008, "reason": refusal[1][:120]})
            return
        if scope["type"] != "http":
            return  # a scope this server does not speak: nothing is served
        send = _with_safe_headers(send)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, message, headers = refusal
        await error_response(status, message, headers)(scope, receive, send)

    def refuse(self, scope: Scope) -> tuple[int, str, dict[str, str] | None] | None:
        headers = Headers(scope=scope)
        host = headers.get("host")
        if host is None:
            return 400, "a Host header is required", None
        if not _HOST.fullmatch(host):
            return 400, f"Host {host[:100]!r} is not a host name or address with an optional port of digits", None
        if self._expected is None:
            name = _hostname(host).lower()
            if not (is_loopback_name(name) or name == self.admin_host):
                return 403, (f"Host {host!r} refused: without ADMIN_TOKEN this server answers only to loopback "
                             "names (localhost, 127.0.0.1, [::1]); set ADMIN_TOKEN to serve other names"), None
        if self._expected is not None and needs_token(scope["path"]):
            given = headers.get("authorization", "").encode("latin-1", "replace")
            if not hmac.compare_digest(given, self._expected):
                reason = "missing" if not given else "wrong"
                return 401, f"Authorization: Bearer <ADMIN_TOKEN> is {reason}", {"WWW-Authenticate": 'Bearer realm="pipeline admin"'}
        method = "GET" if scope["type"] == "websocket" else scope["method"]
        if method in WRITES or scope["type"] == "websocket":
            origin = headers.get("origin")
            if origin is not None and _netloc(origin) != host.lower():
                return 403, f"cross-origin write from {origin[:100]!r} refused", None
            site = headers.get("sec-fetch-site", "").strip().lower()
            if site in CROSS_SITE:
                return 403, f"cross-origin write refused (Sec-Fetch-Site: {site})", None
        content_type = headers.get("content-type")
        if method == "POST" and not _is_json(content_type) and not (
                scope["path"].startswith(LINKS) and _is_form(content_type)):
            what = ("a signed link's POST must be its page's form (Content-Type: application/x-www-form-urlencoded) "
                    "or say Content-Type: application/json" if scope["path"].startswith(LINKS)
                    else "a POST must have Content-Type: application/json")
            return 415, what + ("" if content_type is None else f", not {content_type[:100]!r}"), None
        length = headers.get("content-length")
        if length is not None and length.strip().isdigit() and int(length) > self.max_body:
            return 413, f"request body is larger than {self.max_body} bytes (ADMIN_MAX_BODY_BYTES)", None
        return None


def _with_safe_headers(send: Send) -> Send:
    """``send`` adding nosniff, and no-store where the route chose no caching of its own."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            names = {name.lower() for name, _ in headers}
            if b"x-content-type-options" not in names:
                headers.append((b"x-content-type-options", b"nosniff"))
            if b"cache-control" not in names:
                headers.append((b"cache-control", b"no-store"))
            message = {**message, "headers": headers}
        await send(message)

    return sending
