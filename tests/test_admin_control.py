"""Issue 23's control in the admin API (cancel, bulk cancel/retry/delete, job types paused and resumed,
expiry, what a job shows) and pipeline/control.py under it, served for real by Hypercorn on a loopback
port on each store (tests/backends/stores.py), driven with httpx. The store's states are made through
the Backend protocol itself (claims under another owner, settlements), so no worker runs here."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from admin_harness import seed_registry
from backends.stores import BACKENDS
from conftest import fast_config
from prometheus_client.parser import text_string_to_metric_families
from test_admin_api import assert_error, served

from pipeline import Config, control
from pipeline.admin.api import AdminApi
from pipeline.admin.openapi import openapi_document
from pipeline.backends import Backend, open_backend
from pipeline.backends.base import Settlement
from pipeline.clock import format_ts, now_ts, to_epoch
from pipeline.requests import JobRequest, prepare_rows
from pipeline.site.jobs import GenerateSitemap
from pipeline.states import Transition

OWNER = "elsewhere:4242:abcdef"  # a worker process of another machine: it holds the running job


@pytest.fixture(params=sorted(BACKENDS))
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Config]:
    """A fresh store of each backend, with the admin API on a free port and no workers."""
    async with BACKENDS[request.param](tmp_path) as config:
        yield config.replace(admin=fast_config(tmp_path / "x.db", admin_port=0).admin,
                             worker=fast_config(tmp_path / "x.db", worker_enabled=False).worker)


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> Config:
    return fast_config(tmp_path / "control.db", admin_port=0, worker_enabled=False)


def rows(*requests: JobRequest) -> list[Any]:
    return prepare_rows(seed_registry(), requests)


def email(to: str, **fields: Any) -> JobRequest:
    return JobRequest("send_email", {"to": to, "subject": "hi", "body": "hello"}, **fields)


async def control_seed(config: Config) -> dict[str, list[str]]:
    """Jobs in every state, made through the protocol: 2 send_email dead, 1 send_email completed with a
    result, 1 invalidate_cache running under another owner (a long lease, progress 0.4), 2 send_email and
    1 generate_sitemap pending, 1 generate_sitemap cancelled. Returns the ids by state."""
    ids: dict[str, list[str]] = {}
    async with open_backend(config) as backend:
        done = rows(email("ok@example.com"), email("gone0@example.com"), email("gone1@example.com"))
        await backend.insert(done)
        leases = await backend.claim({"send_email": 3}, owner=OWNER, lease_seconds=3600)
        assert sorted(lease.id for lease in leases) == sorted(row.id for row in done)
        by_id = {lease.id: lease for lease in leases}
        ok, *dead = (by_id[row.id] for row in done)
        assert await backend.settle([
            Settlement(ok.id, ok.token, Transition.SUCCEED, result=json.dumps({"sent": 1, "to": "ok@example.com"})),
            *(Settlement(d.id, d.token, Transition.BURY, error="550 mailbox unavailable") for d in dead),
        ]) == [True, True, True]
        ids["completed"], ids["dead"] = [ok.id], [d.id for d in dead]

        (running,) = rows(JobRequest("invalidate_cache", {"keys": ["post:1"]}))
        await backend.insert([running])
        (lease,) = await backend.claim({"invalidate_cache": 1}, owner=OWNER, lease_seconds=3600)
        assert await backend.set_progress(lease.id, lease.token, 0.4, "40 of 100 keys")
        ids["running"] = [lease.id]

        pending = rows(email("later0@example.com"), email("later1@example.com"), JobRequest("generate_sitemap", {}),
                       JobRequest("generate_sitemap", {}))
        await backend.insert(pending)
        assert await backend.cancel([pending[3].id], reason="by the test") == ["cancelled"]
        ids["pending"], ids["cancelled"] = [row.id for row in pending[:3]], [pending[3].id]
    return ids


# -- one job ---------------------------------------------------------------------------------------


async def test_cancel_a_pending_job_then_it_is_final(store: Config) -> None:
    ids = await control_seed(store)
    async with served(store) as (pipeline, client):
        job_id = ids["pending"][0]
        r = await client.post(f"/admin/jobs/{job_id}/cancel")
        assert r.status_code == 200, r.text
        job = r.json()
        assert (job["id"], job["status"], job["cancel_requested"]) == (job_id, "cancelled", False)
        assert job["error"] == "cancelled before it started: by an operator through the admin API"
        assert (await pipeline.backend.get(job_id)).status == "cancelled"
        assert_error(await client.post(f"/admin/jobs/{job_id}/cancel"), 409, f"job {job_id} is cancelled",
                     "only waiting, pending, suspended or running jobs can be cancelled")
        assert_error(await client.post(f"/admin/jobs/{ids['completed'][0]}/cancel"), 409, "is completed")
        assert_error(await client.post(f"/admin/jobs/{ids['dead'][0]}/cancel"), 409, "is dead")
        assert_error(await client.post("/admin/jobs/no-such-job/cancel"), 404, "no job with id 'no-such-job'")
        # a cancelled job is retried like a dead one: pending, attempts reset
        r = await client.post(f"/admin/jobs/{job_id}/retry")
        assert r.status_code == 200, r.text
        assert (r.json()["status"], r.json()["attempts"]) == ("pending", 0)


async def test_cancel_a_running_job_asks_its_worker(store: Config) -> None:
    ids = await control_seed(store)
    async with served(store) as (pipeline, client):
        job_id = ids["running"][0]
        r = await client.post(f"/admin/jobs/{job_id}/cancel")
        assert r.status_code == 200, r.text
        assert (r.json()["status"], r.json()["cancel_requested"]) == ("running", True)
        assert [i for i, _ in await pipeline.backend.cancel_requests(OWNER)] == [job_id]  # its owner hears it
        again = await client.post(f"/admin/jobs/{job_id}/cancel")  # asking twice is harmless
        assert again.status_code == 200 and again.json()["cancel_requested"] is True
        assert_error(await client.delete(f"/admin/jobs/{job_id}"), 409, "running")


async def test_a_job_shows_its_result_progress_snoozes_expiry_and_cancel_request(store: Config) -> None:
    ids = await control_seed(store)
    async with served(store) as (_, client):
        done = (await client.get(f"/admin/jobs/{ids['completed'][0]}")).json()
        assert done["result"] == {"sent": 1, "to": "ok@example.com"} and done["progress"] is None
        running = (await client.get(f"/admin/jobs/{ids['running'][0]}")).json()
        assert running["progress"] == {"fraction": 0.4, "message": "40 of 100 keys"}
        assert (running["snoozes"], running["expires_at"], running["cancel_requested"]) == (0, None, False)
        assert running["result"] is None
        listed = (await client.get("/admin/jobs", params={"status": "cancelled"})).json()
        assert [j["id"] for j in listed["items"]] == ids["cancelled"]
        assert listed["items"][0]["error"] == "cancelled before it started: by the test"


# -- bulk ------------------------------------------------------------------------------------------


async def test_bulk_cancel_by_type_cancels_pending_and_asks_running(store: Config) -> None:
    ids = await control_seed(store)
    async with served(store) as (pipeline, client):
        r = await client.post("/admin/jobs/cancel", json={"job_type": "send_email"})
        assert r.status_code == 200, r.text
        assert r.json() == {"matched": 2, "cancelled": 2, "cancel_requested": 0, "skipped": 0, "reasons": []}
        for job_id in ids["pending"][:2]:
            assert (await pipeline.backend.get(job_id)).status == "cancelled"
        assert (await pipeline.backend.get(ids["pending"][2])).status == "pending"  # another type's
        r = await client.post("/admin/jobs/cancel", json={"status": "running"})
        assert r.json() == {"matched": 1, "cancelled": 0, "cancel_requested": 1, "skipped": 0, "reasons": []}
        assert (await pipeline.backend.get(ids["running"][0])).cancel_requested
        r = await client.post("/admin/jobs/cancel", json={"status": "pending"})
        assert r.json()["cancelled"] == 1
        stats = (await client.get("/admin/stats")).json()  # the cache was dropped by the writes
        assert stats["by_status"]["cancelled"] == 4 and stats["by_status"]["pending"] == 0


async def test_bulk_retry_and_delete(store: Config) -> None:
    ids = await control_seed(store)
    async with served(store) as (pipeline, client):
        r = await client.post("/admin/jobs/retry", json={"status": "dead", "job_type": "send_email"})
        assert r.json() == {"matched": 2, "retried": 2, "skipped": 0, "reasons": []}
        assert {(await pipeline.backend.get(i)).status for i in ids["dead"]} == {"pending"}
        r = await client.post("/admin/jobs/retry", json={"job_type": "generate_sitemap"})  # dead and cancelled
        assert r.json()["retried"] == 1 and (await pipeline.backend.get(ids["cancelled"][0])).status == "pending"
        r = await client.post("/admin/jobs/delete", json={"status": "completed"})
        assert r.json() == {"matched": 1, "deleted": 1, "skipped": 0, "reasons": []}
        assert await pipeline.backend.get(ids["completed"][0]) is None
        r = await client.post("/admin/jobs/delete", json={"status": "pending", "job_type": "generate_sitemap"})
        assert r.json()["deleted"] == 2
        assert (await client.get("/admin/jobs")).json()["total"] == 5  # 4 send_email pending, 1 running


@pytest.mark.parametrize(
    "path, body, status, words",
    [
        ("cancel", {}, 422, ["cancel of every matching job needs a filter: status (waiting, pending, running, suspended), job_type"]),
        ("cancel", {"status": "completed"}, 422, ["cancel takes jobs of status waiting or pending or running or suspended; status 'completed'"]),
        ("cancel", {"status": None, "job_type": "send_email"}, 422, ["status must be a string, got null"]),
        ("cancel", {"job_type": ""}, 422, ["job_type must be a non-empty string"]),
        ("cancel", {"job_type": 7}, 422, ["job_type must be a non-empty string"]),
        ("cancel", {"statuses": ["pending"]}, 422, ["unknown field 'statuses'; expected status, job_type"]),
        ("cancel", [], 422, ["must be a JSON object"]),
        ("retry", {"status": "pending"}, 422, ["retry takes jobs of status dead or cancelled"]),
        ("delete", {"job_type": "send_email"}, 422, ["delete of every job of a type needs a status too"]),
        ("delete", {"status": "running"}, 422, ["delete takes jobs of status waiting or pending or completed or dead or cancelled"]),
    ],
)
async def test_bulk_filters_it_does_not_take_are_422(sqlite_store: Config, path: str, body: Any, status: int,
                                                     words: list[str]) -> None:
    await control_seed(sqlite_store)
    async with served(sqlite_store) as (_, client):
        assert_error(await client.post(f"/admin/jobs/{path}", json=body), status, *words)
        assert_error(await client.post(f"/admin/jobs/{path}"), 400, "a JSON body is required")
        assert (await client.get("/admin/stats")).json()["by_status"]["pending"] == 3  # nothing changed


class Counting:
    """A real backend whose list, cancel, revive and delete calls are counted (and their sizes kept)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.calls: list[tuple[str, int]] = []

    async def list(self, **kwargs: Any) -> Any:
        self.calls.append(("list", kwargs["limit"]))
        return await self.backend.list(**kwargs)

    async def cancel(self, ids: Sequence[str], *, reason: str) -> Any:
        self.calls.append(("cancel", len(ids)))
        return await self.backend.cancel(ids, reason=reason)

    async def revive(self, job_id: str) -> Any:
        self.calls.append(("revive", 1))
        return await self.backend.revive(job_id)

    async def delete(self, job_id: str) -> Any:
        self.calls.append(("delete", 1))
        return await self.backend.delete(job_id)


