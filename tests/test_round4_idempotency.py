"""Issue 32, item 7: an enqueue's commit outcome when the store drops mid-commit, and idempotency keys.

a) ``enqueue(..., idempotency_key=K)`` on every store: a second enqueue of the same type and key within
   JOB_IDEMPOTENCY_SECONDS answers the first job's id whatever became of it (even deleted), concurrent
   callers in two processes leave one job, a key past its window enqueues again, bad keys are refused,
   and the schema change reaches existing databases.
b) A connection dropped after the store committed, before its answer arrived (a TCP proxy of the test's
   own between the pipeline and Postgres or Redis, which drops the connection at that very moment): the
   enqueue answers the real outcome (asked again), never "retry later" for a job that was written.

Real stores (tests/backends/stores.py), real processes, real sockets."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import trio
from backends.stores import BACKENDS, on_each_store
from jobkit import Echo, registry

import pipeline
from pipeline import Config, open_pipeline
from pipeline.backends import open_backend
from pipeline.config import RetentionSettings, WorkerSettings
from pipeline.errors import UsageError

TESTS = Path(__file__).parent
ROOT = TESTS.parent


@pytest.fixture(params=sorted(BACKENDS))
async def store_config(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Config]:
    """A fresh store of each backend, whose pipelines claim nothing (the jobs stay as enqueued)."""
    async with BACKENDS[request.param](tmp_path) as config:
        yield config.replace(worker=WorkerSettings(enabled=False))


async def jobs_of(config: Config) -> list[str]:
    async with open_backend(config) as backend:
        return [job.id for job in (await backend.list(limit=1000))[0]]


# -- a) the key -----------------------------------------------------------------------------------------


async def test_a_second_enqueue_with_the_key_answers_the_first_job_whatever_its_status(store_config: Config) -> None:
    async with open_pipeline(store_config, registry()) as p:
        first = await p.enqueue(Echo("one"), idempotency_key="order-42")
        assert await p.enqueue(Echo("two"), idempotency_key="order-42") == first
        other = await p.enqueue(Echo("three"), idempotency_key="order-43")
        assert other != first
        # the job ended (cancelled here; completed or dead the same): the key still answers it
        await p.backend.cancel([first], reason="test")
        assert await p.enqueue(Echo("four"), idempotency_key="order-42") == first
        # and once retention (or an operator) removed it: the key outlives the job for its window
        await p.backend.delete(first)
        assert await p.backend.get(first) is None
        assert await p.enqueue(Echo("five"), idempotency_key="order-42") == first
        # enqueue_many: one key per job; a key held answers its job, two of one call the first's
        ids = await p.enqueue_many([Echo("a"), Echo("b"), Echo("c"), Echo("d")],
                                   idempotency_keys=["order-43", "new", "new", None])
        assert ids[0] == other and ids[1] == ids[2] and len({ids[1], ids[3], other}) == 3
        # the key and a unique key together: the key names the id the enqueue answered (the holder's)
        held = await p.enqueue(Echo("held"), unique_key="u")
        assert await p.enqueue(Echo("again"), unique_key="u", idempotency_key="with-unique") == held
        await p.backend.cancel([held], reason="test")  # frees the unique key; the idempotency key still names it
        assert await p.enqueue(Echo("again"), unique_key="u", idempotency_key="with-unique") == held
    stored = await jobs_of(store_config)
    assert first not in stored and len(stored) == 4, stored  # other, new, d, held, and nothing more


async def test_a_key_past_its_window_enqueues_again(store_config: Config) -> None:
    config = store_config.replace(retention=RetentionSettings(idempotency_seconds=0.3))
    async with open_pipeline(config, registry()) as p:
        first = await p.enqueue(Echo("one"), idempotency_key="k")
        assert await p.enqueue(Echo("one"), idempotency_key="k") == first
        with trio.fail_after(30):
            while (again := await p.enqueue(Echo("one"), idempotency_key="k")) == first:
                await trio.sleep(0.1)
        assert await p.enqueue(Echo("one"), idempotency_key="k") == again  # the new job's window


@pytest.mark.parametrize(("key", "says"), [
    ("", "must not be empty"), ("x" * 201, "at most 200"), ("bad\ud800", "surrogate"), (42, "must be a string"),
])
async def test_a_bad_key_is_refused_and_nothing_is_written(store_config: Config, key: object, says: str) -> None:
    async with open_pipeline(store_config, registry()) as p:
        with pytest.raises(UsageError, match=says) as raised:
            await p.enqueue(Echo("x"), idempotency_key=key)  # type: ignore[arg-type]
        assert "idempotency_key" in str(raised.value)
        with pytest.raises(UsageError, match="idempotency_keys must give one key"):
            await p.enqueue_many([Echo("x")], idempotency_keys=["a", "b"])
    assert await jobs_of(store_config) == []


RACER = """
import sys, trio
sys.path.insert(0, {tests!r})
from jobkit import Echo, registry
from pipeline import Config, open_pipeline
from pipeline.config import RedisSettings, WorkerSettings

