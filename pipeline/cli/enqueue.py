"""``enqueue`` (one job from flags, or a JSON-lines file) and ``emit`` (an event's routed jobs)."""

from __future__ import annotations

import argparse
import io
import os
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ..clock import format_ts, now_ts, to_epoch
from ..config import Config
from ..errors import UsageError
from ..requests import JobRequest, check_unique_key, prepare_rows
from .application import Application, AppSummary
from .parsing import json_object
from .store import emit_json, with_backend

if TYPE_CHECKING:
    from ..backends import Backend, JobRecord


ENQUEUE_EXAMPLES = """\
examples:
  python -m pipeline enqueue send_email --payload '{"to": "a@example.com", "subject": "Hi", "body": "Hello"}'
  python -m pipeline enqueue generate_sitemap --delay 60 --priority 1
  python -m pipeline enqueue generate_sitemap --unique-key nightly   # nothing new while one is pending or running
  python -m pipeline enqueue generate_sitemap --expires-in 600        # never started if not started within 10 min
  python -m pipeline enqueue generate_sitemap --after 01920c1e-... --after 01920c1f-...   # waits for both to complete
  python -m pipeline enqueue generate_sitemap --after 01920c1e-... --on-parent-failure run  # runs however it ends
  python -m pipeline enqueue --from-file jobs.jsonl
  python -m pipeline enqueue --from-file big.jsonl --commit-every 100000   # into a live service

a jobs.jsonl line:
  {"job_type": "invalidate_cache", "payload": {"keys": ["post:1"]}, "priority": 3}
  {"job_type": "invalidate_cache", "payload": {"keys": ["post:2"]}, "after": ["01920c1e-..."]}
"""


def add_parsers(sub: Any, app: AppSummary, as_json: argparse.ArgumentParser) -> None:
    """``enqueue`` and ``emit``."""
    p = sub.add_parser(
        "enqueue", parents=[as_json], formatter_class=argparse.RawDescriptionHelpFormatter,
        help="insert a job (prints its id), or many from a JSON-lines file",
        description="Insert one job from flags, or every job of a JSON-lines file in one transaction.",
        epilog=app.examples(ENQUEUE_EXAMPLES),
    )
    p.add_argument("job_type", nargs="?", help=f"one of the app's: {', '.join(app.job_types) or 'none'} (omit with --from-file)")
    p.add_argument("--payload", help="the job's fields as a JSON object (default {})")
    p.add_argument("--from-file", metavar="FILE",
                   help='one job per line: {"job_type": ..., "payload": {...}} with optional priority, max_attempts, '
                   "run_after, unique_key, unique_while, expires_at, after, on_parent_failure, idempotency_key; all or "
                   "nothing; - reads "
                   "standard input")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--delay", type=float, metavar="SECONDS", help="run no sooner than this many seconds from now")
    when.add_argument("--run-after", metavar="ISO8601", help="run no sooner than this time, with its offset (2030-01-02T03:04:05Z)")
    p.add_argument("--max-attempts", type=int, metavar="N", help="default: the type's own, else WORKER_DEFAULT_MAX_ATTEMPTS")
    p.add_argument("--priority", type=int, metavar="N", help="lower runs first (default 5)")
    p.add_argument("--unique-key", metavar="KEY",
                   help="while a job of this type and key is pending or running, insert nothing and print that job's id")
    p.add_argument("--idempotency-key", metavar="KEY",
                   help="a second enqueue of this type and key within JOB_IDEMPOTENCY_SECONDS (a day) inserts nothing "
                   "and prints the first one's job id, whatever its status: a command whose answer was lost can be "
                   "run again safely")
    p.add_argument("--unique-while", choices=["pending_or_running", "pending"],
                   help="how long --unique-key is held: until the job finishes (the default), or only while it is "
                   "pending (an enqueue made while it runs inserts a new job)")
    p.add_argument("--expires-in", type=float, metavar="SECONDS",
                   help="if it has not started this many seconds from now, it never starts: it ends cancelled "
                   "(expired); counted from now, not from --delay")
    p.add_argument("--after", action="append", metavar="ID",
                   help="wait for this job (an existing one) to complete first: stored waiting, pending once every "
                   "--after job has completed (repeat for more)")
    p.add_argument("--on-parent-failure", choices=["cancel", "run"],
                   help="with --after: what a parent that ends dead or cancelled (or is deleted) does to this job: "
                   "cancel it (the default; and the jobs waiting for it), or run it once every parent has ended")
    p.add_argument("--commit-every", type=int, metavar="JOBS",
                   help="with --from-file: commit every JOBS jobs instead of once, so that a running service's writes "
                   "wait for one part, not the whole file; a bad line then keeps the parts committed before it")

    p = sub.add_parser("emit", parents=[as_json], help="emit an event: insert the jobs it routes to; prints their ids",
                       description="Emit a domain event: the jobs its route gives are inserted in one transaction.")
    p.add_argument("event", help=f"one of the app's: {', '.join(app.events) or 'none'}")
    p.add_argument("--data", default="{}", help="the event's fields as a JSON object")


