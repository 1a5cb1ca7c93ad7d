"""Signed approval links (docs/operating.md, "Approval links"): a URL on the admin server that sends one
signal to one job, usable by a person who has no admin token, once, until it expires.

    url = signal_link(config, job_id, "approval", True, expires_in=2 * 86400)   # or: jobs signal-link

The token in the URL carries what the link sends and its limits, and proves that whoever holds
ADMIN_SIGNING_KEY made it:

    <claims>.<mac>    claims: base64url of the JSON {"v": 1, "job", "name", "payload", "exp", "nonce"}
                      mac: base64url of HMAC-SHA256(ADMIN_SIGNING_KEY, "pipeline signal link v1." + claims)

``exp`` is the expiry in whole seconds since the epoch; ``nonce`` is 128 random bits, and the signal is sent
with the key ``link:<nonce>``, which the store takes once per job (``Backend.signal(key=)``): that is what
makes a link work once, in every process sharing the store, with no table of used links. The claims are
readable by whoever holds the link (they are not encrypted): they hold nothing the page does not show.

Only the standard library (hmac, hashlib, secrets): a token of one format and one purpose does not need
itsdangerous. Nothing here does I/O; link_page.py serves the links, cli/jobs.py prints them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import secrets
import time
from typing import Any

import attrs

from ..config import Config
from ..durable import check_signal_name, encode_signal_payload
from ..errors import ConfigError, UsageError
from ..requests import check_job_id

VERSION = 1
_CONTEXT = b"pipeline signal link v1."  # what is signed starts with this: no other token of ours can pass for a link
PATH = "/signal-links/"  # where the admin server serves them: outside /admin/, which needs the admin token
DEFAULT_EXPIRES_IN = 7 * 86400.0
MAX_EXPIRES_IN = 366 * 86400.0  # a link that outlives a year is a standing credential, not an approval
# the payload travels in the URL, which mail clients, proxies and servers cut somewhere past 8 KB: a link
# carries a decision and a few details (bigger payloads: `jobs signal`, the admin API, Client.signal)
MAX_LINK_PAYLOAD_BYTES = 2048
NONCE_BYTES = 16
KEY_PREFIX = "link:"  # the signal's key: link:<nonce>


class LinkRefused(Exception):
    """A link that cannot be used: ``status`` is the HTTP answer (403 not ours or altered, 410 expired)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@attrs.frozen
class LinkClaims:
    """What a link sends, to which job, until when."""

    job_id: str
    name: str
    payload: str | None  # JSON text as the store keeps it (None: none)
    expires_at: int  # seconds since the epoch
    nonce: str

    @property
    def key(self) -> str:
        """The signal's key: the store refuses a second signal with it (the link works once)."""
        return KEY_PREFIX + self.nonce

    def payload_value(self) -> Any:
        return None if self.payload is None else json.loads(self.payload)

    def to_json(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "name": self.name, "payload": self.payload_value(),
                "expires_at": _iso(self.expires_at)}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: str, claims: str) -> str:
    return _b64(hmac.new(key.encode("utf-8"), _CONTEXT + claims.encode("ascii"), hashlib.sha256).digest())