async def test_bulk_works_in_bounded_batches_and_ends_on_jobs_it_cannot_change(store: Config) -> None:
    """Twelve pending jobs cancelled 5 per call to the store; five running jobs, whose cancel is only
    requested (they stay running, still matching), and dead jobs whose retry is refused (another job holds
    their unique key) each handled once: the loop moves past them and ends."""
    async with open_backend(store) as backend:
        await backend.insert(rows(*(email(f"p{i}@example.com") for i in range(12))))
        counted = Counting(backend)
        outcome = await control.bulk(counted, control.JobFilter.checked("cancel", "pending", "send_email"),  # type: ignore[arg-type]
                                     reason="by the test", batch=5)
        assert (outcome.matched, outcome.done, outcome.skipped) == (12, 12, 0)
        assert [n for kind, n in counted.calls if kind == "cancel"] == [5, 5, 2]
        assert all(n == 5 for kind, n in counted.calls if kind == "list")

        await backend.insert(rows(*(email(f"r{i}@example.com") for i in range(5))))
        assert len(await backend.claim({"send_email": 5}, owner=OWNER, lease_seconds=3600)) == 5
        counted.calls.clear()
        with trio.fail_after(10):
            outcome = await control.bulk(counted, control.JobFilter("cancel", "running"), batch=2)  # type: ignore[arg-type]
        assert (outcome.matched, outcome.done, outcome.requested, outcome.skipped) == (5, 0, 5, 0)
        assert sum(n for kind, n in counted.calls if kind == "cancel") == 5  # each asked once
        assert len(await backend.cancel_requests(OWNER)) == 5

        # two dead jobs whose keys pending jobs took meanwhile: the retry is refused, named, not looped on
        keyed = rows(JobRequest("generate_sitemap", {}, unique_key="k0"), JobRequest("generate_sitemap", {}, unique_key="k1"))
        await backend.insert(keyed)
        leases = await backend.claim({"generate_sitemap": 2}, owner=OWNER, lease_seconds=3600)
        await backend.settle([Settlement(lease.id, lease.token, Transition.BURY, error="boom") for lease in leases])
        holders = await backend.insert(rows(JobRequest("generate_sitemap", {}, unique_key="k0"),
                                            JobRequest("generate_sitemap", {}, unique_key="k1")))
        counted.calls.clear()
        with trio.fail_after(10):
            outcome = await control.bulk(counted, control.JobFilter("retry", "dead", "generate_sitemap"), batch=1)  # type: ignore[arg-type]
        assert (outcome.matched, outcome.done, outcome.skipped) == (2, 0, 2)
        assert [kind for kind, _ in counted.calls].count("revive") == 2
        assert any(holders[0] in reason for reason in outcome.reasons), outcome.reasons
        assert outcome.to_json()["skipped"] == 2 and len(outcome.to_json()["reasons"]) == 2


