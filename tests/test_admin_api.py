"""The admin HTTP API, served for real by Hypercorn on a loopback port, driven with httpx."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import trio
from admin_harness import seed, seed_registry
from conftest import config_of, fast_config
from prometheus_client.parser import text_string_to_metric_families

from pipeline import Config, ConfigError, Registry, open_pipeline
from pipeline.admin import AdminBindError, check_bind, open_admin_listener, run_admin_server
from pipeline.backends import Settlement
from pipeline.clock import to_epoch
from pipeline.site import SendEmail
from pipeline.site.jobs import GenerateSitemap
from pipeline.states import Transition

TOKEN = "s3cret-token"


@asynccontextmanager
async def served(cfg: Config, registry: Registry | None = None, *, auth: bool = True) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """The pipeline and its admin server in this test's trio run; a client for it."""
    async with open_pipeline(cfg, registry or seed_registry()) as pipeline, trio.open_nursery() as tn:
        stop = trio.Event()
        url = await tn.start(run_admin_server, pipeline, None, stop.wait)
        headers = {"Authorization": f"Bearer {cfg.admin.token}"} if cfg.admin.token and auth else {}
        headers["Content-Type"] = "application/json"  # as the dashboard sends on every write (a POST needs it)
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=10) as client:
            yield pipeline, client
        stop.set()


def api_config(db_path: Any, **overrides: Any) -> Config:
    return fast_config(db_path, admin_port=0, **{"worker_enabled": False, **overrides})


def assert_error(response: httpx.Response, status: int, *words: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"code", "message"}
    for word in words:
        assert word in error["message"], error["message"]


@pytest.fixture
async def seeded(db_path: Any) -> dict[str, list[str]]:
    return await seed(fast_config(db_path))


# -- listing -----------------------------------------------------------------------------------


async def test_list_jobs_newest_first_with_filters_and_pages(db_path: Any, seeded: dict[str, list[str]]) -> None:
    async with served(api_config(db_path)) as (_, client):
        r = await client.get("/admin/jobs")
        assert r.status_code == 200
        body = r.json()
        assert (body["total"], body["page"], body["per_page"]) == (7, 1, 50)
        ids = [job["id"] for job in body["items"]]
        assert ids == sorted(ids, reverse=True) and len(ids) == 7
        job = body["items"][0]
        assert set(job) == {"id", "job_type", "payload", "status", "attempts", "max_attempts", "run_after", "error",
                            "created_at", "updated_at", "priority", "unique_key", "result", "progress", "snoozes",
                            "expires_at", "cancel_requested", "limit_key", "parents", "parent_count", "waiting_for",
                            "children", "child_count", "batch", "on_parent_failure", "awaiting_signal", "steps"}

        dead = (await client.get("/admin/jobs", params={"status": "dead"})).json()
        assert dead["total"] == 2 and {j["id"] for j in dead["items"]} == set(seeded["dead"])
        assert all(j["error"] and "550 mailbox" in j["error"] for j in dead["items"])

        sitemap = (await client.get("/admin/jobs", params={"job_type": "generate_sitemap"})).json()
        assert sitemap["total"] == 2 and all(j["payload"] == {} for j in sitemap["items"])
        both = (await client.get("/admin/jobs", params={"job_type": "send_email", "status": "completed"})).json()
        assert both["total"] == 3

        pages = [(await client.get("/admin/jobs", params={"page": p, "per_page": 3})).json() for p in (1, 2, 3, 4)]
        assert [len(p["items"]) for p in pages] == [3, 3, 1, 0]
        assert [j["id"] for p in pages for j in p["items"]] == ids
        assert all(p["total"] == 7 for p in pages)


@pytest.mark.parametrize(
    "params, words",
    [
        ({"status": "bogus"}, ["status must be one of"]),
        ({"status": ""}, ["status must be one of"]),
        ({"page": "0"}, ["page must be an integer"]),
        ({"page": "-1"}, ["page"]),
        ({"page": "abc"}, ["page"]),
        ({"page": "1.5"}, ["page"]),
        ({"page": ""}, ["page"]),
        ({"page": "99999999999999999999999"}, ["page"]),
        ({"per_page": "201"}, ["per_page must be an integer from 1 to 200"]),
        ({"per_page": "0"}, ["per_page"]),
        ({"per_page": "ten"}, ["per_page"]),
        ({"job_type": ""}, ["job_type must not be empty"]),
        ({"statu": "dead"}, ["unknown query parameter 'statu'", "status, job_type, page, per_page, priority, order"]),
        ({"priority": "high"}, ["priority must be an integer from -2147483648 to 2147483647, got 'high'"]),
        ({"priority": str(2**31)}, ["priority must be an integer from -2147483648 to 2147483647, got 2147483648"]),
        ({"priority": "--1"}, ["priority must be an integer"]),
        ({"priority": ""}, ["priority must be an integer"]),
        ({"order": "oldest"}, ["order must be one of newest, claim, got 'oldest'"]),
    ],
)
async def test_list_rejects_malformed_filters(db_path: Any, params: dict[str, str], words: list[str]) -> None:
    async with served(api_config(db_path)) as (_, client):
        assert_error(await client.get("/admin/jobs", params=params), 400, *words)