async def main():
    config = Config(database_url={url!r}, worker=WorkerSettings(enabled=False),
                    redis=RedisSettings(allow_non_durable=True))
    async with open_pipeline(config, registry()) as p:
        print("ready", flush=True)
        # each line from the test is a round: its key, enqueued by {together} tasks at once; the
        # test hands a round to both racers together and waits for both answers before the next
        while key := (await trio.to_thread.run_sync(sys.stdin.readline)).strip():
            ids = []
            async with trio.open_nursery() as tn:
                async def one(n):
                    ids.append(await p.enqueue(Echo(f"{{key}} {{n}}"), idempotency_key=key))
                for n in range({together}):
                    tn.start_soon(one, n)
            print(key, " ".join(sorted(set(ids))), flush=True)

trio.run(main)
"""
RACE_ROUNDS = 25  # keys raced, one round each: with the check outside the store's transaction, 25 of 25 duplicated
RACE_TOGETHER = 3  # enqueues of a round's key in each racer at once


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(BACKENDS))
async def test_two_processes_racing_with_one_key_leave_one_job(kind: str, tmp_path: Path) -> None:
    """Two processes enqueue each key at the same moment (released together by the test, round by
    round: a racer reads its round's key from its stdin, so neither runs ahead of the other), a few
    tasks each: every round leaves one job, which every enqueue of its key answered. Checked against
    the check made before the store's transaction (a read, then the insert), on SQLite and Postgres:
    it fails (duplicates in most rounds) where the old test, whose racers started apart, passed."""
    async with BACKENDS[kind](tmp_path) as config:
        async with open_backend(config):
            pass  # migrated before the racers start
        script = RACER.format(tests=str(TESTS), url=config.database_url, together=RACE_TOGETHER)
        racers = [subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, bufsize=1) for _ in range(2)]
        try:
            def line_of(racer: subprocess.Popen[str]) -> list[str]:
                line = racer.stdout.readline()  # type: ignore[union-attr]
                assert line, racer.stderr.read()  # type: ignore[union-attr]
                return line.split()

            with trio.fail_after(120):
                for racer in racers:
                    assert await trio.to_thread.run_sync(line_of, racer) == ["ready"]
                answers: dict[str, set[str]] = {}
                for n in range(RACE_ROUNDS):
                    key = f"race-{n}"
                    for racer in racers:  # (both wake within microseconds: each blocks on its stdin meanwhile)
                        racer.stdin.write(key + "\n")  # type: ignore[union-attr]
                        racer.stdin.flush()  # type: ignore[union-attr]
                    for racer in racers:
                        said, *ids = await trio.to_thread.run_sync(line_of, racer)
                        assert said == key
                        answers.setdefault(key, set()).update(ids)
                for racer in racers:
                    racer.stdin.close()  # type: ignore[union-attr]
                    assert await trio.to_thread.run_sync(racer.wait) == 0, racer.stderr.read()  # type: ignore[union-attr]
        finally:
            for racer in racers:
                if racer.poll() is None:
                    racer.kill()
                    racer.wait()
        raced = {key: ids for key, ids in answers.items() if len(ids) != 1}
        assert not raced, f"{len(raced)} of {RACE_ROUNDS} keys answered more than one job: {raced}"
        stored = await jobs_of(config)
        assert sorted(stored) == sorted(id_ for ids in answers.values() for id_ in ids)


async def test_existing_databases_get_the_keys_table(tmp_path: Path) -> None:
    """An SQLite file and a Postgres schema at the version before: opening them migrates them."""
    import sqlite3

    async with BACKENDS["sqlite"](tmp_path) as config:
        async with open_backend(config):
            pass
        conn = sqlite3.connect(config.database_path)
        conn.execute("DROP TABLE idempotency_keys")
        conn.execute("DELETE FROM schema_migrations WHERE version = 16")
        conn.commit()
        conn.close()
        async with open_pipeline(config.replace(worker=WorkerSettings(enabled=False)), registry()) as p:
            first = await p.enqueue(Echo("x"), idempotency_key="k")
            assert await p.enqueue(Echo("y"), idempotency_key="k") == first
    async with BACKENDS["postgres"](tmp_path / "pg") as config:
        import psycopg

        async with open_backend(config):
            pass
        with psycopg.connect(config.database_url, autocommit=True) as pg:
            pg.execute("DROP TABLE idempotency_keys")
            pg.execute("DELETE FROM pipeline_migrations WHERE version = 10")
        async with open_pipeline(config.replace(worker=WorkerSettings(enabled=False)), registry()) as p:
            first = await p.enqueue(Echo("x"), idempotency_key="k")
            assert await p.enqueue(Echo("y"), idempotency_key="k") == first


# -- b) the connection drops after the commit, before its answer --------------------------------------------


class DropAfterCommit:
    """A TCP proxy on a free loopback port in front of a server: it forwards both ways, and once the
    client has sent ``marker`` it drops that connection (both sockets) as soon as the server says the
    transaction is over (Postgres: ReadyForQuery, idle; Redis: any reply): the commit happened, and its
    answer is lost. ``refuse``: every other connection is dropped with it, and those made after are
    closed at once (the store stays away)."""

    def __init__(self, host: str, port: int, marker: bytes, *, postgres: bool, refuse: bool = False) -> None:
        self.target = (host, port)
        self.marker = marker
        self.postgres = postgres
        self.refuse = refuse
        self.dropped = threading.Event()
        self.open: list[socket.socket] = []  # every socket of the connections made (refuse: all closed at the drop)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.refuse and self.dropped.is_set():
                client.close()
                continue
            server = socket.create_connection(self.target)
            self.open += (client, server)
            seen = threading.Event()
            threading.Thread(target=self._pipe, args=(client, server, seen, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, seen, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, seen: threading.Event, upstream: bool) -> None:
        try:
            while data := src.recv(65536):
                if upstream and not self.dropped.is_set() and self.marker in data:
                    seen.set()
                if not upstream and seen.is_set() and not self.dropped.is_set() and (
                        not self.postgres or b"Z\x00\x00\x00\x05I" in data):
                    self.dropped.set()
                    for s in (src, dst, *(self.open if self.refuse else ())):
                        try:
                            s.shutdown(socket.SHUT_RDWR)
                            s.close()
                        except OSError:
                            pass  # closed already
                    return
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()


def through(url: str, port: int, *, postgres: bool) -> str:
    parts = urlsplit(url)
    netloc = f"{parts.username + '@' if parts.username else ''}127.0.0.1:{port}"
    query = parts.query + ("&sslmode=disable" if postgres else "")
    return urlunsplit(parts._replace(netloc=netloc, query=query))


SERVER_STORES = ["postgres", "redis"]


@pytest.mark.parametrize("key", [None, "drop-key"], ids=["plain", "with-key"])
@pytest.mark.parametrize("kind", SERVER_STORES)
async def test_a_commit_whose_answer_is_lost_answers_its_real_outcome(kind: str, key: str | None, tmp_path: Path) -> None:
    async with BACKENDS[kind](tmp_path) as config:
        parts = urlsplit(config.database_url)
        proxy = DropAfterCommit(parts.hostname or "127.0.0.1", parts.port or (5432 if kind == "postgres" else 6379),
                                b"drop-at-commit", postgres=kind == "postgres")
        try:
            dropping = config.replace(database_url=through(config.database_url, proxy.port, postgres=kind == "postgres"),
                                      worker=WorkerSettings(enabled=False))
            async with open_pipeline(dropping, registry()) as p:
                job_id = await p.enqueue(Echo("drop-at-commit"), idempotency_key=key)
                assert proxy.dropped.is_set()  # the answer was lost on the way
                record = await p.backend.get(job_id)
                assert record is not None and record.status == "pending"
                if key is not None:  # and the retry the key makes safe answers the same job
                    assert await p.enqueue(Echo("drop-at-commit again"), idempotency_key=key) == job_id
            assert await jobs_of(config) == [job_id]
        finally:
            proxy.close()


@pytest.mark.parametrize("kind", SERVER_STORES)
async def test_a_commit_whose_answer_is_lost_and_cannot_be_asked_says_it_may_have_been_committed(
        kind: str, tmp_path: Path) -> None:
    async with BACKENDS[kind](tmp_path) as config:
        parts = urlsplit(config.database_url)
        proxy = DropAfterCommit(parts.hostname or "127.0.0.1", parts.port or (5432 if kind == "postgres" else 6379),
                                b"drop-at-commit", postgres=kind == "postgres", refuse=True)
        try:
            dropping = config.replace(database_url=through(config.database_url, proxy.port, postgres=kind == "postgres"),
                                      worker=WorkerSettings(enabled=False))
            async with open_pipeline(dropping, registry()) as p:
                with pytest.raises(pipeline.errors.CommitUnknown, match="may have been committed") as raised:
                    await p.enqueue(Echo("drop-at-commit"))
                proxy.refuse = False  # the store is back, for the pipeline's own stop
            (job_id,) = raised.value.job_ids
            assert f"jobs show {job_id}" in str(raised.value) and "idempotency_key" in str(raised.value)
            assert await jobs_of(config) == [job_id]  # it had been: the error said how to find out
        finally:
            proxy.close()


# -- the public name ------------------------------------------------------------------------------------


def test_commit_unknown_is_a_public_name_in_the_exception_tree() -> None:
    """A caller catches it as ``pipeline.CommitUnknown`` (the docs name it), a StoreError like the
    'retry later' it refines, and the errors module's tree draws it."""
    assert "CommitUnknown" in pipeline.__all__
    assert pipeline.CommitUnknown is pipeline.errors.CommitUnknown
    assert issubclass(pipeline.CommitUnknown, pipeline.StoreError)
    tree = pipeline.errors.__doc__ or ""
    assert any(line.split("──")[-1].split()[0] == "CommitUnknown" for line in tree.splitlines() if "──" in line), tree


# -- the CLI (real `python -m pipeline` processes, on each store) -----------------------------------------


async def cli(config: Config, folder: Path, *argv: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ADMIN_", "WORKER_", "LOG_", "DATABASE_", "JOB_"))}
    env.update(DATABASE_URL=config.database_url, REDIS_ALLOW_NON_DURABLE="true",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    return await trio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "pipeline", *argv], env=env, input=input, capture_output=True, text=True, timeout=60,
        cwd=folder))


