"""Issue 34, item 2: payloads, events and results beyond plain JSON (docs/jobs.md, "Payload types").

Timezone-aware datetime, date, time, timedelta, UUID, Decimal, Enum, set/frozenset, bytes and
containers of them, in attrs classes, dataclasses and pydantic v2 models, round-trip as payloads,
events and results on each store, through a real pipeline, a sync Client, the CLI (a real process)
and the admin API (served on loopback); their JSON forms are the documented ones; what cannot be
stored is refused at registration (a field) or fails once (a return value), naming the type and
the hook; ``Registry(converter=...)`` gives a type of one's own a form. The application is
tests/payload_types_app.py."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import attrs
import cattrs
import pytest
import trio
from backends.stores import on_each_store
from payload_types_app import (
    RESULTS,
    RETURNS_PAYLOADS,
    Callback,
    Collect,
    Everything,
    Line,
    everything,
    everything_dc,
    everything_model,
    happened,
    make_registry,
)
from test_admin_api import served

import pipeline
from pipeline import Config, open_pipeline
from pipeline.testing import open_test_pipeline

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent


def payload_class(name: str) -> Any:
    return RETURNS_PAYLOADS[name]


async def wait_ended(p: Any, job_id: str) -> Any:
    with trio.fail_after(60):
        while (record := await p.backend.get(job_id)) is None or record.status not in ("completed", "dead", "cancelled"):
            await trio.sleep(0.02)
    return record


# -- the JSON forms ---------------------------------------------------------------------------------------


def test_each_type_is_stored_in_its_documented_json_form_and_read_back_equal() -> None:
    """The forms of docs/jobs.md's table, exactly: what an operator's ``->>``, the CLI and the admin
    API show, and what another process (or language) reads."""
    registry = make_registry()
    name, text = registry.encode(everything())
    stored = json.loads(text)
    assert name == "everything_job"
    assert stored == {
        "at": "2024-07-14T14:30:00.250000+02:00",  # ISO 8601 with its offset
        "day": "2024-02-29",
        "clock": "09:30:15.000005",
        "offset_clock": "23:59:59-05:00",
        "took": 172803.000007,  # seconds
        "id": "0b7e6f3a-5c1d-4e2f-9a8b-7c6d5e4f3a2b",
        "amount": "12.50",  # text, its exponent kept
        "colour": "green",  # an Enum's value
        "level": 2,
        "tags": ["a", "b", "é"],  # sets: arrays, sorted
        "codes": [1, 2, 3],
        "blob": json.loads(json.dumps(__import__("base64").b64encode(bytes(range(256))).decode())),  # base64
        "pair": ["2024-01-01T00:00:00+00:00", "f0e1d2c3-b4a5-4697-8899-aabbccddeeff"],
        "by_day": {"q1": [["2024-01-31", "-1E+3"], ["2024-03-31", "0.001"]]},
        "by_id": {"0b7e6f3a-5c1d-4e2f-9a8b-7c6d5e4f3a2b": "red", "f0e1d2c3-b4a5-4697-8899-aabbccddeeff": "green"},
        "lines": [{"day": "2024-05-01", "amount": "99.99"}],
        "maybe": None,
        "either": "seven",
        "ids": [["0b7e6f3a-5c1d-4e2f-9a8b-7c6d5e4f3a2b", "f0e1d2c3-b4a5-4697-8899-aabbccddeeff"], []],
    }
    back = registry.decode(name, text)
    assert back == everything() and type(back.level) is type(everything().level) and type(back.blob) is bytes
    for job in (everything_dc(), everything_model()):
        assert registry.decode(*registry.encode(job)) == job
    # the same instant under another zone comes back with its offset (equal); a whole timedelta is an integer
    assert back.at.utcoffset() == dt.timedelta(hours=2) and back.at == everything().at
    assert registry.encode_result(dt.timedelta(minutes=90)) == "5400"
    # pydantic's own forms for a model: ISO 8601 durations, bytes as UTF-8 text (its defaults; documented)
    model = json.loads(registry.encode(everything_model())[1])
    assert (model["took"], model["blob"], model["amount"]) == ("PT1H0.000001S", "text, as pydantic stores bytes", "1.10")


def test_json_a_person_types_is_read_as_the_documented_forms_allow() -> None:
    """What the CLI's --payload or an admin API body holds: ``Z`` for UTC, a Decimal as a JSON number, a
    UUID in any case; and what is refused, naming the field."""
    registry = make_registry()
    typed = json.loads(registry.encode(everything_dc())[1])
    typed |= {"at": "2024-05-01T09:30:00Z", "amount": 9.99, "id": "00000000-0000-0000-0000-00000000000A"}
    job = registry.decode("everything_dc_job", typed)
    assert job.at == dt.datetime(2024, 5, 1, 9, 30, tzinfo=dt.UTC)
    assert job.amount == decimal.Decimal("9.99") and str(job.amount) == "9.99"  # not 9.9900000000000002131...
    assert job.id == uuid.UUID(int=10)
    refused = {
        "at": ("2024-05-01T09:30:00", "$.at", "has no offset"),  # naive
        "took": ("90", "$.took", "expected a number of seconds, got str"),
        "amount": ("NaN", "$.amount", "expected a decimal number"),
        "blob": ("not base64!", "$.blob", "expected standard base64 text"),
        "id": ("42", "$.id", "expected a UUID"),
        "day": ("2024-13-01", "$.day", "expected an ISO 8601 date"),
        "colour": ("blue", "$.colour", "'blue' is not a valid Colour"),
        "tags": ("x", "$.tags", "expected an array, got str"),
    }
    for field, (value, where, words) in refused.items():
        with pytest.raises(pipeline.InvalidPayload, match=rf"does not fit EverythingDC: .*{words}.* @ {re.escape(where)}"):
            registry.decode("everything_dc_job", typed | {field: value})
    with pytest.raises(pipeline.InvalidPayload, match=r"EverythingModel: \$\.at: Input should have timezone info"):
        registry.decode("everything_model_job", json.loads(registry.encode(everything_model())[1]) | {"at": "2024-05-01T09:30:00"})


def test_a_naive_datetime_is_refused_at_enqueue_naming_the_fix() -> None:
    registry = make_registry()
    with pytest.raises(pipeline.InvalidPayload, match=r"the datetime 2024-05-01T09:30:00 is naive .*datetime.now\(timezone.utc\)"):
        registry.encode(attrs.evolve(everything(), at=dt.datetime(2024, 5, 1, 9, 30)))
    with pytest.raises(pipeline.InvalidPayload, match=r"has a zone \(Europe/Paris\) but no offset"):
        registry.encode(attrs.evolve(everything(), clock=dt.time(9, tzinfo=everything().at.tzinfo)))
    with pytest.raises(pipeline.InvalidPayload, match=r"a datetime \(.*\) where a date is declared: pass its .date\(\)"):
        registry.encode(attrs.evolve(everything(), day=everything().at))
    with pytest.raises(pipeline.InvalidPayload, match="the Decimal NaN cannot be stored"):
        registry.encode(attrs.evolve(everything(), amount=decimal.Decimal("NaN")))


def test_payloads_and_results_of_the_old_code_read_back_as_they_did() -> None:
    """JSON the previous version stored (plain JSON types) decodes to the same object and encodes to the
    same text; a result of a handler without a return annotation is its JSON form, as before; a stored
    result that does not fit the annotation (the handler changed) is its JSON form, not an error."""

    @attrs.frozen
    class Plain:
        n: int
        name: str
        tags: list[str]
        extra: dict[str, Any]

    registry = pipeline.Registry()

    async def old(job: Plain, ctx: pipeline.JobContext):  # type: ignore[no-untyped-def]  # no annotation
        return {"n": job.n}

    async def typed(job: Everything, ctx: pipeline.JobContext) -> dt.date:
        return dt.date(2024, 1, 1)

    registry.register("plain", Plain, old)
    registry.register("typed", Everything, typed)
    legacy = '{"n":1,"name":"é","tags":["a"],"extra":{"k":[1.5,null,true]}}'
    assert registry.validate("plain", legacy) == legacy
    assert registry.decode("plain", legacy, stored=True) == Plain(1, "é", ["a"], {"k": [1.5, None, True]})
    assert registry.decode_result("plain", '{"n":1}') == {"n": 1}
    assert registry.decode_result("typed", '"2024-01-01"') == dt.date(2024, 1, 1)
    assert registry.decode_result("typed", '{"rows":3}') == {"rows": 3}  # stored before `-> date`
    assert registry.decode_result("typed", "not json") == "not json"
    assert registry.decode_result("gone", '"2024-01-01"') == "2024-01-01"  # a type this registry does not know


def test_a_result_is_read_back_as_returns_or_its_json_form() -> None:
    """``register(returns=...)`` for a process that declares a type without its handler (a web app that
    enqueues), and ``returns=typing.Any`` for the JSON form whatever the annotation."""
    producer = pipeline.Registry()
    producer.register("returns_datetime", payload_class("datetime"), returns=dt.datetime)
    producer.register("returns_uuid", payload_class("uuid"))
    producer.register("returns_date", payload_class("date"), make_registry().spec("returns_date").handler, returns=Any)
    assert producer.decode_result("returns_datetime", '"2024-05-01T09:30:00+00:00"') == dt.datetime(2024, 5, 1, 9, 30,
                                                                                                      tzinfo=dt.UTC)
    assert producer.decode_result("returns_uuid", '"12345678-1234-5678-1234-567812345678"') == "12345678-1234-5678-1234-567812345678"
    assert producer.decode_result("returns_date", '"2024-12-31"') == "2024-12-31"
    # attaching the handler later keeps a declared returns= unless the handler says otherwise
    assert producer.spec("returns_datetime").returns is dt.datetime


# -- on each store, through a real pipeline --------------------------------------------------------------


async def test_each_type_round_trips_as_payload_event_and_result_on_each_store(tmp_path: Path) -> None:
    """attrs, dataclass and pydantic payloads reach their handlers equal and come back equal as results
    (Pipeline.result, a sync Client's result); an event's fields reach the job it routes to; each type's
    result comes back equal, of its type, through result(), ctx.parent_results() and a batch's members."""

    async def scenario(store: str, config: Config, folder: Path) -> None:
        seen: dict[str, Any] = {}
        registry = make_registry(seen)
        async with open_pipeline(config, registry) as p:
            payloads = {"everything_job": everything(), "everything_dc_job": everything_dc(),
                        "everything_model_job": everything_model()}
            ids = {name: await p.enqueue(job) for name, job in payloads.items()}
            (routed,) = await p.emit(happened())
            per_type = {name: await p.enqueue(payload_class(name)()) for name in RESULTS}
            collect = await p.enqueue(Collect(), after=list(per_type.values()), on_parent_failure="run")
            batch = await p.enqueue_batch([payload_class(name)() for name in RESULTS], then=Callback())

            for name, job in payloads.items():
                result = await p.result(ids[name], timeout=60)
                assert result == job and type(result) is type(job), name
                assert seen[name][0] == job, name
                stored = (await p.backend.get(ids[name])).payload
                assert stored == registry.encode(job)[1]  # the documented form is what the store holds
            assert await p.result(routed, timeout=60) == everything()
            assert seen["everything_job"] == [everything(), everything()]  # enqueued, and routed from the event

            for name, job_id in per_type.items():
                value = RESULTS[name][1]
                result = await p.result(job_id, timeout=60)
                assert result == value and type(result) is type(value), (name, result)
            await p.result(collect, timeout=60)
            assert seen["parents"] == {per_type[name]: value for name, (_, value) in RESULTS.items()}
            assert [type(v) for v in seen["parents"].values()] == [type(v) for _, v in RESULTS.values()]
            await p.result(batch.callback_id, timeout=60)
            assert seen["members"] == {f"returns_{name}": value for name, (_, value) in RESULTS.items()}

            # a sync Client (its own loop thread), as a web app's view uses it
            def from_a_client() -> tuple[Any, Any]:
                with pipeline.Client(registry=make_registry(), config=config) as client:
                    job_id = client.enqueue(everything_dc())
                    return client.result(job_id, timeout=60), client.result(per_type["datetime"], timeout=60)

            assert await trio.to_thread.run_sync(from_a_client) == (everything_dc(), RESULTS["datetime"][1])

    await on_each_store(tmp_path, scenario)


async def test_payloads_and_events_given_as_json_to_the_cli_and_the_admin_api_on_each_store(tmp_path: Path) -> None:
    """The CLI (``python -m pipeline --app payload_types_app:registry``, a real process) and ``POST
    /admin/jobs`` / ``POST /admin/events`` take the documented JSON forms and store what enqueue would;
    the admin API shows a result in its JSON form; a naive datetime is refused by both, naming the field."""
    registry = make_registry()
    payload = json.loads(registry.encode(everything())[1])
    event = json.loads(registry.encode(everything())[1])  # Happened has Everything's fields

    async def scenario(store: str, config: Config, folder: Path) -> None:
        env = {**os.environ, "DATABASE_URL": config.database_url, "REDIS_ALLOW_NON_DURABLE": "true",
               "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]), "LOG_LEVEL": "WARNING"}

        async def cli(*argv: str) -> subprocess.CompletedProcess[str]:
            return await trio.to_thread.run_sync(lambda: subprocess.run(
                [sys.executable, "-m", "pipeline", "--app", "payload_types_app:registry", *argv],
                env=env, cwd=folder, capture_output=True, text=True, timeout=120))

        enqueued = await cli("enqueue", "everything_job", "--payload", json.dumps(payload))
        assert enqueued.returncode == 0, enqueued.stderr
        emitted = await cli("emit", "happened", "--data", json.dumps(event))
        assert emitted.returncode == 0, emitted.stderr
        naive = await cli("enqueue", "everything_job", "--payload", json.dumps(payload | {"at": "2024-05-01T09:30:00"}))
        assert naive.returncode == 2 and "$.at" in naive.stderr and "has no offset" in naive.stderr, naive.stderr
        cli_ids = [enqueued.stdout.strip(), emitted.stdout.strip()]

        seen: dict[str, Any] = {}
        admin_config = config.replace(admin=attrs.evolve(config.admin, port=0))
        async with served(admin_config, make_registry(seen)) as (p, client):
            r = await client.post("/admin/jobs", json={"job_type": "everything_job", "payload": payload})
            assert r.status_code == 201, r.text
            admin_id = r.json()["id"]
            r = await client.post("/admin/events", json={"event": "happened", "data": event})
            assert r.status_code == 201, r.text
            (routed,) = r.json()["job_ids"]
            r = await client.post("/admin/jobs", json={"job_type": "everything_job", "payload": payload | {"at": "2024-05-01"}})
            assert r.status_code == 422 and "$.at" in r.text and "has no offset" in r.text, r.text
            for job_id in [*cli_ids, admin_id, routed]:
                assert await p.result(job_id, timeout=60) == everything()
                assert (await p.backend.get(job_id)).payload == registry.encode(everything())[1]
            shown = (await client.get(f"/admin/jobs/{admin_id}")).json()
            assert shown["status"] == "completed" and shown["payload"] == payload and shown["result"] == payload
        assert seen["everything_job"] == [everything()] * 4

    await on_each_store(tmp_path, scenario)


# -- what cannot be stored ---------------------------------------------------------------------------------


class Point:
    """A plain class: no JSON form, no hook."""

    def __init__(self, x: float, y: float) -> None:
        self.x, self.y = x, y

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)

    def __hash__(self) -> int:
        return hash((self.x, self.y))


@attrs.frozen
class HasPoint:
    where: Point


@attrs.frozen
class Deep:
    lines: list[Line]
    points: dict[str, list[HasPoint | None]]


@dataclasses.dataclass
class IntKeys:
    counts: dict[int, str]


@attrs.frozen
class Ambiguous:
    when: dt.datetime | int


class Shape(enum.Enum):
    SQUARE = (1, 1)


@attrs.frozen
class HasShape:
    shape: Shape


def test_a_field_that_cannot_be_stored_is_refused_at_registration_naming_the_class_field_type_and_hook() -> None:
    """It registered without complaint and every enqueue failed: now the registration says which field,
    which type, and the hook (Registry(converter=...)) that would give it a form."""
    registry = pipeline.Registry()
    hook = r"register structure and unstructure hooks for Point on a cattrs.Converter and pass it as pipeline.Registry\(converter=...\)"
    with pytest.raises(TypeError, match=rf"job type 'p': the payload class HasPoint cannot be stored: field HasPoint.where \(Point\): "
                                        rf"Point has no JSON form among the pipeline's types .*{hook}"):
        registry.register("p", HasPoint)
    with pytest.raises(TypeError, match=r"the payload class Deep cannot be stored: field Deep.points → HasPoint.where \(Point\)"):
        registry.register("deep", Deep)
    with pytest.raises(TypeError, match=r"field IntKeys.counts \(dict\[int, str\]\): its keys are int, and a JSON object's keys are text"):
        registry.register("int_keys", IntKeys)
    with pytest.raises(TypeError, match=r"field Ambiguous.when \(datetime \| int\): cattrs cannot tell which arm .*register a structure "
                                        r"hook for datetime \| int"):
        registry.register("ambiguous", Ambiguous)
    with pytest.raises(TypeError, match=r"field HasShape.shape \(Shape\): the value \(1, 1\) of Shape.SQUARE has no JSON form"):
        registry.register("shape", HasShape)
    with pytest.raises(TypeError, match=r"event 'moved': the payload class HasPoint cannot be stored: field HasPoint.where"):
        registry.add_event("moved", HasPoint, lambda event, config: [])

    async def returns_a_point(job: Line, ctx: pipeline.JobContext) -> Point:
        return Point(0, 0)

    with pytest.raises(TypeError, match=rf"job type 'returns_a_point': the return annotation of its handler .*returns_a_point is Point, "
                                        rf"which cannot be stored as a result: Point has no JSON form .*{hook}.*returns=typing.Any"):
        registry.job(returns_a_point)
    assert registry.job_types() == []  # nothing half-registered


def test_a_return_value_that_cannot_be_stored_fails_once_naming_its_type_and_the_hook() -> None:
    """Issue 32 made it fail for good (the handler is not run again); the error names the type and the hook."""
    registry = pipeline.Registry()
    runs: list[str] = []

    @attrs.frozen
    class Job:
        what: str

    async def odd(job: Job, ctx: pipeline.JobContext):  # type: ignore[no-untyped-def]
        runs.append(job.what)
        return {"point": Point(1, 2)} if job.what == "point" else dt.datetime(2024, 5, 1)

    registry.register("odd", Job, odd)
    with open_test_pipeline(registry) as p:
        ids = [p.enqueue(Job("point")), p.enqueue(Job("naive"))]
        records = {r.id: r for r in p.drain()}
    point, naive = records[ids[0]], records[ids[1]]
    assert (point.status, point.attempts, naive.status, naive.attempts) == ("dead", 1, "dead", 1)
    assert sorted(runs) == ["naive", "point"]
    assert "the handler's return value (a dict) cannot be stored as its result" in point.error
    assert "Object of type Point is not JSON serializable: test_payload_types.Point has no JSON form" in point.error
    assert "register an unstructure hook for Point on a cattrs.Converter and pass it as pipeline.Registry(converter=...)" in point.error
    assert "the handler's return value (a datetime)" in naive.error and "is naive" in naive.error


# -- a converter of one's own ------------------------------------------------------------------------------


class Money:
    """A type of the application's, stored as "12.50 EUR" through its own hooks."""

    def __init__(self, amount: decimal.Decimal, currency: str) -> None:
        self.amount, self.currency = amount, currency

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Money) and (self.amount, self.currency) == (other.amount, other.currency)

    def __repr__(self) -> str:
        return f"Money({self.amount} {self.currency})"


