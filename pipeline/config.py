"""Configuration: frozen attrs classes read from the environment and a ``.env`` file.

    config = Config.from_env()                 # .env, then the environment
    config.worker.concurrency                  # the engine's sections: worker, sqlite, redis, admin, log
    config.section(MailSettings).smtp_host     # an application's own section (the site's handlers)

Every setting is declared once, with :func:`setting`: its default, its environment variable
and the parser that checks it. The same check runs on a value given in code
(``WorkerSettings(concurrency=0)`` is refused) as on the text of a variable. A bad value
raises ConfigError naming the variable and what it accepts; ``python -m pipeline`` turns
that into exit status 2. Sections other than the engine's are read from the same
variables when first asked for (:meth:`Config.section`), so each handler owns its section
and the engine knows none of them.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs

from .errors import ConfigError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def boolean(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("true or false")


def int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError(f"an integer >= {minimum}") from None
        if value < minimum:
            raise ValueError(f"an integer >= {minimum}")
        return value

    return parse


def seconds(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError("a number of seconds >= 0") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError("a number of seconds >= 0")
    return value


def positive_seconds(text: str) -> float:
    value = seconds(text)
    if value <= 0:
        raise ValueError("a number of seconds > 0")
    return value


def choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        low = text.strip().lower()
        if low not in options:
            raise ValueError("one of " + ", ".join(options))
        return low

    return parse


def url_list(text: str) -> tuple[str, ...]:
    urls = tuple(part.strip() for part in text.split(",") if part.strip())
    for url in urls:
        if not (url.startswith("http://") or url.startswith("https://")):
            raise ValueError(f"comma-separated http(s) URLs ({masked_url(url)!r} is not one)")
    return urls


# The job stores DATABASE_URL can name, by the scheme its text starts with.
DATABASE_SCHEMES = {
    "sqlite:///": "sqlite",
    "postgresql://": "postgres",
    "postgres://": "postgres",
    "redis://": "redis",
    "rediss://": "redis",
}
DATABASE_URL_FORMS = "sqlite:///PATH.db, postgresql://USER:PASSWORD@HOST:PORT/DB (or postgres://) or redis://HOST:PORT/DB (or rediss://)"


def database_url(text: str) -> str:
    text = text.strip()
    for scheme in DATABASE_SCHEMES:
        if text[: len(scheme)].lower() == scheme and len(text) > len(scheme):
            return text
    raise ValueError(f"one of {DATABASE_URL_FORMS}")


_JOB_TYPE = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,99}")  # registry.register's names


def global_limits(text: str) -> str:
    """``send_email=5,webhook_notify=2``: each job type once, each limit an integer >= 1.
    Kept as text (a setting's value is one of the simple kinds); read by WorkerSettings.global_limits."""
    expected = "comma-separated JOB_TYPE=N pairs, each type once, each N an integer >= 1 (e.g. webhook_notify=2,send_email=5)"
    limits: dict[str, int] = {}
    for part in text.split(","):
        name, sep, number = (piece.strip() for piece in part.partition("="))
        if not sep or not _JOB_TYPE.fullmatch(name) or name in limits:
            raise ValueError(f"{expected}; {part.strip()!r} is not one")
        try:
            limits[name] = int(number)
        except ValueError:
            raise ValueError(f"{expected}; {part.strip()!r} is not one") from None
        if limits[name] < 1:
            raise ValueError(f"{expected}; {part.strip()!r} is not one")
    return ",".join(f"{name}={n}" for name, n in limits.items())


RATE_FORMS = "N/s, N/m or N/h (N an integer >= 1: starts per second, minute or hour)"
_RATE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_rate(text: str) -> tuple[int, float]:
    """``10/s`` → (10, 1.0): at most N starts in any window of that length. ValueError naming the forms."""
    number, sep, unit = text.strip().partition("/")
    try:
        n = int(number.strip())
    except ValueError:
        n = 0
    if not sep or unit.strip() not in _RATE_UNITS or n < 1:
        raise ValueError(f"a rate limit is {RATE_FORMS}; {text.strip()!r} is not one")
    return n, _RATE_UNITS[unit.strip()]


def rate_limits(text: str) -> str:
    """``webhook_notify=10/s,send_email=600/m``: each job type once, each rate as :func:`parse_rate`
    reads it. Kept as text; read by WorkerSettings.rate_limits."""
    expected = f"comma-separated JOB_TYPE=RATE pairs, each type once, each RATE {RATE_FORMS} (e.g. webhook_notify=10/s)"
    seen: list[str] = []
    for part in text.split(","):
        name, sep, rate = (piece.strip() for piece in part.partition("="))
        if not sep or not _JOB_TYPE.fullmatch(name) or name in seen:
            raise ValueError(f"{expected}; {part.strip()!r} is not one")
        try:
            parse_rate(rate)
        except ValueError:
            raise ValueError(f"{expected}; {part.strip()!r} is not one") from None
        seen.append(name)
    return ",".join(part.strip().replace(" ", "") for part in text.split(","))


def text(value: str) -> str:
    return value.strip()


def port(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError("a TCP port 1-65535") from None
    if not 1 <= value <= 65535:
        raise ValueError("a TCP port 1-65535")
    return value


def port_or_zero(text: str) -> int:
    if text.strip() == "0":
        return 0
    try:
        return port(text)
    except ValueError:
        raise ValueError("a TCP port 1-65535 (or 0: any free port)") from None


def site_url(text: str) -> str:
    text = text.strip().rstrip("/")
    if not (text.startswith("http://") or text.startswith("https://")):
        raise ValueError("an http(s) URL such as https://example.com")
    return text


def cache_url(text: str) -> str:
    text = text.strip()
    if text not in ("", "memory://") and not text.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError("memory:// or redis://HOST:PORT/DB")
    return text


def webhook_secret(text: str) -> str:
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


MIN_SIGNING_KEY_CHARS = 32


def signing_key(text: str) -> str:
    """ADMIN_SIGNING_KEY: the secret that signs approval links (pipeline/admin/links.py): random text long
    enough that nobody guesses it."""
    text = text.strip()
    if len(text) < MIN_SIGNING_KEY_CHARS:
        raise ValueError(f"at least {MIN_SIGNING_KEY_CHARS} characters of random text, such as the output of "
                         "python -c 'import secrets; print(secrets.token_urlsafe(32))'")
    return text




_KIND_NAMES = {int: "an integer", float: "a number", bool: "True or False", str: "text", tuple: "a tuple of text"}


def masked_url(url: str) -> str:
    """The URL with any password replaced by ``***``: the form to show in logs, errors and pages.

    Both places a password can stand: the userinfo (``scheme://user:PASSWORD@host``, the
    password itself may hold an unescaped ``@``: everything up to the authority's last ``@``
    is userinfo) and a query parameter (libpq's ``?password=`` and ``?sslpassword=``)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return _masked_query(url)
    end = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    if "@" in authority:
        userinfo, _, hosts = authority.rpartition("@")
        if ":" in userinfo:
            userinfo = userinfo.partition(":")[0] + ":***"
        authority = f"{userinfo}@{hosts}"
    return f"{scheme}{sep}{authority}{_masked_query(tail)}"


def _masked_query(text: str) -> str:
    return re.sub(r"((?:^|[?&;\s])(?:ssl)?password=)[^&;#\s]*", r"\1***", text, flags=re.I)


def without_password(text: str, url: str) -> str:
    """``text`` (a driver's message about ``url``) with the URL's password in none of its
    forms: drivers quote what they could not parse (libpq: ``invalid percent-encoded token:
    "PASSWORD%zz"``, or the whole URI), so the password is looked for as written and
    percent-decoded, and the whole URL shown masked."""
    text = text.replace(url, masked_url(url))
    found: set[str] = set()
    scheme, sep, rest = url.partition("://")
    if sep:
        end = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
        userinfo = rest[:end].rpartition("@")[0]
        if ":" in userinfo:
            found.add(userinfo.partition(":")[2])
    found.update(re.findall(r"(?:^|[?&;\s])(?:ssl)?password=([^&;#\s]*)", url, flags=re.I))
    for password in list(found):
        found.add(urllib.parse.unquote(password))
    for password in sorted(filter(None, found), key=len, reverse=True):
        text = text.replace(password, "***")
    return text


def _masked(value: Any) -> Any:
    """A URL setting's value with its passwords masked: one URL, or a tuple of them."""
    return tuple(masked_url(v) for v in value) if isinstance(value, tuple) else masked_url(value)


def setting(default: Any, env: str, parse: Callable[[str], Any], *, secret: bool = False, url: bool = False) -> Any:
    """One setting: its default, its environment variable and the parser of the variable's
    text, which also checks a value given in code. ``secret``: never shown in a message;
    ``url``: shown with its password masked."""
    shown: Any = (lambda value: "'***'" if value else "''") if secret else (lambda value: repr(_masked(value))) if url else True
    return attrs.field(default=default, converter=_normalised(default, parse), validator=_check, repr=shown,
                       metadata={"env": env, "parse": parse, "secret": secret, "url": url})


def _normalised(default: Any, parse: Callable[[str], Any]) -> Callable[[Any], Any]:
    """Text given in code is stored as its variable's parser leaves it ("FULL" as "full", a
    trailing / dropped from an URL); empty text means the default, as an empty variable does.
    Text the parser refuses is kept, for the check to refuse with the variable's name."""

    def convert(value: Any) -> Any:
        if isinstance(value, list):
            return tuple(value)
        if not isinstance(value, str) or not isinstance(default, str):
            return value
        if value.strip() == "":
            return default
        try:
            return parse(value)
        except ValueError:
            return value

    return convert


def _shown(attribute: attrs.Attribute[Any], value: Any) -> str:
    if attribute.metadata.get("secret"):
        return "'***'"
    if attribute.metadata.get("url") and isinstance(value, (str, tuple)):
        return repr(_masked(value))
    return repr(value)


def _check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """A value given in code, checked by the parser of its variable: of the default's type
    (an int where an int is expected, not a bool or a string), then as text."""
    default = attribute.default
    if type(value) is type(default) and value == default:  # (1 == True: a bool setting wants a bool)
        return
    kind = int if default is None else type(default)  # WORKER_PREFETCH: None or an int
    try:
        if isinstance(value, bool) and kind is not bool or not isinstance(value, kind if kind is not float else (int, float)):
            raise ValueError(f"{_KIND_NAMES[kind]}, got {type(value).__name__}")
        text = str(value)
        if isinstance(value, tuple):
            if not all(isinstance(item, str) for item in value):
                raise ValueError("a tuple of strings")
            text = ",".join(value)
        if text != "":  # empty text means "not set", as an empty variable does
            attribute.metadata["parse"](text.lower() if kind is bool else text)
    except ValueError as exc:
        env = attribute.metadata["env"]
        raise ConfigError(f"{attribute.name}={_shown(attribute, value)} is not valid (the setting {env}): expected {exc}") from None


S = TypeVar("S")


def settings_of(cls: type[S], values: Mapping[str, str]) -> S:
    """A section built from environment text: each of its settings whose variable is set
    and not empty, parsed; the others keep their defaults."""
    kwargs: dict[str, Any] = {}
    for attribute in attrs.fields(cls):  # type: ignore[arg-type]  # S is an attrs class; TypeVar bounds cannot say so
        env = attribute.metadata.get("env")
        if env is None or values.get(env, "").strip() == "":
            continue
        try:
            kwargs[attribute.name] = attribute.metadata["parse"](values[env])
        except ValueError as exc:
            raise ConfigError(f"{env}={_shown(attribute, values[env])} is not valid: expected {exc}") from None
    return cls(**kwargs)


def variables(cls: type) -> Iterator[tuple[str, attrs.Attribute[Any]]]:
    """(variable, field) of every setting of a section: what docs and tests list."""
    for attribute in attrs.fields(cls):
        if "env" in attribute.metadata:
            yield attribute.metadata["env"], attribute


# -- the engine's sections ----------------------------------------------------------------------


@attrs.frozen
class WorkerSettings:
    """How this process runs jobs."""

    enabled: bool = setting(True, "WORKER_ENABLED", boolean)
    concurrency: int = setting(2, "WORKER_CONCURRENCY", int_at_least(1))  # per job type, unless the type sets its own
    poll_interval_ms: int = setting(500, "WORKER_POLL_INTERVAL_MS", int_at_least(1))  # other processes' and delayed jobs
    default_max_attempts: int = setting(3, "WORKER_DEFAULT_MAX_ATTEMPTS", int_at_least(1))
    shutdown_timeout: float = setting(30.0, "WORKER_SHUTDOWN_TIMEOUT", seconds)  # seconds in-flight jobs get on SIGTERM
    backoff_base_ms: int = setting(10_000, "WORKER_BACKOFF_BASE_MS", int_at_least(0))
    lease_seconds: float = setting(30.0, "WORKER_LEASE_SECONDS", positive_seconds)  # renewed every third of this
    job_timeout_seconds: float = setting(300.0, "WORKER_JOB_TIMEOUT_SECONDS", positive_seconds)
    prefetch: int | None = setting(None, "WORKER_PREFETCH", int_at_least(0))  # claimed ahead per type; None: a pool's worth
    # worker processes `python -m pipeline` starts under one supervisor; None: one per core
    processes: int | None = setting(None, "WORKER_PROCESSES", int_at_least(1))
    # a pending job of a type no code here knows goes dead once it has been due this long
    # unclaimed (another process may know the type; a rolling deploy may be under way)
    unknown_type_grace_seconds: float = setting(300.0, "WORKER_UNKNOWN_TYPE_GRACE_SECONDS", seconds)
    # job types' limits across every process sharing the store ("webhook_notify=2,send_email=5"):
    # a type's running jobs never exceed its limit; over Registry.register(global_limit=)
    global_limits_text: str = setting("", "WORKER_GLOBAL_LIMITS", global_limits)
    # job types' rate limits across every process sharing the store ("webhook_notify=10/s,send_email=600/m"):
    # no window of that length sees more starts of the type; over Registry.register(rate_limit=)
    rate_limits_text: str = setting("", "WORKER_RATE_LIMITS", rate_limits)
    # a job that raises Snooze more often than this ends dead (one that snoozes for ever)
    max_snoozes: int = setting(100, "WORKER_MAX_SNOOZES", int_at_least(1))
    # a handler's return value is stored as the job's result, as JSON of at most this many bytes
    # (a larger one fails the attempt, saying so)
    result_max_bytes: int = setting(65_536, "WORKER_RESULT_MAX_BYTES", int_at_least(1))
    # the event loop a worker process hosts for its asyncio handlers (runtime="asyncio"): "asyncio" (the
    # standard library's) or "uvloop" (the `asyncio` extra; refused at start when not installed)
    asyncio_loop: str = setting("asyncio", "WORKER_ASYNCIO_LOOP", choice("asyncio", "uvloop"))

    @property
    def backoff_base_seconds(self) -> float:
        return self.backoff_base_ms / 1000.0

    @property
    def poll_interval(self) -> float:
        return self.poll_interval_ms / 1000.0

    def process_count(self) -> int:
        return self.processes if self.processes is not None else (os.cpu_count() or 1)

    def prefetch_for(self, concurrency: int) -> int:
        return concurrency if self.prefetch is None else self.prefetch

    @property
    def rate_limits(self) -> dict[str, tuple[int, float]]:
        """WORKER_RATE_LIMITS by job type: (starts, window seconds) (checked by its parser already)."""
        if not self.rate_limits_text:
            return {}
        return {name: parse_rate(rate) for name, _, rate in (part.partition("=") for part in self.rate_limits_text.split(","))}

    @property
    def global_limits(self) -> dict[str, int]:
        """WORKER_GLOBAL_LIMITS by job type (checked by its parser already)."""
        if not self.global_limits_text:
            return {}
        return {name: int(n) for name, _, n in (part.partition("=") for part in self.global_limits_text.split(","))}


@attrs.frozen
class SqliteSettings:
    """The SQLite backend's files."""

    # full: a commit survives power loss; normal: faster, WAL may lose the last commits
    synchronous: str = setting("full", "SQLITE_SYNCHRONOUS", choice("full", "normal"))
    # how long a connection waits for another writer's lock; not set (None): a third of
    # WORKER_LEASE_SECONDS, at most 5000, filled in by Config (which checks a value set)
    busy_timeout_ms: int = setting(None, "SQLITE_BUSY_TIMEOUT_MS", int_at_least(0))
    derived: bool = attrs.field(default=False, repr=False, eq=False)  # busy_timeout_ms is Config's, from the lease


def key_prefix(text: str) -> str:
    text = text.strip()
    if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", text):
        raise ValueError("1-64 letters, digits or _ . : - (the keys' hash tag)")
    return text


@attrs.frozen
class RedisSettings:
    """The Redis backend (DATABASE_URL=redis://...)."""

    # true: start even when the server's persistence settings can lose acknowledged jobs
    allow_non_durable: bool = setting(False, "REDIS_ALLOW_NON_DURABLE", boolean)
    # every key is {PREFIX}:...; a URL's ?prefix=NAME takes precedence
    key_prefix: str = setting("pipeline", "REDIS_KEY_PREFIX", key_prefix)


@attrs.frozen
class AdminSettings:
    """The admin HTTP API and dashboard of ``python -m pipeline``."""

    enabled: bool = setting(True, "ADMIN_ENABLED", boolean)
    host: str = setting("127.0.0.1", "ADMIN_HOST", text)
    port: int = setting(8000, "ADMIN_PORT", port_or_zero)
    token: str = setting("", "ADMIN_TOKEN", text, secret=True)  # empty: no auth, and loopback only
    max_body_bytes: int = setting(1_048_576, "ADMIN_MAX_BODY_BYTES", int_at_least(1))
    # signs the approval links of `jobs signal-link` (docs/operating.md); empty: no link is made or accepted
    signing_key: str = setting("", "ADMIN_SIGNING_KEY", signing_key, secret=True)
    # the admin server's address as people reach it (behind a proxy, TLS, a path prefix): the base of the
    # links `jobs signal-link` prints; empty: http://ADMIN_HOST:ADMIN_PORT
    public_url: str = setting("", "ADMIN_PUBLIC_URL", site_url)


@attrs.frozen
class RetentionSettings:
    """How long finished job records are kept before the service removes them; 0 keeps them for ever."""

    completed_seconds: float = setting(604_800.0, "JOB_RETENTION_COMPLETED_SECONDS", seconds)  # 7 days
    dead_seconds: float = setting(2_592_000.0, "JOB_RETENTION_DEAD_SECONDS", seconds)  # 30 days
    cancelled_seconds: float = setting(604_800.0, "JOB_RETENTION_CANCELLED_SECONDS", seconds)  # 7 days
    # how often one process (of all sharing the store) looks for records past their retention
    interval_seconds: float = setting(60.0, "JOB_RETENTION_INTERVAL_SECONDS", positive_seconds)
    # how long an enqueue's idempotency key answers its first job's id (whatever became of the job,
    # which retention may remove sooner: the key outlives it); a key older than this may be used again
    idempotency_seconds: float = setting(86_400.0, "JOB_IDEMPOTENCY_SECONDS", positive_seconds)  # 1 day

    def kept_for(self) -> dict[str, float]:
        """By final status, the age past which a record goes (statuses kept for ever left out)."""
        ages = {"completed": self.completed_seconds, "dead": self.dead_seconds, "cancelled": self.cancelled_seconds}
        return {status: age for status, age in ages.items() if age > 0}


@attrs.frozen
class LogSettings:
    level: str = setting("info", "LOG_LEVEL", choice("debug", "info", "warning", "error"))
    format: str = setting("text", "LOG_FORMAT", choice("text", "json"))
    # false: `python -m pipeline` leaves the root logger to the application's own set-up (logs.configure)
    configure: bool = setting(True, "LOG_CONFIGURE", boolean)


ENGINE_SECTIONS = {
    "worker": WorkerSettings, "sqlite": SqliteSettings, "redis": RedisSettings, "admin": AdminSettings, "log": LogSettings,
    "retention": RetentionSettings,
}


@attrs.frozen
class Config:
    """All settings of one pipeline. Build with ``Config.from_env()`` or directly:

        Config(database_url="sqlite:///app.db", worker=WorkerSettings(concurrency=8))
    """

    database_url: str = setting("sqlite:///pipeline.db", "DATABASE_URL", database_url, url=True)
    worker: WorkerSettings = attrs.field(factory=WorkerSettings)
    sqlite: SqliteSettings = attrs.field(factory=SqliteSettings)
    redis: RedisSettings = attrs.field(factory=RedisSettings)
    admin: AdminSettings = attrs.field(factory=AdminSettings)
    log: LogSettings = attrs.field(factory=LogSettings)
    retention: RetentionSettings = attrs.field(factory=RetentionSettings)
    # applications' sections, by class: given here, or read from ``environ`` when first asked for
    sections: Mapping[type, Any] = attrs.field(factory=dict, repr=False, hash=False)
    environ: Mapping[str, str] = attrs.field(factory=dict, repr=False, eq=False)  # the text from_env read
    _read: dict[type, Any] = attrs.field(factory=dict, init=False, repr=False, eq=False)  # sections built from it

    def __attrs_post_init__(self) -> None:
        # A renewal is tried every third of the lease; one that waits out the whole busy
        # timeout for another writer's lock must still commit before the lease runs out.
        limit = self.worker.lease_seconds * 1000 * 2 / 3
        if self.sqlite.busy_timeout_ms is None or self.sqlite.derived:  # not set: follows the lease (a copy's too)
            derived = attrs.evolve(self.sqlite, busy_timeout_ms=min(5_000, int(self.worker.lease_seconds * 1000 / 3)),
                                   derived=True)
            object.__setattr__(self, "sqlite", derived)  # (frozen: attrs' own way in __attrs_post_init__)
        elif self.database_url.startswith("sqlite:") and self.sqlite.busy_timeout_ms >= limit:
            raise ConfigError(
                f"SQLITE_BUSY_TIMEOUT_MS={self.sqlite.busy_timeout_ms} could eat the lease of WORKER_LEASE_SECONDS="
                f"{self.worker.lease_seconds:g}: a lease renewal waiting that long for a lock would let the lease run "
                f"out under a running job; set it below two thirds of the lease ({limit:.0f} ms), or lengthen the lease"
            )

    def section(self, cls: type[S]) -> S:
        """An application's section (``MailSettings``, ...): as given in ``sections``, else
        read from the environment this config was read from (defaults if built in code)."""
        given = self.sections.get(cls)
        if given is not None:
            return given
        if cls not in self._read:
            self._read[cls] = settings_of(cls, self.environ)
        return self._read[cls]

    def replace(self, **changes: Any) -> Config:
        """A copy with some top-level fields or sections replaced; sections by class:
        ``config.replace(worker=..., sections={MailSettings: ...})`` (merged with the present ones)."""
        sections = {**self.sections, **changes.pop("sections", {})}
        return attrs.evolve(self, sections=sections, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, env_file: str | os.PathLike[str] | None = ".env") -> Config:
        """Read settings from ``env_file`` (if it exists), then the environment (or ``environ``)."""
        values: dict[str, str] = {}
        if env_file is not None and Path(env_file).is_file():
            from dotenv import dotenv_values  # python-dotenv: the .env dialect people already write

            values.update({k: v for k, v in dotenv_values(env_file).items() if v is not None})
        values.update(os.environ if environ is None else environ)
        top = settings_of(_TopLevel, values)
        sections: dict[str, Any] = {name: settings_of(section, values) for name, section in ENGINE_SECTIONS.items()}
        return cls(database_url=top.database_url, **sections, environ=values)

    # -- derived --------------------------------------------------------------------------

    @property
    def backend(self) -> str:
        """The kind of job store DATABASE_URL names: sqlite, postgres or redis."""
        for scheme, kind in DATABASE_SCHEMES.items():
            if self.database_url[: len(scheme)].lower() == scheme:
                return kind
        return self.database_url.partition("://")[0]

    @property
    def database_path(self) -> Path:
        if not self.database_url.startswith("sqlite:///"):
            raise ConfigError(f"DATABASE_URL={masked_url(self.database_url)!r} is not a SQLite database")
        return Path(self.database_url[len("sqlite:///") :])


@attrs.frozen
class _TopLevel:
    database_url: str = setting("sqlite:///pipeline.db", "DATABASE_URL", database_url, url=True)