async def test_hostile_filters_and_ids_never_500(db_path: Any, seeded: dict[str, list[str]]) -> None:
    hostile = ["' OR '1'='1", "'; DROP TABLE jobs; --", "\x00", "%00", "é😀", "a" * 10_000, "../../etc/passwd", " ", "\\", "NULL"]
    async with served(api_config(db_path)) as (_, client):
        for text in hostile:
            r = await client.get("/admin/jobs", params={"job_type": text})
            assert r.status_code == 200 and r.json()["total"] == 0, (text, r.text)
            for method, path in (("GET", "/admin/jobs/{}"), ("DELETE", "/admin/jobs/{}"), ("POST", "/admin/jobs/{}/retry")):
                r = await client.request(method, path.format(quote(text, safe="")))
                assert r.status_code in (404, 405), (method, text, r.status_code, r.text)
                assert r.json()["error"]["code"] in ("not_found", "method_not_allowed")
        raw = await client.get("/admin/jobs?status=%ff%fe&page=%00")
        assert raw.status_code == 400
        # the table is intact
        assert (await client.get("/admin/jobs")).json()["total"] == 7


async def test_list_jobs_by_priority_and_in_claim_order(db_path: Any) -> None:
    async with served(api_config(db_path)) as (_, client):
        made = {}
        for priority in (3, -7, 3, 0):
            r = await client.post("/admin/jobs", json={"job_type": "generate_sitemap", "priority": priority})
            assert r.status_code == 201, r.text
            made.setdefault(priority, []).append(r.json()["id"])
        claim = (await client.get("/admin/jobs", params={"order": "claim"})).json()
        assert [j["id"] for j in claim["items"]] == [*made[-7], *made[0], *made[3]]  # ties: the oldest first
        threes = (await client.get("/admin/jobs", params={"priority": "3"})).json()
        assert threes["total"] == 2 and [j["id"] for j in threes["items"]] == made[3][::-1]  # newest first
        negative = (await client.get("/admin/jobs", params={"priority": "-7", "order": "claim", "status": "pending"})).json()
        assert [j["id"] for j in negative["items"]] == made[-7] and negative["items"][0]["priority"] == -7
        r = await client.post("/admin/jobs", json={"job_type": "generate_sitemap", "priority": 2**31})
        assert_error(r, 422, "priority must be between -2147483648 and 2147483647")
        assert (await client.get("/admin/jobs")).json()["total"] == 4


async def test_metrics_show_the_global_limits(db_path: Any) -> None:
    async with served(api_config(db_path, worker_global_limits="send_email=3")) as (_, client):
        text = (await client.get("/metrics")).text
        assert '\npipeline_global_limit{job_type="send_email"} 3\n' in text
    async with served(api_config(db_path)) as (_, client):
        assert "pipeline_global_limit" not in (await client.get("/metrics")).text


# -- one job ------------------------------------------------------------------------------------


async def test_get_job_and_unknown_id(db_path: Any, seeded: dict[str, list[str]]) -> None:
    async with served(api_config(db_path)) as (_, client):
        job_id = seeded["dead"][0]
        r = await client.get(f"/admin/jobs/{job_id}")
        assert r.status_code == 200
        job = r.json()
        assert job["id"] == job_id and job["status"] == "dead" and job["job_type"] == "send_email"
        assert job["payload"]["to"] == "gone0@example.com"
        assert "550 mailbox gone0@example.com unavailable" in job["error"]
        assert (job["attempts"], job["max_attempts"]) == (1, 3)
        assert_error(await client.get("/admin/jobs/01920000-0000-7000-8000-000000000000"), 404, "no job with id")


