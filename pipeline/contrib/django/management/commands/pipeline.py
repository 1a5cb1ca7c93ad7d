"""``python manage.py pipeline [ARGS]``: the pipeline's CLI for this project's tasks, as
``python -m pipeline --app pipeline.contrib.django:registry [ARGS]`` (no ARGS: the service, the
worker; ``--processes 4``, ``jobs list``, ``stats``... as there). DATABASE_URL comes from TASKS."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand

APP = "pipeline.contrib.django:registry"
_DJANGO_OPTIONS = ("--settings", "--pythonpath")  # manage.py's own, taken before the command ran


class Command(BaseCommand):
    help = "Run the pipeline (the worker of this project's tasks), or one of its commands: manage.py pipeline --help"

    def run_from_argv(self, argv: list[str]) -> None:
        """Every argument is the pipeline CLI's (Django's parser would refuse its options)."""
        sys.exit(run(_without_django_options(argv[2:])))

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("args", nargs="*", help="the pipeline CLI's arguments (call_command)")

    def handle(self, *args: str, **options: Any) -> None:
        code = run(list(args))
        if code:
            from django.core.management.base import CommandError

            raise CommandError(f"the pipeline exited with status {code}", returncode=code)


def run(argv: list[str]) -> int:
    from pipeline.cli import main

    return main(["--app", APP, *argv])


def _without_django_options(argv: list[str]) -> list[str]:
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _DJANGO_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{option}=" for option in _DJANGO_OPTIONS)):
            kept.append(arg)
    return kept
