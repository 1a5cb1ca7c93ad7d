"""``schedule`` (and its alias ``schedules``): cron schedules in the store: add, list, remove, pause,
resume."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, TextIO

from ..config import Config
from .application import Application, AppSummary
from .parsing import CliError, Parser, json_object
from .store import emit_json, with_backend

if TYPE_CHECKING:
    from ..backends import Backend


SCHEDULE_EXAMPLES = """\
examples:
  python -m pipeline schedule add nightly-sitemap "0 3 * * *" generate_sitemap --timezone Europe/Paris
  python -m pipeline schedule add digest "*/15 * * * *" send_email --payload '{"to": "a@example.com", "subject": "Digest", "body": "..."}'
  python -m pipeline schedule list --json
  python -m pipeline schedule pause nightly-sitemap
"""


def add_parsers(sub: Any, app: AppSummary, as_json: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "schedule", aliases=["schedules"], parents=[as_json], formatter_class=argparse.RawDescriptionHelpFormatter,
        help="cron schedules: add, list, remove, pause, resume (bare `schedule` lists)",
        description="Cron schedules in the job store (DATABASE_URL): each tick of a running service enqueues the "
        "schedule's job once, however many processes run. Without an action, lists them.",
        epilog=app.examples(SCHEDULE_EXAMPLES),
    )
    actions = p.add_subparsers(dest="schedule_command", parser_class=Parser, metavar="ACTION")
    a = actions.add_parser("add", parents=[as_json], help="add a schedule (a name not in use)",
                           description="Add a cron schedule: JOB_TYPE with --payload at each tick of CRON in --timezone.")
    a.add_argument("name", help="unique: letters, digits, _.:-")
    a.add_argument("cron", help='5 fields (minute hour day month weekday: "0 3 * * *"), or 6 with seconds first')
    a.add_argument("job_type", help=f"one of the app's: {', '.join(app.job_types) or 'none'}")
    a.add_argument("--payload", help="the job's fields as a JSON object (default {})")
    a.add_argument("--timezone", default="UTC", metavar="TZ", help="IANA time zone the expression is read in (default UTC)")
    actions.add_parser("list", parents=[as_json], help="every schedule with its next run (the default)",
                       description="List every schedule, by name, with its state and next run.")
    for action, text in (("remove", "delete a schedule"), ("pause", "stop a schedule firing (kept, with its history)"),
                         ("resume", "fire a paused schedule again, from its next tick after now")):
        a = actions.add_parser(action, parents=[as_json], help=text, description=text[0].upper() + text[1:] + ".")
        a.add_argument("name")


def cmd_schedule(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    action = args.schedule_command or "list"
    if action == "add":
        return _schedule_add(args, config, app, out)
    if action == "list":
        return _schedule_list(args, config, out)
    return _schedule_change(args, config, out, action)


def _schedule_add(args: argparse.Namespace, config: Config, app: Application, out: TextIO) -> int:
    from ..backends.base import ScheduleRecord
    from ..schedules import make_schedule

    reg = app.types(config)
    payload = json_object("{}" if args.payload is None else args.payload, "--payload")
    record = ScheduleRecord.of(make_schedule(reg, args.name, args.cron, args.job_type, payload, args.timezone), origin="operator")
    added = with_backend(config, lambda backend: backend.put_schedule(record))  # checked before opening
    if args.json:
        emit_json(out, added.to_json())
    else:
        print(f"schedule {added.name}: {added.job_type} at \"{added.cron}\" ({added.timezone}); next run {added.next_run}",
              file=out)
    return 0


def _schedule_list(args: argparse.Namespace, config: Config, out: TextIO) -> int:
    from ..admin import console

    found = with_backend(config, lambda backend: backend.schedules())
    if args.json:  # the shape of GET /admin/schedules
        emit_json(out, {"schedules": [s.to_json() for s in found]})
    else:
        console.schedules_table(out, found)
    return 0


def _schedule_change(args: argparse.Namespace, config: Config, out: TextIO, action: str) -> int:
    from ..schedules import check_name

    name = check_name(args.name)

    async def work(backend: Backend) -> Any:
        if action == "remove":
            return await backend.remove_schedule(name)
        return await backend.set_schedule_enabled(name, action == "resume")

    try:
        changed = with_backend(config, work)
    except LookupError:
        raise CliError(f"error: no schedule named {name!r}", 1) from None
    if args.json:
        emit_json(out, {"removed": name} if changed is None else changed.to_json())
    elif changed is None:
        print(f"removed schedule {name}", file=out)
    else:
        state = f"next run {changed.next_run}" if changed.enabled else "paused"
        print(f"schedule {name}: {state}", file=out)
    return 0