async def test_retry_dead_job_then_conflict(db_path: Any, seeded: dict[str, list[str]]) -> None:
    async with served(api_config(db_path)) as (pipeline, client):
        job_id = seeded["dead"][0]
        r = await client.post(f"/admin/jobs/{job_id}/retry")
        assert r.status_code == 200, r.text
        job = r.json()
        assert (job["status"], job["attempts"]) == ("pending", 0)
        assert job["run_after"] <= job["updated_at"]
        assert (await pipeline.backend.get(job_id)).status == "pending"
        assert_error(await client.post(f"/admin/jobs/{job_id}/retry"), 409, "pending", "only dead or cancelled jobs")
        assert_error(await client.post(f"/admin/jobs/{seeded['completed'][0]}/retry"), 409, "completed")
        assert_error(await client.post("/admin/jobs/nope/retry"), 404, "no job with id 'nope'")


async def test_retried_job_runs_again(db_path: Any, seeded: dict[str, list[str]]) -> None:
    """With workers on, a retried job is claimed at once (the revive wakes the Poller)."""
    registry = seed_registry()
    seen = trio.Event()

    async def send_email(job: SendEmail, ctx: Any) -> None:
        seen.set()

    registry.register("send_email", SendEmail, send_email)
    async with served(api_config(db_path, worker_enabled=True), registry) as (pipeline, client):
        job_id = seeded["dead"][0]
        assert (await client.post(f"/admin/jobs/{job_id}/retry")).status_code == 200
        with trio.fail_after(5):
            await seen.wait()
            while (await pipeline.backend.get(job_id)).status != "completed":
                await trio.sleep(0.01)


async def test_delete_job(db_path: Any, seeded: dict[str, list[str]]) -> None:
    async with served(api_config(db_path)) as (_, client):
        job_id = seeded["completed"][0]
        r = await client.delete(f"/admin/jobs/{job_id}")
        assert r.status_code == 204 and r.content == b""
        assert_error(await client.get(f"/admin/jobs/{job_id}"), 404)
        assert_error(await client.delete(f"/admin/jobs/{job_id}"), 404)
        assert (await client.get("/admin/jobs")).json()["total"] == 6


async def test_delete_running_job_is_a_conflict(db_path: Any) -> None:
    registry = seed_registry()
    started, release = trio.Event(), trio.Event()

    async def slow_sitemap(job: GenerateSitemap, ctx: Any) -> None:
        started.set()
        await release.wait()

    registry.register("generate_sitemap", GenerateSitemap, slow_sitemap)
    async with served(api_config(db_path, worker_enabled=True), registry) as (pipeline, client):
        job_id = await pipeline.enqueue(GenerateSitemap())
        with trio.fail_after(5):
            await started.wait()
        assert_error(await client.delete(f"/admin/jobs/{job_id}"), 409, "running")
        release.set()
        with trio.fail_after(5):
            while (await pipeline.backend.get(job_id)).status != "completed":
                await trio.sleep(0.01)
        assert (await client.delete(f"/admin/jobs/{job_id}")).status_code == 204


# -- cleanup ---------------------------------------------------------------------------------------


async def test_cleanup_defaults_and_options(db_path: Any, seeded: dict[str, list[str]]) -> None:
    async with served(api_config(db_path)) as (_, client):
        r = await client.post("/admin/jobs/cleanup", json={"older_than_seconds": 3600})
        assert r.json() == {"deleted": 0}
        r = await client.post("/admin/jobs/cleanup", json={"statuses": ["dead"]})
        assert r.status_code == 200 and r.json() == {"deleted": 2}
        r = await client.post("/admin/jobs/cleanup")  # no body: completed and dead
        assert r.json() == {"deleted": 3}
        left = (await client.get("/admin/jobs")).json()
        assert left["total"] == 2 and {j["status"] for j in left["items"]} == {"pending"}


@pytest.mark.parametrize(
    "content, status, words",
    [
        (json.dumps({"statuses": ["pending"]}), 422, ["statuses must be"]),
        (json.dumps({"statuses": []}), 422, ["statuses"]),
        (json.dumps({"statuses": "dead"}), 422, ["statuses"]),
        (json.dumps({"older_than_seconds": -1}), 422, ["older_than_seconds must be between"]),
        (json.dumps({"older_than_seconds": "1d"}), 422, ["older_than_seconds must be a number"]),
        (json.dumps({"older_than_seconds": 1e308}), 422, ["older_than_seconds"]),
        (json.dumps({"older_than_seconds": True}), 422, ["older_than_seconds"]),
        (json.dumps({"everything": True}), 422, ["unknown field 'everything'"]),
        (json.dumps([1, 2]), 422, ["must be a JSON object"]),
        ("{not json", 400, ["not valid JSON"]),
        ('{"older_than_seconds": NaN}', 400, ["NaN is not a JSON number"]),
    ],
)
async def test_cleanup_rejects_bad_bodies(db_path: Any, content: str, status: int, words: list[str]) -> None:
    async with served(api_config(db_path)) as (_, client):
        r = await client.post("/admin/jobs/cleanup", content=content, headers={"Content-Type": "application/json"})
        assert_error(r, status, *words)


