"""Issue 24's workflows in the admin API: a job's parents, children and batch; ``after`` and
``on_parent_failure`` in ``POST /admin/jobs``; ``POST /admin/batches`` and ``GET /admin/batches/{id}``;
``status=waiting`` in the list, the stats, /metrics and the bulk cancel; the bodies it refuses. Served for
real by Hypercorn on a loopback port (tests/test_admin_api.py's ``served``), driven with httpx; the main
scenario on each store. The store's states are made through the engine and the Backend protocol (claims
under another owner, settlements): no worker runs here."""

from __future__ import annotations

import json
from typing import Any

import attrs
from admin_harness import seed_registry
from prometheus_client.parser import text_string_to_metric_families
from test_admin_api import assert_error, served
from test_admin_control import OWNER, sqlite_store, store  # noqa: F401 -- fixtures

from pipeline import Config, open_pipeline
from pipeline.backends.base import Settlement
from pipeline.site import SendEmail
from pipeline.site.jobs import GenerateSitemap, InvalidateCache
from pipeline.states import Transition


def email(to: str) -> SendEmail:
    return SendEmail(to=to, subject="hi", body="hello")


async def workflow_seed(config: Config) -> dict[str, Any]:
    """A small workflow, made through the engine (``enqueue(after=)``, ``enqueue_batch``) and settled
    through the protocol: ``done`` (send_email, completed, result {"sent": 1}) and ``pending``
    (invalidate_cache) are the parents of ``child`` (generate_sitemap, waiting for one of its two); the
    batch ``batch`` holds ``members``: send_email completed (result {"sent": 2}), send_email dead,
    invalidate_cache pending; its ``callback`` (generate_sitemap) waits for the last one."""
    async with open_pipeline(config.replace(worker=attrs.evolve(config.worker, enabled=False)), seed_registry()) as p:
        backend = p.backend
        done = await p.enqueue(email("ok@example.com"))
        (lease,) = await backend.claim({"send_email": 1}, owner=OWNER, lease_seconds=3600)
        assert await backend.settle([Settlement(lease.id, lease.token, Transition.SUCCEED, result=json.dumps({"sent": 1}))]) == [True]
        pending = await p.enqueue(InvalidateCache(keys=["post:1"]))
        child = await p.enqueue(GenerateSitemap(), after=[done, pending])
        batch = await p.enqueue_batch([email("a@example.com"), email("b@example.com"), InvalidateCache(keys=["post:2"])],
                                      then=GenerateSitemap())
        by_id = {lease.id: lease for lease in await backend.claim({"send_email": 2}, owner=OWNER, lease_seconds=3600)}
        ok, gone = by_id[batch.job_ids[0]], by_id[batch.job_ids[1]]
        assert await backend.settle([
            Settlement(ok.id, ok.token, Transition.SUCCEED, result=json.dumps({"sent": 2})),
            Settlement(gone.id, gone.token, Transition.BURY, error="550 mailbox unavailable"),
        ]) == [True, True]
    return {"done": done, "pending": pending, "child": child, "batch": batch.id, "members": list(batch.job_ids),
            "callback": batch.callback_id}


