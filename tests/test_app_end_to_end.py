"""Issue 22's "done when", on each store: a throw-away application — its own module in a folder of
its own, an async and a sync handler, a dataclass and an attrs payload, a middleware, a schedule —
runs under ``python -m pipeline --app shop:registry --processes 2``; a plain sync script
(``pipeline.Client``) and an asyncio program (``pipeline.AsyncClient``) enqueue to it, and their
jobs complete within well under a second of the enqueue (asserted < 3 s with a poll interval of a
minute, so only the stores' wake-ups can explain it); a sqlite3 and a psycopg transaction rolled
back leave no job, committed ones run; the middleware saw every job; the admin API knows the
app's types and schedule. And the shop's own pytest file runs its handlers with ``pipeline.testing``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from app_harness import Service, app_env, cli
from backends.stores import on_each_store

from pipeline import Config

pytestmark = pytest.mark.slow

SHOP = textwrap.dedent('''
    """A shop's jobs: what a user writes, and nothing of the test's."""
    import contextlib
    import dataclasses
    import json
    import os
    import time

    import attrs
    import trio

    import pipeline

    registry = pipeline.Registry()


    def note(kind, ctx, key=None):  # one line each, appended (O_APPEND: whole lines from every process)
        line = {"kind": kind, "id": ctx.id, "type": ctx.job_type, "key": key, "pid": os.getpid(), "at": time.time()}
        with open(os.environ["SHOP_LOG"], "a") as f:
            f.write(json.dumps(line) + "\\n")


    @registry.middleware
    @contextlib.asynccontextmanager
    async def seen(ctx):
        note("middleware", ctx)
        yield


    @dataclasses.dataclass
    class Receipt:
        order_id: str


    @attrs.frozen
    class Thumbnail:
        image: str
        size: int = 64


    @registry.job
    async def send_receipt(job: Receipt, ctx: pipeline.JobContext) -> None:
        await trio.sleep(0.001)
        note("done", ctx, job.order_id)


    @registry.job(concurrency=4)
    def make_thumbnail(job: Thumbnail, ctx: pipeline.JobContext) -> None:  # a plain def: a worker thread
        time.sleep(0.005)
        note("done", ctx, job.image)


    registry.schedule("every-second", "* * * * * *", Thumbnail("scheduled"))
''')

SYNC_PRODUCER = textwrap.dedent('''
    """A plain script: a Client, and the application's own transactions."""
    import json
    import os
    import sys
    import time

    import pipeline
    from shop import Receipt, Thumbnail, registry

    store, url = sys.argv[1], os.environ["DATABASE_URL"]
    sent, checks = [], {}
    with pipeline.Client(registry=registry) as client:
        for i, job in enumerate([Receipt("sync-0"), Thumbnail("sync-1"), Receipt("sync-2")]):
            at = time.time()
            sent.append({"id": client.enqueue(job), "at": at})
            time.sleep(0.05)
        if store in ("sqlite", "postgres"):
            if store == "sqlite":
                import sqlite3
                conn = sqlite3.connect(url.removeprefix("sqlite:///"))
            else:
                import psycopg
                conn = psycopg.connect(url)
            conn.execute("CREATE TABLE orders (id text PRIMARY KEY)")
            conn.commit()
            conn.execute("INSERT INTO orders VALUES ('o-1')")
            rolled = client.enqueue(Receipt("rolled-back"), connection=conn)
            conn.rollback()
            checks["rolled"], checks["rolled_after_rollback"] = rolled, client.get(rolled) is not None
            conn.execute("INSERT INTO orders VALUES ('o-2')")
            at = time.time()
            kept = client.enqueue(Receipt("committed"), connection=conn)
            checks["kept_before_commit"] = client.get(kept) is not None  # not yet: it is in the open transaction
            conn.commit()
            sent.append({"id": kept, "at": at})
            checks["orders"] = [row[0] for row in conn.execute("SELECT id FROM orders")]
            conn.close()
    print(json.dumps({"sent": sent, "checks": checks}))
''')

ASYNCIO_PRODUCER = textwrap.dedent('''
    """An asyncio program: an AsyncClient on its own loop, one task after another, then many at once."""
    import asyncio
    import json
    import time

    import pipeline
    from shop import Receipt, Thumbnail, registry


    async def main():
        sent = []
        async with pipeline.AsyncClient(registry=registry) as client:
            for i in range(3):
                at = time.time()
                sent.append({"id": await client.enqueue(Thumbnail(f"asyncio-{i}", size=32)), "at": at})
                await asyncio.sleep(0.05)
            at = time.time()
            ids = await asyncio.gather(*(client.enqueue(Receipt(f"asyncio-many-{i}")) for i in range(5)))
            sent.extend({"id": job_id, "at": at} for job_id in ids)
        print(json.dumps({"sent": sent}))


    asyncio.run(main())