@pytest.mark.slow
async def test_the_cli_enqueues_once_per_idempotency_key_and_says_so(tmp_path: Path) -> None:
    """`enqueue TYPE --idempotency-key K` twice: one job, the second run prints its id (exit 0) and says
    the key answered; a bad key exits 2 naming the flag and writes nothing; `--from-file` lines with
    "idempotency_key" (SQLite and Postgres) are answered by their keys like the flag (SQLite's bulk load
    inserted them as plain rows: three jobs where one was due), and Redis's bulk load refuses them,
    naming the key and the way out, with nothing of the file loaded."""
    async def scenario(name: str, config: Config, folder: Path) -> None:
        first = await cli(config, folder, "enqueue", "generate_sitemap", "--idempotency-key", "nightly-7", "--json")
        assert first.returncode == 0, first.stderr
        created = json.loads(first.stdout)
        assert created["duplicate"] is False
        again = await cli(config, folder, "enqueue", "generate_sitemap", "--idempotency-key", "nightly-7",
                          "--priority", "1")
        assert again.returncode == 0, again.stderr
        assert again.stdout.strip() == created["id"]
        assert "duplicate" in again.stderr and "idempotency key 'nightly-7'" in again.stderr, again.stderr
        assert "nothing was inserted" in again.stderr and "unique key None" not in again.stderr
        as_json = await cli(config, folder, "enqueue", "generate_sitemap", "--idempotency-key", "nightly-7", "--json")
        assert as_json.returncode == 0, as_json.stderr
        assert json.loads(as_json.stdout) == {**created, "duplicate": True}
        assert await jobs_of(config) == [created["id"]]

        for bad, words in (("", "must not be empty"), ("x" * 201, "at most 200")):
            refused = await cli(config, folder, "enqueue", "generate_sitemap", "--idempotency-key", bad)
            assert refused.returncode == 2, refused.stderr
            assert "--idempotency-key" in refused.stderr and words in refused.stderr, refused.stderr
        assert await jobs_of(config) == [created["id"]]

        lines = [{"job_type": "generate_sitemap", "idempotency_key": "nightly-7"},  # answered by the first job
                 {"job_type": "generate_sitemap", "idempotency_key": "weekly-1"},
                 {"job_type": "generate_sitemap", "idempotency_key": "weekly-1"},  # answered by the line before
                 {"job_type": "generate_sitemap"}]
        text = "".join(json.dumps(line) + "\n" for line in lines)
        loaded = await cli(config, folder, "enqueue", "--from-file", "-", "--json", input=text)
        if name == "redis":
            assert loaded.returncode == 2, loaded.stderr
            said = loaded.stderr
            assert "idempotency_key 'nightly-7'" in said and "--from-file" in said and "--idempotency-key" in said, said
            assert "nothing was enqueued" in said, said
            assert await jobs_of(config) == [created["id"]]  # nothing of the file, not even its plain line
            # in parts: those committed before the keyed line are kept, and the message says how many
            parted = await cli(config, folder, "enqueue", "--from-file", "-", "--commit-every", "1",
                               input="".join(json.dumps(line) + "\n" for line in (lines[3], lines[3], lines[1])))
            assert parted.returncode == 2 and "the 2 jobs before it were enqueued" in parted.stderr, parted.stderr
            assert len(await jobs_of(config)) == 3
            return
        assert loaded.returncode == 0, loaded.stderr
        report = json.loads(loaded.stdout)
        assert (report["enqueued"], report["duplicates"]) == (2, 2), report
        ids = report["job_ids"]
        assert ids[0] == created["id"] and ids[1] == ids[2] and len(set(ids)) == 3
        assert len(await jobs_of(config)) == 3
        plain = await cli(config, folder, "enqueue", "--from-file", "-", input=json.dumps(lines[2]) + "\n")
        assert plain.returncode == 0, plain.stderr
        assert "enqueued 0 jobs" in plain.stdout and "idempotency key" in plain.stdout, plain.stdout
        assert len(await jobs_of(config)) == 3

    await on_each_store(tmp_path, scenario)