async def test_jobs_show_their_workflow_and_batches_are_made_and_read(store: Config) -> None:  # noqa: F811
    ids = await workflow_seed(store)
    async with served(store) as (pipeline, client):
        child = (await client.get(f"/admin/jobs/{ids['child']}")).json()
        assert (child["status"], child["parents"], child["parent_count"], child["waiting_for"]) == (
            "waiting", [ids["done"], ids["pending"]], 2, 1)
        assert (child["children"], child["child_count"], child["batch"], child["on_parent_failure"]) == ([], 0, None, "cancel")
        parent = (await client.get(f"/admin/jobs/{ids['pending']}")).json()
        assert (parent["children"], parent["child_count"], parent["parents"]) == ([ids["child"]], 1, [])
        member = (await client.get(f"/admin/jobs/{ids['members'][2]}")).json()
        assert (member["batch"], member["children"]) == (ids["batch"], [ids["callback"]])
        callback = (await client.get(f"/admin/jobs/{ids['callback']}")).json()
        assert (callback["batch"], callback["parents"], callback["waiting_for"], callback["on_parent_failure"]) == (
            ids["batch"], ids["members"], 1, "run")

        # waiting: listed, counted, in /metrics
        waiting = (await client.get("/admin/jobs", params={"status": "waiting"})).json()
        assert sorted(j["id"] for j in waiting["items"]) == sorted([ids["child"], ids["callback"]])
        assert (await client.get("/admin/stats")).json()["by_status"]["waiting"] == 2
        families = {f.name: f for f in text_string_to_metric_families((await client.get("/metrics")).text)}
        assert {s.labels["status"]: s.value for s in families["pipeline_jobs"].samples}["waiting"] == 2

        # the seeded batch: counted by status, its jobs in order, a completed one's result decoded
        r = await client.get(f"/admin/batches/{ids['batch']}")
        assert r.status_code == 200, r.text
        batch = r.json()
        assert {k: batch[k] for k in ("id", "callback_id", "callback_status", "total", "finished", "counts", "limit", "offset")} == {
            "id": ids["batch"], "callback_id": ids["callback"], "callback_status": "waiting", "total": 3, "finished": 2,
            "counts": {"completed": 1, "dead": 1, "pending": 1}, "limit": 50, "offset": 0}
        assert [(j["id"], j["job_type"], j["status"]) for j in batch["jobs"]] == [
            (ids["members"][0], "send_email", "completed"), (ids["members"][1], "send_email", "dead"),
            (ids["members"][2], "invalidate_cache", "pending")]
        assert [(j["result"], j["error"]) for j in batch["jobs"][:2]] == [({"sent": 2}, None), (None, "550 mailbox unavailable")]
        page = (await client.get(f"/admin/batches/{ids['batch']}", params={"limit": 1, "offset": 1})).json()
        assert ([j["id"] for j in page["jobs"]], page["limit"], page["offset"], page["total"]) == ([ids["members"][1]], 1, 1, 3)
        assert_error(await client.get("/admin/batches/no-such-batch"), 404, "no batch with id 'no-such-batch'")

        # a job with parents through the API: waiting while one has not completed
        r = await client.post("/admin/jobs", json={"job_type": "generate_sitemap", "after": [ids["pending"], ids["done"]],
                                                   "on_parent_failure": "run"})
        assert r.status_code == 201, r.text
        made = r.json()
        assert (made["status"], made["parents"], made["waiting_for"], made["on_parent_failure"]) == (
            "waiting", [ids["pending"], ids["done"]], 1, "run")
        r = await client.post("/admin/jobs", json={"job_type": "generate_sitemap", "after": [ids["done"]]})
        assert r.status_code == 201 and r.json()["status"] == "pending"  # its one parent completed already

        # a batch through the API: its jobs and its callback, in one transaction
        r = await client.post("/admin/batches", json={
            "jobs": [{"job_type": "invalidate_cache", "payload": {"keys": ["a"]}, "priority": 1},
                     {"job_type": "generate_sitemap"}],
            "then": {"job_type": "send_email", "payload": {"to": "me@example.com", "subject": "done", "body": "all done"}}})
        assert r.status_code == 201, r.text
        made = r.json()
        assert set(made) == {"id", "job_ids", "callback_id"} and len(made["job_ids"]) == 2
        assert r.headers["location"] == f"/admin/batches/{made['id']}"
        batch = (await client.get(f"/admin/batches/{made['id']}")).json()
        assert (batch["total"], batch["finished"], batch["counts"], batch["callback_id"], batch["callback_status"]) == (
            2, 0, {"pending": 2}, made["callback_id"], "waiting")
        assert [j["id"] for j in batch["jobs"]] == made["job_ids"]
        first = (await client.get(f"/admin/jobs/{made['job_ids'][0]}")).json()
        assert (first["priority"], first["batch"]) == (1, made["id"])
        callback = (await client.get(f"/admin/jobs/{made['callback_id']}")).json()
        assert (callback["job_type"], callback["parents"], callback["on_parent_failure"]) == (
            "send_email", made["job_ids"], "run")
        alone = (await client.post("/admin/batches", json={"jobs": [{"job_type": "generate_sitemap"}]})).json()
        assert alone["callback_id"] is None and len(alone["job_ids"]) == 1
        assert (await client.get(f"/admin/batches/{alone['id']}")).json()["callback_status"] is None

        # cancel a waiting job, one by id and the rest by the bulk filter
        r = await client.post(f"/admin/jobs/{ids['child']}/cancel")
        assert r.status_code == 200 and r.json()["status"] == "cancelled", r.text
        r = await client.post("/admin/jobs/cancel", json={"status": "waiting", "job_type": "send_email"})
        assert r.json() == {"matched": 1, "cancelled": 1, "cancel_requested": 0, "skipped": 0, "reasons": []}
        assert (await pipeline.backend.get(made["callback_id"])).status == "cancelled"