async def test_cancel_jobs_by_id_answers_each(store: Config) -> None:
    ids = await control_seed(store)
    async with open_backend(store) as backend:
        asked = [ids["pending"][0], ids["running"][0], ids["completed"][0], ids["cancelled"][0], "nope", ids["pending"][0]]
        answers = await control.cancel_jobs(backend, asked, reason="by the test")
        assert [(a.outcome, a.status) for a in answers] == [
            ("cancelled", "cancelled"), ("cancel_requested", "running"), ("already_final", "completed"),
            ("already_final", "cancelled"), ("unknown", None), ("cancelled", "cancelled")]
        assert [a.text() for a in answers][:5] == ["cancelled", "running: cancel requested", "already completed",
                                                    "already cancelled", "no such job"]


# -- job types -------------------------------------------------------------------------------------


async def test_types_are_listed_paused_and_resumed(store: Config) -> None:
    ids = await control_seed(store)
    cfg = store.replace(worker=fast_config(Path("x.db"), worker_enabled=False, worker_concurrency=3,
                                           worker_global_limits="send_email=2",
                                           worker_rate_limits="send_email=600/m,invalidate_cache=5/s").worker)
    async with served(cfg) as (pipeline, client):
        r = await client.get("/admin/types")
        assert r.status_code == 200
        types = {t["name"]: t for t in r.json()["types"]}
        assert list(types) == seed_registry().job_types()  # the registry's, by name
        email_type = types["send_email"]
        assert email_type == {"name": "send_email", "paused": False, "registered": True, "concurrency": 2,
                              "global_limit": 2, "rate_limit": "600/m",
                              "counts": {"waiting": 0, "pending": 2, "running": 0, "completed": 1, "dead": 2, "cancelled": 0,
                                         "suspended": 0}}
        assert types["generate_sitemap"]["counts"]["cancelled"] == 1 and types["generate_sitemap"]["concurrency"] == 3
        assert types["invalidate_cache"]["counts"]["running"] == 1 == len(ids["running"])
        assert types["invalidate_cache"]["rate_limit"] == "5/s" and types["generate_sitemap"]["rate_limit"] is None

        r = await client.post("/admin/types/send_email/pause")
        assert r.status_code == 200, r.text
        assert r.json()["paused"] is True and r.json()["counts"]["dead"] == 2
        assert await pipeline.backend.paused_types() == {"send_email"}
        again = await client.post("/admin/types/send_email/pause")  # idempotent
        assert again.status_code == 200 and again.json()["paused"] is True
        listed = {t["name"]: t["paused"] for t in (await client.get("/admin/types")).json()["types"]}
        assert listed["send_email"] is True and listed["generate_sitemap"] is False
        metrics = (await client.get("/metrics")).text
        assert '\npipeline_job_type_paused{job_type="send_email"} 1\n' in metrics
        assert (await client.post("/admin/types/send_email/resume")).json()["paused"] is False
        assert await pipeline.backend.paused_types() == set()
        assert "pipeline_job_type_paused{" not in (await client.get("/metrics")).text

        r = await client.post("/admin/types/send_emial/pause")
        assert_error(r, 404, "no job type named 'send_emial'", "known: ", "send_email", "generate_sitemap")
        assert await pipeline.backend.paused_types() == set()


