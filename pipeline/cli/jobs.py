"""``jobs``: list, show, retry, cancel, delete and clean up jobs, one by one or in bulk."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from ..backends.base import LIST_ORDERS, PRIORITY_MAX, PRIORITY_MIN
from ..config import Config
from ..errors import UsageError
from ..states import Status
from .application import Application, AppSummary
from .parsing import CliError, Parser
from .store import emit_json, with_backend

if TYPE_CHECKING:
    from ..backends import Backend, JobRecord


JOBS_EXAMPLES = """\
examples:
  python -m pipeline jobs --status dead            # the same as: jobs list --status dead
  python -m pipeline jobs --status pending --order claim   # the next jobs a worker takes, first first
  python -m pipeline jobs --priority 0             # the jobs of priority 0 only
  python -m pipeline jobs show 01920c1e-...        # payload, error, attempts, times, parents, children, batch
  python -m pipeline jobs --status waiting         # the jobs waiting for their parents
  python -m pipeline jobs retry 01920c1e-...       # dead (or cancelled) → pending, attempts reset
  python -m pipeline jobs cancel 01920c1e-... 01920c1f-...   # pending: cancelled; running: asked to stop
  python -m pipeline jobs cancel --type send_email --status pending   # every pending send_email job
  python -m pipeline jobs retry --type send_email --status dead        # every dead one back to pending
  python -m pipeline jobs delete --status cancelled                    # every cancelled job record
  python -m pipeline jobs cleanup --older-than 604800 --status completed
  python -m pipeline jobs --status suspended       # durable jobs asleep or waiting for a signal
  python -m pipeline jobs signal 01920c1e-... approval --payload true      # resumes its ctx.wait_for("approval")
  python -m pipeline jobs signal-link 01920c1e-... approval --payload true --expires-in 2d   # a link to mail
  python -m pipeline jobs retry 01920c1e-... --from-step charge    # run it again from its step "charge"
"""


def _list_flags(p: argparse.ArgumentParser, *, suppress: bool) -> None:
    """`jobs` and `jobs list` take the same flags; on `list` they must not overwrite what
    was given before it (argparse copies a sub-parser's defaults over the parent's)."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    p.add_argument("--status", choices=[s.value for s in Status], default=default(None))
    p.add_argument("--type", dest="job_type", metavar="JOB_TYPE", default=default(None))
    p.add_argument("--limit", type=int, default=default(50), metavar="N", help="jobs per page (default 50)")
    p.add_argument("--page", type=int, default=default(1), metavar="N", help="page number, from 1 (newest first)")
    p.add_argument("--priority", type=int, default=default(None), metavar="N", help="only jobs of this priority")
    p.add_argument("--order", choices=LIST_ORDERS, default=default("newest"),
                   help="newest first (the default), or claim: the order workers take pending jobs in "
                        "(priority, then due time, then insertion)")


def _bulk_flags(p: argparse.ArgumentParser, action: str) -> None:
    """--type and --status of a bulk action (dests of their own: `jobs --status` is the list's filter)."""
    from ..control import ACTIONS

    p.add_argument("--type", dest="bulk_type", metavar="JOB_TYPE", help="every matching job of this type")
    p.add_argument("--status", dest="bulk_status", choices=ACTIONS[action],
                   help="every matching job of this status" + ("" if action == "delete" else
                                                              f" (default: {' and '.join(ACTIONS[action])})"))


