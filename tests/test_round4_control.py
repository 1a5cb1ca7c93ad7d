"""Issue 32, control: bulk actions that walk a list shifting under them, a bad id on every admin route,
the listeners' pings, and /healthz naming a silent worker. Real stores (tests/backends/stores.py), the
admin API served for real on a loopback port."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from admin_harness import seed_registry
from backends.stores import BACKENDS
from conftest import fast_config

from pipeline import Config, control
from pipeline.backends import Backend, open_backend
from pipeline.backends.base import Settlement
from pipeline.requests import JobRequest, prepare_rows
from pipeline.states import Transition

OWNER = "elsewhere:4242:abcdef"  # a worker process of another machine: it holds the running jobs


@pytest.fixture(params=sorted(BACKENDS))
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Config]:
    """A fresh store of each backend, with the admin API on a free port and no workers."""
    async with BACKENDS[request.param](tmp_path) as config:
        yield config.replace(admin=fast_config(tmp_path / "x.db", admin_port=0).admin,
                             worker=fast_config(tmp_path / "x.db", worker_enabled=False).worker)


def rows(*requests: JobRequest) -> list[Any]:
    return prepare_rows(seed_registry(), requests)


# -- bulk actions over a list that shifts ------------------------------------------------------------


class Shifting:
    """A backend whose third list call first runs ``meanwhile``: jobs at the head of the list end
    between two pages, as a worker's outcomes do while an operator's bulk cancel walks the list."""

    def __init__(self, backend: Backend, meanwhile: Any) -> None:
        self.backend = backend
        self.meanwhile = meanwhile
        self.lists = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    async def list(self, **kwargs: Any) -> Any:
        self.lists += 1
        if self.lists == 3:
            await self.meanwhile()
        return await self.backend.list(**kwargs)


async def test_bulk_cancel_reaches_every_running_job_while_some_end_between_pages(store: Config) -> None:
    """30 running jobs, bulk cancel 10 a page; the 3 newest (asked first) end after the second page.
    Before issue 32 the offset walked past 3 jobs the shift carried below it: they ran on with no cancel
    requested, and the report said "cancelled 0 of 27 ...; 27 running: cancel requested"."""
    async with open_backend(store) as backend:
        await backend.insert(rows(*(JobRequest("send_email", {"to": f"r{i}@example.com", "subject": "s", "body": "b"})
                                    for i in range(30))))
        leases = await backend.claim({"send_email": 30}, owner=OWNER, lease_seconds=3600)
        assert len(leases) == 30
        newest = sorted(leases, key=lambda lease: lease.id)[-3:]

        async def finish() -> None:
            assert await backend.settle([Settlement(lease.id, lease.token, Transition.SUCCEED) for lease in newest]) == [True] * 3

        shifting = Shifting(backend, finish)
        with trio.fail_after(20):
            outcome = await control.bulk(shifting, control.JobFilter("cancel", "running", "send_email"), batch=10)
        assert shifting.lists >= 3  # the jobs did end in the middle of the walk
        still_running = {lease.id for lease in leases} - {lease.id for lease in newest}
        assert {job_id for job_id, _ in await backend.cancel_requests(OWNER)} == still_running  # none left unasked
        assert (outcome.matched, outcome.requested, outcome.done, outcome.skipped) == (30, 30, 0, 0)
        assert outcome.text().startswith("cancelled 0 of 30 running jobs of type send_email; 30 running: cancel requested")


async def test_bulk_retry_reaches_every_dead_job_while_some_are_removed_between_pages(store: Config) -> None:
    """The same walk for retry: 30 dead jobs whose retry is refused (pending jobs hold their unique keys),
    so they stay dead, still matching; the 3 newest are deleted after the second page. Each of the 30 is
    tried once and counted skipped, with the reason."""
    async with open_backend(store) as backend:
        await backend.insert(rows(*(JobRequest("generate_sitemap", {}, unique_key=f"k{i}") for i in range(30))))
        leases = await backend.claim({"generate_sitemap": 30}, owner=OWNER, lease_seconds=3600)
        assert await backend.settle([Settlement(lease.id, lease.token, Transition.BURY, error="boom") for lease in leases]) == [True] * 30
        await backend.insert(rows(*(JobRequest("generate_sitemap", {}, unique_key=f"k{i}") for i in range(30))))
        newest = sorted(lease.id for lease in leases)[-3:]
        tried: list[str] = []

        async def remove() -> None:
            for job_id in newest:
                await backend.delete(job_id)

        shifting = Shifting(backend, remove)

        async def revive(job_id: str) -> Any:
            tried.append(job_id)
            return await backend.revive(job_id)

        shifting.revive = revive  # type: ignore[attr-defined]
        with trio.fail_after(20):
            outcome = await control.bulk(shifting, control.JobFilter("retry", "dead", "generate_sitemap"), batch=10)
        assert sorted(tried) == sorted(lease.id for lease in leases)  # each tried, once
        assert (outcome.matched, outcome.done, outcome.skipped) == (30, 0, 30)
        assert outcome.reasons and "k" in outcome.reasons[0]
        assert json.loads(json.dumps(outcome.to_json()))["matched"] == 30


async def test_bulk_cancel_of_a_large_pending_backlog_reads_each_page_once(store: Config) -> None:
    """The cursor costs nothing when nothing shifts: 25 pending jobs cancelled 10 a page take 3 cancels
    and 4 lists (the last one empty), as the offset walk did."""
    async with open_backend(store) as backend:
        await backend.insert(rows(*(JobRequest("generate_sitemap", {}) for _ in range(25))))
        shifting = Shifting(backend, trio.lowlevel.checkpoint)
        outcome = await control.bulk(shifting, control.JobFilter("cancel", "pending"), batch=10)
        assert (outcome.matched, outcome.done) == (25, 25)
        assert shifting.lists == 4


# -- an id or a name that no store can hold -----------------------------------------------------------

ID_ROUTES = [("GET", "/admin/jobs/{}"), ("DELETE", "/admin/jobs/{}"), ("POST", "/admin/jobs/{}/retry"),
             ("POST", "/admin/jobs/{}/cancel"), ("GET", "/admin/batches/{}"), ("POST", "/admin/types/{}/pause"),
             ("POST", "/admin/types/{}/resume"), ("DELETE", "/admin/schedules/{}"),
             ("POST", "/admin/schedules/{}/pause"), ("POST", "/admin/schedules/{}/resume")]


async def test_an_id_or_name_with_nul_is_404_or_422_on_every_admin_route(store: Config) -> None:
    """Postgres's text holds no NUL: asked about such an id, the API answered 503 "database unavailable"
    (as if the store were down). Now every route that takes an id or a name answers as for any unknown
    one (404), and filters and parent ids with a NUL are refused (422), on every store alike."""
    from urllib.parse import quote

    from test_admin_api import assert_error, served

    async with served(store) as (_, client):
        job = (await client.post("/admin/jobs", json={"job_type": "generate_sitemap"})).json()
        for text in ("\x00", "a\x00b", job["id"] + "\x00"):
            for method, path in ID_ROUTES:
                r = await client.request(method, path.format(quote(text, safe="")))
                assert r.status_code == 404, (method, path, repr(text), r.status_code, r.text)
                assert r.json()["error"]["code"] == "not_found"
            listed = await client.get("/admin/jobs", params={"job_type": text})
            assert listed.status_code == 200 and listed.json()["total"] == 0, listed.text
            for action, status in (("cancel", "pending"), ("retry", "dead"), ("delete", "dead")):
                assert_error(await client.post(f"/admin/jobs/{action}", json={"job_type": text, "status": status}),
                             422, "NUL")
            assert_error(await client.post("/admin/jobs", json={"job_type": "generate_sitemap", "after": [text]}),
                         422, "NUL")
        # nothing was harmed: the job is there, the store answers
        assert (await client.get(f"/admin/jobs/{job['id']}")).json()["status"] == "pending"
        assert (await client.get("/healthz")).status_code == 200


async def test_the_cli_refuses_a_parent_id_with_nul_from_a_file(store: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capfd: pytest.CaptureFixture[str]) -> None:
    """The CLI's ids come from argv (no NUL can be there; bytes that are not UTF-8 are refused) or from
    a file: `enqueue --from-file` with such a parent exits 2 naming it, where Postgres said "error:
    database ...: PostgreSQL text fields cannot contain NUL (0x00) bytes" and exited 1."""
    import io

    from pipeline.cli import main

    monkeypatch.setenv("DATABASE_URL", store.database_url)
    monkeypatch.setenv("REDIS_ALLOW_NON_DURABLE", "true")
    lines = tmp_path / "jobs.jsonl"
    lines.write_text(json.dumps({"job_type": "generate_sitemap", "payload": {}, "after": ["a\x00b"]}) + "\n")
    out = io.StringIO()
    code = await trio.to_thread.run_sync(lambda: main(["enqueue", "--from-file", str(lines)], stdout=out))
    assert code == 2
    assert "NUL" in capfd.readouterr().err
    async with open_backend(store) as backend:
        assert (await backend.list())[1] == 0  # nothing stored