async def test_a_types_own_limits_show_unless_the_settings_override_them(sqlite_store: Config) -> None:
    registry = seed_registry()

    async def sitemap(job: GenerateSitemap, ctx: Any) -> None:
        return None

    registry.register("generate_sitemap", GenerateSitemap, sitemap, concurrency=7, global_limit=5, rate_limit="3/m")
    async with open_backend(sqlite_store) as backend:
        found = {t.name: t for t in await control.types_summary(backend, registry, sqlite_store)}
        assert (found["generate_sitemap"].concurrency, found["generate_sitemap"].global_limit) == (5, 5)
        assert found["generate_sitemap"].rate_limit == "3/m"
        settings = sqlite_store.replace(worker=fast_config(Path("x.db"), worker_global_limits="generate_sitemap=9",
                                                           worker_rate_limits="generate_sitemap=1/h").worker)
        found = {t.name: t for t in await control.types_summary(backend, registry, settings)}
        assert (found["generate_sitemap"].concurrency, found["generate_sitemap"].global_limit) == (7, 9)
        assert found["generate_sitemap"].rate_limit == "1/h"


async def test_a_paused_type_the_app_no_longer_has_is_listed_and_can_be_resumed(sqlite_store: Config) -> None:
    async with open_backend(sqlite_store) as backend:
        await backend.set_type_paused("old_type", True)
    async with served(sqlite_store) as (pipeline, client):
        types = {t["name"]: t for t in (await client.get("/admin/types")).json()["types"]}
        assert types["old_type"]["paused"] is True and types["old_type"]["registered"] is False
        assert types["old_type"]["concurrency"] is None
        assert_error(await client.post("/admin/types/old_type/pause"), 404, "no job type named 'old_type'")
        r = await client.post("/admin/types/old_type/resume")
        assert r.status_code == 200 and r.json()["paused"] is False
        assert await pipeline.backend.paused_types() == set()


