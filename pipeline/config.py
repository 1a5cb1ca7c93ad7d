"""Configuration: a frozen attrs class read from the environment and a ``.env`` file.

Every setting has an environment variable of the same name in upper case (seed 10,
DESIGN 6). A bad value raises ConfigError naming the variable and what it accepts;
``python -m pipeline`` turns that into exit status 2.
"""

from __future__ import annotations

import os
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
    if text.startswith(("redis://", "rediss://")):
        return text
    raise ValueError("sqlite:///RELATIVE/PATH.db, sqlite:////ABSOLUTE/PATH.db or redis://HOST:PORT/DB")


# variable -> (attribute, parser). The attribute's default is the documented default.
_PARSERS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "DATABASE_URL": ("database_url", _database_url),
    "WORKER_ENABLED": ("worker_enabled", _parse_bool),
    "WORKER_CONCURRENCY": ("worker_concurrency", _int_at_least(1)),
    "WORKER_POLL_INTERVAL_MS": ("worker_poll_interval_ms", _int_at_least(1)),
    "WORKER_DEFAULT_MAX_ATTEMPTS": ("worker_default_max_attempts", _int_at_least(1)),
    "WORKER_SHUTDOWN_TIMEOUT": ("worker_shutdown_timeout", _seconds),
    "WORKER_BACKOFF_BASE_MS": ("worker_backoff_base_ms", _int_at_least(0)),
    "WORKER_LEASE_SECONDS": ("worker_lease_seconds", _positive_seconds),
    "WORKER_JOB_TIMEOUT_SECONDS": ("worker_job_timeout_seconds", _positive_seconds),
    "WORKER_PREFETCH": ("worker_prefetch", _int_at_least(0)),
    "SQLITE_SYNCHRONOUS": ("sqlite_synchronous", _choice("full", "normal")),
    "SQLITE_BUSY_TIMEOUT_MS": ("sqlite_busy_timeout_ms", _int_at_least(0)),
    "WEBHOOK_URLS": ("webhook_urls", _url_list),
    "LOG_LEVEL": ("log_level", _choice("debug", "info", "warning", "error")),
    "LOG_FORMAT": ("log_format", _choice("text", "json")),
}


@attrs.frozen
class Config:
    """All settings of one pipeline. Build with ``Config.from_env()`` or directly."""

    database_url: str = "sqlite:///pipeline.db"
    worker_enabled: bool = True
    worker_concurrency: int = 2  # per job type, unless the type sets its own
    worker_poll_interval_ms: int = 500  # how often other processes' and delayed jobs are looked for
    worker_default_max_attempts: int = 3
    worker_shutdown_timeout: float = 30.0  # seconds in-flight jobs get on SIGTERM
    worker_backoff_base_ms: int = 10_000
    worker_lease_seconds: float = 30.0  # renewed every third of this while a job runs
    worker_job_timeout_seconds: float = 300.0
    worker_prefetch: int | None = None  # jobs claimed ahead per type; None: one pool's worth
    sqlite_synchronous: str = "full"  # full: a commit survives power loss; normal: faster, WAL may lose the last commits
    sqlite_busy_timeout_ms: int = 5_000
    webhook_urls: tuple[str, ...] = ()
    log_level: str = "info"
    log_format: str = "text"

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
                    raise ConfigError(f"{var}={values[var]!r} is not valid: expected {exc}") from None
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
    def backoff_base_seconds(self) -> float:
        return self.worker_backoff_base_ms / 1000.0

    @property
    def poll_interval(self) -> float:
        return self.worker_poll_interval_ms / 1000.0

    def prefetch_for(self, concurrency: int) -> int:
        return concurrency if self.worker_prefetch is None else self.worker_prefetch