# -- the listener's ping ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [name for name in ("postgres", "redis") if name in BACKENDS])
async def test_a_healthy_listener_keeps_its_connection_through_many_pings(name: str, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A quiet listener pings its connection every LISTENER_PING_INTERVAL s; the answer must clear the
    pending ping. If it did not (a receive that does not report the pong), every healthy listener was
    torn down a deadline after its first ping (every 20 s in production) and /healthz flapped. Here the
    interval is 0.05 s and the deadline generous (3 s: a loaded machine answers late): five pings must
    pass on one connection, and /healthz never names the listener."""
    import importlib

    from pipeline import Registry, open_pipeline
    from pipeline.backends import batches

    monkeypatch.setattr(batches, "LISTENER_PING_INTERVAL", 0.05)
    monkeypatch.setattr(batches, "LISTENER_PING_DEADLINE", 3.0)
    module = importlib.import_module(f"pipeline.backends.{name}.listener")
    connect_name = "_listening" if name == "postgres" else "_subscribed"
    pings, connects = [0], [0]
    real_ping, real_connect = module._ping, getattr(module, connect_name)

    async def counted_ping(conn: Any) -> None:
        pings[0] += 1
        await real_ping(conn)

    def counted_connect(*args: Any) -> Any:
        connects[0] += 1
        return real_connect(*args)

    monkeypatch.setattr(module, "_ping", counted_ping)
    monkeypatch.setattr(module, connect_name, counted_connect)
    registry = Registry()
    registry.register("noop", Wake, _noop)
    async with BACKENDS[name](tmp_path) as config, open_pipeline(config, registry) as p:
        flapped: list[str] = []

        async def watch() -> None:
            while True:
                flapped.extend(r for r in p.health.reasons(trio.current_time()) if r.startswith("listener"))
                await trio.sleep(0.01)

        async with trio.open_nursery() as tn:
            tn.start_soon(watch)
            with trio.fail_after(30):
                while pings[0] < 6 and connects[0] < 2:  # stops at once when the connection is given up
                    await trio.sleep(0.01)
            tn.cancel_scope.cancel()
        assert connects[0] == 1, f"the listener connected {connects[0]} times in {pings[0]} pings: a ping's answer was not heard"
        assert not flapped, flapped


@attrs.frozen
class Wake:
    n: int = 0


async def _noop(job: Wake, ctx: Any) -> None:
    return None


# -- /healthz and a silent worker process -----------------------------------------------------------


async def test_healthz_names_a_silent_worker_process_after_5_s_well_before_it_is_killed(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    """docs/operating.md: /healthz names a worker process that has sent no report for 5 s; the supervisor
    ends it at 10 s (SILENCE_LIMIT). A /healthz that named it only as it was about to be killed (at the
    limit) said nothing for the whole of the hang. A real process that never reports (sleep), the
    supervisor's own watchdog, and /healthz's reasons as the admin API reads them, on a mock clock."""
    import signal

    from pipeline import supervisor
    from pipeline.engine.health import Health

    sup = supervisor.Supervisor(fast_config(tmp_path / "x.db"), 1, ["true"])
    assert sup.silence_limit == 10.0  # the documented limit: named from 5 s
    (child,) = sup.children
    process = await trio.lowlevel.open_process(["sleep", "600"])
    try:
        t0 = trio.current_time()
        child.process, child.reported_at, child.ready = process, t0, True
        health = Health(others=sup.health)  # as supervise() hooks it into its pipeline's /healthz
        async with trio.open_nursery() as tn:
            tn.start_soon(sup._watchdog, child, process, trio.CancelScope())
            await trio.sleep(4.5)
            assert health.reasons(trio.current_time()) == []
            await trio.sleep(1.0)  # 5.5 s without a report
            assert process.poll() is None  # not killed yet
            assert health.reasons(trio.current_time()) == [
                f"worker process 0 (pid {process.pid}) has sent no report for 6 s (hung?)"]  # (5.5, rounded)
        # the watchdog ended it once the limit was up (its task returned after the SIGKILL)
        assert trio.current_time() - t0 > 10.0 and await process.wait() == -signal.SIGKILL
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