# -- the admin API (served for real on a loopback port, on each store) ---------------------------------------


async def test_the_admin_api_answers_a_second_post_with_the_key_as_a_duplicate(store_config: Config) -> None:
    """POST /admin/jobs with "idempotency_key" twice: 201, then 200 with the same job and "duplicate":
    true (the unique key's shape); once the job is gone (retention, an operator) the key still
    answers its id, 200 {"id", "duplicate": true} (it was a 404 "no job with id": a client retrying
    a lost answer read it as a failure); a bad key is 422 naming the field, nothing stored; the
    OpenAPI document lists the field and both answers."""
    import httpx
    from admin_harness import seed_registry

    from pipeline.admin import run_admin_server
    from pipeline.config import AdminSettings

    config = store_config.replace(admin=AdminSettings(port=0))
    async with open_pipeline(config, seed_registry()) as p, trio.open_nursery() as tn:
        stop = trio.Event()
        url = await tn.start(run_admin_server, p, None, stop.wait)
        async with httpx.AsyncClient(base_url=url, headers={"Content-Type": "application/json"}, timeout=30) as client:
            body = {"job_type": "generate_sitemap", "idempotency_key": "nightly-7"}
            first = await client.post("/admin/jobs", json=body)
            assert first.status_code == 201, first.text
            assert first.json()["duplicate"] is False
            job_id = first.json()["id"]
            again = await client.post("/admin/jobs", json={**body, "priority": 1})
            assert again.status_code == 200, again.text
            assert again.json() == {**first.json(), "duplicate": True}  # the first job, unchanged
            assert again.headers["location"] == f"/admin/jobs/{job_id}"
            assert (await client.get("/admin/jobs")).json()["total"] == 1

            await p.backend.delete(job_id)  # removed (retention, an operator): the key outlives it
            assert await p.backend.get(job_id) is None
            gone = await client.post("/admin/jobs", json=body)
            assert gone.status_code == 200, gone.text
            assert gone.json() == {"id": job_id, "duplicate": True}
            assert gone.headers["location"] == f"/admin/jobs/{job_id}"
            assert (await client.get("/admin/jobs")).json()["total"] == 0

            for bad in ("", 7, "x" * 201, "a\u0000b"):  # (a lone surrogate: 400 for the whole body, as anywhere)
                r = await client.post("/admin/jobs", content=json.dumps({"job_type": "generate_sitemap",
                                                                          "idempotency_key": bad}))
                assert r.status_code == 422, (bad, r.text)
                assert "idempotency_key" in r.json()["error"]["message"], r.text
            assert (await client.get("/admin/jobs")).json()["total"] == 0

            schemas = (await client.get("/openapi.json")).json()["components"]["schemas"]
            field = schemas["NewJob"]["properties"]["idempotency_key"]
            assert (field["type"], field["minLength"], field["maxLength"]) == ("string", 1, 200)
            duplicate = schemas["EnqueuedJob"]["allOf"][1]["properties"]["duplicate"]["description"]
            assert "idempotency key" in duplicate, duplicate
            assert set(schemas["EnqueuedJobRemoved"]["required"]) == {"id", "duplicate"}
        stop.set()


