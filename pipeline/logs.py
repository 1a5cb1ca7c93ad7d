"""Logging set-up for ``python -m pipeline``: text lines for people, JSON lines with LOG_FORMAT=json.

The one line per job outcome is the hot path: at INFO, through ``logging`` (a LogRecord, the
formatter, a write and a flush per line) it cost a third of the drain rate. Once
:func:`configure` has set up the pipeline's logging, those lines go through
:class:`OutcomeLines` instead: formatted exactly as the handler would format them (text or
JSON), gathered, and written a batch at a time (at most every 0.1 s, or every 256 lines). Any
other record first writes out the lines gathered before it, so the log keeps its order. An
application that sets up logging its own way (other handlers on the ``pipeline`` logger)
gets every line through ``logging`` as before.
"""

from __future__ import annotations

import atexit
import json
import logging
import sys
import threading
import time
from typing import Any, TextIO

from .clock import format_ts
from .config import Config


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ms), level, logger, message, and for job
    outcomes the job's fields (job_id, job_type, attempt, outcome, status, duration_ms,
    waited_ms, retry_delay_ms, error) at the top level, so log tools can filter on them."""

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


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def outcome_message(fields: dict[str, Any]) -> str:
    """The text of the one line per job outcome (``describe_outcome``'s fields). The run time
    and the wait before the next attempt are two numbers, each said for what it is:
    ``job … attempt 1/3 error → retry: failed after 1.2 ms; next attempt in 10.3 s: <error>``."""
    took = _duration(fields["duration_ms"])
    status = fields["status"]
    if status == "completed":
        what = f" in {took}"
    elif status == "retry":
        what = f": failed after {took}; next attempt in {_duration(fields.get('retry_delay_ms'))}"
    elif status == "dead":
        what = f": failed after {took}"
    elif status == "snoozed":
        what = f" after {took}; due again in {_duration(fields.get('retry_delay_ms'))} (attempt not counted)"
    else:  # released (shutdown), stale (the lease had been lost)
        what = f" after {took}"
    err = f": {fields['error']}" if fields["error"] else ""
    return (f"job {fields['job_id']} {fields['job_type']} attempt {fields['attempt']}/{fields['max_attempts']} "
            f"{fields['outcome']} → {status}{what}{err}")


def _duration(ms: float | None) -> str:
    """1.2 ms, 10.3 s, 2.5 min, 1.5 h, 3.0 d: a tenth of the unit that fits."""
    if ms is None:
        return "an unknown time"
    for unit, size in (("d", 86_400_000.0), ("h", 3_600_000.0), ("min", 60_000.0), ("s", 1000.0)):
        if ms >= size:
            return f"{ms / size:.1f} {unit}"
    return f"{ms:.1f} ms"


class OutcomeLines:
    """Job outcome lines, formatted as ``configure``'s handler formats records, written in
    batches by whoever fills one, by a timer thread within FLUSH_EVERY, and before any other
    record of the handler (see the module docstring)."""

    FLUSH_EVERY = 0.1  # seconds a line may wait
    BATCH = 256  # lines written at once

    def __init__(self, stream: TextIO, *, json_lines: bool, logger: str = "pipeline") -> None:
        self.stream = stream
        self.json_lines = json_lines
        self.logger = logger
        self.handlers = logging.getLogger(logger).handlers  # the list configure fills (handlers[:] = ...)
        self._lines: list[str] = []
        self._lock = threading.Lock()  # the buffer; and one writer of the stream at a time
        self._second = -1
        self._prefix = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pipeline-log-lines", daemon=True)
        self._thread.start()

    def write(self, level: int, message: str, fields: dict[str, Any]) -> None:
        now = time.time()
        if self.json_lines:
            line = json.dumps({"time": self._utc(now), "level": logging.getLevelName(level).lower(), "logger": self.logger,
                               "message": message, **fields}, ensure_ascii=False)
        else:
            line = f"{self._local(now)} {logging.getLevelName(level)} {self.logger}: {message}"
        with self._lock:
            self._lines.append(line)
            if len(self._lines) < self.BATCH:
                return
            self._write_locked()

    def flush(self) -> None:
        with self._lock:
            self._write_locked()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(1)
        self.flush()

    def _write_locked(self) -> None:
        if not self._lines:
            return
        text = "\n".join(self._lines) + "\n"
        self._lines.clear()
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed stream, a reader gone: as logging's handlers do, go on
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.FLUSH_EVERY):
            self.flush()

    def _local(self, now: float) -> str:
        """``logging.Formatter``'s asctime: local time, comma, milliseconds."""
        second = int(now)
        if second != self._second:
            self._second, self._prefix = second, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        return f"{self._prefix},{int((now - second) * 1000):03d}"

    def _utc(self, now: float) -> str:
        """``clock.format_ts``: UTC, rounded to the millisecond."""
        second, millis = divmod(round(now * 1000), 1000)
        if second != self._second:
            self._second, self._prefix = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{millis:03d}Z"


class _Handler(logging.StreamHandler):
    """The pipeline logger's handler: writes out the outcome lines gathered before a record."""

    def __init__(self, stream: TextIO, lines: OutcomeLines) -> None:
        super().__init__(stream)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.flush()
        super().emit(record)


_outcomes: OutcomeLines | None = None


def outcome_lines() -> OutcomeLines | None:
    """The batched writer for job outcome lines, while ``configure``'s handler is the pipeline
    logger's only one; None otherwise (log through ``logging``)."""
    lines = _outcomes
    if lines is None:
        return None
    handlers = lines.handlers  # (the logger's own list: no getLogger lookup per job)
    if len(handlers) != 1 or not isinstance(handlers[0], _Handler) or handlers[0].lines is not lines:
        return None
    return lines


def configure(config: Config, stream: object = None) -> None:
    global _outcomes
    out: TextIO = stream or sys.stderr  # type: ignore[assignment]
    if _outcomes is not None:
        _outcomes.close()
    _outcomes = OutcomeLines(out, json_lines=config.log.format == "json")
    handler = _Handler(out, _outcomes)
    if config.log.format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger("pipeline")
    root.handlers[:] = [handler]
    root.setLevel(config.log.level.upper())
    root.propagate = False


@atexit.register
def flush() -> None:
    """Write out the outcome lines gathered so far: at exit, and on the service's exit-at-once
    path before ``os._exit`` (which runs no atexit function)."""
    if _outcomes is not None:
        _outcomes.flush()
