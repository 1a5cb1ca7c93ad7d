"""The dashboard: one HTML page, one script, one stylesheet, shipped in the package.

No build step: the files under ``static/`` are what the browser gets. The page holds no
data; its script reads the JSON API (with the Bearer token the person typed in, when
the server has one) and redraws every few seconds.
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import Response

from .api import error_response

_TYPES = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}

# the page runs only its own script and style; job data is inserted as text, never as HTML
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class Dashboard:
    def __init__(self) -> None:
        folder = resources.files(__package__).joinpath("static")
        self._page = folder.joinpath("dashboard.html").read_bytes()
        self._files = {name: folder.joinpath(name).read_bytes() for name in _TYPES}

    async def page(self, request: Request) -> Response:
        """GET /admin"""
        return Response(self._page, media_type="text/html; charset=utf-8", headers=HEADERS)

    async def static(self, request: Request) -> Response:
        """GET /admin/static/{name}"""
        name = request.path_params["name"]
        body = self._files.get(name)
        if body is None:
            return error_response(404, f"no static file {name!r}", sent=(name,))
        return Response(body, media_type=_TYPES[name], headers=HEADERS)