REFUSED: list[tuple[str, Any, list[str]]] = [  # (path, body, what the 422 says); "{done}": a job of the store
    ("jobs", {"job_type": "generate_sitemap", "after": ["no-such-job"]}, ["unknown parent job in after: no-such-job",
                                                                         "nothing was enqueued"]),
    ("jobs", {"job_type": "generate_sitemap", "after": "{done}"}, ["after must be an array of job ids, got a string"]),
    ("jobs", {"job_type": "generate_sitemap", "after": ["{done}", "{done}"]}, ["after names a job more than once"]),
    ("jobs", {"job_type": "generate_sitemap", "after": [""]}, ["after must hold job ids (non-empty text)"]),
    ("jobs", {"job_type": "generate_sitemap", "on_parent_failure": "run"}, ["on_parent_failure is given without after"]),
    ("jobs", {"job_type": "generate_sitemap", "after": ["{done}"], "on_parent_failure": "maybe"},
     ['on_parent_failure must be "cancel" or "run", got \'maybe\'']),
    ("batches", {"jobs": []}, ["jobs must be a non-empty array of jobs, got an empty array"]),
    ("batches", {"jobs": {"job_type": "generate_sitemap"}}, ["jobs must be a non-empty array of jobs, got an object"]),
    ("batches", {"then": {"job_type": "generate_sitemap"}}, ["jobs must be a non-empty array of jobs, got null"]),
    ("batches", {"jobs": [{"job_type": "generate_sitemap"}], "then": None}, ["then must be a job object, got null"]),
    ("batches", {"jobs": [{"job_type": "generate_sitemap", "unique_key": "k"}]}, ["jobs[0]: unknown field 'unique_key'"]),
    ("batches", {"jobs": [{"job_type": "generate_sitemap"}], "then": {"job_type": "generate_sitemap", "after": ["{done}"]}},
     ["then: unknown field 'after'"]),
    ("batches", {"jobs": [{"job_type": "generate_sitemap"}, {"job_type": "nope"}]}, ["jobs[1]: ", "nope"]),
    ("batches", {"jobs": [{"job_type": "generate_sitemap", "after": ["no-such-job"]}]}, ["unknown parent job in after"]),
    ("batches", {"jobs": [{"job_type": "generate_sitemap"}], "extra": 1}, ["unknown field 'extra'; expected jobs, then"]),
    ("batches", [], ["must be a JSON object"]),
]


async def test_bodies_that_do_not_fit_are_422_and_write_nothing(sqlite_store: Config) -> None:  # noqa: F811
    ids = await workflow_seed(sqlite_store)
    async with served(sqlite_store) as (_, client):
        before = (await client.get("/admin/stats")).json()["by_status"]
        for path, body, words in REFUSED:
            sent = json.loads(json.dumps(body).replace("{done}", ids["done"]))
            assert_error(await client.post(f"/admin/{path}", json=sent), 422, *words)
        assert (await client.get("/admin/stats")).json()["by_status"] == before
        for query in ({"limit": "0"}, {"limit": "201"}, {"offset": "-1"}, {"page": "1"}):
            assert_error(await client.get(f"/admin/batches/{ids['batch']}", params=query), 400)


def test_the_openapi_document_describes_the_workflow_fields() -> None:
    from pipeline.admin.openapi import openapi_document

    schemas = openapi_document(seed_registry(), auth=False)["components"]["schemas"]
    assert {"parents", "parent_count", "waiting_for", "children", "child_count", "batch", "on_parent_failure"} <= set(
        schemas["Job"]["required"])
    assert "waiting" in schemas["Job"]["properties"]["status"]["enum"]
    assert {"after", "on_parent_failure"} <= set(schemas["NewJob"]["properties"])
    assert set(schemas["NewBatchJob"]["properties"]) == set(schemas["NewJob"]["properties"]) - {"unique_key", "unique_while",
                                                                                                     "idempotency_key"}
    assert set(schemas["NewBatchCallback"]["properties"]) == set(schemas["NewBatchJob"]["properties"]) - {
        "after", "on_parent_failure"}