# -- expired keys are removed as fast as they come ----------------------------------------------------------


async def keys_stored(config: Config) -> int:
    if config.database_url.startswith("postgresql"):
        import psycopg

        def count() -> int:
            with psycopg.connect(config.database_url) as conn:
                return int(conn.execute("SELECT count(*) FROM idempotency_keys").fetchone()[0])  # type: ignore[index]
    else:
        import sqlite3

        def count() -> int:
            db = sqlite3.connect(config.database_path)
            try:
                return int(db.execute("SELECT count(*) FROM idempotency_keys").fetchone()[0])
            finally:
                db.close()
    return await trio.to_thread.run_sync(count)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_expired_keys_go_as_fast_as_keys_come_in_calls_of_many(kind: str, tmp_path: Path) -> None:
    """Each insert that records keys removed at most 4 expired ones, per call: enqueue_many with 50
    keys (or 50 single enqueues the SQLite Ledger writes in one transaction) recorded 50 and removed
    4, so the table grew by 46 a call for ever. Now a call removes up to twice what it records."""
    async with BACKENDS[kind](tmp_path) as config:
        config = config.replace(worker=WorkerSettings(enabled=False),
                                retention=RetentionSettings(idempotency_seconds=0.05))
        async with open_pipeline(config, registry()) as p:
            for n in range(8):
                await p.enqueue_many([Echo(f"{n}.{i}") for i in range(50)],
                                     idempotency_keys=[f"round-{n}-{i}" for i in range(50)])
                await trio.sleep(0.1)  # this round's keys expire (the window is 0.05 s)
            await p.enqueue_many([Echo("last")], idempotency_keys=["last"])
        # the 50 of each round are gone within the next round: what is left is the last round's 50 and
        # the last key; at 4 a call it was 8 x 50 - 8 x 4 + 1 = 369 (less what the Ledger batched apart)
        assert await keys_stored(config) <= 60


