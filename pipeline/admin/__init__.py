"""Operating the job store: the admin HTTP API, the dashboard, Prometheus metrics.

    from pipeline.admin import create_app            # mount in your own ASGI server, or
    from pipeline.admin import run_admin_server      # serve it with Hypercorn in your nursery
    from pipeline.admin import signal_link           # a signed approval link to mail (links.py)

``python -m pipeline`` serves it on ADMIN_HOST:ADMIN_PORT next to the workers.
"""

from __future__ import annotations

import importlib
from typing import Any

# Imported on first use: the CLI's job commands use this package's inputs and console
# modules and should not pay for Starlette and Hypercorn at start-up.
_EXPORTS = {
    "Metrics": ".metrics",
    "AdminBindError": ".server",
    "AdminListener": ".server",
    "check_bind": ".server",
    "create_app": ".server",
    "open_admin_listener": ".server",
    "run_admin_server": ".server",
    "signal_link": ".links",
}

__all__ = ["AdminBindError", "AdminListener", "Metrics", "check_bind", "create_app", "open_admin_listener", "run_admin_server",
           "signal_link"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