# -- new work ----------------------------------------------------------------------------------------


async def test_create_job(db_path: Any) -> None:
    async with served(api_config(db_path)) as (_, client):
        body = {"job_type": "send_email", "payload": {"to": "a@example.com", "subject": "Hi", "body": "Hello"},
                "priority": 1, "max_attempts": 7, "run_after": "2030-01-02T03:04:05+02:00"}
        r = await client.post("/admin/jobs", json=body)
        assert r.status_code == 201, r.text
        job = r.json()
        assert r.headers["location"] == f"/admin/jobs/{job['id']}"
        assert (job["status"], job["priority"], job["max_attempts"], job["attempts"]) == ("pending", 1, 7, 0)
        assert job["run_after"] == "2030-01-02T01:04:05.000Z"
        assert job["payload"] == body["payload"]
        assert job.pop("duplicate") is False
        assert (await client.get(f"/admin/jobs/{job['id']}")).json() == job
        minimal = (await client.post("/admin/jobs", json={"job_type": "generate_sitemap"})).json()
        assert (minimal["payload"], minimal["priority"], minimal["max_attempts"]) == ({}, 5, 3)


async def test_create_job_with_a_unique_key_answers_the_holder_while_it_is_pending(db_path: Any) -> None:
    async with served(api_config(db_path)) as (pipeline, client):
        body = {"job_type": "generate_sitemap", "unique_key": "nightly"}
        first = await client.post("/admin/jobs", json=body)
        assert first.status_code == 201, first.text
        assert (first.json()["unique_key"], first.json()["duplicate"]) == ("nightly", False)
        again = await client.post("/admin/jobs", json={**body, "priority": 1})
        assert again.status_code == 200, again.text
        assert again.json()["duplicate"] is True
        assert again.json()["id"] == first.json()["id"] and again.json()["priority"] == 5  # the holder, unchanged
        assert again.headers["location"] == f"/admin/jobs/{first.json()['id']}"
        assert (await client.get("/admin/jobs")).json()["total"] == 1
        shown = (await client.get(f"/admin/jobs/{first.json()['id']}")).json()
        assert shown["unique_key"] == "nightly"
        # another type may use the same key
        other = await client.post("/admin/jobs", json={"job_type": "invalidate_cache", "payload": {"keys": ["a"]},
                                                       "unique_key": "nightly"})
        assert other.status_code == 201, other.text
        # a bad key: 422 naming it, nothing stored
        for bad in ("", 7, "x" * 201, "a\u0000b"):
            r = await client.post("/admin/jobs", json={"job_type": "generate_sitemap", "unique_key": bad})
            assert r.status_code == 422, (bad, r.text)
            assert "unique_key" in r.json()["error"]["message"]
        assert (await client.get("/admin/jobs")).json()["total"] == 2
        # once the holder is dead, the key is free; retrying the dead one is then refused (409)
        holder = first.json()["id"]
        (lease,) = await pipeline.backend.claim({"generate_sitemap": 1}, owner="t", lease_seconds=60)
        await pipeline.backend.settle([Settlement(lease.id, lease.token, Transition.BURY, error="x")])
        successor = await client.post("/admin/jobs", json=body)
        assert successor.status_code == 201 and successor.json()["id"] != holder
        retry = await client.post(f"/admin/jobs/{holder}/retry")
        assert retry.status_code == 409, retry.text
        assert successor.json()["id"] in retry.json()["error"]["message"]
        assert (await client.get(f"/admin/jobs/{holder}")).json()["status"] == "dead"


