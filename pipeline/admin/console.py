"""The CLI's output for people: tables, one job's details, the stats view, a progress bar (rich).

Everything here writes to the stream it is given. On a terminal rich picks the width and
colours; elsewhere (a pipe, a file, a test) output is plain text as wide as it needs to
be, so ``grep`` and ``awk`` see whole lines. ``--json`` output does not come through here.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TextIO

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from ..backends.base import FOREVER, JobRecord, ScheduleRecord
from ..states import Status

if TYPE_CHECKING:
    from ..control import BatchView, TypeSummary

STATUS_STYLE = {"waiting": "cyan", "pending": "blue", "running": "yellow", "completed": "green", "dead": "bold red",
                "cancelled": "magenta", "suspended": "bright_blue"}
MAX_STEP_VALUE_CHARS = 120  # of a step's value in `jobs show`'s table (--json has it whole)
# every Status in the columns' order, as the dashboard's: the live statuses (a suspended job is live), then the
# final ones (tests/test_signals_cli.py checks that it names each status once)
SHOWN_STATUSES = ("waiting", "pending", "running", "suspended", "completed", "dead", "cancelled")
PLAIN_WIDTH = 250  # columns when not on a terminal: wide enough that rows are not wrapped


def _is_terminal(out: TextIO) -> bool:
    return hasattr(out, "isatty") and out.isatty()


@contextmanager
def console(out: TextIO) -> Iterator[Console]:
    """A console for ``out``: rich itself on a terminal; elsewhere rendered wide, then each
    line stripped of the padding rich adds, so pipes and files get clean text."""
    if _is_terminal(out):
        yield Console(file=out, highlight=False)
        return
    buffer = io.StringIO()
    yield Console(file=buffer, width=PLAIN_WIDTH, highlight=False, color_system=None)
    out.write("".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines()))


def _status(status: str) -> Text:
    return Text(status, style=STATUS_STYLE.get(status, ""))


def jobs_table(out: TextIO, jobs: Sequence[JobRecord], total: int, *, offset: int = 0) -> None:
    if not jobs:
        message(out, "no jobs match" if total == 0 else f"no jobs on this page ({total} match)")
        return
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    for name, justify in (("ID", "left"), ("TYPE", "left"), ("STATUS", "left"), ("ATTEMPTS", "right"),
                          ("PRIORITY", "right"), ("RUN AFTER", "left"), ("UPDATED", "left"), ("ERROR", "left")):
        table.add_column(name, justify=justify, no_wrap=name != "ERROR", overflow="ellipsis")  # type: ignore[arg-type]
    for j in jobs:
        error = (j.error or "").splitlines()[0][:80] if j.error else ""
        table.add_row(j.id, j.job_type, _status(j.status), f"{j.attempts}/{j.max_attempts}", str(j.priority), j.run_after,
                      j.updated_at, Text(error, style="red"))
    with console(out) as con:
        con.print(table)
        con.print(f"{offset + 1}–{offset + len(jobs)} of {total} jobs, newest first")


def schedules_table(out: TextIO, schedules: Sequence[ScheduleRecord]) -> None:
    if not schedules:
        message(out, "no schedules")
        return
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    for name in ("NAME", "CRON", "TIME ZONE", "JOB TYPE", "STATE", "NEXT RUN", "LAST RUN", "ORIGIN", "PAYLOAD"):
        table.add_column(name, no_wrap=name != "PAYLOAD", overflow="ellipsis")
    for s in schedules:
        shown = s.to_json()
        state = Text(shown["state"], style="green" if s.enabled else "yellow")
        table.add_row(s.name, s.cron, s.timezone, s.job_type, state, s.next_run if s.enabled else "-", s.last_run or "-",
                      s.origin, json.dumps(shown["payload"], ensure_ascii=False)[:120])
    with console(out) as con:
        con.print(table)


def job_detail(out: TextIO, job: JobRecord, statuses: Mapping[str, str | None] | None = None, *,
               command: str = "python -m pipeline") -> None:
    """One job; for a job of a workflow also its parents, children and batch, each relative with its
    status from ``statuses`` (None there: no longer in the store)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    status = _status(job.status)
    if job.cancel_requested:
        status.append(" (cancel requested: its worker stops it)", style="magenta")
    rows: list[tuple[str, Any]] = [
        ("id", job.id), ("type", job.job_type), ("status", status),
        ("attempts", f"{job.attempts} of {job.max_attempts}"), ("priority", str(job.priority)),
        ("unique key", "none" if job.unique_key is None else Text(job.unique_key)),  # Text: no markup
        ("run after", job.run_after), ("expires at", job.expires_at or "never"),
        ("created", job.created_at), ("updated", job.updated_at),
    ]
    if job.snoozes:
        rows.insert(4, ("snoozes", str(job.snoozes)))
    if job.awaiting_signal is not None:  # suspended in ctx.wait_for; run after: its timeout
        rows.insert(3, ("awaiting signal", Text(job.awaiting_signal)))
    if job.status == Status.SUSPENDED:
        until = "its signal (no timeout)" if job.run_after == FOREVER else job.run_after
        rows[rows.index(("run after", job.run_after))] = ("suspended until", until)
    if job.parent_count:
        waits = f"{job.waiting_for} of its {job.parent_count} parents" if job.status == Status.WAITING else None
        if waits is not None:
            rows.insert(3, ("waiting for", waits))
        rows.append(("on parent failure", "run (it runs once every parent has ended)" if job.on_parent_failure == "run"
                     else "cancel (a parent that ends dead or cancelled cancels it)"))
    if job.batch_id is not None:
        rows.append(("batch", Text(f"{job.batch_id}  ({command} batches show {job.batch_id})")))  # command: with its --app
    if job.progress is not None:
        shown = f"{job.progress * 100:.0f}% {_bar(job.progress)}"
        rows.insert(3, ("progress", Text(shown + (f"  {job.progress_message}" if job.progress_message else ""))))
    for label, value in rows:
        grid.add_row(label, value)
    fields = job.to_json()
    with console(out) as con:
        con.print(grid)
        for name, ids, count in (("parents", job.parents, job.parent_count), ("children", job.children, job.child_count)):
            if count:
                con.print(f"\n[bold]{name}[/bold] ({count})")
                con.print(_relatives(ids, count, statuses or {}))
        if job.steps:
            con.print(f"\n[bold]steps[/bold] ({len(job.steps)})")
            con.print(_steps(job))
        con.print("\n[bold]payload[/bold]")
        con.print(Text(json.dumps(fields["payload"], indent=2, ensure_ascii=False)))
        if job.status == Status.COMPLETED or job.result is not None:
            con.print("\n[bold]result[/bold]")
            con.print(Text("none" if job.result is None else json.dumps(fields["result"], indent=2, ensure_ascii=False)))
        con.print("\n[bold]error[/bold]")
        con.print(Text(job.error, style="red") if job.error else Text("none"))