def add_parsers(sub: Any, app: AppSummary, as_json: argparse.ArgumentParser) -> None:
    """``jobs`` and its actions; bare ``jobs`` lists, with the flags of ``jobs list``."""
    p = sub.add_parser(
        "jobs", parents=[as_json], formatter_class=argparse.RawDescriptionHelpFormatter,
        help="list, show, retry, delete and clean up jobs (bare `jobs` lists)",
        description="Work on the job store (DATABASE_URL) directly; no running service is needed. "
        "Without an action, lists jobs (same as `jobs list`).",
        epilog=JOBS_EXAMPLES,
    )
    _list_flags(p, suppress=False)
    actions = p.add_subparsers(dest="jobs_command", parser_class=Parser, metavar="ACTION")
    a = actions.add_parser("list", parents=[as_json], help="list jobs, newest first (the default)",
                           description="List jobs, newest first or in claim order, filtered by status, type and priority.")
    _list_flags(a, suppress=True)
    a = actions.add_parser("show", parents=[as_json], help="one job with its payload and error",
                           description="Show one job: its fields, payload and last error, and for a job of a workflow "
                           "its parents and children (with their statuses) and its batch; for a durable job the "
                           "signal it awaits and its steps (name, status, times, stored value).")
    a.add_argument("id")
    a = actions.add_parser("retry", parents=[as_json],
                           help="a dead job back to pending (or a cancelled one; attempts reset, due now); "
                           "bulk with --type/--status",
                           description="Put a dead job back to pending (or a cancelled one), attempts reset, due now; or "
                           "every dead or cancelled job matching --type and --status, in batches.")
    a.add_argument("id", nargs="?", help="the job (or none, with --type and/or --status)")
    a.add_argument("--from-step", metavar="NAME",
                   help="a replay of a durable job (dead, cancelled or completed): the step NAME and every step after "
                        "it are forgotten and run again; the steps before it keep their values")
    _bulk_flags(a, "retry")
    a = actions.add_parser("delete", parents=[as_json], help="delete a job record (not while it runs); bulk with --status",
                           description="Delete one job record (a running job cannot be deleted); or every job of "
                           "--status (and --type), in batches.")
    a.add_argument("id", nargs="?", help="the job (or none, with --status and maybe --type)")
    _bulk_flags(a, "delete")
    a = actions.add_parser("cancel", parents=[as_json],
                           help="cancel jobs: a pending, waiting or suspended one at once, a running one is asked to stop; "
                           "bulk with --type/--status",
                           description="Cancel jobs by id: a pending, waiting or suspended job is cancelled at once (final, "
                           "never run or resumed; the jobs waiting for it are cancelled too, unless enqueued with "
                           "--on-parent-failure run); "
                           "a running job's worker is asked to cancel its handler, and ends it cancelled, never retried. "
                           "Or every waiting, pending and/or running job matching --type and --status, in batches. Prints "
                           "per id: cancelled, running: cancel requested, already <status>, or no such job (exit 1 if any).")
    a.add_argument("ids", nargs="*", metavar="ID", help="the jobs (or none, with --type and/or --status)")
    _bulk_flags(a, "cancel")
    a = actions.add_parser("signal", parents=[as_json], help="send a signal to a durable job (ctx.wait_for)",
                           description="Send the signal NAME to a job: one suspended in ctx.wait_for(NAME) resumes "
                           "(woken); one that has not reached its wait keeps it for that wait (kept). Exit 1 for an "
                           "unknown or finished job.")
    a.add_argument("id")
    a.add_argument("name", metavar="NAME", help="the signal's name, as the handler waits for it")
    a.add_argument("--payload", metavar="JSON", help="what ctx.wait_for returns: any JSON value (default: none)")
    a = actions.add_parser("signal-link", parents=[as_json],
                           help="print a signed link that sends a signal once, without the admin token",
                           description="Print a URL on the admin server (ADMIN_PUBLIC_URL, else ADMIN_HOST:ADMIN_PORT) "
                           "signed with ADMIN_SIGNING_KEY: whoever opens it sees the job, the signal and its payload, "
                           "and a button that sends it, once, until it expires. Opening it changes nothing.")
    a.add_argument("id")
    a.add_argument("name", metavar="NAME", help="the signal's name, as the handler waits for it")
    a.add_argument("--payload", metavar="JSON", help="what ctx.wait_for returns: any JSON value (default: none)")
    a.add_argument("--expires-in", default="7d", metavar="DURATION",
                   help="how long the link works: 30m, 2h, 2d, 1w or seconds (default 7d, at most 366d)")
    a = actions.add_parser("cleanup", parents=[as_json], help="delete completed and dead job records",
                           description="Delete finished job records: completed and dead (or only --status: "
                           "completed, dead or cancelled).")
    a.add_argument("--older-than", type=float, metavar="SECONDS", help="only records last updated more than this long ago")
    a.add_argument("--status", dest="statuses", action="append", choices=["completed", "dead", "cancelled"],
                   help="only this status (repeat for more; default completed and dead)")


