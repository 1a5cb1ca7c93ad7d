"""What a ``TASKS`` entry whose BACKEND is ``pipeline.contrib.django.PipelineBackend`` asks of the
pipeline, read once per backend and checked (``ImproperlyConfigured`` naming the setting):

    TASKS = {"default": {
        "BACKEND": "pipeline.contrib.django.PipelineBackend",
        "QUEUES": ["default", "emails"],               # each queue is a job type: django.default, django.emails
        "OPTIONS": {
            "DATABASE": "default",                     # the jobs live in this database; enqueues join its transactions
            # "DATABASE_URL": "redis://...",           # or another store (then no DATABASE, unless it is the same database)
            "MAX_ATTEMPTS": 1,                         # a task that raises is FAILED (more: retried with backoff first)
            "QUEUES": {"emails": {"concurrency": 4, "timeout": 30, "max_attempts": 3, "rate_limit": "10/s"}},
        },
    }}
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

import attrs

BACKEND_PATH = "pipeline.contrib.django.PipelineBackend"
JOB_TYPE_PREFIX = "django."  # a queue's job type is django.<queue>
_QUEUE = re.compile(r"[A-Za-z0-9_.:-]{1,90}")  # what a job type's name may hold, after the prefix
_QUEUE_KEYS = {"concurrency", "timeout", "max_attempts", "global_limit", "rate_limit"}  # @registry.job's own
_OPTION_KEYS = {"DATABASE", "DATABASE_URL", "MAX_ATTEMPTS", "QUEUES"}


@attrs.frozen
class Queue:
    """One Django queue: the pipeline job type its tasks are stored as, and that type's options."""

    name: str
    job_type: str
    options: Mapping[str, Any]  # register()'s keyword arguments (max_attempts always among them)


@attrs.frozen
class BackendOptions:
    alias: str  # the TASKS alias
    database: str | None  # the Django database holding the jobs, whose transactions enqueues join; None: none
    url: str | None  # OPTIONS["DATABASE_URL"]; None: the store is ``database`` itself (store_url)
    queues: Mapping[str, Queue]

    def queue(self, name: str) -> Queue:
        return self.queues[name]


def _improper(message: str) -> Exception:
    from django.core.exceptions import ImproperlyConfigured

    return ImproperlyConfigured(message)


def read(alias: str, params: Mapping[str, Any]) -> BackendOptions:
    """A TASKS entry's settings, checked."""
    where = f"TASKS[{alias!r}]"
    queues = list(params.get("QUEUES", ["default"]))
    if not queues:
        raise _improper(f"{where}['QUEUES'] is empty, which Django takes for 'any queue': PipelineBackend needs its "
                        "queues listed, since each is a job type its workers run (e.g. ['default', 'emails'])")
    options = dict(params.get("OPTIONS") or {})
    unknown = sorted(set(options) - _OPTION_KEYS)
    if unknown:
        raise _improper(f"{where}['OPTIONS'] has {', '.join(map(repr, unknown))}: PipelineBackend takes "
                        f"{', '.join(sorted(_OPTION_KEYS))}")
    url = options.get("DATABASE_URL")
    database = options.get("DATABASE", None if url else "default")
    if url is not None and not isinstance(url, str):
        raise _improper(f"{where}['OPTIONS']['DATABASE_URL'] must be text, got {url!r}")
    if database is not None:
        from django.conf import settings

        if database not in settings.DATABASES:
            raise _improper(f"{where}['OPTIONS']['DATABASE'] is {database!r}, which is not in DATABASES "
                            f"({', '.join(settings.DATABASES) or 'none'})")
    max_attempts = options.get("MAX_ATTEMPTS", 1)
    per_queue = dict(options.get("QUEUES") or {})
    strays = sorted(set(per_queue) - set(queues))
    if strays:
        raise _improper(f"{where}['OPTIONS']['QUEUES'] names {', '.join(map(repr, strays))}, not among the backend's "
                        f"QUEUES {queues}")
    made = {}
    for name in queues:
        if not isinstance(name, str) or not _QUEUE.fullmatch(name):
            raise _improper(f"{where}['QUEUES'] has {name!r}: a queue's name becomes a job type's "
                            "(1 to 90 of A-Z a-z 0-9 _ . : -)")
        given = dict(per_queue.get(name) or {})
        bad = sorted(set(given) - _QUEUE_KEYS)
        if bad:
            raise _improper(f"{where}['OPTIONS']['QUEUES'][{name!r}] has {', '.join(map(repr, bad))}: a queue takes "
                            f"{', '.join(sorted(_QUEUE_KEYS))}")
        given.setdefault("max_attempts", max_attempts)
        made[name] = Queue(name, JOB_TYPE_PREFIX + name, given)
    return BackendOptions(alias, database, url, made)


# -- the store ------------------------------------------------------------------------------------------

# OPTIONS of a Django Postgres database that are Django's (or psycopg's in Python), not libpq's
_DJANGO_ONLY = {"pool", "server_side_binding", "assume_role", "isolation_level", "cursor_factory", "context",
                "prepare_threshold"}


def store_url(options: BackendOptions) -> str:
    """The DATABASE_URL of the backend's store: OPTIONS' own, else its Django database's, as that
    database is now (in a test run, the test database)."""
    if options.url is not None:
        return options.url
    assert options.database is not None
    from django.db import connections

    return database_url(connections[options.database], f"DATABASES[{options.database!r}]")


def database_url(connection: Any, where: str) -> str:
    """A Django connection's database as the pipeline's DATABASE_URL (SQLite and Postgres)."""
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        name = str(settings["NAME"])
        if connection.is_in_memory_db():
            raise _improper(
                f"{where} is an in-memory SQLite database ({name!r}), which the pipeline's processes cannot share: give it "
                "a file (in tests: DATABASES[...]['TEST'] = {'NAME': BASE_DIR / 'test.sqlite3'}), or give "
                "PipelineBackend a store of its own (OPTIONS['DATABASE_URL'])")
        return "sqlite:///" + os.path.abspath(name)
    if connection.vendor == "postgresql":
        user = quote(str(settings.get("USER") or ""), safe="")
        password = quote(str(settings.get("PASSWORD") or ""), safe="")
        host, port = str(settings.get("HOST") or ""), str(settings.get("PORT") or "")
        query = {key: str(value) for key, value in (settings.get("OPTIONS") or {}).items()
                 if key not in _DJANGO_ONLY and isinstance(value, str | int) and not isinstance(value, bool)}
        if host.startswith("/"):  # a Unix socket's directory
            query["host"], host = host, ""
        auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
        netloc = auth + quote(host, safe="") + (f":{port}" if port else "")
        name = quote(str(settings.get("NAME") or ""), safe="")
        return f"postgresql://{netloc}/{name}" + (f"?{urlencode(query)}" if query else "")
    raise _improper(f"{where} is a {connection.vendor} database; the pipeline stores jobs in SQLite, Postgres or Redis: "
                    "give PipelineBackend a store of its own (OPTIONS['DATABASE_URL'], and no OPTIONS['DATABASE'])")
