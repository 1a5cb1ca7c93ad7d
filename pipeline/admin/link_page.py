"""The approval link's page (links.py makes the links): ``GET /signal-links/{token}`` shows what the link
sends and to which job, and changes nothing (a mail scanner or a link preview that fetches it sends
nothing); the page's button POSTs to the same address, which sends the signal, once.

No admin token is asked: the signed token is the credential, and it allows one thing, for one job, once,
until it expires. What the admin guard still does (security.py): Host names, same origin for the POST (a
page elsewhere cannot make a visitor's browser press the button), body size. The page is plain HTML with
every value escaped, an inline style allowed by its hash and nothing else (no script), it cannot be framed
(a button under someone else's page), and its address is not sent as a referrer anywhere.

A person reads HTML; a client that asks for JSON (``Accept: application/json``) gets the admin API's
shapes: ``{"outcome", "job"}`` or ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import logging
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from ..backends.base import signal_refused
from ..errors import PipelineClosed, SignalKeyUsed, StoreError, UsageError
from ..states import TERMINAL, Status
from . import inputs
from .api import error_response
from .links import LinkClaims, LinkRefused, verify

if TYPE_CHECKING:
    from ..backends import JobRecord
    from ..engine.wiring import Pipeline

log = logging.getLogger("pipeline.admin")

STYLE = (
    "body{font:16px/1.5 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:#1d2330;background:#f5f6f8;margin:0}"
    "main{max-width:40rem;margin:3rem auto;padding:1.5rem 2rem;background:#fff;border-radius:10px;"
    "box-shadow:0 1px 6px rgba(20,30,50,.08)}"
    "h1{font-size:1.3rem;margin:0 0 1rem}dl{display:grid;grid-template-columns:max-content 1fr;gap:.3rem 1rem}"
    "dt{color:#6a7285}dd{margin:0;overflow-wrap:anywhere}code,pre{font-family:ui-monospace,Menlo,Consolas,monospace}"
    "pre{background:#f5f6f8;border:1px solid #e2e5eb;border-radius:6px;padding:.6rem;margin:0;white-space:pre-wrap;"
    "overflow-wrap:anywhere;max-height:20rem;overflow:auto;font-size:.9rem}"
    "button{font:inherit;padding:.5rem 1.4rem;border-radius:6px;border:1px solid #3451b2;background:#3451b2;color:#fff;"
    "cursor:pointer}.muted{color:#6a7285}.error h1{color:#d1394a}.sent h1{color:#2e9a5b}"
)
_STYLE_HASH = base64.b64encode(hashlib.sha256(STYLE.encode("utf-8")).digest()).decode("ascii")
HEADERS = {
    "Content-Security-Policy": f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; form-action 'self'; "
                               "base-uri 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    # same-origin, not no-referrer: under no-referrer a browser sends `Origin: null` with the form's POST,
    # which the guard's same-origin check refuses; either way the address (the token) leaves for nowhere else
    "Referrer-Policy": "same-origin",
}

def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _page(status: int, title: str, body: str, kind: str = "") -> HTMLResponse:
    text = (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<meta name="robots" content="noindex"><title>{_e(title)}</title><style>{STYLE}</style></head>'
            f'<body><main class="{kind}"><h1>{_e(title)}</h1>{body}</main></body></html>')
    return HTMLResponse(text, status, headers=HEADERS)


def _wants_json(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return "application/json" in accept and "text/html" not in accept


def _payload_text(claims: LinkClaims) -> str:
    return "none" if claims.payload is None else json.dumps(claims.payload_value(), indent=2, ensure_ascii=False)


def _job_state(job: JobRecord, name: str) -> str:
    if job.status == Status.SUSPENDED and job.awaiting_signal == name:
        return "waiting for this signal: it resumes when it is sent"
    if job.status == Status.SUSPENDED and job.awaiting_signal:
        return f"suspended, waiting for the signal {job.awaiting_signal!r}: it takes this one when it waits for it"
    return f"{job.status}: it takes this signal when it waits for it"


class LinkPage:
    """The two endpoints of a signed link, for one pipeline."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.key = pipeline.config.admin.signing_key

    def routes(self) -> list[tuple[str, str, Any]]:
        return [("GET", "/signal-links/{token}", self.show), ("POST", "/signal-links/{token}", self.send)]

    async def show(self, request: Request) -> Response:
        """GET /signal-links/{token}: what the link sends, and a button; changes nothing."""
        try:
            claims = self._claims(request)
            if await self.pipeline.backend.signal_key_used(claims.job_id, claims.key):
                raise LinkRefused(410, "this link was used already: it sends its signal once")
            job = await self._job(claims)
        except LinkRefused as exc:
            return self._refused(request, exc)
        except (PipelineClosed, StoreError) as exc:
            return self._refused(request, LinkRefused(503, str(exc)))
        if _wants_json(request):
            return JSONResponse({"link": claims.to_json(), "job": job.to_json()})
        body = (
            "<dl>"
            f"<dt>job</dt><dd><code>{_e(job.id)}</code> ({_e(job.job_type)})</dd>"
            f"<dt>its state</dt><dd>{_e(_job_state(job, claims.name))}</dd>"
            f"<dt>signal</dt><dd><code>{_e(claims.name)}</code></dd>"
            f"<dt>payload</dt><dd><pre>{_e(_payload_text(claims))}</pre></dd>"
            f"<dt>link expires</dt><dd>{_e(claims.to_json()['expires_at'])}</dd>"
            "</dl>"
            f'<form method="post"><p><button type="submit">Send {_e(claims.name)}</button></p></form>'
            '<p class="muted">Opening this page sent nothing. The button sends the signal; the link works once.</p>'
        )
        return _page(200, f"Send the signal {claims.name!r} to this job?", body)

    async def send(self, request: Request) -> Response:
        """POST /signal-links/{token}: sends the signal, keyed by the link's nonce (a second use is 410)."""
        try:
            claims = self._claims(request)
            try:
                outcome = await self.pipeline.signal(claims.job_id, claims.name, claims.payload_value(), key=claims.key)
            except LookupError:
                raise LinkRefused(404, f"job {claims.job_id} no longer exists: there is nothing to send this signal to") from None
            except SignalKeyUsed:
                raise LinkRefused(410, "this link was used already: it sends its signal once") from None
            except UsageError as exc:  # the job finished (signal_refused's text)
                raise LinkRefused(409, str(exc)) from None
            job = await self.pipeline.backend.get(claims.job_id)
        except LinkRefused as exc:
            return self._refused(request, exc)
        except (PipelineClosed, StoreError) as exc:
            return self._refused(request, LinkRefused(503, str(exc)))
        log.info("signal link: signal %r sent to job %s (%s)", claims.name, claims.job_id, outcome)
        if _wants_json(request):
            return JSONResponse({"outcome": outcome, "job": None if job is None else job.to_json()})
        said = ("The job was waiting for it and resumes now." if outcome == "woken"
                else "The job is not waiting for it yet: it takes it when it gets there.")
        body = (f"<p>{_e(said)}</p><dl><dt>job</dt><dd><code>{_e(claims.job_id)}</code></dd>"
                f"<dt>signal</dt><dd><code>{_e(claims.name)}</code></dd>"
                f"<dt>payload</dt><dd><pre>{_e(_payload_text(claims))}</pre></dd></dl>"
                '<p class="muted">This link has done its work: it will not send again.</p>')
        return _page(200, f"Sent: {claims.name}", body, "sent")

    def _claims(self, request: Request) -> LinkClaims:
        if not self.key:
            raise LinkRefused(403, "this server accepts no signed link: its ADMIN_SIGNING_KEY is not set")
        token = request.path_params["token"]
        if not inputs.storable(token):
            raise LinkRefused(403, "this link is not valid: it was altered, cut short, or signed with another key "
                                   "(ADMIN_SIGNING_KEY). Ask for a new link")
        return verify(self.key, token)

    async def _job(self, claims: LinkClaims) -> JobRecord:
        job = await self.pipeline.backend.get(claims.job_id)
        if job is None:
            raise LinkRefused(404, f"job {claims.job_id} no longer exists: there is nothing to send this signal to")
        if job.status in TERMINAL:
            raise LinkRefused(409, signal_refused(claims.job_id, job.status))
        return job

    def _refused(self, request: Request, exc: LinkRefused) -> Response:
        if _wants_json(request):
            return error_response(exc.status, exc.message)
        title = {403: "This link is not valid", 404: "No such job", 409: "The job has finished",
                 410: "This link no longer works", 503: "Try again later"}.get(exc.status, "This link cannot be used")
        return _page(exc.status, title, f"<p>{_e(exc.message)}</p>", "error")