@pytest.mark.parametrize(
    "body, status, words",
    [
        ({"job_type": "launch_rockets", "payload": {}}, 422, ["unknown job type 'launch_rockets'", "send_email"]),
        ({"job_type": "send_email", "payload": {"to": "a@example.com"}}, 422, ["does not fit SendEmail", "subject"]),
        ({"job_type": "send_email", "payload": {"to": 5, "subject": "s", "body": "b"}}, 422, ["to"]),
        ({"job_type": "generate_thumbnail", "payload": {"media_id": "m", "size": -3}}, 422, ["size"]),
        ({"payload": {}}, 422, ["job_type must be a non-empty string"]),
        ({"job_type": "generate_sitemap", "payload": [1]}, 422, ["payload must be a JSON object"]),
        ({"job_type": "generate_sitemap", "priority": 2**63}, 422, ["priority must be between"]),
        ({"job_type": "generate_sitemap", "priority": "high"}, 422, ["priority must be an integer"]),
        ({"job_type": "generate_sitemap", "max_attempts": 0}, 422, ["max_attempts must be between 1"]),
        ({"job_type": "generate_sitemap", "run_after": "yesterday"}, 422, ["run_after 'yesterday' is not an ISO 8601 time"]),
        ({"job_type": "generate_sitemap", "run_after": 1700000000}, 422, ["run_after must be an ISO 8601 time as a string"]),
        ({"job_type": "generate_sitemap", "colour": "red"}, 422, ["unknown field 'colour'"]),
        ("a string", 422, ["must be a JSON object"]),
    ],
)
async def test_create_job_rejects(db_path: Any, body: Any, status: int, words: list[str]) -> None:
    async with served(api_config(db_path)) as (_, client):
        assert_error(await client.post("/admin/jobs", json=body), status, *words)
        assert (await client.get("/admin/jobs")).json()["total"] == 0


@pytest.mark.parametrize(
    "content, words",
    [
        (b"", ["a JSON body is required"]),
        (b"{", ["not valid JSON"]),
        (b'{"job_type": "generate_sitemap", "payload": {"x": Infinity}}', ["Infinity is not a JSON number"]),
        (b'{"job_type": "send_email", "payload": {"to": "\\ud800", "subject": "s", "body": "b"}}', ["unpaired UTF-16 surrogate"]),
        (b"[" * 100_000 + b"]" * 100_000, ["nested too deeply"]),
        (b"\xff\xfe{}", ["not valid JSON"]),
        (b'{"job_type": "generate_sitemap", "priority": 1' + b"0" * 5000 + b"}", ["not valid JSON"]),
    ],
)
async def test_create_job_rejects_malformed_bodies(db_path: Any, content: bytes, words: list[str]) -> None:
    async with served(api_config(db_path, admin_max_body_bytes=1_000_000)) as (_, client):
        r = await client.post("/admin/jobs", content=content, headers={"Content-Type": "application/json"})
        assert_error(r, 400, *words)


async def test_emit_event(db_path: Any) -> None:
    async with served(api_config(db_path)) as (_, client):
        r = await client.post("/admin/events", json={"event": "UserRegistered",
                                                     "data": {"user_id": "u1", "email": "u1@example.com", "username": "ann"}})
        assert r.status_code == 201, r.text
        (job_id,) = r.json()["job_ids"]
        job = (await client.get(f"/admin/jobs/{job_id}")).json()
        assert job["job_type"] == "send_welcome_email" and job["payload"]["username"] == "ann"
        r = await client.post("/admin/events", json={"event": "MediaUploaded", "data": {"id": "m1"}})
        assert len(r.json()["job_ids"]) == 2
        r = await client.post("/admin/events", json={"event": "PostScheduled", "data": {"id": "p1", "publish_at": "2031-01-01T00:00:00Z"}})
        (job_id,) = r.json()["job_ids"]
        assert (await client.get(f"/admin/jobs/{job_id}")).json()["run_after"] == "2031-01-01T00:00:00.000Z"


@pytest.mark.parametrize(
    "body, words",
    [
        ({"event": "MoonLanded", "data": {}}, ["unknown event 'MoonLanded'", "UserRegistered"]),
        ({"event": "UserRegistered", "data": {"user_id": "u1"}}, ["does not fit UserRegistered", "email"]),
        ({"event": "PostScheduled", "data": {"id": "p", "publish_at": "soon"}}, ["does not fit PostScheduled", "'soon'"]),
        ({"event": "PostCreated", "data": [1]}, ["data must be a JSON object"]),
        ({"data": {}}, ["event must be a non-empty string"]),
        ({"event": "PostCreated", "data": {"id": "1"}, "when": "now"}, ["unknown field 'when'"]),
    ],
)
async def test_emit_event_rejects(db_path: Any, body: Any, words: list[str]) -> None:
    async with served(api_config(db_path)) as (_, client):
        assert_error(await client.post("/admin/events", json=body), 422, *words)


