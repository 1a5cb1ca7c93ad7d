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
    ({"cron": "61 * * * *"}, 400, ["bad cron expression", "Bad minute"]),
    ({"cron": "* * *"}, 400, ["Wrong number of fields"]),
    ({"timezone": "Mars/Olympus"}, 400, ["unknown time zone 'Mars/Olympus'"]),
    ({"job_type": "nope"}, 400, ["unknown job type 'nope'"]),
    ({"payload": {"to": 3}}, 400, ["does not fit SendEmail", "$.to"]),
    ({"payload": [1]}, 400, ["payload must be a JSON object"]),
    ({"name": "bad name"}, 400, ["schedule name 'bad name'"]),
    ({"name": "nightly\n"}, 400, ["schedule name 'nightly\\n'"]),
    ({"name": 7}, 400, ["schedule name 7"]),
    ({"cron": None}, 400, ["bad cron expression None"]),
    ({"extra": 1}, 400, ["unknown field 'extra'"]),
    ({"cron": ...}, 400, ["needs cron"]),
])
async def test_a_schedule_that_does_not_fit_is_refused_with_400_and_nothing_stored(
    db_path: Any, changes: dict[str, Any], status: int, words: list[str],
) -> None:
    body = {**NIGHTLY, **changes}
    body = {k: v for k, v in body.items() if v is not ...}
    async with served(api_config(db_path)) as (pipeline, client):
        assert_error(await client.post("/admin/schedules", json=body), status, *words)
        assert await pipeline.backend.schedules() == []


async def test_a_name_in_use_is_a_conflict_and_changes_nothing(db_path: Any) -> None:
    async with served(api_config(db_path)) as (pipeline, client):
        first = (await client.post("/admin/schedules", json=NIGHTLY)).json()
        assert_error(await client.post("/admin/schedules", json={**NIGHTLY, "cron": "* * * * *"}), 409, "already exists")
        assert (await client.get("/admin/schedules")).json() == {"schedules": [first]}