def cmd_jobs(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    action = args.jobs_command or "list"
    args.again = app.command  # what its hints print to run a command again (with the --app in use)
    return JOB_ACTIONS[action](args, config, out)


def _jobs_list(args: argparse.Namespace, config: Config, out: TextIO) -> int:
    from ..admin import console

    if not 1 <= args.limit <= 10_000:
        raise UsageError(f"--limit must be from 1 to 10000, got {args.limit}")
    if not 1 <= args.page <= 10_000_000:
        raise UsageError(f"--page must be from 1 to 10000000, got {args.page}")
    if args.status is not None and args.status not in set(Status):
        raise UsageError(f"unknown status {args.status!r}; expected one of {', '.join(Status)}")
    if args.priority is not None and not PRIORITY_MIN <= args.priority <= PRIORITY_MAX:
        raise UsageError(f"--priority must be from {PRIORITY_MIN} to {PRIORITY_MAX}, got {args.priority}")
    offset = (args.page - 1) * args.limit
    jobs, total = with_backend(config, lambda backend: backend.list(
        status=args.status, job_type=args.job_type, limit=args.limit, offset=offset, priority=args.priority,
        order=args.order))
    if args.json:  # the shape of GET /admin/jobs
        emit_json(out, {"items": [j.to_json() for j in jobs], "total": total, "page": args.page, "per_page": args.limit})
    else:
        console.jobs_table(out, jobs, total, offset=offset)
    return 0


def _no_job(job_id: str) -> CliError:
    return CliError(f"error: no job with id {job_id!r}", 1)


def _jobs_show(args: argparse.Namespace, config: Config, out: TextIO) -> int:
    from ..admin import console

    async def work(backend: Backend) -> tuple[JobRecord | None, dict[str, str | None]]:
        job = await backend.get(args.id)
        statuses: dict[str, str | None] = {}  # of the parents and children it lists (None: gone)
        if job is not None and not args.json:
            for relative in dict.fromkeys((*job.parents, *job.children)):
                found = await backend.get(relative)
                statuses[relative] = None if found is None else found.status
        return job, statuses

    job, statuses = with_backend(config, work)
    if job is None:
        raise _no_job(args.id)
    if args.json:
        emit_json(out, job.to_json())
    else:
        console.job_detail(out, job, statuses, command=args.again)
    return 0


def _jobs_retry(args: argparse.Namespace, config: Config, out: TextIO) -> int:
    if _bulk_filter(args, "retry", [args.id] if args.id else []) is not None:
        if args.from_step is not None:
            raise UsageError("jobs retry --from-step replays one job: give its id, not --type/--status")
        return _jobs_bulk(args, config, out, "retry")
    if args.from_step is not None and not args.from_step:
        raise UsageError("--from-step must name one of the job's steps (`jobs show ID` lists them)")

    async def work(backend: Backend) -> tuple[str, JobRecord]:
        was = await backend.get(args.id)
        return ("dead" if was is None else was.status), await backend.revive(args.id, from_step=args.from_step)

    try:
        was, job = with_backend(config, work)
    except LookupError:
        raise _no_job(args.id) from None
    if args.json:
        emit_json(out, job.to_json())
    elif args.from_step is not None:
        print(f"job {job.id}: {was} → pending (attempts reset, due now), from its step {args.from_step!r}: it and "
              "the steps after it run again", file=out)
    else:
        print(f"job {job.id}: {was} → pending (attempts reset, due now)", file=out)
    return 0


def _signal_payload(args: argparse.Namespace) -> Any:
    """--payload as a JSON value (None: none); UsageError naming the option if it is not JSON (exit 2)."""
    from ..admin import inputs

    if args.payload is None or not args.payload.strip():
        return None
    return inputs.loads(args.payload, "--payload")


def _jobs_signal(args: argparse.Namespace, config: Config, out: TextIO) -> int:
    """woken or kept; exit 1 for an unknown job or a finished one (the store says which)."""
    from ..durable import check_signal_name, encode_signal_payload

    check_signal_name(args.name)
    payload = encode_signal_payload(_signal_payload(args))
    try:
        outcome = with_backend(config, lambda backend: backend.signal(args.id, args.name, payload))
    except LookupError:
        raise _no_job(args.id) from None
    except UsageError as exc:  # the job finished: not a mistake in the command, a state of the store
        raise CliError(f"error: {exc}", 1) from None
    if args.json:
        emit_json(out, {"outcome": outcome, "job_id": args.id, "name": args.name})
    elif outcome == "woken":
        print(f"job {args.id}: woken (it was waiting for {args.name!r} and is pending now)", file=out)
    else:
        print(f"job {args.id}: kept (it takes {args.name!r} when it reaches its wait)", file=out)
    return 0


def _jobs_signal_link(args: argparse.Namespace, config: Config, out: TextIO) -> int:
    """The URL of a signed link; exit 1 without ADMIN_SIGNING_KEY, or for an unknown or finished job."""
    from ..admin import links
    from ..backends.base import signal_refused
    from ..errors import ConfigError
    from ..states import TERMINAL
    from .parsing import duration

    try:
        key = links.require_key(config)
        base = links.base_url(config)
    except ConfigError as exc:  # a setting this command needs, not a bad one: exit 1 like a missing file
        raise CliError(f"error: {exc}", 1) from None
    claims = links.make_claims(args.id, args.name, _signal_payload(args),
                               expires_in=duration(args.expires_in, "--expires-in"))
    job = with_backend(config, lambda backend: backend.get(args.id))
    if job is None:
        raise _no_job(args.id)
    if job.status in TERMINAL:
        raise CliError(f"error: {signal_refused(args.id, job.status)}", 1)
    url = base + links.PATH + links.sign(key, claims)
    if args.json:
        emit_json(out, {"url": url, **claims.to_json()})
    else:
        print(url, file=out)
    return 0


def _jobs_delete(args: argparse.Namespace, config: Config, out: TextIO) -> int:
    if _bulk_filter(args, "delete", [args.id] if args.id else []) is not None:
        return _jobs_bulk(args, config, out, "delete")
    try:
        with_backend(config, lambda backend: backend.delete(args.id))
    except LookupError:
        raise _no_job(args.id) from None
    if args.json:
        emit_json(out, {"deleted": args.id})
    else:
        print(f"deleted job {args.id}", file=out)
    return 0


CANCEL_REASON = "by an operator (python -m pipeline jobs cancel)"  # in the error of a job cancelled here


def _jobs_cancel(args: argparse.Namespace, config: Config, out: TextIO) -> int:
    """Per id: cancelled, running: cancel requested, already <status>, no such job (exit 1 if any is
    unknown); or, with --type/--status, every matching job in batches."""
    from .. import control

    if _bulk_filter(args, "cancel", args.ids) is not None:
        return _jobs_bulk(args, config, out, "cancel")
    ids = list(args.ids)
    answers = with_backend(config, lambda backend: control.cancel_jobs(backend, ids, reason=CANCEL_REASON))
    if args.json:
        emit_json(out, {"jobs": [a.to_json() for a in answers]})
    else:
        for answer in answers:
            print(f"{answer.id}: {answer.text()}", file=out)
    unknown = [a.id for a in answers if a.outcome == "unknown"]
    if unknown:
        print(f"error: no job with id {', '.join(repr(i) for i in unknown)}", file=sys.stderr)
        return 1
    return 0


def _bulk_filter(args: argparse.Namespace, action: str, ids: Sequence[str]) -> Any:
    """The bulk filter --type/--status give (None: the action is by id); UsageError for both or neither."""
    from ..control import JobFilter

    given = args.bulk_type is not None or args.bulk_status is not None
    if given and ids:
        raise UsageError(f"jobs {action} takes ids or --type/--status, not both")
    if not given:
        if not ids:
            needs = "--status (and maybe --type)" if action == "delete" else "--type and/or --status"
            raise UsageError(f"jobs {action} needs {'a job id' if action != 'cancel' else 'job ids'}, or {needs} "
                             "for every matching job")
        return None
    return JobFilter.checked(action, args.bulk_status, args.bulk_type, status_name="--status", type_name="--type")


def _jobs_bulk(args: argparse.Namespace, config: Config, out: TextIO, action: str) -> int:
    from .. import control

    job_filter = _bulk_filter(args, action, [])
    outcome = with_backend(config, lambda backend: control.bulk(backend, job_filter, reason=CANCEL_REASON))
    if args.json:
        emit_json(out, outcome.to_json())
    else:
        print(outcome.text(), file=out)
    return 0


def _jobs_cleanup(args: argparse.Namespace, config: Config, out: TextIO) -> int:
    from ..admin import inputs

    statuses = tuple(dict.fromkeys(args.statuses or ("completed", "dead")))
    older = None if args.older_than is None else inputs.seconds(args.older_than, "--older-than")
    deleted = with_backend(config, lambda backend: backend.cleanup(statuses=statuses, older_than_seconds=older))
    if args.json:
        emit_json(out, {"deleted": deleted})
    else:
        age = "" if args.older_than is None else f" last updated more than {args.older_than:g} s ago"
        print(f"deleted {deleted} {' and '.join(statuses)} jobs{age}", file=out)
    return 0


JOB_ACTIONS: dict[str, Callable[[argparse.Namespace, Config, TextIO], int]] = {
    "list": _jobs_list,
    "show": _jobs_show,
    "retry": _jobs_retry,
    "delete": _jobs_delete,
    "cancel": _jobs_cancel,
    "cleanup": _jobs_cleanup,
    "signal": _jobs_signal,
    "signal-link": _jobs_signal_link,
}