# -- limits and access ------------------------------------------------------------------------------


async def test_request_body_over_the_limit_is_413(db_path: Any) -> None:
    async with served(api_config(db_path, admin_max_body_bytes=1000)) as (_, client):
        big = {"job_type": "send_email", "payload": {"to": "a@example.com", "subject": "s", "body": "x" * 2000}}
        assert_error(await client.post("/admin/jobs", json=big), 413, "1000 bytes", "ADMIN_MAX_BODY_BYTES")

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it is read
            for _ in range(5):
                yield b" " * 400

        assert_error(await client.post("/admin/jobs", content=chunks()), 413)
        assert_error(await client.post("/admin/jobs/cleanup", content=b"{}" + b" " * 5000), 413)
        # a body just under the limit is fine
        small = {"job_type": "send_email", "payload": {"to": "a@example.com", "subject": "s", "body": "x" * 800}}
        assert (await client.post("/admin/jobs", json=small)).status_code == 201


async def test_token_is_required_everywhere_but_health_docs_and_page(db_path: Any, seeded: dict[str, list[str]]) -> None:
    cfg = api_config(db_path, admin_token=TOKEN)
    async with served(cfg, auth=False) as (_, client):
        job_id = seeded["dead"][0]
        protected = [("GET", "/admin/jobs"), ("GET", f"/admin/jobs/{job_id}"), ("POST", f"/admin/jobs/{job_id}/retry"),
                     ("DELETE", f"/admin/jobs/{job_id}"), ("POST", "/admin/jobs/cleanup"), ("POST", "/admin/jobs"),
                     ("POST", "/admin/events"), ("GET", "/admin/stats"), ("GET", "/admin/workers"), ("GET", "/metrics"), ("GET", "/admin/nothing")]
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}, {"Authorization": f"Basic {TOKEN}"},
                        {"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": "Bearer é".encode()}):
            for method, path in protected:
                r = await client.request(method, path, headers=headers)
                assert_error(r, 401, "Authorization: Bearer")
                assert r.headers["www-authenticate"].startswith("Bearer")
        assert (await client.get(f"/admin/jobs/{job_id}")).status_code == 401
        ok = {"Authorization": f"Bearer {TOKEN}"}
        assert (await client.get(f"/admin/jobs/{job_id}", headers=ok)).json()["status"] == "dead"  # nothing changed
        assert (await client.get("/metrics", headers=ok)).status_code == 200
        for path in ("/healthz", "/openapi.json", "/admin", "/admin/", "/admin/static/dashboard.js"):
            r = await client.get(path, follow_redirects=True)
            assert r.status_code == 200, path
        doc = (await client.get("/openapi.json")).json()
        assert doc["security"] == [{"bearer": []}]


async def test_without_token_only_loopback_host_names_are_served(db_path: Any) -> None:
    async with served(api_config(db_path)) as (_, client):
        port = client.base_url.port
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}", f"app.localhost:{port}"):
            assert (await client.get("/admin/jobs", headers={"Host": host})).status_code == 200, host
        for host in (f"evil.example:{port}", "attacker.test", f"10.0.0.1:{port}"):
            assert_error(await client.get("/admin/jobs", headers={"Host": host}), 403, "loopback")
        doc = (await client.get("/openapi.json")).json()
        assert doc["security"] == []


async def test_cross_origin_writes_are_refused(db_path: Any, seeded: dict[str, list[str]]) -> None:
    async with served(api_config(db_path)) as (_, client):
        job_id = seeded["dead"][0]
        for origin in ("http://evil.example", "null", "http://127.0.0.1:1", "http://[::1"):
            r = await client.post(f"/admin/jobs/{job_id}/retry", headers={"Origin": origin})
            assert_error(r, 403, "cross-origin")
            assert_error(await client.post("/admin/jobs/cleanup", headers={"Origin": origin}), 403)
        assert (await client.get("/admin/jobs", headers={"Origin": "http://evil.example"})).status_code == 200  # reads: CORS applies
        same = str(client.base_url).rstrip("/")
        assert (await client.post(f"/admin/jobs/{job_id}/retry", headers={"Origin": same})).status_code == 200


async def test_unknown_routes_and_methods(db_path: Any) -> None:
    async with served(api_config(db_path)) as (_, client):
        assert_error(await client.get("/admin/nothing/here"), 404, "no route")
        r = await client.patch("/admin/jobs")
        assert_error(r, 405, "PATCH")
        assert set(r.headers["allow"].replace(" ", "").split(",")) >= {"GET", "POST"}
        assert_error(await client.put("/admin/jobs/x"), 405)
        assert_error(await client.get("/admin/static/../../pyproject.toml"), 404)
        assert_error(await client.get("/admin/static/nothing.js"), 404)


