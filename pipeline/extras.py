"""What each optional part of the package needs installed, and the error that says so.

``pip install trio-pipeline`` is the core: the engine, the SQLite store, the clients, the CLI and
the admin API with its dashboard. The rest are extras (pyproject.toml says why each is one):

    postgres   DATABASE_URL=postgresql://     psycopg 3 and its pool
    redis      DATABASE_URL=redis://, CACHE_URL=redis://    redis-py
    otel       pipeline.otel.instrument     opentelemetry-api
    pydantic   pydantic models as payloads  (found when the application defines one)
    demo       the bundled blog, pipeline.site (the default app), and `demo`: Pillow, httpx
    asyncio    WORKER_ASYNCIO_LOOP=uvloop   uvloop
    django     pipeline.contrib.django      Django (and the django-tasks backport before 3.12)

The core never imports an extra's modules at start: the part that needs one calls
:func:`require` just before its import, so a missing extra is a :class:`ConfigError` (exit
status 2) that names the setting or command asking for it and the install that gives it, instead
of a ``ModuleNotFoundError`` from deep inside. The check finds the module without importing it.
"""

from __future__ import annotations

import importlib.util

from .errors import ConfigError

# extra -> the top-level modules its requirements install (what the part that needs it imports)
MODULES: dict[str, tuple[str, ...]] = {
    "postgres": ("psycopg", "psycopg_pool"),
    "redis": ("redis",),
    "otel": ("opentelemetry",),
    "demo": ("PIL", "httpx", "httpcore"),
}


class MissingExtra(ConfigError, ImportError):
    """A setting or command needs an extra that is not installed: a ConfigError (the CLI's exit
    status 2) and an ImportError (what code that guards an optional import already catches)."""


def missing(extra: str) -> str | None:
    """The first of ``extra``'s modules that cannot be found, or None when all can."""
    for module in MODULES[extra]:
        try:
            if importlib.util.find_spec(module) is None:
                return module
        except (ImportError, ValueError):  # a module broken or removed under a stale sys.modules entry
            return module
    return None


def require(extra: str, needed_by: str, *, otherwise: str = "") -> None:
    """Raise :class:`MissingExtra` when ``extra`` is not installed: ``needed_by`` (the setting or
    the command, as a person wrote it) needs it; ``otherwise``: another way out, said after the
    install."""
    module = missing(extra)
    if module is None:
        return
    raise MissingExtra(f"{needed_by} needs the {extra} extra: pip install 'trio-pipeline[{extra}]'"
                       f"{'; ' + otherwise if otherwise else ''} (the module {module!r} is not installed)")
