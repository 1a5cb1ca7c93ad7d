"""The admin API's cron schedules (GET/POST /admin/schedules, DELETE /admin/schedules/{name},
POST .../pause and .../resume), served for real and driven with httpx."""

from __future__ import annotations

from typing import Any

import pytest
from test_admin_api import api_config, assert_error, served

from pipeline.clock import now_ts

NIGHTLY = {"name": "nightly", "cron": "0 3 * * *", "job_type": "send_email", "timezone": "Europe/Paris",
           "payload": {"to": "ops@example.com", "subject": "report", "body": "..."}}


async def test_schedules_are_added_listed_paused_resumed_and_removed(db_path: Any) -> None:
    async with served(api_config(db_path)) as (pipeline, client):
        assert (await client.get("/admin/schedules")).json() == {"schedules": []}
        r = await client.post("/admin/schedules", json=NIGHTLY)
        assert r.status_code == 201 and r.headers["location"] == "/admin/schedules/nightly"
        added = r.json()
        assert {k: added[k] for k in NIGHTLY} == NIGHTLY
        assert (added["state"], added["origin"], added["last_run"]) == ("active", "operator", None)
        assert added["next_run"] > now_ts() and added["next_run"][11:] in ("01:00:00.000Z", "02:00:00.000Z")
        assert (await client.get("/admin/schedules")).json() == {"schedules": [added]}
        assert [s.name for s in await pipeline.backend.schedules()] == ["nightly"]  # in the store

        paused = (await client.post("/admin/schedules/nightly/pause")).json()
        assert (paused["enabled"], paused["state"]) == (False, "paused")
        resumed = (await client.post("/admin/schedules/nightly/resume")).json()
        assert (resumed["enabled"], resumed["state"]) == (True, "active")

        assert (await client.delete("/admin/schedules/nightly")).status_code == 204
        assert (await client.get("/admin/schedules")).json() == {"schedules": []}
        for method, path in (("DELETE", "/admin/schedules/nightly"), ("POST", "/admin/schedules/nightly/pause"),
                             ("POST", "/admin/schedules/nightly/resume")):
            assert_error(await client.request(method, path), 404, "no schedule named 'nightly'")


@pytest.mark.parametrize(("changes", "status", "words"), [
    ({"cron": "61 * * * *"}, 422, ["bad cron expression", "Bad minute"]),
    ({"cron": "* * *"}, 422, ["Wrong number of fields"]),
    ({"timezone": "Mars/Olympus"}, 422, ["unknown time zone 'Mars/Olympus'"]),
    ({"job_type": "nope"}, 422, ["unknown job type 'nope'"]),
    ({"payload": {"to": 3}}, 422, ["does not fit SendEmail", "$.to"]),
    ({"payload": [1]}, 422, ["payload must be a JSON object"]),
    ({"name": "bad name"}, 422, ["schedule name 'bad name'"]),
    ({"name": "nightly\n"}, 422, ["schedule name 'nightly\\n'"]),
    ({"name": 7}, 422, ["schedule name 7"]),
    ({"cron": None}, 422, ["bad cron expression None"]),
    ({"extra": 1}, 422, ["unknown field 'extra'"]),
    ({"cron": ...}, 422, ["needs cron"]),
    ({"payload": None}, 422, ["payload must be a JSON object"]),
])
async def test_a_schedule_that_does_not_fit_is_refused_with_422_and_nothing_stored(
    db_path: Any, changes: dict[str, Any], status: int, words: list[str],
) -> None:
    body = {**NIGHTLY, **changes}
    body = {k: v for k, v in body.items() if v is not ...}
    async with served(api_config(db_path)) as (pipeline, client):
        assert_error(await client.post("/admin/schedules", json=body), status, *words)
        assert await pipeline.backend.schedules() == []


async def test_a_body_that_is_not_a_json_object_is_422_and_one_that_is_not_json_400(db_path: Any) -> None:
    """One convention on every route (issue 21): 400 for a request that cannot be read (not JSON, no
    body), 422 for JSON that does not fit, as POST /admin/jobs answers."""
    async with served(api_config(db_path)) as (pipeline, client):
        for path in ("/admin/schedules", "/admin/jobs", "/admin/events"):
            assert_error(await client.post(path, json=[NIGHTLY]), 422, "must be a JSON object, got an array")
            assert_error(await client.post(path, content=b'{"name": '), 400, "not valid JSON")
            assert_error(await client.post(path, content=b""), 400, "a JSON body is required")
        assert await pipeline.backend.schedules() == []


LONG = "x" * 100_000


@pytest.mark.parametrize(("changes", "words"), [
    ({"name": LONG}, ["schedule name 'xxx", "must be 1-100 letters"]),
    ({"cron": LONG}, ["bad cron expression 'xxx", "expected 5 fields"]),
    ({"cron": "* " * 50_000}, ["bad cron expression '* * *", "expected 5 fields"]),
    ({"timezone": LONG}, ["unknown time zone 'xxx", "IANA name"]),
    ({"job_type": LONG}, ["unknown job type 'xxx", "known: "]),
    ({LONG: 1}, ["unknown field 'xxx", "expected name, cron"]),
    ({"payload": {LONG: 1}}, ["does not fit SendEmail", "extra fields found (xxx"]),
    ({"payload": {"to": LONG, "subject": 1, "body": ""}}, ["does not fit SendEmail", "$.subject"]),
])
async def test_a_100000_character_field_is_echoed_clipped(db_path: Any, changes: dict[str, Any], words: list[str]) -> None:
    """Every echoed input is clipped as names are (issue 21: a time zone or cron expression came back whole,
    100 KB answers): the answer stays small and still says what was wrong."""
    async with served(api_config(db_path)) as (pipeline, client):
        r = await client.post("/admin/schedules", json={**NIGHTLY, **changes})
        assert len(r.content) < 2000, r.content[:300]
        assert_error(r, 422, *words)
        assert "x" * 81 not in r.json()["error"]["message"]
        assert await pipeline.backend.schedules() == []


async def test_a_name_in_use_is_a_conflict_and_changes_nothing(db_path: Any) -> None:
    async with served(api_config(db_path)) as (pipeline, client):
        first = (await client.post("/admin/schedules", json=NIGHTLY)).json()
        assert_error(await client.post("/admin/schedules", json={**NIGHTLY, "cron": "* * * * *"}), 409, "already exists")
        assert (await client.get("/admin/schedules")).json() == {"schedules": [first]}
