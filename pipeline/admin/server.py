"""The admin server: the ASGI app, and Hypercorn's trio worker serving it in the pipeline's nursery.

    listener = open_admin_listener(config)    # binds now: a busy port fails before anything starts
    async with open_pipeline(config) as pipeline, trio.open_nursery() as tn:
        url = await tn.start(run_admin_server, pipeline, listener, stop.wait)
        ...                                    # stop.set() → in-flight requests finish, then it returns

``python -m pipeline`` does exactly this (``service.serve``). An application that has its own
ASGI server can mount ``create_app(pipeline)`` instead.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..config import Config
from ..errors import ConfigError, PipelineError
from .api import AdminApi, Endpoint, error_response
from .dashboard import Dashboard
from .link_page import LinkPage
from .metrics import Metrics
from .openapi import openapi_document
from .security import AdminGuard, is_loopback_name

if TYPE_CHECKING:
    from ..engine.wiring import Pipeline

log = logging.getLogger("pipeline.admin")

GRACEFUL_TIMEOUT = 5.0  # seconds in-flight requests get once shutdown begins


class AdminBindError(PipelineError):
    """The admin server cannot listen where ADMIN_HOST and ADMIN_PORT say (CLI exit 1)."""


# -- the app --------------------------------------------------------------------------------


def create_app(pipeline: Pipeline, *, metrics: Metrics | None = None) -> Starlette:
    """The admin API, dashboard, /metrics, /healthz, /openapi.json and the signed links' pages
    (/signal-links/...) for one pipeline.

    Registers a metrics observer on the pipeline: create one app per pipeline.
    """
    config = pipeline.config
    metrics = metrics or Metrics(pipeline.external_metrics, pipeline.worker_processes, pruned=pipeline.pruned)
    pipeline.add_observer(metrics.observe)
    api = AdminApi(pipeline, metrics)
    dashboard = Dashboard()
    links = LinkPage(pipeline)
    document = openapi_document(pipeline.registry, auth=bool(config.admin.token))

    async def openapi(request: Request) -> Response:
        return JSONResponse(document)

    table = [
        *api.routes(),
        *links.routes(),
        ("GET", "/openapi.json", openapi),
        ("GET", "/admin", dashboard.page),
        ("GET", "/admin/static/{name}", dashboard.static),
    ]
    by_path: dict[str, dict[str, Endpoint]] = {}
    for method, path, endpoint in table:
        by_path.setdefault(path, {})[method] = endpoint
    # one Route per path, so a 405 lists every method the path has in its Allow header
    routes = [Route(path, _dispatch(methods), methods=list(methods)) for path, methods in by_path.items()]
    return Starlette(
        routes=routes,
        middleware=[Middleware(AdminGuard, token=config.admin.token, max_body=config.admin.max_body_bytes,
                               admin_host=config.admin.host)],
        exception_handlers={HTTPException: _http_error, Exception: _server_error},
    )


def _dispatch(methods: dict[str, Endpoint]) -> Endpoint:
    async def endpoint(request: Request) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        return await methods[method](request)

    return endpoint


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = {404: f"no route {request.url.path[:100]!r}", 405: f"{request.method} is not allowed here"}.get(
        exc.status_code, str(exc.detail)
    )
    return error_response(exc.status_code, message, dict(exc.headers or {}))


async def _server_error(request: Request, exc: Exception) -> Response:
    # Starlette re-raises after answering, so Hypercorn logs the traceback (to pipeline.admin.http)
    return error_response(500, f"internal error ({type(exc).__name__}); the server log has the details")


# -- binding ----------------------------------------------------------------------------------


def check_bind(config: Config) -> None:
    """Without ADMIN_TOKEN, listen on loopback only (ConfigError otherwise, CLI exit 2)."""
    if config.admin.token or _resolves_to_loopback(config.admin.host):
        return
    raise ConfigError(
        f"ADMIN_HOST={config.admin.host!r} is not a loopback address and ADMIN_TOKEN is empty: refusing to serve "
        "the admin API (which can delete and enqueue jobs) to the network without a token. Set ADMIN_TOKEN, "
        "or ADMIN_HOST=127.0.0.1"
    )


def _resolves_to_loopback(host: str) -> bool:
    if is_loopback_name(host):
        return True
    try:
        ipaddress.ip_address(host.strip("[]"))
        return False  # an address, and not a loopback one
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


class AdminListener:
    """A listening socket made before the pipeline opens; owned by Hypercorn once served."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock: socket.socket | None = sock
        host, port = sock.getsockname()[:2]
        self.host, self.port = host, port
        self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def take_fd(self) -> int:
        assert self._sock is not None, "this listener was already served or closed"
        sock, self._sock = self._sock, None
        return sock.detach()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def open_admin_listener(config: Config) -> AdminListener:
    """Bind ADMIN_HOST:ADMIN_PORT (0: a free port). ConfigError / AdminBindError say what is wrong."""
    check_bind(config)
    host = config.admin.host.strip("[]")
    hc = HypercornConfig()
    hc.bind = [f"[{host}]:{config.admin.port}" if ":" in host else f"{host}:{config.admin.port}"]
    try:
        (sock,) = hc.create_sockets().insecure_sockets
        sock.listen(hc.backlog)
    except OSError as exc:
        raise AdminBindError(
            f"cannot listen on {config.admin.host}:{config.admin.port} (ADMIN_HOST, ADMIN_PORT): {exc.strerror or exc}"
        ) from None
    return AdminListener(sock)


# -- serving ----------------------------------------------------------------------------------


class _Started:
    """Hypercorn reports its binds; our parent wants the URL."""

    def __init__(self, task_status: trio.TaskStatus[str], url: str) -> None:
        self._task_status, self._url = task_status, url

    def started(self, value: Any = None) -> None:
        self._task_status.started(self._url)


async def run_admin_server(
    pipeline: Pipeline,
    listener: AdminListener | None = None,
    shutdown_trigger: Callable[[], Awaitable[Any]] | None = None,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the admin app on ``listener`` (default: bind from the config) until
    ``shutdown_trigger`` returns, then let in-flight requests finish (GRACEFUL_TIMEOUT).
    ``task_status.started`` gets the base URL once it is listening."""
    listener = listener or open_admin_listener(pipeline.config)
    try:
        app = create_app(pipeline)
        hc = HypercornConfig()
        hc.bind = [f"fd://{listener.take_fd()}"]
        hc.graceful_timeout = GRACEFUL_TIMEOUT
        hc.accesslog = None
        hc.errorlog = logging.getLogger("pipeline.admin.http")
        hc.include_server_header = False
        log.info("admin API on %s (dashboard: %s/admin, metrics: %s/metrics)%s", listener.url, listener.url, listener.url,
                 "" if pipeline.config.admin.token else "; no ADMIN_TOKEN: loopback only")
        await hypercorn_serve(app, hc, shutdown_trigger=shutdown_trigger, task_status=_Started(task_status, listener.url))  # type: ignore[arg-type]
    finally:
        listener.close()
