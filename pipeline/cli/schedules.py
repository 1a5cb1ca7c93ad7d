"""``schedule`` (and its alias ``schedules``): cron schedules in the store: add, list, remove, pause,
resume."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, TextIO

from ..config import Config
from .application import Application
from .parsing import CliError, _json_object
from .store import _emit_json, _with_backend

if TYPE_CHECKING:
    from ..backends import Backend


SCHEDULE_EXAMPLES = """\
examples:
  python -m pipeline schedule add nightly-sitemap "0 3 * * *" generate_sitemap --timezone Europe/Paris
  python -m pipeline schedule add digest "*/15 * * * *" send_email --payload '{"to": "a@example.com", "subject": "Digest", "body": "..."}'
  python -m pipeline schedule list --json
  python -m pipeline schedule pause nightly-sitemap
"""


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
    payload = _json_object("{}" if args.payload is None else args.payload, "--payload")
    record = ScheduleRecord.of(make_schedule(reg, args.name, args.cron, args.job_type, payload, args.timezone), origin="operator")
    added = _with_backend(config, lambda backend: backend.put_schedule(record))  # checked before opening
    if args.json:
        _emit_json(out, added.to_json())
    else:
        print(f"schedule {added.name}: {added.job_type} at \"{added.cron}\" ({added.timezone}); next run {added.next_run}",
              file=out)
    return 0


def _schedule_list(args: argparse.Namespace, config: Config, out: TextIO) -> int:
    from ..admin import console

    found = _with_backend(config, lambda backend: backend.schedules())
    if args.json:  # the shape of GET /admin/schedules
        _emit_json(out, {"schedules": [s.to_json() for s in found]})
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
        changed = _with_backend(config, work)
    except LookupError:
        raise CliError(f"error: no schedule named {name!r}", 1) from None
    if args.json:
        _emit_json(out, {"removed": name} if changed is None else changed.to_json())
    elif changed is None:
        print(f"removed schedule {name}", file=out)
    else:
        state = f"next run {changed.next_run}" if changed.enabled else "paused"
        print(f"schedule {name}: {state}", file=out)
    return 0
