"""``python -m pipeline``: run the service, or work on the database directly.

Exit status: 0 success; 2 bad usage or configuration (the message names the problem);
1 a runtime failure (the database refused, a file is unreadable).

A package by noun. ``program`` builds the parser for the app in use and runs one command (``main``);
``application`` is that app (--app, PIPELINE_APP, the bundled site, or a program's own registry);
``parsing`` and ``store`` are what the commands share (the parser class, CliError, JSON arguments; the
backend a command's work runs on, JSON output). Then one module per noun, each with its part of the
parser (``add_parsers``) and its commands (``cmd_*``): ``run`` (the service), ``enqueue`` (and
``emit``), ``jobs``, ``batches``, ``types``, ``schedules``, ``stats``, and, with the bundled site only,
``site`` (search, demo) and ``tools`` (diagrams, bench). Below: the public names ``pipeline/cli.py``
had, so that whatever imported one still can.
"""

from __future__ import annotations

from .application import APP_HELP, Application, AppSummary, choose_application
from .batches import BATCHES_EXAMPLES, cmd_batches
from .enqueue import ENQUEUE_EXAMPLES, cmd_emit, cmd_enqueue
from .jobs import CANCEL_REASON, JOB_ACTIONS, JOBS_EXAMPLES, cmd_jobs
from .parsing import CliError
from .program import COMMANDS, MAIN_EPILOG, build_parser, main
from .run import cmd_run
from .schedules import SCHEDULE_EXAMPLES, cmd_schedule
from .site import cmd_demo, cmd_search
from .stats import cmd_stats
from .tools import OWN_TOOLS, cmd_bench, cmd_diagrams
from .types import TYPES_EXAMPLES, cmd_types

__all__ = [
    "APP_HELP", "BATCHES_EXAMPLES", "CANCEL_REASON", "COMMANDS", "ENQUEUE_EXAMPLES", "JOBS_EXAMPLES", "JOB_ACTIONS",
    "MAIN_EPILOG", "OWN_TOOLS", "SCHEDULE_EXAMPLES", "TYPES_EXAMPLES", "AppSummary", "Application", "CliError",
    "build_parser", "choose_application", "cmd_batches", "cmd_bench", "cmd_demo", "cmd_diagrams", "cmd_emit",
    "cmd_enqueue", "cmd_jobs", "cmd_run", "cmd_schedule", "cmd_search", "cmd_stats", "cmd_types", "main",
]