def _steps(job: JobRecord) -> Table:
    """A durable job's steps in the order first written: name, status, times, stored value (cut short)."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    for name in ("NAME", "STATUS", "STARTED", "ENDED", "VALUE"):
        table.add_column(name, no_wrap=name != "VALUE", overflow="ellipsis")
    for step in job.steps:
        value = step.to_json()["value"]
        shown = "-" if step.value is None else json.dumps(value, ensure_ascii=False)
        if len(shown) > MAX_STEP_VALUE_CHARS:
            shown = shown[:MAX_STEP_VALUE_CHARS] + "…"
        table.add_row(Text(step.name), Text(step.status, style="green" if step.status == "completed" else "bright_blue"),
                      step.started_at, step.ended_at or "-", Text(shown))
    return table


def _relatives(ids: Sequence[str], count: int, statuses: Mapping[str, str | None]) -> Table:
    table = Table.grid(padding=(0, 2))
    for job_id in ids:
        status = statuses.get(job_id, "")
        table.add_row(Text(job_id), Text("deleted", style="dim") if status is None else _status(status))
    if count > len(ids):
        table.add_row(Text(f"… and {count - len(ids)} more", style="dim"), "")
    return table


def batch_detail(out: TextIO, view: BatchView) -> None:
    """A batch: its jobs counted by status, its callback, then one page of its jobs."""
    record = view.record
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    counts = Text()
    for status in [s for s in SHOWN_STATUSES if record.counts.get(s)]:
        if counts:
            counts.append(", ")
        counts.append(f"{record.counts[status]} {status}", style=STATUS_STYLE[status])
    callback: Any = "none"
    if record.callback_id is not None:
        callback = Text(f"{record.callback_id} ")
        callback.append_text(Text("deleted", style="dim") if record.callback_status is None else _status(record.callback_status))
    for label, value in (("id", Text(record.id)), ("created", record.created_at),
                         ("jobs", f"{record.total}, {record.finished} finished"), ("by status", counts or "none"),
                         ("callback", callback)):
        grid.add_row(label, value)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    for name in ("ID", "TYPE", "STATUS", "ERROR"):
        table.add_column(name, no_wrap=name != "ERROR", overflow="ellipsis")
    for m in view.jobs:
        error = (m.error or "").splitlines()[0][:80] if m.error else ""
        table.add_row(m.id, Text(m.job_type), _status(m.status), Text(error, style="red"))
    with console(out) as con:
        con.print(grid)
        con.print()
        if view.jobs:
            con.print(table)
            con.print(f"{view.offset + 1}–{view.offset + len(view.jobs)} of {record.total} jobs, in the order enqueued")
        else:
            con.print(f"no jobs on this page ({record.total} in the batch)")


def _bar(fraction: float, width: int = 20) -> str:
    filled = max(0, min(width, round(fraction * width)))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def types_table(out: TextIO, types: Sequence[TypeSummary]) -> None:
    """Each job type: paused or running, its jobs by status, its limits."""
    if not types:
        message(out, "no job types")
        return
    statuses = list(SHOWN_STATUSES)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    table.add_column("TYPE", no_wrap=True)
    table.add_column("STATE", no_wrap=True)
    for s in statuses:
        table.add_column(s.upper(), justify="right")
    for name in ("CONCURRENCY", "GLOBAL LIMIT", "RATE LIMIT"):
        table.add_column(name, justify="right")
    for t in types:
        state = Text("paused", style="bold yellow") if t.paused else Text("active", style="green")
        if not t.registered:
            state.append(" (not in the app)", style="dim")
        table.add_row(Text(t.name), state, *(_count(t.counts.get(s, 0), s) for s in statuses),
                      _limit(t.concurrency), _limit(t.global_limit), _limit(t.rate_limit))
    with console(out) as con:
        con.print(table)


def _limit(value: int | str | None) -> Text:
    return Text("-", style="dim") if value is None else Text(str(value))


def stats_view(out: TextIO, stats: dict[str, Any]) -> None:
    statuses = list(SHOWN_STATUSES)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    table.add_column("TYPE")
    for s in statuses:
        table.add_column(s.upper(), justify="right")
    for job_type, counts in sorted(stats["by_type"].items()):
        table.add_row(Text(job_type), *(_count(counts.get(s, 0), s) for s in statuses))
    table.add_section()
    table.add_row(Text("all types", style="bold"), *(_count(stats["by_status"].get(s, 0), s) for s in statuses))
    minutes = stats["finished_per_minute"]
    finished = {s: sum(m.get(s, 0) for m in minutes) for s in ("completed", "dead", "cancelled")}
    age = stats["oldest_due_pending_age_seconds"]
    with console(out) as con:
        if stats["by_type"]:
            con.print(table)
        else:
            con.print("no jobs in the store")
        con.print(f"finished in the last hour: {sum(finished.values())} ("
                  + ", ".join(f"{n} {s}" for s, n in finished.items()) + ")")
        con.print(f"per minute, oldest first: {_sparkline([sum(m.get(s, 0) for s in finished) for m in minutes])}")
        con.print("oldest due pending job: " + ("none is waiting" if age is None else f"waiting {_duration(age)}"))


def _count(n: int, status: str) -> Text:
    return Text(str(n), style=STATUS_STYLE[status] if n else "dim")


def _sparkline(values: Sequence[int]) -> str:
    bars = "·▁▂▃▄▅▆▇█"
    top = max(values, default=0)
    if top == 0:
        return "(none)"
    return "".join(bars[0 if v == 0 else max(1, round(v / top * 8))] for v in values)


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def message(out: TextIO, text: str) -> None:
    with console(out) as con:
        con.print(escape(text))


class Bar:
    """A progress bar on stderr when it is a terminal; silent otherwise."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress

    def task(self, description: str, total: float | None) -> TaskID:
        return self._progress.add_task(description, total=total)

    def advance(self, task: TaskID, amount: float) -> None:
        self._progress.advance(task, amount)

    def finish(self, task: TaskID, total: float) -> None:
        self._progress.update(task, total=total, completed=total)


@contextmanager
def progress_bar(err: TextIO) -> Iterator[Bar]:
    con = Console(file=err, stderr=True)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                        console=con, disable=not con.is_terminal, transient=False)
    with progress:
        yield Bar(progress)
