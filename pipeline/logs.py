"""Logging set-up for ``python -m pipeline``: text lines for people, JSON lines with LOG_FORMAT=json."""

from __future__ import annotations

import json
import logging
import sys

from .clock import format_ts
from .config import Config


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ms), level, logger, message, and for job
    outcomes the job's fields (job_id, job_type, attempt, outcome, status, duration_ms,
    waited_ms, error) at the top level, so log tools can filter on them."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": format_ts(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        job = getattr(record, "job", None)
        if isinstance(job, dict):
            out.update(job)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure(config: Config, stream: object = None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)  # type: ignore[arg-type]
    if config.log.format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("pipeline")
    root.handlers[:] = [handler]
    root.setLevel(config.log.level.upper())
    root.propagate = False
