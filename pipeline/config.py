"""Configuration: a frozen attrs class read from the environment and a ``.env`` file.

Every setting has an environment variable of the same name in upper case (seed 10,
DESIGN 6). A bad value raises ConfigError naming the variable and what it accepts;
``python -m pipeline`` turns that into exit status 2.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from .errors import ConfigError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("true or false")


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError(f"an integer >= {minimum}") from None
        if value < minimum:
            raise ValueError(f"an integer >= {minimum}")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError("a number of seconds >= 0") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError("a number of seconds >= 0")
    return value


def _positive_seconds(text: str) -> float:
    value = _seconds(text)
    if value <= 0:
        raise ValueError("a number of seconds > 0")
    return value


def _choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        low = text.strip().lower()
        if low not in options:
            raise ValueError("one of " + ", ".join(options))
        return low

    return parse


def _url_list(text: str) -> tuple[str, ...]:
    urls = tuple(part.strip() for part in text.split(",") if part.strip())
    for url in urls:
        if not (url.startswith("http://") or url.startswith("https://")):
            raise ValueError(f"comma-separated http(s) URLs ({url!r} is not one)")
    return urls


def _database_url(text: str) -> str:
    text = text.strip()
    if text.startswith("sqlite:///") and len(text) > len("sqlite:///"):
        return text
    raise ValueError("sqlite:///RELATIVE/PATH.db or sqlite:////ABSOLUTE/PATH.db (this version stores jobs in SQLite only)")


def _site_database_url(text: str) -> str:
    text = text.strip()
    if text.startswith("sqlite:///") and len(text) > len("sqlite:///"):
        return text
    raise ValueError("sqlite:///RELATIVE/PATH.db or sqlite:////ABSOLUTE/PATH.db (the site's content is in SQLite)")


def _text(text: str) -> str:
    return text.strip()


def _port(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError("a TCP port 1-65535") from None
    if not 1 <= value <= 65535:
        raise ValueError("a TCP port 1-65535")
    return value


def _port_or_zero(text: str) -> int:
    if text.strip() == "0":
        return 0
    try:
        return _port(text)
    except ValueError:
        raise ValueError("a TCP port 1-65535 (or 0: any free port)") from None


def _site_url(text: str) -> str:
    text = text.strip().rstrip("/")
    if not (text.startswith("http://") or text.startswith("https://")):
        raise ValueError("an http(s) URL such as https://example.com")
    return text


def _cache_url(text: str) -> str:
    text = text.strip()
    if text not in ("", "memory://") and not text.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError("memory:// or redis://HOST:PORT/DB")
    return text


def _webhook_secret(text: str) -> str:
    import base64
    import binascii

    text = text.strip()
    if not text.startswith("whsec_"):
        raise ValueError("whsec_ followed by the base64 of the key bytes (Standard Webhooks)")
    try:
        key = base64.b64decode(text[len("whsec_") :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("whsec_ followed by valid base64 of the key bytes") from None
    if len(key) < 16:
        raise ValueError("a key of at least 16 bytes after whsec_")
    return text


# variable -> (attribute, parser). The attribute's default is the documented default.
_PARSERS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "DATABASE_URL": ("database_url", _database_url),
    "SITE_DATABASE_URL": ("site_database_url", _site_database_url),
    "WORKER_ENABLED": ("worker_enabled", _parse_bool),
    "WORKER_CONCURRENCY": ("worker_concurrency", _int_at_least(1)),
    "WORKER_POLL_INTERVAL_MS": ("worker_poll_interval_ms", _int_at_least(1)),
    "WORKER_DEFAULT_MAX_ATTEMPTS": ("worker_default_max_attempts", _int_at_least(1)),
    "WORKER_SHUTDOWN_TIMEOUT": ("worker_shutdown_timeout", _seconds),
    "WORKER_BACKOFF_BASE_MS": ("worker_backoff_base_ms", _int_at_least(0)),
    "WORKER_LEASE_SECONDS": ("worker_lease_seconds", _positive_seconds),
    "WORKER_JOB_TIMEOUT_SECONDS": ("worker_job_timeout_seconds", _positive_seconds),
    "WORKER_PREFETCH": ("worker_prefetch", _int_at_least(0)),
    "WORKER_UNKNOWN_TYPE_GRACE_SECONDS": ("worker_unknown_type_grace_seconds", _seconds),
    "SQLITE_SYNCHRONOUS": ("sqlite_synchronous", _choice("full", "normal")),
    "SQLITE_BUSY_TIMEOUT_MS": ("sqlite_busy_timeout_ms", _int_at_least(0)),
    "WEBHOOK_URLS": ("webhook_urls", _url_list),
    "WEBHOOK_SECRET": ("webhook_secret", _webhook_secret),
    "WEBHOOK_TIMEOUT_SECONDS": ("webhook_timeout_seconds", _positive_seconds),
    "WEBHOOK_ALLOW_PRIVATE_NETWORKS": ("webhook_allow_private_networks", _parse_bool),
    "SMTP_HOST": ("smtp_host", _text),
    "SMTP_PORT": ("smtp_port", _port),
    "SMTP_USERNAME": ("smtp_username", _text),
    "SMTP_PASSWORD": ("smtp_password", _text),
    "SMTP_SECURITY": ("smtp_security", _choice("none", "starttls", "tls")),
    "SMTP_TIMEOUT": ("smtp_timeout", _positive_seconds),
    "MAIL_FROM": ("mail_from", _text),
    "MEDIA_DIR": ("media_dir", _text),
    "PUBLIC_DIR": ("public_dir", _text),
    "SITE_URL": ("site_url", _site_url),
    "IMAGE_MAX_PIXELS": ("image_max_pixels", _int_at_least(1)),
    "CACHE_URL": ("cache_url", _cache_url),
    "ADMIN_ENABLED": ("admin_enabled", _parse_bool),
    "ADMIN_HOST": ("admin_host", _text),
    "ADMIN_PORT": ("admin_port", _port_or_zero),
    "ADMIN_TOKEN": ("admin_token", _text),
    "ADMIN_MAX_BODY_BYTES": ("admin_max_body_bytes", _int_at_least(1)),
    "LOG_LEVEL": ("log_level", _choice("debug", "info", "warning", "error")),
    "LOG_FORMAT": ("log_format", _choice("text", "json")),
}


_KIND_NAMES = {int: "an integer", float: "a number", bool: "True or False", str: "text", tuple: "a tuple of text"}
_SECRETS = {"WEBHOOK_SECRET", "SMTP_PASSWORD", "ADMIN_TOKEN"}  # never echoed in a message
_URLS = {"DATABASE_URL", "SITE_DATABASE_URL", "CACHE_URL"}  # echoed with any password masked


def masked_url(url: str) -> str:
    """The URL with any password replaced by ``***``: the form to show in logs, errors and pages."""
    return re.sub(r"^([a-z][a-z0-9+.-]*://[^/:@]*:)[^/@]*@", r"\1***@", url, flags=re.I)


def _shown(var: str, value: Any) -> str:
    if var in _SECRETS:
        return "'***'"
    if var in _URLS and isinstance(value, str):
        return repr(masked_url(value))
    return repr(value)


def _check_value(value: Any, default: Any, parse: Callable[[str], Any]) -> None:
    """A value given in code checked by the parser of its environment variable: of the
    default's type (an int where an int is expected, not a bool or a string), then as text."""
    kind = int if default is None else type(default)  # WORKER_PREFETCH: None or an int
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind if kind is not float else (int, float)):
        raise ValueError(f"{_KIND_NAMES[kind]}, got {type(value).__name__}")
    text = str(value)
    if isinstance(value, tuple):
        if not all(isinstance(item, str) for item in value):
            raise ValueError("a tuple of strings")
        text = ",".join(value)
    if text == "":
        return  # empty text means "not set", as an empty variable does
    parse(text.lower() if kind is bool else text)