@attrs.frozen
class Invoice:
    total: Money
    lines: list[Money]
    due: dt.datetime


def test_a_converter_hook_gives_a_type_of_ones_own_a_form_as_payload_and_result() -> None:
    """Registry(converter=...) is the base: its hooks serve Money; the pipeline's hooks, registered on a
    copy, keep the table's forms (the base's own datetime hook does not change them) and the caller's
    converter is left as it was."""
    base = cattrs.Converter()
    base.register_unstructure_hook(Money, lambda m: f"{m.amount} {m.currency}")
    base.register_structure_hook(Money, lambda v, _: Money(decimal.Decimal(v.split()[0]), v.split()[1]))
    base.register_unstructure_hook(dt.datetime, lambda d: d.timestamp())  # the table's form wins
    registry = pipeline.Registry(converter=base)

    async def bill(job: Invoice, ctx: pipeline.JobContext) -> Money:
        return Money(sum((m.amount for m in job.lines), decimal.Decimal(0)), job.total.currency)

    registry.register("bill", Invoice, bill)
    invoice = Invoice(Money(decimal.Decimal("12.50"), "EUR"), [Money(decimal.Decimal("10"), "EUR"),
                                                                Money(decimal.Decimal("2.50"), "EUR")],
                      dt.datetime(2024, 5, 1, tzinfo=dt.UTC))
    assert json.loads(registry.encode(invoice)[1]) == {"total": "12.50 EUR", "lines": ["10 EUR", "2.50 EUR"],
                                                       "due": "2024-05-01T00:00:00+00:00"}
    with open_test_pipeline(registry) as p:
        job_id = p.enqueue(invoice)
        assert p.result(job_id) == Money(decimal.Decimal("12.50"), "EUR")
    assert base.unstructure(dt.datetime(2024, 5, 1, tzinfo=dt.UTC)) == 1714521600.0  # yours, unchanged
    assert base.unstructure({1, 2}) == {1, 2}
    # without the hook, the same class is refused at registration, naming Money
    with pytest.raises(TypeError, match=r"field Invoice.total \(Money\): Money has no JSON form"):
        pipeline.Registry().register("bill", Invoice)
    with pytest.raises(TypeError, match="Registry\\(converter=...\\) takes a cattrs.Converter, got dict"):
        pipeline.Registry(converter={})  # type: ignore[arg-type]