# -- overview --------------------------------------------------------------------------------------


async def test_stats(db_path: Any, seeded: dict[str, list[str]]) -> None:
    async with served(api_config(db_path)) as (_, client):
        stats = (await client.get("/admin/stats")).json()
        assert stats["by_status"] == {"waiting": 0, "pending": 2, "running": 0, "completed": 3, "dead": 2, "cancelled": 0,
                                      "suspended": 0}
        assert stats["total"] == 7
        assert stats["by_type"]["send_email"] == {"waiting": 0, "pending": 0, "running": 0, "completed": 3, "dead": 2,
                                                     "cancelled": 0, "suspended": 0}
        assert stats["by_type"]["generate_sitemap"]["pending"] == 2
        minutes = stats["finished_per_minute"]
        assert len(minutes) == 60
        assert [m["minute"] for m in minutes] == sorted(m["minute"] for m in minutes)
        assert sum(m["completed"] for m in minutes) == 3 and sum(m["dead"] for m in minutes) == 2
        # as times, not text: "12:01:00Z" sorts after "12:01:00.250Z"
        assert to_epoch(minutes[-1]["minute"]) <= to_epoch(stats["now"])
        assert 0 <= stats["oldest_due_pending_age_seconds"] < 60


async def test_stats_when_nothing_is_due(db_path: Any) -> None:
    async with served(api_config(db_path)) as (_, client):
        stats = (await client.get("/admin/stats")).json()
        assert stats["oldest_due_pending_age_seconds"] is None and stats["total"] == 0
        await client.post("/admin/jobs", json={"job_type": "generate_sitemap", "run_after": "2099-01-01T00:00:00Z"})
        assert (await client.get("/admin/stats")).json()["oldest_due_pending_age_seconds"] is None  # pending, not due


async def test_healthz(db_path: Any) -> None:
    async with served(api_config(db_path)) as (_, client):
        r = await client.get("/healthz")
        assert r.status_code == 200 and r.json() == {"status": "ok", "workers": False}


