"""Operating the job store: the admin HTTP API, the dashboard, Prometheus metrics.

    from pipeline.admin import create_app            # mount in your own ASGI server, or
    from pipeline.admin import run_admin_server      # serve it with Hypercorn in your nursery

``python -m pipeline`` serves it on ADMIN_HOST:ADMIN_PORT next to the workers.
"""

from .metrics import Metrics
from .server import AdminBindError, AdminListener, check_bind, create_app, open_admin_listener, run_admin_server

__all__ = ["AdminBindError", "AdminListener", "Metrics", "check_bind", "create_app", "open_admin_listener", "run_admin_server"]