def _iso(epoch: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def require_key(config: Config) -> str:
    """ADMIN_SIGNING_KEY; ConfigError naming it when it is not set."""
    if not config.admin.signing_key:
        raise ConfigError("ADMIN_SIGNING_KEY is not set: it signs approval links (and the admin server needs the "
                          "same key to accept them); set it to at least 32 characters of random text, e.g. "
                          "python -c 'import secrets; print(secrets.token_urlsafe(32))'")
    return config.admin.signing_key


def make_claims(job_id: str, name: str, payload: Any = None, *, expires_in: float = DEFAULT_EXPIRES_IN,
                now: float | None = None) -> LinkClaims:
    """The claims of a new link, checked: UsageError naming what does not fit (the job id, the signal's name,
    a payload that is not JSON or too big for a URL, an expiry out of bounds)."""
    check_job_id(job_id)
    check_signal_name(name)
    if not isinstance(expires_in, (int, float)) or isinstance(expires_in, bool) or not 0 < expires_in <= MAX_EXPIRES_IN:
        raise UsageError(f"a link's expiry must be more than 0 s and at most {MAX_EXPIRES_IN / 86400:g} days, "
                         f"got {expires_in!r} s")
    text = encode_signal_payload(payload)
    if text is not None and len(text.encode("utf-8")) > MAX_LINK_PAYLOAD_BYTES:
        raise UsageError(f"a link's payload must be at most {MAX_LINK_PAYLOAD_BYTES:,} bytes as JSON (it travels in "
                         f"the URL), got {len(text.encode('utf-8')):,}; send a larger one with `jobs signal` or the "
                         "admin API instead")
    expires_at = math.ceil((time.time() if now is None else now) + expires_in)
    return LinkClaims(job_id, name, text, expires_at, _b64(secrets.token_bytes(NONCE_BYTES)))


def sign(key: str, claims: LinkClaims) -> str:
    """The token for ``claims``, signed with ``key``."""
    body = {"v": VERSION, "job": claims.job_id, "name": claims.name, "payload": claims.payload_value(),
            "exp": claims.expires_at, "nonce": claims.nonce}
    encoded = _b64(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    return f"{encoded}.{_mac(key, encoded)}"


def verify(key: str, token: str, *, now: float | None = None) -> LinkClaims:
    """The claims of a token this server's key signed and that has not expired; LinkRefused otherwise (403
    for a token that is not one of ours or was altered, 410 once it expired). Whether it was used is the
    store's to say, when the signal is sent."""
    altered = LinkRefused(403, "this link is not valid: it was altered, cut short, or signed with another key "
                               "(ADMIN_SIGNING_KEY). Ask for a new link")
    encoded, dot, mac = token.rpartition(".")
    if not dot or not encoded.isascii() or not mac.isascii():
        raise altered
    if not hmac.compare_digest(_mac(key, encoded).encode("ascii"), mac.encode("ascii")):
        raise altered
    # signed by our key: what follows can only fail for a token made by another version of this code
    try:
        body = json.loads(_unb64(encoded))
        claims = LinkClaims(body["job"], body["name"], encode_signal_payload(body["payload"]), int(body["exp"]),
                            body["nonce"])
        if body["v"] != VERSION or not all(isinstance(v, str) for v in (claims.job_id, claims.name, claims.nonce)):
            raise ValueError("unknown version")
    except (ValueError, KeyError, TypeError, UsageError, binascii.Error):
        raise altered from None
    if (time.time() if now is None else now) >= claims.expires_at:
        raise LinkRefused(410, f"this link expired at {_iso(claims.expires_at)}: ask for a new one")
    return claims


def base_url(config: Config) -> str:
    """Where people reach the admin server: ADMIN_PUBLIC_URL, else http://ADMIN_HOST:ADMIN_PORT (ConfigError
    when that is no address a person can open: a wildcard host, or port 0)."""
    if config.admin.public_url:
        return config.admin.public_url
    host, port = config.admin.host.strip(), config.admin.port
    if host.strip("[]") in ("0.0.0.0", "::", ""):
        raise ConfigError(f"ADMIN_HOST={host} is where the server listens, not an address a person can open: set "
                          "ADMIN_PUBLIC_URL to the admin server's address as people reach it (https://jobs.example.com)")
    if port == 0:
        raise ConfigError("ADMIN_PORT=0 picks a free port at start, which a link cannot name: set ADMIN_PORT, or "
                          "ADMIN_PUBLIC_URL to the admin server's address as people reach it")
    shown = f"[{host.strip('[]')}]" if ":" in host.strip("[]") else host
    return f"http://{shown}:{port}"


def link_url(config: Config, token: str) -> str:
    return base_url(config) + PATH + token


def signal_link(config: Config, job_id: str, name: str, payload: Any = None, *,
                expires_in: float = DEFAULT_EXPIRES_IN) -> str:
    """A URL on the admin server that sends the signal ``name`` with ``payload`` to the job once, to whoever
    opens it and presses its button, without the admin token, for ``expires_in`` seconds (default 7 days).
    ConfigError without ADMIN_SIGNING_KEY; UsageError naming what does not fit. Whether the job exists is not
    asked here (``jobs signal-link`` asks); the link answers 404 or 409 if it is gone or finished.

    Made in a handler (to mail it), make it inside a ``ctx.step``: each call makes a new link."""
    key = require_key(config)
    return link_url(config, sign(key, make_claims(job_id, name, payload, expires_in=expires_in)))
