"""An application whose payloads, events and results hold the types of docs/jobs.md's "Payload types"
table: tests/test_payload_types.py runs it in-process on each store, and as ``--app
payload_types_app:registry`` for the CLI. ``make_registry(seen)`` records what its handlers received."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import uuid
from typing import Any
from zoneinfo import ZoneInfo

import attrs
import pydantic

import pipeline


class Colour(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


PARIS = ZoneInfo("Europe/Paris")


@attrs.frozen
class Line:
    day: dt.date
    amount: decimal.Decimal


@attrs.frozen
class Everything:
    """Each type of the table, alone and nested."""

    at: dt.datetime
    day: dt.date
    clock: dt.time
    offset_clock: dt.time
    took: dt.timedelta
    id: uuid.UUID
    amount: decimal.Decimal
    colour: Colour
    level: Level
    tags: set[str]
    codes: frozenset[int]
    blob: bytes
    pair: tuple[dt.datetime, uuid.UUID]
    by_day: dict[str, list[tuple[dt.date, decimal.Decimal]]]
    by_id: dict[uuid.UUID, Colour]
    lines: list[Line]
    maybe: dt.datetime | None
    either: int | str
    ids: list[frozenset[uuid.UUID]]


@dataclasses.dataclass(frozen=True)
class EverythingDC:
    """The same, as a dataclass."""

    at: dt.datetime
    day: dt.date
    clock: dt.time
    took: dt.timedelta
    id: uuid.UUID
    amount: decimal.Decimal
    colour: Colour
    level: Level
    tags: frozenset[str]
    blob: bytes
    lines: list[Line]
    maybe: uuid.UUID | None = None


class EverythingModel(pydantic.BaseModel):
    """The same, as a pydantic v2 model (what a FastAPI request body is)."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    at: pydantic.AwareDatetime
    day: dt.date
    clock: dt.time
    took: dt.timedelta
    id: uuid.UUID
    amount: decimal.Decimal
    colour: Colour
    level: Level
    tags: frozenset[str]
    blob: bytes
    by_day: dict[str, list[dt.date]]
    maybe: uuid.UUID | None = None


@attrs.frozen
class Happened:
    """An event with the same fields as Everything: it routes to an Everything job."""

    at: dt.datetime
    day: dt.date
    clock: dt.time
    offset_clock: dt.time
    took: dt.timedelta
    id: uuid.UUID
    amount: decimal.Decimal
    colour: Colour
    level: Level
    tags: set[str]
    codes: frozenset[int]
    blob: bytes
    pair: tuple[dt.datetime, uuid.UUID]
    by_day: dict[str, list[tuple[dt.date, decimal.Decimal]]]
    by_id: dict[uuid.UUID, Colour]
    lines: list[Line]
    maybe: dt.datetime | None
    either: int | str
    ids: list[frozenset[uuid.UUID]]


def everything() -> Everything:
    first, second = uuid.UUID("0b7e6f3a-5c1d-4e2f-9a8b-7c6d5e4f3a2b"), uuid.UUID("f0e1d2c3-b4a5-4697-8899-aabbccddeeff")
    return Everything(
        at=dt.datetime(2024, 7, 14, 14, 30, 0, 250_000, tzinfo=PARIS),
        day=dt.date(2024, 2, 29),
        clock=dt.time(9, 30, 15, 5),
        offset_clock=dt.time(23, 59, 59, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
        took=dt.timedelta(days=2, seconds=3, microseconds=7),
        id=first,
        amount=decimal.Decimal("12.50"),
        colour=Colour.GREEN,
        level=Level.HIGH,
        tags={"b", "a", "é"},
        codes=frozenset({3, 1, 2}),
        blob=bytes(range(256)),
        pair=(dt.datetime(2024, 1, 1, tzinfo=dt.UTC), second),
        by_day={"q1": [(dt.date(2024, 1, 31), decimal.Decimal("-1E+3")), (dt.date(2024, 3, 31), decimal.Decimal("0.001"))]},
        by_id={first: Colour.RED, second: Colour.GREEN},
        lines=[Line(dt.date(2024, 5, 1), decimal.Decimal("99.99"))],
        maybe=None,
        either="seven",
        ids=[frozenset({second, first}), frozenset()],
    )


def everything_dc() -> EverythingDC:
    return EverythingDC(
        at=dt.datetime(2024, 5, 1, 9, 30, tzinfo=dt.UTC), day=dt.date(1999, 12, 31), clock=dt.time(0, 0),
        took=dt.timedelta(seconds=-1.5), id=uuid.UUID(int=1), amount=decimal.Decimal("-0.10"), colour=Colour.RED,
        level=Level.LOW, tags=frozenset({"x"}), blob=b"\x00\xff", lines=[], maybe=uuid.UUID(int=2),
    )


def everything_model() -> EverythingModel:
    return EverythingModel(
        at=dt.datetime(2024, 5, 1, 9, 30, 0, 1, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))),
        day=dt.date(2024, 5, 1), clock=dt.time(12, 0, 1), took=dt.timedelta(hours=1, microseconds=1),
        id=uuid.UUID(int=3), amount=decimal.Decimal("1.10"), colour=Colour.GREEN, level=Level.HIGH,
        tags=frozenset({"m", "n"}), blob=b"text, as pydantic stores bytes", by_day={"d": [dt.date(2024, 1, 1)]},
    )