# -- expiry, stats, metrics ------------------------------------------------------------------------


async def test_create_job_with_expires_at(store: Config) -> None:
    async with served(store) as (pipeline, client):
        soon = format_ts(to_epoch(now_ts()) + 600)
        r = await client.post("/admin/jobs", json={"job_type": "generate_sitemap", "expires_at": soon})
        assert r.status_code == 201, r.text
        assert r.json()["expires_at"] == soon
        assert (await pipeline.backend.get(r.json()["id"])).expires_at == soon
        local = dt.datetime.now(dt.timezone(dt.timedelta(hours=2))) + dt.timedelta(hours=1)  # an offset: stored in UTC
        r = await client.post("/admin/jobs", json={"job_type": "generate_sitemap", "expires_at": local.isoformat()})
        assert r.status_code == 201 and r.json()["expires_at"].endswith("Z")
        assert abs(to_epoch(r.json()["expires_at"]) - local.timestamp()) < 0.01
        for expires_at, words in [
            ("2020-01-01T00:00:00Z", ["expires_at '2020-01-01T00:00:00Z' is not in the future", "would never run"]),
            ("tomorrow", ["expires_at 'tomorrow' is not an ISO 8601 time"]),
            (3600, ["expires_at must be an ISO 8601 time as a string, got an integer"]),
        ]:
            r = await client.post("/admin/jobs", json={"job_type": "generate_sitemap", "expires_at": expires_at})
            assert_error(r, 422, *words)
        later = format_ts(to_epoch(now_ts()) + 7200)
        r = await client.post("/admin/jobs", json={"job_type": "generate_sitemap", "run_after": later, "expires_at": soon})
        assert_error(r, 422, "is not after the job's run_after", "never run")
        assert (await client.get("/admin/jobs")).json()["total"] == 2


