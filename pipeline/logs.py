"""Logging set-up for ``python -m pipeline``: text lines for people, JSON lines with LOG_FORMAT=json.

When the pipeline is the program (``python -m pipeline``: the service, its supervisor and worker
processes, ``demo --verbose``), :func:`configure` puts one handler on the root logger, at LOG_LEVEL:
the pipeline's records and the application's own (``logging.getLogger(__name__)`` in a handler
module, its libraries') come out alike, times in UTC with an offset (``Z``) whatever the process's
TZ or a ``time.tzset()`` (Django's TIME_ZONE) makes local time. ``LOG_CONFIGURE=false`` leaves the
root logger alone for an application that sets up logging itself; embedding the pipeline
(``open_pipeline``, the clients, ``pipeline.testing``) never calls ``configure``.

A record made inside a job (its middleware, its handler, a sync handler's thread, a task the
handler starts: whatever runs in a copy of the job's context) carries the job's ``job_id``,
``job_type`` and ``attempt`` as record attributes, whoever handles it: the pool sets
:data:`JOB` (a contextvar) around each run, and a log record factory copies it onto the record.
Both formatters show them (JSON fields; ``[job ID TYPE attempt N]`` at the end of a text line).

The one line per job outcome is the hot path: at INFO, through ``logging`` (a LogRecord, the
formatter, a write and a flush per line) it cost a third of the drain rate. Once
:func:`configure` has set up the pipeline's logging, those lines go through
:class:`OutcomeLines` instead: formatted exactly as the handler would format them (text or
JSON), gathered, and written a batch at a time (at most every 0.1 s, or every 256 lines). Any
other record first writes out the lines gathered before it, so the log keeps its order. Where
another handler could see an outcome record (one added to the root or the ``pipeline`` logger
after ``configure``; LOG_CONFIGURE=false; embedding), every line goes through ``logging``.
"""

from __future__ import annotations

import atexit
import contextvars
import json
import logging
import sys
import threading
import time
from typing import Any, TextIO

from .clock import format_ts
from .config import Config

# The job whose run this is, in the context of its middleware and handler: set by the pool around each
# run (pools._execute), read by the record factory below. A contextvar, so it follows every copy of the
# run's context: a sync handler's worker thread (trio.to_thread copies it), a task the handler starts
# (trio's start_soon copies the starter's), an asyncio task made from it; and nothing else (not the
# next job of the same worker task: the pool resets it). Module-level as logging itself is: the
# records of one process share one factory, whichever pipeline runs the job.
JOB: contextvars.ContextVar[tuple[str, str, int] | None] = contextvars.ContextVar("pipeline_job", default=None)
JOB_FIELDS = ("job_id", "job_type", "attempt")


def enter_job(job_id: str, job_type: str, attempt: int) -> contextvars.Token[tuple[str, str, int] | None]:
    """The records made from here in this context carry this job's fields (the pool's run; undo with
    ``JOB.reset(token)``). The first call installs the record factory."""
    if not _factory_installed:
        _install_record_factory()
    return JOB.set((job_id, job_type, attempt))


_factory_installed = False
_factory_lock = threading.Lock()


def _install_record_factory() -> None:
    """Wrap logging's record factory (whatever it is now: another library's is kept and called) so
    that a record made inside a job gets ``job_id``, ``job_type`` and ``attempt`` attributes. On the
    record itself, not only in our formatters: an application's handlers and format strings
    (``%(job_id)s``, LOG_CONFIGURE=false) see them too. The price: inside a job, ``extra=`` may not
    use these three names (logging refuses to overwrite a record's attribute, KeyError)."""
    global _factory_installed
    with _factory_lock:
        if _factory_installed:
            return
        made_before = logging.getLogRecordFactory()

        def make_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = made_before(*args, **kwargs)
            job = JOB.get()
            if job is not None:
                record.job_id, record.job_type, record.attempt = job
            return record

        logging.setLogRecordFactory(make_record)
        _factory_installed = True