# -- pydantic ------------------------------------------------------------------------------------------------


def test_pydantic_is_imported_only_by_an_application_that_uses_it() -> None:
    """The core never imports pydantic: an application of attrs classes runs its jobs without it in
    sys.modules (and a pydantic model is recognised once the application imported pydantic)."""
    script = """
import sys, datetime as dt, attrs, pipeline
from pipeline.testing import open_test_pipeline

@attrs.frozen
class Job:
    at: dt.datetime

registry = pipeline.Registry()

async def handler(job: Job, ctx: pipeline.JobContext) -> dt.datetime:
    return job.at

registry.register("job", Job, handler)
when = dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)
with open_test_pipeline(registry) as p:
    assert p.result(p.enqueue(Job(when))) == when
assert "pydantic" not in sys.modules, "pydantic was imported"
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_pydantic_model_validates_as_it_is_declared_and_a_v1_model_is_refused() -> None:
    import pydantic
    import pydantic.v1

    registry = make_registry()
    body = json.loads(registry.encode(everything_model())[1])
    with pytest.raises(pipeline.InvalidPayload, match=r"\$\.unknown: Extra inputs are not permitted"):  # extra="forbid"
        registry.decode("everything_model_job", body | {"unknown": 1})

    class Old(pydantic.v1.BaseModel):
        n: int

    with pytest.raises(TypeError, match="it is a pydantic.v1 one, make it a pydantic.BaseModel"):
        registry.register("old", Old)

    class Loose(pydantic.BaseModel):  # pydantic's default: unknown keys ignored, as the model says
        n: int

    registry.register("loose", Loose)
    assert registry.decode("loose", {"n": 1, "unknown": 2}) == Loose(n=1)


def test_the_docs_table_lists_every_type_the_converter_gives_a_form() -> None:
    """docs/jobs.md's "Payload types" table has a row for each type of payloads.TABLE, and the examples it
    shows for them are what the converter writes."""
    from pipeline.payloads import TABLE

    text = (ROOT / "docs" / "jobs.md").read_text()
    table = text[text.index("| type |", text.index("## Payload types")):]
    table = table[:table.index("\n\n")]
    rows = {row.split("|")[1].strip(): row for row in table.splitlines()[2:]}
    for kind in TABLE:
        assert any(f"`{kind.__name__}`" in name for name in rows), kind
    registry = pipeline.Registry()
    shown = {
        "`datetime`": everything().at, "`date`": everything().day, "`time`": everything().clock,
        "`timedelta`": everything().took, "`UUID`": everything().id, "`Decimal`": decimal.Decimal("-1E+3"),
        "`bytes`, `bytearray`": b"\x00\xff", "`set`, `frozenset`": {"b", "a"},
    }
    for name, value in shown.items():
        assert f"`{registry.encode_result(value)}`" in rows[name], (name, registry.encode_result(value))