''')


def notes(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def wait_for_notes(log: Path, done: Any, what: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while not done(found := notes(log)):
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}; the application noted {found}"
        time.sleep(0.02)
    return found


def produce(folder: Path, env: dict[str, str], script: str, *argv: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, script, *argv], cwd=folder, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_a_throwaway_application_runs_under_app_on_each_store(tmp_path: Path) -> None:
    """The three stores side by side: each run mostly waits for its processes."""
    async def on(name: str, config: Config, folder: Path) -> None:
        await trio.to_thread.run_sync(run_the_shop, name, config.database_url, folder)

    await on_each_store(tmp_path, on)


def run_the_shop(name: str, database_url: str, tmp_path: Path) -> None:
    folder = tmp_path / "shop-app"
    folder.mkdir()
    (folder / "shop.py").write_text(SHOP)
    (folder / "sync_producer.py").write_text(SYNC_PRODUCER)
    (folder / "asyncio_producer.py").write_text(ASYNCIO_PRODUCER)
    log = tmp_path / "shop.log"
    env = app_env(folder, database_url, SHOP_LOG=str(log), ADMIN_PORT="0", WORKER_POLL_INTERVAL_MS="60000",
                  WORKER_SHUTDOWN_TIMEOUT="2", REDIS_ALLOW_NON_DURABLE="true")
    env["PYTHONPATH"] += f":{folder}"  # the producers import the app as the service does: from their folder

    service = Service(folder, env, "--app", "shop:registry", "--processes", "2")
    try:
        service.ready(2, "make_thumbnail, send_receipt")  # each worker process loaded the app
        url = service.admin_url()

        synced = produce(folder, env, "sync_producer.py", name)
        asyncio_ = produce(folder, env, "asyncio_producer.py")
        sent = synced["sent"] + asyncio_["sent"]
        created = httpx.post(f"{url}/admin/jobs", json={"job_type": "send_receipt", "payload": {"order_id": "http"}})
        assert created.status_code == 201, created.text
        ids = {s["id"] for s in sent} | {created.json()["id"]}
        assert len(ids) == len(sent) + 1 == (13 if name != "redis" else 12)

        found = wait_for_notes(log, lambda found: ids <= {n["id"] for n in found if n["kind"] == "done"}
                               and any(n["key"] == "scheduled" and n["kind"] == "done" for n in found),
                               "every job done, and a scheduled one")
        done = {n["id"]: n for n in found if n["kind"] == "done"}
        late = {s["id"]: round(done[s["id"]]["at"] - s["at"], 3) for s in sent if done[s["id"]]["at"] - s["at"] >= 3.0}
        assert late == {}, "jobs done 3 s or more after their enqueue began: the service was not woken"
        seen = {n["id"] for n in found if n["kind"] == "middleware"}
        assert set(done) <= seen, "the middleware did not see every job"
        assert len([n for n in found if n["kind"] == "done"]) == len(done), "a job ran twice"

        checks = synced["checks"]
        if name != "redis":
            assert checks["rolled_after_rollback"] is False and checks["kept_before_commit"] is False
            assert checks["orders"] == ["o-2"]
            assert checks["rolled"] not in {n["id"] for n in found}
            assert done[sent[3]["id"]]["key"] == "committed"

        # the admin API and the CLI know the app: its types, its schedule; the site's types are unknown
        refused = httpx.post(f"{url}/admin/jobs", json={"job_type": "send_email", "payload": {}})
        assert refused.status_code in (400, 422) and "send_receipt" in refused.text
        listed = httpx.get(f"{url}/admin/schedules").json()["schedules"]
        assert [(s["name"], s["job_type"], s["origin"]) for s in listed] == [("every-second", "make_thumbnail", "code")]
        assert "make_thumbnail" in httpx.get(f"{url}/openapi.json").text
        jobs = json.loads(cli(folder, env, "--app", "shop:registry", "jobs", "--limit", "1000", "--json").stdout)["items"]
        assert {j["job_type"] for j in jobs} == {"send_receipt", "make_thumbnail"}
        assert not any(j["payload"] == {"order_id": "rolled-back"} for j in jobs)
        assert {j["status"] for j in jobs if j["id"] in ids} == {"completed"}

        assert service.stop() == 0
    finally:
        service.kill()


SHOP_TESTS = textwrap.dedent('''
    """The shop's own tests: its handlers run by the real engine, without a service."""
    import json
    import os

    import pipeline.testing
    from shop import Receipt, Thumbnail, registry


    def test_a_receipt_is_sent():
        record = pipeline.testing.run(registry, Receipt("t-1"))
        assert (record.status, record.job_type, record.attempts) == ("completed", "send_receipt", 1)


    def test_a_thumbnail_is_made_in_a_thread_and_the_middleware_sees_it():
        record = pipeline.testing.run(registry, Thumbnail("t-2"))
        assert record.status == "completed"
        with open(os.environ["SHOP_LOG"]) as f:
            noted = [json.loads(line) for line in f]
        assert {(n["kind"], n["id"]) for n in noted} >= {("middleware", record.id), ("done", record.id)}
''')


def test_the_shops_own_pytest_file_runs_its_handlers_with_pipeline_testing(tmp_path: Path) -> None:
    folder = tmp_path / "shop-app"
    folder.mkdir()
    (folder / "shop.py").write_text(SHOP)
    (folder / "test_shop.py").write_text(SHOP_TESTS)
    env = app_env(folder, "sqlite:///unused.db", SHOP_LOG=str(tmp_path / "shop.log"))
    # (without the plugins of this repository's own test tools, which a shop would not have: schemathesis's
    # and hypothesis's cost the run 1.7 s of CPU here)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:schemathesis",
                           "-p", "no:hypothesispytest", "test_shop.py"], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout
