"""Issue 32, item 7 (review): "nothing was written" is said only once the dropped session cannot write.

When Postgres drops an enqueue's connection mid-commit, the pipeline asks again on a new connection
whether the jobs are stored (tests/test_round4_idempotency.py). A look that finds nothing proves nothing
while the dropped connection's server session still lives: its INSERT may be waiting for a lock (or the
server has not yet noticed its client is gone), and it commits after the look, so the "enqueueing again is
safe" it answered made a duplicate. The ask now ends that session first (pg_terminate_backend: a session's
open transaction rolls back) and waits until pg_stat_activity no longer shows it; a session it cannot end
or see gone leaves the outcome unknown: CommitUnknown, never "not written".

Real Postgres, a real TCP proxy of the test's own between the pipeline and the server (it drops the
connection on cue), a real transaction of the test's holding the lock the insert waits for."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import trio
from backends.stores import BACKENDS
from jobkit import Echo, registry

import pipeline
from pipeline import Config, open_pipeline
from pipeline.backends import open_backend
from pipeline.config import WorkerSettings
from pipeline.errors import StoreError

psycopg = pytest.importorskip("psycopg")


class DropOnCue:
    """A TCP proxy on a free loopback port in front of a server: it forwards both ways, and
    :meth:`drop` closes (both sockets of) every connection whose client has sent ``marker``, at once,
    whatever the server is doing meanwhile: the server's session lives on until it next reads or
    writes its socket."""

    def __init__(self, host: str, port: int, marker: bytes) -> None:
        self.target = (host, port)
        self.marker = marker
        self.marked: list[tuple[socket.socket, socket.socket]] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            while data := src.recv(65536):
                if upstream and self.marker in data:
                    self.marked.append((src, dst))
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass

    def drop(self) -> None:
        for pair in self.marked:
            for s in pair:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                    s.close()
                except OSError:
                    pass  # closed already

    def close(self) -> None:
        self.listener.close()


def through(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = f"{parts.username + '@' if parts.username else ''}127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc, query=parts.query + "&sslmode=disable"))


@asynccontextmanager
async def postgres_behind_a_proxy(tmp_path: Path, marker: bytes) -> AsyncIterator[tuple[Config, Config, DropOnCue]]:
    """A fresh Postgres store: its config, and the same reached through a :class:`DropOnCue` proxy
    (a pipeline that claims nothing: the jobs stay as enqueued)."""
    async with BACKENDS["postgres"](tmp_path) as config:
        parts = urlsplit(config.database_url)
        proxy = DropOnCue(parts.hostname or "127.0.0.1", parts.port or 5432, marker)
        try:
            yield config, config.replace(database_url=through(config.database_url, proxy.port),
                                         worker=WorkerSettings(enabled=False)), proxy
        finally:
            proxy.close()


async def jobs_of(config: Config) -> list[str]:
    async with open_backend(config) as backend:
        return [job.id for job in (await backend.list(limit=1000))[0]]


def sessions_waiting_for(watch: Any, holder_pid: int) -> list[int]:
    return [pid for (pid,) in watch.execute(
        "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", (holder_pid,)).fetchall()]


def session_alive(watch: Any, pid: int) -> bool:
    return watch.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() is not None


async def until(condition: Any, what: str) -> None:
    with trio.fail_after(30):  # generous: a loaded machine; the condition is an event, not a duration
        while not await trio.to_thread.run_sync(condition):
            await trio.sleep(0.02)


@contextmanager
def connected(url: str, **kwargs: Any) -> Iterator[Any]:
    conn = psycopg.connect(url, **kwargs)
    try:
        yield conn
    finally:
        conn.close()


async def test_an_insert_still_waiting_on_the_server_when_asked_is_ended_before_nothing_written_is_said(
        tmp_path: Path) -> None:
    """The Ledger's insert (one statement, committed by the server at its end: no COMMIT of the client's
    to wait for) waits on a lock a transaction of the test holds (LOCK TABLE jobs IN SHARE MODE, as a
    maintenance or migration would); the proxy drops the connection meanwhile; the enqueue asks again and
    answers while the lock is still held; then the lock is released. Before: the look found nothing and
    said "nothing of this enqueue was written: enqueueing it again is safe", and the waiting INSERT then
    committed the job (1 job stored after "not written": a retry makes two). Now the ask ends that
    session first (its statement rolls back), so "not written" is the truth: no job appears once the lock
    is released."""
    marker = b"still-waiting-" + uuid.uuid4().hex.encode()
    async with postgres_behind_a_proxy(tmp_path, marker) as (config, dropping, proxy):
        async with open_pipeline(dropping, registry()) as p:
            with connected(config.database_url) as holder, connected(config.database_url, autocommit=True) as watch:
                holder.execute("LOCK TABLE jobs IN SHARE MODE")  # (an open transaction: held until commit)
                holder_pid = holder.info.backend_pid
                said: list[BaseException | list[str]] = []

                async def enqueue() -> None:
                    try:
                        said.append([await p.enqueue(Echo(marker.decode()))])
                    except StoreError as exc:
                        said.append(exc)

                async with trio.open_nursery() as tn:
                    tn.start_soon(enqueue)
                    await until(lambda: sessions_waiting_for(watch, holder_pid), "the insert waits for the lock")
                    (inserting,) = sessions_waiting_for(watch, holder_pid)
                    proxy.drop()  # the client's connection is gone; the server's session still waits
                # the enqueue has answered, the lock still held
                (answer,) = said
                holder.commit()  # the lock is released: a session still waiting would now insert and commit
                await until(lambda: not session_alive(watch, inserting), "the dropped session ended")
        stored = await jobs_of(config)
        if isinstance(answer, list):
            assert stored == answer  # committed, and said so
        elif isinstance(answer, pipeline.CommitUnknown):
            assert set(stored) <= set(answer.job_ids)
        else:
            assert "nothing of this enqueue was written" in str(answer), answer
            assert stored == [], f"the enqueue said nothing was written ({answer}), and then the job was: {stored}"
        # and what the ask now does here: it ended the session, whose insert rolled back
        assert isinstance(answer, StoreError) and not isinstance(answer, pipeline.CommitUnknown), answer
        assert "enqueueing it again is safe" in str(answer), answer


def session_of(conn: Any) -> Any:
    from pipeline.backends.postgres.db import ServerSession

    (pid, started), = conn.execute("SELECT pid, extract(epoch FROM backend_start)::text FROM pg_stat_activity "
                                   "WHERE pid = pg_backend_pid()").fetchall()
    return ServerSession(pid, started)


async def test_a_pid_now_naming_another_session_is_left_alone_and_the_old_one_taken_for_gone(tmp_path: Path) -> None:
    """Pids are reused: the session to end is named by its pid and its start. A live session with
    the pid but another start is not the one that ran the insert (that one is gone): it is not ended,
    and the ask says so (gone: the look is final)."""
    from pipeline.backends.postgres.db import ServerSession, configure, end_session

    async with BACKENDS["postgres"](tmp_path) as config:
        with connected(config.database_url, autocommit=True) as bystander, \
                connected(config.database_url, autocommit=True) as asker:
            configure(asker)
            now = session_of(bystander)
            assert asker._pipeline_session == session_of(asker)  # what configure keeps for an answer lost
            earlier = ServerSession(now.pid, str(float(now.started) - 3600))
            assert await trio.to_thread.run_sync(end_session, asker, earlier) is True
            assert session_alive(asker, now.pid)
            assert bystander.execute("SELECT 1").fetchone() == (1,)  # it was not ended


async def test_a_session_the_role_may_not_end_is_not_taken_for_gone(tmp_path: Path) -> None:
    """A role may end only its own sessions (or be a superuser): asked to end a session it may not
    signal, end_session says "not gone" (the ask then answers CommitUnknown), and the session lives."""
    from pipeline.backends.postgres.db import end_session

    role = f"r2_{uuid.uuid4().hex[:10]}"
    async with BACKENDS["postgres"](tmp_path) as config:
        with connected(config.database_url, autocommit=True) as admin:
            admin.execute(f"CREATE ROLE {role} LOGIN")
            try:
                parts = urlsplit(config.database_url)
                as_role = urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port or 5432}"))
                with connected(as_role, autocommit=True) as asker:
                    superuser = session_of(admin)
                    assert await trio.to_thread.run_sync(end_session, asker, superuser) is False
                assert admin.execute("SELECT 1").fetchone() == (1,)
            finally:
                admin.execute(f"DROP ROLE {role}")


async def test_an_answer_lost_where_the_session_cannot_be_ended_or_is_not_known_is_commit_unknown(
        tmp_path: Path) -> None:
    """The ask finds none of the jobs, but could not end the session that ran the insert (the server
    refused, or it was still there after the wait), or the error does not say which it was: the jobs
    may still be committed, so the enqueue raises CommitUnknown naming the id to check, never "nothing
    was written". (The session here: a superuser's, which the pipeline's role may not end, as the
    test above shows; the error as the Ledger's, marked lost, naming it: db.sent_on.)"""
    from pipeline.backends.base import lost
    from pipeline.backends.postgres import db as pg_db

    role = f"r2_{uuid.uuid4().hex[:10]}"
    async with BACKENDS["postgres"](tmp_path) as config:
        with connected(config.database_url, autocommit=True) as admin:
            schema = admin.execute("SELECT current_schema()").fetchone()[0]
            admin.execute(f"CREATE ROLE {role} LOGIN")
            admin.execute(f"GRANT USAGE, CREATE ON SCHEMA {schema} TO {role}")
            admin.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA {schema} TO {role}")
            admin.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA {schema} TO {role}")
            try:
                parts = urlsplit(config.database_url)
                as_role = config.replace(database_url=urlunsplit(
                    parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port or 5432}")),
                    worker=WorkerSettings(enabled=False))
                async with open_pipeline(as_role, registry()) as p:
                    row = p.new_job(Echo("x"))
                    for pending in ("cannot be ended", "not known"):
                        error = lost(StoreError("database: the connection dropped (test); retry later"))
                        if pending == "cannot be ended":
                            pg_db.sent_on(error, _Broken(session_of(admin)))  # type: ignore[arg-type]
                        with pytest.raises(pipeline.CommitUnknown, match="could not be ended") as raised:
                            await p.backend._ask_again([row], error)  # type: ignore[attr-defined]
                        assert raised.value.job_ids == (row.id,) and f"jobs show {row.id}" in str(raised.value)
                    assert admin.execute("SELECT 1").fetchone() == (1,)  # left alone
            finally:
                admin.execute(f"DROP OWNED BY {role}")
                admin.execute(f"DROP ROLE {role}")


class _Broken:
    """A driver connection as sent_on sees one whose answer was lost: broken, with its session."""

    broken = True
    closed = False

    def __init__(self, session: Any) -> None:
        self._pipeline_session = session
