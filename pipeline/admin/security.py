"""The checks in front of every admin route: who may ask, from where, and how much.

* **Bearer token.** With ADMIN_TOKEN set, every ``/admin/...`` API route and ``/metrics``
  need ``Authorization: Bearer <token>``, compared in constant time. The dashboard's page
  and its static files (``/admin``, ``/admin/static/...``) hold no data and stay public,
  so a browser can load the page, which then asks for the token.
* **Same origin for writes.** A browser sends ``Origin`` with cross-site POSTs; a write
  whose Origin is not this server is refused, so a web page cannot drive the API
  through a browser that can reach it (CSRF: a token-less POST is a "simple" request).
* **Loopback names only without a token.** A token-less server listens on loopback
  only (see ``server.check_bind``); it also refuses a Host header that is not a
  loopback name, which defeats DNS rebinding (a foreign name resolved to 127.0.0.1).
* **Body size.** A declared Content-Length over ADMIN_MAX_BODY_BYTES is refused at once
  with 413; bodies without one are counted as they are read (``AdminApi._body``).
"""

from __future__ import annotations

import hmac
import ipaddress
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from .api import error_response

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


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


class AdminGuard:
    def __init__(self, app: ASGIApp, *, token: str, max_body: int, admin_host: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode() if token else None
        self.max_body = max_body
        self.admin_host = admin_host.strip().lower()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refuse(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, message, headers = refusal
        await error_response(status, message, headers)(scope, receive, send)

    def refuse(self, scope: Scope) -> tuple[int, str, dict[str, str] | None] | None:
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if self._expected is None and host:
            name = _hostname(host).lower()
            if not (is_loopback_name(name) or name == self.admin_host):
                return 403, (f"Host {host!r} refused: without ADMIN_TOKEN this server answers only to loopback "
                             "names (localhost, 127.0.0.1, [::1]); set ADMIN_TOKEN to serve other names"), None
        if self._expected is not None and needs_token(scope["path"]):
            given = headers.get("authorization", "").encode("latin-1", "replace")
            if not hmac.compare_digest(given, self._expected):
                reason = "missing" if not given else "wrong"
                return 401, f"Authorization: Bearer <ADMIN_TOKEN> is {reason}", {"WWW-Authenticate": 'Bearer realm="pipeline admin"'}
        if scope["method"] in WRITES:
            origin = headers.get("origin")
            if origin is not None and _netloc(origin) != host.lower():
                return 403, f"cross-origin write from {origin[:100]!r} refused", None
        length = headers.get("content-length")
        if length is not None and length.strip().isdigit() and int(length) > self.max_body:
            return 413, f"request body is larger than {self.max_body} bytes (ADMIN_MAX_BODY_BYTES)", None
        return None