# -- Postgres: a key whose first enqueue has not committed yet ------------------------------------------------


@pytest.mark.parametrize("first_ends", ["commit", "rollback"])
async def test_postgres_an_enqueue_waits_for_the_open_transaction_holding_its_key(first_ends: str, tmp_path: Path) -> None:
    """While another transaction has taken the key and not yet committed, a second enqueue of it
    waits (the primary key's lock), neither answering nor inserting; that transaction commits: the
    second answers its job; it rolls back: the second inserts its own."""
    import psycopg

    from pipeline.backends.postgres import store as pg_store

    async with BACKENDS["postgres"](tmp_path) as config:
        config = config.replace(worker=WorkerSettings(enabled=False))
        async with open_pipeline(config, registry()) as p:
            row = p.new_job(Echo("first"), idempotency_key="open")
            conn = psycopg.connect(config.database_url)
            try:
                tx = conn.transaction()
                tx.__enter__()
                (first,) = pg_store.insert_idempotent(conn, [row], lambda c, rows: pg_store.insert_jobs(c, rows, notify=False))
                answers: list[str] = []

                async def second() -> None:
                    answers.append(await p.enqueue(Echo("second"), idempotency_key="open"))

                async with trio.open_nursery() as tn:
                    tn.start_soon(second)
                    with psycopg.connect(config.database_url, autocommit=True) as watch, trio.fail_after(30):
                        while not watch.execute("SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                                "AND query LIKE '%%idempotency_keys%%'").fetchone():
                            await trio.sleep(0.02)
                    assert answers == []  # waiting on the key, not answered
                    if first_ends == "commit":
                        tx.__exit__(None, None, None)
                    else:
                        tx.__exit__(RuntimeError, RuntimeError("rolled back"), None)
                    conn.commit()
            finally:
                conn.close()
            stored = await jobs_of(config)
            if first_ends == "commit":
                assert answers == [first] and stored == [first]
            else:
                assert answers != [first] and stored == answers


# -- an enqueue without a key pays nothing for keys ------------------------------------------------------------


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What this process sends Postgres, recorded on the real connections (psycopg's Cursor.execute)."""
    import psycopg

    sent: list[str] = []  # "<the connection's options> <the statement>" (other tests' schemas are made meanwhile)
    execute = psycopg.Cursor.execute

    def recording(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(f"{self.connection.info.get_parameters().get('options', '')} "
                    f"{query if isinstance(query, str) else repr(query)}")
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", recording)
    return sent


async def test_an_enqueue_without_a_key_sends_nothing_for_keys(store_config: Config, statements: list[str]) -> None:
    """A plain enqueue's statements (SQLite: the Ledger's connection traced; Postgres: every statement
    this process sends; Redis: MONITOR on a connection of its own) are the ones it sent before keys
    existed: none names the keys' table or script, and there are as many as for a plain enqueue made
    once keys were used (a sweep or a look-up on every insert would add some). A keyed enqueue, for
    contrast, is seen using them."""
    from pipeline.backends.redis.scripts import ALL

    kind = store_config.database_url.split(":", 1)[0].removesuffix("ql")  # sqlite, postgres(ql), redis
    async with open_pipeline(store_config, registry()) as p:
        await p.enqueue(Echo("warm"))  # (connections, scripts loaded)
        seen: list[str] = []
        if kind == "sqlite":
            def trace(conn: Any) -> None:
                conn.set_trace_callback(seen.append)
            await p.backend._db.write(trace)  # type: ignore[attr-defined]
            sent = seen
        elif kind == "redis":
            import redis as redis_py

            monitor_client = redis_py.Redis.from_url(store_config.database_url.split("?", 1)[0])
            monitor = monitor_client.monitor()
            monitor.__enter__()
            started = trio.Event()
            token = trio.lowlevel.current_trio_token()

            def listen() -> None:
                try:
                    for command in monitor.listen():
                        trio.from_thread.run_sync(started.set, trio_token=token)
                        seen.append(command["command"])
                except (redis_py.RedisError, OSError, trio.RunFinishedError):
                    pass  # the monitor closed at the test's end

            threading.Thread(target=listen, daemon=True).start()
            monitor_client.ping()
            with trio.fail_after(30):
                while not started.is_set():
                    await trio.to_thread.run_sync(monitor_client.ping)
                    await trio.sleep(0.02)
            sent = seen
        else:
            sent = statements
            schema = store_config.database_url.rsplit("search_path%3D", 1)[1]

        async def echoed() -> None:
            """(Redis) every command sent before this call is in ``seen``: the monitor has echoed a marker
            sent after them (a fixed sleep was too short for a loaded machine's monitor)."""
            if kind != "redis":
                await trio.sleep(0.1)
                return
            marker = f"marker-{uuid.uuid4().hex}"
            await trio.to_thread.run_sync(monitor_client.echo, marker)
            with trio.fail_after(30):
                while not any(marker in c for c in list(seen)):
                    await trio.sleep(0.01)

        async def sent_by(**kwargs: Any) -> list[str]:
            await echoed()  # (what came before, out of the way)
            sent.clear()
            await p.enqueue(Echo("x"), **kwargs)
            await echoed()
            # what an insert sends (the pipeline's other actors write now and then meanwhile)
            if kind == "redis":
                inserts = {ALL[name].sha for name in ALL if name.startswith("insert")}
                prefix = store_config.database_url.rsplit("prefix=", 1)[1].split("&", 1)[0]  # (other tests' commands)
                return [c for c in sent if c.upper().startswith("EVALSHA") and any(sha in c for sha in inserts)
                        and prefix in c]
            mine = [s for s in sent if kind == "sqlite" or schema in s.split(" ", 1)[0]]
            return [s for s in mine if "INSERT" in s.upper() or "idempotency" in s]

        plain_before = await sent_by()
        keyed = await sent_by(idempotency_key="k")
        plain_after = await sent_by()
        if kind == "redis":
            monitor.__exit__(None, None, None)
            marks = (ALL["insert_idempotent"].sha,)
        else:
            marks = ("idempotency_keys",)
        assert any(mark in s for s in keyed for mark in marks), keyed
        for plain in (plain_before, plain_after):
            assert not any(mark in s for s in plain for mark in marks), plain
        assert len(plain_before) == len(plain_after), [[s[:100] for s in ss] for ss in (plain_before, plain_after)]
