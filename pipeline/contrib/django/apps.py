"""``pipeline.contrib.django`` in INSTALLED_APPS: ``python manage.py pipeline``, and the store's tables
made by ``migrate`` in the database that holds them (before a test run's first transaction, which on
SQLite would otherwise hold the write lock the pipeline's first opening needs)."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig


class PipelineConfig(AppConfig):
    name = "pipeline.contrib.django"
    label = "pipeline_django"
    verbose_name = "pipeline"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        # for every app's migrations (Django sends it only for apps with models, and this one has none):
        # the first opens the store, the others find its client open
        post_migrate.connect(open_stores, dispatch_uid="pipeline.contrib.django.open_stores")


def open_stores(*, using: str = "default", **kwargs: Any) -> None:
    """After ``migrate`` of database ``using``: open the store of every PipelineBackend kept there
    (the pipeline makes or upgrades its tables as it opens; the client stays open for the process)."""
    from .backend import PipelineBackend, pipeline_backends
    from .compat import PRIMARY

    for alias, options in pipeline_backends().items():
        if options.database == using:
            backend = PRIMARY.task_backends()[alias]
            if isinstance(backend, PipelineBackend):
                backend.client  # noqa: B018 - opened: its tables made
                _closed_before_teardown(using)


def _closed_before_teardown(using: str) -> None:
    """In a test run, the stores' clients are closed before the test database is destroyed: Postgres
    refuses to drop a database others are connected to. Django sends no signal then, so the test
    database's own ``destroy_test_db`` (this connection's creation object) closes them first."""
    from django.db import connections

    creation = connections[using].creation  # (destroy_test_db is called in test runs alone)
    if hasattr(creation, "_pipeline_closes"):
        return
    destroy = creation.destroy_test_db

    def destroy_test_db(*args: Any, **kwargs: Any) -> Any:
        from .stores import close_clients

        close_clients()
        return destroy(*args, **kwargs)

    creation.destroy_test_db = destroy_test_db
    creation._pipeline_closes = True