@attrs.frozen
class Config:
    """All settings of one pipeline. Build with ``Config.from_env()`` or directly."""

    database_url: str = "sqlite:///pipeline.db"
    # the bundled site's content (users, posts, media, search index); empty: the job
    # database's file when that is SQLite, else sqlite:///site.db
    site_database_url: str = ""
    worker_enabled: bool = True
    worker_concurrency: int = 2  # per job type, unless the type sets its own
    worker_poll_interval_ms: int = 500  # how often other processes' and delayed jobs are looked for
    worker_default_max_attempts: int = 3
    worker_shutdown_timeout: float = 30.0  # seconds in-flight jobs get on SIGTERM
    worker_backoff_base_ms: int = 10_000
    worker_lease_seconds: float = 30.0  # renewed every third of this while a job runs
    worker_job_timeout_seconds: float = 300.0
    worker_prefetch: int | None = None  # jobs claimed ahead per type; None: one pool's worth
    # a pending job of a type no code here knows goes dead once it has been due this long
    # unclaimed (another process may know the type; a rolling deploy may be under way)
    worker_unknown_type_grace_seconds: float = 300.0
    sqlite_synchronous: str = "full"  # full: a commit survives power loss; normal: faster, WAL may lose the last commits
    sqlite_busy_timeout_ms: int = 5_000
    webhook_urls: tuple[str, ...] = ()
    webhook_secret: str = ""  # whsec_<base64 key>; empty: requests are not signed
    webhook_timeout_seconds: float = 10.0
    webhook_allow_private_networks: bool = False
    smtp_host: str = ""  # empty: mail handlers fail permanently, naming SMTP_HOST
    smtp_port: int = 25
    smtp_username: str = ""
    smtp_password: str = ""
    smtp_security: str = "none"  # none | starttls | tls
    smtp_timeout: float = 30.0
    mail_from: str = ""
    media_dir: str = "media"
    public_dir: str = "public"
    site_url: str = "http://localhost:8000"
    image_max_pixels: int = 50_000_000  # decompression-bomb limit for uploaded images
    cache_url: str = ""  # empty or memory://: in-process cache; redis://...: Redis
    admin_enabled: bool = True
    admin_host: str = "127.0.0.1"
    admin_port: int = 8000
    admin_token: str = ""  # empty: no auth, and the admin server binds to loopback only
    admin_max_body_bytes: int = 1_048_576
    log_level: str = "info"
    log_format: str = "text"

    def __attrs_post_init__(self) -> None:
        """Refuse what the environment would refuse, whichever way the config was built."""
        defaults = {field.name: field.default for field in attrs.fields(type(self))}
        for var, (attr, parse) in _PARSERS.items():
            value, default = getattr(self, attr), defaults[attr]
            if value == default:
                continue
            try:
                _check_value(value, default, parse)
            except ValueError as exc:
                raise ConfigError(f"{attr}={_shown(var, value)} is not valid (the setting {var}): expected {exc}") from None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, env_file: str | os.PathLike[str] | None = ".env", **overrides: Any) -> Config:
        """Read settings from ``env_file`` (if it exists), then the environment, then ``overrides``."""
        values: dict[str, str] = {}
        if env_file is not None and Path(env_file).is_file():
            from dotenv import dotenv_values  # python-dotenv: the .env dialect people already write

            values.update({k: v for k, v in dotenv_values(env_file).items() if v is not None})
        values.update(os.environ if environ is None else environ)
        kwargs: dict[str, Any] = {}
        for var, (attr, parse) in _PARSERS.items():
            if var in values and values[var].strip() != "":
                try:
                    kwargs[attr] = parse(values[var])
                except ValueError as exc:
                    raise ConfigError(f"{var}={_shown(var, values[var])} is not valid: expected {exc}") from None
        kwargs.update(overrides)
        return cls(**kwargs)

    # -- derived --------------------------------------------------------------------------

    @property
    def backend(self) -> str:
        return "redis" if self.database_url.startswith(("redis://", "rediss://")) else "sqlite"

    @property
    def database_path(self) -> Path:
        if self.backend != "sqlite":
            raise ConfigError(f"DATABASE_URL={self.database_url!r} is not a SQLite database")
        return Path(self.database_url[len("sqlite:///") :])

    @property
    def site_database_path(self) -> Path:
        if self.site_database_url:
            return Path(self.site_database_url[len("sqlite:///") :])
        return self.database_path if self.backend == "sqlite" else Path("site.db")

    @property
    def backoff_base_seconds(self) -> float:
        return self.worker_backoff_base_ms / 1000.0

    @property
    def poll_interval(self) -> float:
        return self.worker_poll_interval_ms / 1000.0

    def prefetch_for(self, concurrency: int) -> int:
        return concurrency if self.worker_prefetch is None else self.worker_prefetch