async def test_stats_and_metrics_know_cancelled(store: Config) -> None:
    await control_seed(store)
    async with served(store) as (_, client):
        stats = (await client.get("/admin/stats")).json()
        assert stats["by_status"] == {"waiting": 0, "pending": 3, "running": 1, "completed": 1, "dead": 2, "cancelled": 1,
                                      "suspended": 0}
        assert sum(m["cancelled"] for m in stats["finished_per_minute"]) == 1
        families = {f.name: f for f in text_string_to_metric_families((await client.get("/metrics")).text)}
        jobs = {s.labels["status"]: s.value for s in families["pipeline_jobs"].samples}
        assert jobs["cancelled"] == 1 and jobs["dead"] == 2
        by_type = {(s.labels["job_type"], s.labels["status"]): s.value for s in families["pipeline_jobs_by_type"].samples}
        assert by_type[("generate_sitemap", "cancelled")] == 1
        pruned = {s.labels["status"] for s in families["pipeline_jobs_pruned"].samples}
        assert pruned == {"completed", "dead", "cancelled"}


async def test_cleanup_takes_cancelled(sqlite_store: Config) -> None:
    await control_seed(sqlite_store)
    async with served(sqlite_store) as (_, client):
        r = await client.post("/admin/jobs/cleanup", json={"statuses": ["cancelled"]})
        assert r.status_code == 200 and r.json() == {"deleted": 1}
        assert_error(await client.post("/admin/jobs/cleanup", json={"statuses": ["running"]}), 422,
                     'statuses must be a non-empty array of "completed", "dead" and "cancelled"')


def test_every_route_is_in_the_openapi_document_and_no_other() -> None:
    """The document is written by hand: each route of the API (method and path) is in it, and it
    promises none that the API does not serve."""
    routes = {(method.lower(), path) for method, path, _ in AdminApi.routes(_Routes())}  # type: ignore[arg-type]
    document = openapi_document(seed_registry(), auth=True)
    documented = {(method, path) for path, item in document["paths"].items() for method in item if method != "parameters"}
    assert routes == documented
    for action in control.ACTIONS:
        assert document["components"]["schemas"][f"{action.capitalize()}Filter"]["properties"]["status"]["enum"] == list(
            control.ACTIONS[action])


class _Routes:
    """Enough of an AdminApi for routes() to name its endpoints."""

    def __getattr__(self, name: str) -> Any:
        async def endpoint(request: Any) -> Any:
            raise AssertionError(name)

        return endpoint


async def test_the_new_routes_keep_the_token_and_the_same_origin_rules(sqlite_store: Config) -> None:
    """Every route of issue 23 needs the token when one is set, and a write from another origin is refused
    before it changes anything (the admin guard in front of every route: pipeline/admin/security.py)."""
    ids = await control_seed(sqlite_store)
    cfg = sqlite_store.replace(admin=fast_config(Path("x.db"), admin_port=0, admin_token="t0ken").admin)
    writes = [f"/admin/jobs/{ids['pending'][0]}/cancel", "/admin/jobs/cancel", "/admin/jobs/retry", "/admin/jobs/delete",
              "/admin/types/send_email/pause", "/admin/types/send_email/resume"]
    async with served(cfg, auth=False) as (pipeline, client):
        for path in writes:
            assert_error(await client.post(path, json={"status": "pending"}), 401, "Authorization: Bearer")
        assert_error(await client.get("/admin/types"), 401)
        ok = {"Authorization": "Bearer t0ken"}
        for path in writes:
            r = await client.post(path, json={"status": "pending"}, headers={**ok, "Origin": "http://evil.example"})
            assert_error(r, 403, "cross-origin")
            r = await client.post(path, json={"status": "pending"}, headers={**ok, "Sec-Fetch-Site": "cross-site"})
            assert_error(r, 403)
            r = await client.post(path, content=b'{"status": "pending"}', headers={**ok, "Content-Type": "text/plain"})
            assert_error(r, 415, "Content-Type: application/json")
        assert (await client.get("/admin/types", headers=ok)).status_code == 200
        assert (await pipeline.backend.get(ids["pending"][0])).status == "pending"  # nothing changed
        assert await pipeline.backend.paused_types() == set()