def happened() -> Happened:
    return Happened(**attrs.asdict(everything(), recurse=False))


# What each per-type job returns: (its return annotation, the value). The job type is "returns_<name>".
RESULTS: dict[str, tuple[Any, Any]] = {
    "datetime": (dt.datetime, dt.datetime(2024, 3, 31, 1, 59, 59, 999_999, tzinfo=PARIS)),
    "date": (dt.date, dt.date(2024, 12, 31)),
    "time": (dt.time, dt.time(7, 0, 0, 1)),
    "timedelta": (dt.timedelta, dt.timedelta(weeks=3, milliseconds=1)),
    "uuid": (uuid.UUID, uuid.UUID("12345678-1234-5678-1234-567812345678")),
    "decimal": (decimal.Decimal, decimal.Decimal("3.14159265358979323846264338327950288")),
    "enum": (Colour, Colour.RED),
    "intenum": (Level, Level.LOW),
    "set": (set[dt.date], {dt.date(2024, 1, 2), dt.date(2024, 1, 1)}),
    "frozenset": (frozenset[uuid.UUID], frozenset({uuid.UUID(int=9), uuid.UUID(int=8)})),
    "bytes": (bytes, b"\x89PNG\r\n\x1a\n"),
    "tuple": (tuple[dt.timedelta, decimal.Decimal | None], (dt.timedelta(0), None)),
    "dict": (dict[str, list[dt.datetime]], {"ticks": [dt.datetime(2024, 1, 1, 12, tzinfo=dt.UTC)]}),
    "optional": (dt.date | None, None),
    "attrs": (Everything, everything()),
    "dataclass": (EverythingDC, everything_dc()),
    "pydantic": (EverythingModel, everything_model()),
}


# each per-type job's payload class (a class per job type: enqueue finds the type by the class)
RETURNS_PAYLOADS: dict[str, type] = {name: attrs.make_class(f"Returns_{name}", {}, frozen=True) for name in RESULTS}


def _returns(name: str, annotation: Any, value: Any) -> Any:
    """The handler of returns_<name>: annotated ``-> annotation``, it returns ``value``."""

    async def handler(job: Any, ctx: pipeline.JobContext) -> Any:
        return value

    handler.__annotations__ = {"job": RETURNS_PAYLOADS[name], "ctx": pipeline.JobContext, "return": annotation}
    return handler


@attrs.frozen
class Collect:
    """A job after the per-type jobs: it records what ``ctx.parent_results()`` gives."""

    key: str = "parents"


@attrs.frozen
class Callback:
    """A batch's callback: it records its members' results, as ``ctx.batch()`` gives them."""

    key: str = "members"


def make_registry(seen: dict[str, Any] | None = None) -> pipeline.Registry:
    """The registry; ``seen`` gets what handlers received (payloads by type, parents' and members' results)."""
    seen = {} if seen is None else seen
    registry = pipeline.Registry()

    @registry.job
    async def everything_job(job: Everything, ctx: pipeline.JobContext) -> Everything:
        seen.setdefault("everything_job", []).append(job)
        return job

    @registry.job
    def everything_dc_job(job: EverythingDC, ctx: pipeline.JobContext) -> EverythingDC:  # a thread: the same
        seen.setdefault("everything_dc_job", []).append(job)
        return job

    @registry.job
    async def everything_model_job(job: EverythingModel, ctx: pipeline.JobContext) -> EverythingModel:
        seen.setdefault("everything_model_job", []).append(job)
        return job

    @registry.job
    async def collect(job: Collect, ctx: pipeline.JobContext) -> None:
        seen[job.key] = await ctx.parent_results()

    @registry.job
    async def callback(job: Callback, ctx: pipeline.JobContext) -> None:
        outcome = await ctx.batch()
        seen[job.key] = {member.job_type: member.result async for member in outcome.members()}

    for name, (annotation, value) in RESULTS.items():
        registry.register(f"returns_{name}", RETURNS_PAYLOADS[name], _returns(name, annotation, value))

    registry.add_event("happened", Happened, lambda event, config: [
        pipeline.Routed(Everything(**attrs.asdict(event, recurse=False)))])
    return registry


registry = make_registry()