async def test_metrics_count_outcomes_and_time_them(db_path: Any) -> None:
    cfg = api_config(db_path, worker_enabled=True, worker_backoff_base_ms=1)
    registry = seed_registry()
    tries: dict[str, int] = {}

    async def flaky(job: SendEmail, ctx: Any) -> None:
        tries[job.to] = tries.get(job.to, 0) + 1
        if job.subject == "flaky" and tries[job.to] == 1:
            raise ConnectionError("try again")
        if job.subject == "bounce":
            raise ConnectionError("never")

    registry.register("send_email", SendEmail, flaky)
    async with served(cfg, registry) as (pipeline, client):
        ids = [await pipeline.enqueue(SendEmail(to=f"{i}@example.com", subject="hi", body="b")) for i in range(4)]
        ids.append(await pipeline.enqueue(SendEmail(to="f@example.com", subject="flaky", body="b")))
        ids.append(await pipeline.enqueue(SendEmail(to="d@example.com", subject="bounce", body="b"), max_attempts=2))
        with trio.fail_after(10):
            for job_id in ids:
                while (await pipeline.backend.get(job_id)).status not in ("completed", "dead"):
                    await trio.sleep(0.01)
        r = await client.get("/metrics")
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = {f.name: f for f in text_string_to_metric_families(r.text)}

    def sample(family: str, name: str, **labels: str) -> float:
        found = [s.value for s in families[family].samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
        assert len(found) == 1, (family, name, labels, families[family].samples)
        return found[0]

    assert sample("pipeline_jobs", "pipeline_jobs", status="completed") == 5
    assert sample("pipeline_jobs", "pipeline_jobs", status="dead") == 1
    assert sample("pipeline_jobs_by_type", "pipeline_jobs_by_type", job_type="send_email", status="completed") == 5
    processed = "pipeline_jobs_processed"  # the parser drops _total from the family name
    assert sample(processed, "pipeline_jobs_processed_total", job_type="send_email", outcome="ok") == 5
    assert sample(processed, "pipeline_jobs_processed_total", job_type="send_email", outcome="error") == 3
    for family in ("pipeline_job_duration_seconds", "pipeline_job_queue_wait_seconds"):
        count = sample(family, f"{family}_count", job_type="send_email")
        assert count == 8
        buckets = [(s.labels["le"], s.value) for s in families[family].samples if s.name.endswith("_bucket")]
        values = [v for _, v in buckets]
        assert values == sorted(values) and buckets[-1] == ("+Inf", count)
        assert sample(family, f"{family}_sum", job_type="send_email") >= 0
    assert sample("pipeline_ledger_batches", "pipeline_ledger_batches_total") > 0
    assert sample("pipeline_oldest_due_pending_age_seconds", "pipeline_oldest_due_pending_age_seconds") == 0


# -- binding ---------------------------------------------------------------------------------------


def test_without_token_only_loopback_binds() -> None:
    for host in ("0.0.0.0", "::", "192.0.2.10", "example.invalid"):
        with pytest.raises(ConfigError, match="not a loopback address and ADMIN_TOKEN is empty"):
            check_bind(config_of(admin_host=host))
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        check_bind(config_of(admin_host=host))
    check_bind(config_of(admin_host="0.0.0.0", admin_token=TOKEN))


def test_listener_reports_the_port_it_got_and_a_busy_port_is_refused() -> None:
    listener = open_admin_listener(config_of(admin_port=0))
    try:
        assert listener.port > 0 and listener.url == f"http://127.0.0.1:{listener.port}"
        with pytest.raises(AdminBindError, match=f"cannot listen on 127.0.0.1:{listener.port} .ADMIN_HOST, ADMIN_PORT."):
            open_admin_listener(config_of(admin_port=listener.port))
    finally:
        listener.close()
    with socket.socket() as s:  # closed means free again
        s.bind(("127.0.0.1", listener.port))


async def test_the_worker_processes_are_listed_with_what_they_handle(db_path: Any) -> None:
    async with served(fast_config(db_path)) as (pipeline, client):
        with trio.fail_after(10):
            while not (answer := (await client.get("/admin/workers")).json())["workers"]:
                await trio.sleep(0.05)  # the heartbeat's first beat
        (worker,) = answer["workers"]
        assert worker["owner"] == pipeline.owner and worker["alive"] is True
        assert worker["job_types"] == sorted(pipeline.registry.handled())


async def test_every_echoed_input_is_clipped(db_path: Any, seeded: dict[str, list[str]]) -> None:
    """A 100,000-character value anywhere in a request comes back as its first 80 characters and "…"
    (issue 21: some answers echoed it whole, 100 KB): each answer is small and says what was wrong."""
    long = "x" * 100_000
    cases: list[tuple[str, str, Any, int, list[str]]] = [
        ("POST", "/admin/jobs", {"job_type": long}, 422, ["unknown job type 'xxx"]),
        ("POST", "/admin/jobs", {"job_type": "send_email", long: 1}, 422, ["unknown field 'xxx"]),
        ("POST", "/admin/jobs", {"job_type": "generate_sitemap", "run_after": long}, 422, ["run_after 'xxx", "ISO 8601"]),
        ("POST", "/admin/jobs", {"job_type": "send_email", "payload": {long: 1}}, 422, ["does not fit SendEmail"]),
        ("POST", "/admin/events", {"event": long}, 422, ["unknown event 'xxx"]),
        ("POST", "/admin/events", {"event": "UserRegistered", "data": {long: 1}}, 422, ["does not fit UserRegistered"]),
        ("POST", "/admin/jobs/cleanup", {"statuses": [long]}, 422, ["statuses must be", "['xxx"]),
        ("POST", "/admin/jobs/cleanup", {"statuses": ["a"] * 20_000}, 422, ["statuses must be", "characters left out"]),
        ("POST", "/admin/jobs/cleanup", {long: 1}, 422, ["unknown field 'xxx"]),
        ("GET", "/admin/jobs?status=" + long[:6000], None, 400, ["status must be one of", "got 'xxx"]),
        ("GET", "/admin/jobs?" + long[:6000] + "=1", None, 400, ["unknown query parameter 'xxx"]),
        ("GET", "/admin/jobs/" + long[:6000], None, 404, ["no job with id 'xxx"]),
        ("POST", f"/admin/schedules/{long[:6000]}/pause", None, 404, ["no schedule named 'xxx"]),
    ]
    async with served(api_config(db_path)) as (_, client):
        for method, path, body, status, words in cases:
            r = await client.request(method, path, json=body)
            assert len(r.content) < 2000, (path, r.content[:300])
            assert_error(r, status, *words)
            assert "x" * 81 not in r.text and ("x" * 80 + "…" in r.text or "left out" in r.text), r.text