def cmd_enqueue(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    if args.from_file is not None:
        return _enqueue_file(args, config, app, out)
    from ..admin import inputs

    if args.job_type is None:
        raise UsageError("enqueue needs a JOB_TYPE (or --from-file FILE)")
    if args.commit_every is not None:
        raise UsageError("--commit-every goes with --from-file")
    reg = app.types(config)
    payload = json_object("{}" if args.payload is None else args.payload, "--payload")
    if args.delay is not None and not (0 <= args.delay < 10**9):
        raise UsageError(f"--delay must be a number of seconds >= 0, got {args.delay}")
    now = to_epoch(now_ts())
    run_after = format_ts(now + args.delay) if args.delay is not None else args.run_after
    unique_key = check_unique_key(args.unique_key, "--unique-key")
    expires_at = None
    if args.expires_in is not None:
        if not (0 < args.expires_in < 10**9):
            raise UsageError(f"--expires-in must be a number of seconds > 0, got {args.expires_in}")
        if args.delay is not None and args.expires_in <= args.delay:
            raise UsageError(f"--expires-in {args.expires_in:g} is not after --delay {args.delay:g}: the job would expire "
                             "before it is due and never run (both count from now)")
        expires_at = format_ts(now + args.expires_in)
    request = JobRequest(args.job_type, payload, args.max_attempts, run_after, 5 if args.priority is None else args.priority,
                         unique_key, expires_at, args.unique_while, args.after, args.on_parent_failure,
                         check_unique_key(args.idempotency_key, "--idempotency-key"))
    inputs.with_bounds(request, "the job")
    (row,) = prepare_rows(reg, [request], default_max_attempts=config.worker.default_max_attempts)  # validates before opening
    row = row._replace(idempotency_seconds=config.retention.idempotency_seconds)

    async def work(backend: Backend) -> tuple[str, JobRecord | None]:
        (stored,) = await backend.insert([row])  # a duplicate: the id of the job holding the key
        return stored, await backend.get(stored)

    stored, record = with_backend(config, work)
    duplicate = stored != row.id
    if args.json:
        emit_json(out, {**(record.to_json() if record else {"id": stored}), "duplicate": duplicate})
    else:
        print(stored, file=out)
        if duplicate:
            status = f"is {record.status}" if record else "was pending or running"
            if unique_key is None:  # (so the idempotency key answered)
                print(f"duplicate: job {stored} of type {row.job_type} was enqueued with idempotency key "
                      f"{row.idempotency_key!r} less than JOB_IDEMPOTENCY_SECONDS ago; nothing was inserted", file=sys.stderr)
            else:
                print(f"duplicate: job {stored} of type {row.job_type} with unique key {unique_key!r} {status}; "
                      "nothing was inserted", file=sys.stderr)
    return 0


def _enqueue_file(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    """All or nothing, in one transaction: each chunk of checked lines is inserted while the
    next is checked; a bad line rolls everything back."""
    import tempfile

    from ..admin import console, inputs

    extra = [flag for flag, value in (("JOB_TYPE", args.job_type), ("--payload", args.payload), ("--delay", args.delay),
                                      ("--run-after", args.run_after), ("--max-attempts", args.max_attempts),
                                      ("--priority", args.priority), ("--unique-key", args.unique_key),
                                      ("--expires-in", args.expires_in), ("--unique-while", args.unique_while),
                                      ("--after", args.after), ("--on-parent-failure", args.on_parent_failure),
                                      ("--idempotency-key", args.idempotency_key))
             if value is not None]
    if extra:
        raise UsageError(f"--from-file takes each job's fields from the file; drop {', '.join(extra)}")
    every = args.commit_every
    if every is not None and every < 1:
        raise UsageError(f"--commit-every must be a number of jobs >= 1, got {every}")
    reg = app.types(config)
    name = "standard input" if args.from_file == "-" else args.from_file
    # a line holds one job: its payload (at most the registry's limit, up to 6 bytes a character
    # when written as \\u escapes of four hex digits) and a few fields; longer is not a job
    # (/dev/zero has no end)
    max_line = 6 * reg.max_payload_bytes + 64 * 1024
    if args.from_file == "-":
        opened: Any = sys.stdin.buffer
    else:
        opened = open(args.from_file, "rb")  # noqa: SIM115 -- closed below (a missing file: OSError, exit 1)
    ids: list[str] = []
    duplicates: list[tuple[str, str]] = []  # (a line's id, the id of the job holding its unique key)
    with opened, console.progress_bar(sys.stderr) as bar:
        if _is_regular(opened):  # read twice in place: once to count and check the lines, once to insert
            source, lines = opened, _count_lines(opened, None, name, max_line)
            source.seek(0)
        else:
            # a pipe, a FIFO, a device: read it all first, as it comes (a slow writer must not hold
            # the database's write lock, and it cannot be read twice)
            source = tempfile.TemporaryFile()  # noqa: SIM115 -- closed with `opened`'s block below
            lines = _count_lines(opened, source, name, max_line)
            source.seek(0)
        task = bar.task(f"enqueueing lines of {Path(name).name}", lines)  # the bar has one line: no folders
        rows = inputs.read_jobs(source, name, reg, default_max_attempts=config.worker.default_max_attempts,
                                on_lines=lambda n: bar.advance(task, n))
        window = config.retention.idempotency_seconds  # a line's "idempotency_key" holds for JOB_IDEMPOTENCY_SECONDS
        keyed = False  # a line has an idempotency key: the summary's duplicates name both kinds of key

        def windowed(rows: Any) -> Any:
            nonlocal keyed
            for row in rows:
                if row.idempotency_key is not None:
                    keyed = True
                    row = row._replace(idempotency_seconds=window)
                yield row

        rows = windowed(rows)
        if args.json:
            rows = _keeping_ids(rows, ids)

        async def work(backend: Backend) -> int:
            return await backend.bulk_insert(rows, commit_every=every, duplicates=duplicates)

        try:
            committed = with_backend(config, work)
        finally:
            if source is not opened:
                source.close()
        read = committed + len(duplicates)
        parts = 0 if not read else (1 if every is None else -(-read // every))
        bar.finish(task, lines)
    if args.json:
        held = dict(duplicates)
        emit_json(out, {"enqueued": committed, "duplicates": len(duplicates), "transactions": parts,
                        "job_ids": [held.get(job_id, job_id) for job_id in ids]})
    else:
        n = len(duplicates)
        if keyed:  # (which key answered a line is not told apart: a line may have both)
            skipped = (f"; {n} duplicate{'' if n == 1 else 's'} not inserted (each answered by a pending or running job "
                       "of the same type and unique key, or by the job of an idempotency key used within "
                       "JOB_IDEMPOTENCY_SECONDS)" if duplicates else "")
        else:
            skipped = (f"; {n} duplicate{'' if n == 1 else 's'} of pending or running jobs (same type and unique key) "
                       "not inserted" if duplicates else "")
        print(f"enqueued {committed} jobs from {name}" + (f" in {parts} transactions" if every else "") + skipped, file=out)
    return 0


def _is_regular(stream: Any) -> bool:
    try:
        return stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
    except (OSError, ValueError, io.UnsupportedOperation):
        return False


def _count_lines(stream: Any, copy: Any, name: str, max_line: int) -> int:
    """The number of lines in ``stream`` (read to its end, copied to ``copy`` if given);
    UsageError naming the line once one is longer than ``max_line`` bytes."""
    lines, current = 0, 0  # lines ended so far, bytes of the line being read
    for chunk in iter(lambda: stream.read(1 << 20), b""):
        if copy is not None:
            copy.write(chunk)
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            current += end - start
            if current > max_line:
                break
            lines, current, start = lines + 1, 0, end + 1
        else:
            current += len(chunk) - start
        if current > max_line:
            raise UsageError(f"{name} line {lines + 1} is longer than {max_line:,} bytes: not a job (one JSON object per line)")
    return lines


def _keeping_ids(rows: Any, ids: list[str]) -> Any:
    for row in rows:
        ids.append(row.id)
        yield row


def cmd_emit(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    reg = app.types(config)
    event = reg.decode_event(args.event, json_object(args.data, "--data"))
    requests = []
    for routed in reg.route(event, config):
        job_type, payload = reg.encode(routed.job)
        requests.append(JobRequest(job_type, payload, None, routed.run_after, unique_key=routed.unique_key))
    rows = prepare_rows(reg, requests, default_max_attempts=config.worker.default_max_attempts)
    ids = with_backend(config, lambda backend: backend.insert(rows))  # a duplicate's: its holder's
    if args.json:
        emit_json(out, {"job_ids": ids})
    else:
        for job_id in ids:
            print(job_id, file=out)
    return 0
