"""Issue 35's senders in the admin API: ``POST /admin/jobs/{id}/signals/{name}`` (woken or kept, and the
refusals), ``GET /admin/jobs?status=suspended`` and a job's ``awaiting_signal`` and ``steps``, and the replay
``POST /admin/jobs/{id}/retry {"from_step"}``; served for real by Hypercorn on a loopback port on each store,
driven with httpx. The durable states are made through the Backend protocol (claims, STEP and SUSPEND
settlements), so no worker runs: what a signal did is read back from the store (the job's status, and the
signal itself, consumed by ``take_signal`` as a resumed ``ctx.wait_for`` consumes it)."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from admin_harness import seed_registry
from backends.stores import BACKENDS
from conftest import fast_config
from test_admin_api import assert_error, served

from pipeline import Config
from pipeline.admin.openapi import openapi_document
from pipeline.backends import Backend, Lease, open_backend
from pipeline.backends.base import FOREVER, Settlement, StepRecord
from pipeline.clock import now_ts
from pipeline.requests import JobRequest, prepare_rows
from pipeline.states import Transition

OWNER = "elsewhere:4242:abcdef"  # the worker process of another machine that ran the durable jobs


@pytest.fixture(params=sorted(BACKENDS))
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Config]:
    """A fresh store of each backend, with the admin API on a free port and no workers."""
    async with BACKENDS[request.param](tmp_path) as config:
        yield config.replace(admin=fast_config(tmp_path / "x.db", admin_port=0).admin,
                             worker=fast_config(tmp_path / "x.db", worker_enabled=False).worker)


def email(to: str) -> JobRequest:
    return JobRequest("send_email", {"to": to, "subject": "order 42", "body": "approve?"})


def step(name: str, value: Any = None, *, status: str = "completed") -> StepRecord:
    """A step as the engine writes it (its value as JSON text)."""
    at = now_ts()
    return StepRecord(name, status, None if value is None else json.dumps(value), at,
                      None if status == "waiting" else at)


async def claim_only(backend: Backend, job_id: str, job_type: str, *, owner: str = OWNER) -> Lease:
    """Claim the job (pending and due); the other due jobs of its type claimed with it are given back."""
    leases = await backend.claim({job_type: 50}, owner=owner, lease_seconds=3600)
    (lease,) = [lease for lease in leases if lease.id == job_id]
    await settle(backend, *(Settlement(other.id, other.token, Transition.RELEASE) for other in leases if other is not lease))
    return lease


async def start(backend: Backend, request: JobRequest) -> Lease:
    """A new job, claimed by OWNER (running)."""
    (row,) = prepare_rows(seed_registry(), [request])
    await backend.insert([row])
    return await claim_only(backend, row.id, row.job_type)


async def settle(backend: Backend, *settlements: Settlement) -> None:
    if settlements:
        assert await backend.settle(list(settlements)) == [True] * len(settlements)


async def signal_seed(config: Config) -> dict[str, str]:
    """Durable jobs in each state a signal meets, through the protocol. ``waiting``: suspended in
    ctx.wait_for("approval") with no timeout, after its step "charge"; ``sleeping``: suspended in a ctx.sleep
    of an hour; ``pending``: not started (a signal is kept for it); ``completed`` with the steps "a", "b", "c"
    (a replay's subject); ``dead``, ``cancelled``. Returns their ids by name."""
    ids: dict[str, str] = {}
    async with open_backend(config) as backend:
        lease = await start(backend, email("buyer@example.com"))
        await settle(backend, Settlement(lease.id, lease.token, Transition.STEP, step=step("charge", {"charge_id": "ch_1"})))
        await settle(backend, Settlement(lease.id, lease.token, Transition.SUSPEND, delay=math.inf, awaiting="approval",
                                         step=step("approval", status="waiting")))
        ids["waiting"] = lease.id

        lease = await start(backend, email("sleeper@example.com"))
        await settle(backend, Settlement(lease.id, lease.token, Transition.SUSPEND, delay=3600.0,
                                         step=step("nap", status="waiting")))
        ids["sleeping"] = lease.id

        lease = await start(backend, email("done@example.com"))
        await settle(backend, *(Settlement(lease.id, lease.token, Transition.STEP, step=step(name, i))
                                for i, name in enumerate("abc")))
        await settle(backend, Settlement(lease.id, lease.token, Transition.SUCCEED, result='"shipped"'))
        ids["completed"] = lease.id

        lease = await start(backend, email("gone@example.com"))
        await settle(backend, Settlement(lease.id, lease.token, Transition.BURY, error="550 mailbox unavailable"))
        ids["dead"] = lease.id

        pending, cancelled = prepare_rows(seed_registry(), [email("later@example.com"), email("never@example.com")])
        await backend.insert([pending, cancelled])
        assert await backend.cancel([cancelled.id], reason="by the test") == ["cancelled"]
        ids["pending"], ids["cancelled"] = pending.id, cancelled.id
    return ids


async def take(backend: Backend, job_id: str, name: str, *, times: int = 1) -> list[tuple[bool, str | None] | None]:
    """Claim the job (it must be pending and due; the other due send_email jobs claimed with it are given back)
    and take the signal ``name`` ``times`` times, as its resumed ctx.wait_for would: the answers."""
    lease = await claim_only(backend, job_id, "send_email", owner="taker")
    return [await backend.take_signal(job_id, lease.token, name, step(name)) for _ in range(times)]


# -- sending ------------------------------------------------------------------------------------------------


async def test_a_signal_wakes_the_job_waiting_for_it_and_is_consumed_once(store: Config) -> None:
    ids = await signal_seed(store)
    async with served(store) as (pipeline, client):
        job_id = ids["waiting"]
        r = await client.post(f"/admin/jobs/{job_id}/signals/approval", content=json.dumps({"ok": True, "by": "ann"}))
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["outcome"] == "woken"
        assert (body["job"]["id"], body["job"]["status"], body["job"]["awaiting_signal"]) == (job_id, "pending", None)
        assert [s["name"] for s in body["job"]["steps"]] == ["charge", "approval"]

        got = await pipeline.backend.get(job_id)
        assert (got.status, got.awaiting_signal) == ("pending", None)
        # the resumed wait takes the payload, once
        assert await take(pipeline.backend, job_id, "approval", times=2) == [(True, '{"ok":true,"by":"ann"}'), (False, None)]


async def test_a_signal_sent_before_the_wait_is_kept_for_it(store: Config) -> None:
    ids = await signal_seed(store)
    async with served(store) as (pipeline, client):
        job_id = ids["pending"]
        r = await client.post(f"/admin/jobs/{job_id}/signals/approval")  # no body: no payload
        assert r.status_code == 200, r.text
        assert (r.json()["outcome"], r.json()["job"]["status"]) == ("kept", "pending")
        # a sleeping job keeps a signal too (it waits for none): it stays asleep
        r = await client.post(f"/admin/jobs/{ids['sleeping']}/signals/approval", content="[1, 2]")
        assert (r.status_code, r.json()["outcome"], r.json()["job"]["status"]) == (200, "kept", "suspended")
        # and a job waiting for another signal keeps this one, still waiting
        r = await client.post(f"/admin/jobs/{ids['waiting']}/signals/other", content='"x"')
        assert (r.status_code, r.json()["outcome"], r.json()["job"]["awaiting_signal"]) == (200, "kept", "approval")

        assert await take(pipeline.backend, job_id, "approval", times=2) == [(True, None), (False, None)]  # kept: no payload
        assert (await pipeline.backend.get(ids["sleeping"])).status == "suspended"


async def test_a_signal_is_refused_for_an_unknown_or_finished_job_and_bad_input(store: Config) -> None:
    ids = await signal_seed(store)
    config = store.replace(admin=fast_config(Path("x.db"), admin_port=0, admin_max_body_bytes=2_000_000).admin)
    async with served(config) as (pipeline, client):
        assert_error(await client.post("/admin/jobs/no-such-job/signals/approval", content="true"), 404,
                     "no job with id 'no-such-job'")
        for status in ("completed", "dead", "cancelled"):
            assert_error(await client.post(f"/admin/jobs/{ids[status]}/signals/approval", content="true"), 409,
                         f"job {ids[status]} is {status}: a finished job takes no signal")
        waiting = ids["waiting"]
        assert_error(await client.post(f"/admin/jobs/{waiting}/signals/approval", content="{not json"), 400,
                     "the request body is not valid JSON")
        assert_error(await client.post(f"/admin/jobs/{waiting}/signals/{'n' * 201}", content="true"), 400,
                     "a signal's name must be at most 200 characters, got 201")
        assert_error(await client.post(f"/admin/jobs/{waiting}/signals/%20", content="true"), 400,
                     "a signal's name must not be empty")
        assert_error(await client.post(f"/admin/jobs/{waiting}/signals/approval", content=json.dumps("x" * 1_000_000)),
                     422, "a signal's payload must be at most 1,000,000 bytes")
        no_type = await client.post(f"/admin/jobs/{waiting}/signals/approval", content="true",
                                    headers={"Content-Type": "text/plain"})
        assert_error(no_type, 415, "a POST must have Content-Type: application/json")
        # none of them sent anything: the job still waits, and no signal is kept for it
        got = await pipeline.backend.get(waiting)
        assert (got.status, got.awaiting_signal) == ("suspended", "approval")
        r = await client.post(f"/admin/jobs/{waiting}/signals/approval", content="false")
        assert r.json()["outcome"] == "woken"
        assert await take(pipeline.backend, waiting, "approval", times=2) == [(True, "false"), (False, None)]


async def test_the_token_is_needed_to_send_a_signal(tmp_path: Path) -> None:
    config = fast_config(tmp_path / "auth.db", admin_port=0, worker_enabled=False, admin_token="s3cret")
    ids = await signal_seed(config)
    async with served(config, auth=False) as (pipeline, client):
        assert_error(await client.post(f"/admin/jobs/{ids['waiting']}/signals/approval", content="true"), 401,
                     "Authorization: Bearer <ADMIN_TOKEN> is missing")
        assert (await pipeline.backend.get(ids["waiting"])).status == "suspended"


# -- reading -------------------------------------------------------------------------------------------------


async def test_suspended_jobs_are_listed_with_what_they_await_and_shown_with_their_steps(store: Config) -> None:
    ids = await signal_seed(store)
    async with served(store) as (_, client):
        r = await client.get("/admin/jobs", params={"status": "suspended"})
        assert r.status_code == 200, r.text
        listed = {job["id"]: job for job in r.json()["items"]}
        assert sorted(listed) == sorted([ids["waiting"], ids["sleeping"]]) and r.json()["total"] == 2
        assert listed[ids["waiting"]]["awaiting_signal"] == "approval"
        assert listed[ids["waiting"]]["run_after"] == FOREVER  # no timeout
        assert listed[ids["sleeping"]]["awaiting_signal"] is None
        assert all(job["steps"] == [] for job in listed.values())  # the list leaves them out

        job = (await client.get(f"/admin/jobs/{ids['waiting']}")).json()
        assert job["awaiting_signal"] == "approval"
        assert [(s["name"], s["status"], s["value"]) for s in job["steps"]] == [
            ("charge", "completed", {"charge_id": "ch_1"}), ("approval", "waiting", None)]
        assert job["steps"][0]["started_at"] and job["steps"][0]["ended_at"] and job["steps"][1]["ended_at"] is None
        assert_error(await client.get("/admin/jobs", params={"status": "asleep"}), 400, "status must be one of",
                     "suspended")


# -- replay --------------------------------------------------------------------------------------------------


async def test_retry_from_a_step_replays_a_completed_job_from_there(store: Config) -> None:
    ids = await signal_seed(store)
    async with served(store) as (pipeline, client):
        job_id = ids["completed"]
        assert_error(await client.post(f"/admin/jobs/{job_id}/retry"), 409)  # without from_step: not a completed job
        assert_error(await client.post(f"/admin/jobs/{job_id}/retry", json={"from_step": "z"}), 422,
                     f"job {job_id} has no step named 'z'; its steps: 'a', 'b', 'c'")
        assert_error(await client.post(f"/admin/jobs/{job_id}/retry", json={"from": "b"}), 422,
                     "unknown field 'from'; expected from_step")
        assert_error(await client.post(f"/admin/jobs/{job_id}/retry", json={"from_step": 3}), 422,
                     "from_step must be a step's name")
        assert_error(await client.post(f"/admin/jobs/{job_id}/retry", json=["b"]), 422, "must be a JSON object")
        assert [s.name for s in await pipeline.backend.steps(job_id)] == ["a", "b", "c"]  # nothing changed

        r = await client.post(f"/admin/jobs/{job_id}/retry", json={"from_step": "b"})
        assert r.status_code == 200, r.text
        assert (r.json()["status"], r.json()["attempts"], r.json()["result"]) == ("pending", 0, None)
        assert [s["name"] for s in r.json()["steps"]] == ["a"]
        assert [s.name for s in await pipeline.backend.steps(job_id)] == ["a"]

        # from_step null is a plain retry; a job without that step is refused, whatever its status
        r = await client.post(f"/admin/jobs/{ids['dead']}/retry", json={"from_step": None})
        assert (r.status_code, r.json()["status"]) == (200, "pending")
        assert_error(await client.post(f"/admin/jobs/{ids['pending']}/retry", json={"from_step": "a"}), 422,
                     "has no step named 'a'; its steps: none")


def test_the_openapi_document_describes_signals_and_replay() -> None:
    document = openapi_document(seed_registry(), auth=True)
    paths = document["paths"]
    signal = paths["/admin/jobs/{job_id}/signals/{name}"]["post"]
    assert set(signal["responses"]) >= {"200", "400", "401", "404", "409", "422"}
    assert signal["requestBody"]["required"] is False
    assert paths["/admin/jobs/{job_id}/retry"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Replay"}
    job = document["components"]["schemas"]["Job"]
    assert {"awaiting_signal", "steps"} <= set(job["required"])
    assert "suspended" in job["properties"]["status"]["enum"]
    # the signed links' pages are for people, as the dashboard is: not the JSON API's (docs/operating.md has them)
    assert not [path for path in paths if path.startswith("/signal-links")]