def _job_of(record: logging.LogRecord) -> tuple[Any, Any, Any] | None:
    """The job a record was made in (or named by ``extra=``), else None."""
    fields = record.__dict__
    job_id = fields.get("job_id")
    if job_id is None:
        return None
    return job_id, fields.get("job_type"), fields.get("attempt")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ms, ``Z``), level, logger, message; for a record made
    inside a job its job_id, job_type and attempt; for job outcomes the job's fields (job_id,
    job_type, attempt, outcome, status, duration_ms, waited_ms, retry_delay_ms, error). Fields
    at the top level, so log tools can filter on them."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": format_ts(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        job = getattr(record, "job", None)
        if isinstance(job, dict):  # a job outcome (wiring's observe)
            out.update(job)
        else:
            made_in = _job_of(record)
            if made_in is not None:
                out.update(zip(JOB_FIELDS, made_in, strict=True))
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=repr)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class TextFormatter(logging.Formatter):
    """``TIME LEVEL logger: message``, TIME in UTC as the JSON lines have it (never local time: a
    line without its offset is ambiguous, and Django's TIME_ZONE changes the process's); a record
    made inside a job ends with ``[job ID TYPE attempt N]``, worded as the job's outcome line is
    (``grep "job ID"`` finds both)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return format_ts(record.created)

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        made_in = None if "job" in record.__dict__ else _job_of(record)  # an outcome's message names its job
        if made_in is None:
            return line
        return f"{line} [job {made_in[0]} {made_in[1]} attempt {made_in[2]}]"


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


def outcome_extra(fields: dict[str, Any]) -> dict[str, Any]:
    """The outcome record's ``extra`` when it goes through ``logging`` (not :class:`OutcomeLines`):
    every field as ``record.job`` (the JSON formatter's), and the job's id, type and attempt as
    attributes of their own, as a record made inside a job has them (an application's
    ``%(job_id)s``). Logged outside the job's context (after its run), so no name is taken twice."""
    return {"job": fields, **{name: fields[name] for name in JOB_FIELDS}}


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
        self.logger = logging.getLogger(logger)
        # the lists configure fills (handlers[:] = ...) and logging's addHandler changes in place: read
        # per outcome, with no getLogger lookup
        self.handlers = logging.getLogger().handlers
        self.logger_handlers = self.logger.handlers
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
            line = json.dumps({"time": self._utc(now), "level": logging.getLevelName(level).lower(),
                               "logger": self.logger.name, "message": message, **fields}, ensure_ascii=False)
        else:
            line = f"{self._utc(now)} {logging.getLevelName(level)} {self.logger.name}: {message}"
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

    def _utc(self, now: float) -> str:
        """``clock.format_ts``: UTC, rounded to the millisecond."""
        second, millis = divmod(round(now * 1000), 1000)
        if second != self._second:
            self._second, self._prefix = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{millis:03d}Z"


class _Handler(logging.StreamHandler):
    """The root logger's handler: writes out the outcome lines gathered before a record."""

    def __init__(self, stream: TextIO, lines: OutcomeLines) -> None:
        super().__init__(stream)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.flush()
        super().emit(record)


_outcomes: OutcomeLines | None = None


def outcome_lines() -> OutcomeLines | None:
    """The batched writer for job outcome lines, while ``configure``'s handler is the only one an
    outcome record would reach (the root logger's only handler, none on the ``pipeline`` logger,
    which propagates); None otherwise: log through ``logging``."""
    lines = _outcomes
    if lines is None:
        return None
    handlers = lines.handlers
    if (lines.logger_handlers or len(handlers) != 1 or not isinstance(handlers[0], _Handler)
            or handlers[0].lines is not lines or not lines.logger.propagate):
        return None
    return lines


def configure(config: Config, stream: object = None) -> None:
    """``python -m pipeline``'s logging (see the module docstring): one handler on the root logger,
    writing to ``stream`` (standard error), LOG_FORMAT's lines, the root logger at LOG_LEVEL, Python's
    warnings through it. The root logger's other handlers go (an application's ``basicConfig``: it
    says so); ``LOG_CONFIGURE=false``: nothing is changed, the application's configuration decides."""
    global _outcomes
    if _outcomes is not None:  # configured before in this process (tests, the demo): ours goes
        _outcomes.close()
        for logger in (logging.getLogger(), logging.getLogger("pipeline")):
            logger.handlers[:] = [h for h in logger.handlers if not isinstance(h, _Handler)]
        _outcomes = None
    if not config.log.configure:
        return
    out: TextIO = stream or sys.stderr  # type: ignore[assignment]
    _outcomes = OutcomeLines(out, json_lines=config.log.format == "json")
    handler = _Handler(out, _outcomes)
    handler.setFormatter(JsonFormatter() if config.log.format == "json" else TextFormatter())
    root = logging.getLogger()
    replaced = [type(h).__name__ for h in root.handlers]
    root.handlers[:] = [handler]
    root.setLevel(config.log.level.upper())
    logging.captureWarnings(True)  # a warnings.warn in a handler: a record, not a bare line on stderr
    if replaced:
        logging.getLogger("pipeline").info(
            "logging: the root logger's handlers set up before the service started (%s) were replaced by the "
            "service's (LOG_LEVEL, LOG_FORMAT); LOG_CONFIGURE=false keeps an application's own", ", ".join(replaced))


@atexit.register
def flush() -> None:
    """Write out the outcome lines gathered so far: at exit, and on the service's exit-at-once
    path before ``os._exit`` (which runs no atexit function)."""
    if _outcomes is not None:
        _outcomes.flush()
