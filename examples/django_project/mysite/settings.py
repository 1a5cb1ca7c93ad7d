"""A small Django project whose tasks run on the pipeline (docs/django.md).

Its database: SQLite (EXAMPLE_SQLITE, a file; db.sqlite3 by default), or Postgres when
EXAMPLE_POSTGRES_DB names a database (on EXAMPLE_POSTGRES_HOST, 127.0.0.1:5432, as postgres).
The jobs are kept in the same database, so an enqueue joins the transaction it is made in.
"""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "example-only"
DEBUG = True
ALLOWED_HOSTS: list[str] = []
USE_TZ = True
TIME_ZONE = "America/New_York"  # the worker's log times stay UTC all the same (docs/django.md)

try:  # Django 6 ships the Tasks framework; older ones take the django-tasks backport
    import django.tasks  # noqa: F401

    TASKS_APP: list[str] = []
except ImportError:
    TASKS_APP = ["django_tasks"]

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    *TASKS_APP,
    "pipeline.contrib.django",  # python manage.py pipeline; the jobs' tables made by migrate
    "shop",
]

if os.environ.get("EXAMPLE_POSTGRES_DB"):
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ["EXAMPLE_POSTGRES_DB"],
        "USER": os.environ.get("EXAMPLE_POSTGRES_USER", "postgres"),
        "HOST": os.environ.get("EXAMPLE_POSTGRES_HOST", "127.0.0.1"),
        "PORT": os.environ.get("EXAMPLE_POSTGRES_PORT", "5432"),
    }}
else:
    sqlite = Path(os.environ.get("EXAMPLE_SQLITE", BASE_DIR / "db.sqlite3"))
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": sqlite,
        # the test database is a file too: the pipeline's processes cannot share an in-memory one
        "TEST": {"NAME": sqlite.with_name(f"test_{sqlite.name}")},
    }}

TASKS = {
    "default": {
        "BACKEND": "pipeline.contrib.django.PipelineBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            "QUEUES": {"emails": {"concurrency": 2, "max_attempts": 3}},
        },
    }
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "loggers": {"shop": {"level": "INFO"}},
}
