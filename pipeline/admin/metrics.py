"""Prometheus metrics: what this process did (counters, histograms) and what the store holds.

Two sources:

* job outcomes, counted as they happen: :meth:`Metrics.observe` is registered with
  ``Pipeline.add_observer`` and runs synchronously on the worker's task, so it only
  bumps numbers (no I/O, no allocation beyond a first sighting of a label pair);
* the store, read at scrape time: jobs by status and type, and how long the oldest due
  job has waited (``/metrics`` reads them on a pooled connection, never the Ledger's).

The text exposition format (version 0.0.4) is small enough to write here, which keeps the
counters on the pipeline object instead of in a process-global registry.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

# seconds; job run times go from sub-millisecond cache deletes to minutes of image work
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# seconds from "due" to "a worker started it": near zero when idle, minutes when backed up
WAIT_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# every outcome a job attempt can end with (pools.Outcome's kinds), as pipeline_jobs_processed_total's
# HELP and docs/operating.md list them; tests/test_round4_cli.py compares this with the kinds the pools make
OUTCOMES = ("ok", "error", "permanent", "retry_later", "timeout", "cancelled", "snoozed", "suspended", "released", "lost")


class Histogram:
    """Cumulative buckets as Prometheus wants them; ``observe`` is a bisect and two adds."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def snapshot(self) -> dict[str, Any]:
        return {"counts": list(self.counts), "sum": self.sum, "count": self.count}

    def add(self, data: Mapping[str, Any]) -> None:
        counts = data.get("counts", ())
        if len(counts) != len(self.counts):
            return  # other buckets (another version): not comparable
        self.counts = [a + b for a, b in zip(self.counts, counts)]
        self.sum += data.get("sum", 0.0)
        self.count += data.get("count", 0)

    def cumulative(self) -> list[tuple[str, int]]:
        out, running = [], 0
        for bound, n in zip((*map(_number, self.bounds), "+Inf"), self.counts):
            running += n
            out.append((bound, running))
        return out


class Metrics:
    """The counters of one pipeline. Written by worker tasks (through ``observe``), read by
    ``/metrics``; both on the trio thread, so no lock is needed."""

    def __init__(self, external: Callable[[], Iterable[Mapping[str, Any]]] | None = None,
                 processes: Callable[[], int] | None = None, pruned: dict[str, int] | None = None) -> None:
        self.processed: dict[tuple[str, str], int] = {}  # (job_type, outcome) -> attempts
        # rows retention removed, by status and "workers": the pipeline's own dict (Pipeline.pruned)
        self.pruned: dict[str, int] = pruned if pruned is not None else {}
        self.durations: dict[str, Histogram] = {}  # job_type -> run time
        self.waits: dict[str, Histogram] = {}  # job_type -> queue wait
        self.steps: dict[str, int] = {}  # job_type -> ctx.step values committed (durable functions)
        # other processes' counters (the worker processes of a supervisor), added up at scrape time
        self.external = external
        self.processes = processes  # the supervisor's count of live worker processes

    def snapshot(self) -> dict[str, Any]:
        """The counters as JSON-ready data (what a worker process sends its supervisor)."""
        return {
            "processed": [[t, o, n] for (t, o), n in self.processed.items()],
            "durations": {t: h.snapshot() for t, h in self.durations.items()},
            "waits": {t: h.snapshot() for t, h in self.waits.items()},
            "pruned": dict(self.pruned),
            "steps": dict(self.steps),
        }

    def add(self, snapshot: Mapping[str, Any]) -> None:
        """Add another process's counters (a :meth:`snapshot`) to these."""
        for job_type, outcome, n in snapshot.get("processed", ()):
            key = (job_type, outcome)
            self.processed[key] = self.processed.get(key, 0) + n
        for what, n in snapshot.get("pruned", {}).items():
            self.pruned[what] = self.pruned.get(what, 0) + n
        for job_type, n in snapshot.get("steps", {}).items():
            self.steps[job_type] = self.steps.get(job_type, 0) + n
        for name, table, bounds in (("durations", self.durations, DURATION_BUCKETS), ("waits", self.waits, WAIT_BUCKETS)):
            for job_type, data in snapshot.get(name, {}).items():
                self._histogram(table, job_type, bounds).add(data)

    def combined(self) -> Metrics:
        """These counters plus the external ones."""
        if self.external is None:
            return self
        total = Metrics(processes=self.processes)
        total.add(self.snapshot())
        for snapshot in self.external():
            total.add(snapshot)
        return total

    def observe(self, fields: Mapping[str, Any]) -> None:
        """An observer for ``Pipeline.add_observer``: one job outcome."""
        job_type, outcome = fields["job_type"], fields["outcome"]
        key = (job_type, outcome)
        self.processed[key] = self.processed.get(key, 0) + 1
        steps = fields.get("steps")
        if steps:
            self.steps[job_type] = self.steps.get(job_type, 0) + steps
        if outcome == "released":
            return  # shutdown handed the job back before or while it ran: not a run
        duration_ms = fields.get("duration_ms")
        if duration_ms is not None:
            self._histogram(self.durations, job_type, DURATION_BUCKETS).observe(duration_ms / 1000)
        waited_ms = fields.get("waited_ms")
        if waited_ms is not None:
            self._histogram(self.waits, job_type, WAIT_BUCKETS).observe(waited_ms / 1000)

    @staticmethod
    def _histogram(table: dict[str, Histogram], job_type: str, bounds: Sequence[float]) -> Histogram:
        found = table.get(job_type)
        if found is None:
            found = table[job_type] = Histogram(bounds)
        return found

    def render(self, store_stats: Mapping[str, Any], counters: Iterable[tuple[str, str, float]] = (),
               limits: Mapping[str, int] | None = None, *, paused: Iterable[str] = ()) -> str:
        """The exposition text: the counters above (with the external ones), ``store_stats``
        (``Backend.stats``), the backend's own ``counters``, the job types' global ``limits`` and the
        ``paused`` job types (``Backend.paused_types``)."""
        if self.external is not None:
            return self.combined().render(store_stats, counters, limits, paused=paused)
        lines: list[str] = []
        family = _family(lines)
        family("pipeline_jobs", "gauge", "Jobs in the store by status.",
               ((({"status": s}), n) for s, n in store_stats["by_status"].items()))
        family("pipeline_jobs_by_type", "gauge", "Jobs in the store by type and status.",
               (({"job_type": t, "status": s}, n) for t, counts in sorted(store_stats["by_type"].items())
                for s, n in counts.items()))
        age = store_stats.get("oldest_due_pending_age_seconds")
        family("pipeline_oldest_due_pending_age_seconds", "gauge",
               "How long the pending job that has been due the longest has waited (0: none is due).",
               [({}, age or 0)])
        family("pipeline_jobs_processed_total", "counter",
               "Job attempts this process (with --processes: its worker processes) finished, by type and outcome "
               f"({', '.join(OUTCOMES)}).",
               (({"job_type": t, "outcome": o}, n) for (t, o), n in sorted(self.processed.items())))
        family("pipeline_steps_total", "counter",
               "Durable steps (ctx.step) whose values this process (with --processes: its worker processes) committed, by type.",
               (({"job_type": t}, n) for t, n in sorted(self.steps.items())))
        _histograms(lines, "pipeline_job_duration_seconds", "Run time of job attempts in this process, by type.", self.durations)
        _histograms(lines, "pipeline_job_queue_wait_seconds",
                    "Time from a job being due to a worker of this process starting it, by type.", self.waits)
        if limits:
            family("pipeline_global_limit", "gauge",
                   "The most jobs of a type that run at once across every process (WORKER_GLOBAL_LIMITS, global_limit=): "
                   "compare pipeline_jobs_by_type{status=\"running\"}.",
                   (({"job_type": t}, n) for t, n in sorted(limits.items())))
        family("pipeline_job_type_paused", "gauge",
               "1 for each job type paused (python -m pipeline types pause, POST /admin/types/{name}/pause): "
               "no job of it starts in any process until it is resumed.",
               (({"job_type": t}, 1) for t in sorted(paused)))
        family("pipeline_jobs_pruned_total", "counter",
               "Finished job records retention removed (JOB_RETENTION_*), by status.",
               (({"status": s}, self.pruned.get(s, 0)) for s in ("completed", "dead", "cancelled")))
        family("pipeline_workers_pruned_total", "counter",
               "Worker-registry entries of processes whose lease ran out long ago that retention removed.",
               [({}, self.pruned.get("workers", 0))])
        if self.processes is not None:
            family("pipeline_worker_processes", "gauge", "Worker processes the supervisor runs now (--processes).",
                   [({}, self.processes())])
        for name, text, value in counters:  # a backend's own: counters end in _total (Prometheus' rule), gauges do not
            family(name, "counter" if name.endswith("_total") else "gauge", text, [({}, value)])
        return "\n".join(lines) + "\n"


def _family(lines: list[str]) -> Any:
    def add(name: str, kind: str, help_text: str, samples: Iterable[tuple[Mapping[str, str], float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{_labels(labels)} {_number(value)}")

    return add


def _histograms(lines: list[str], name: str, help_text: str, table: Mapping[str, Histogram]) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} histogram")
    for job_type, hist in sorted(table.items()):
        for bound, n in hist.cumulative():
            lines.append(f"{name}_bucket{_labels({'job_type': job_type, 'le': bound})} {n}")
        lines.append(f"{name}_sum{_labels({'job_type': job_type})} {_number(hist.sum)}")
        lines.append(f"{name}_count{_labels({'job_type': job_type})} {hist.count}")


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))
