"""The worker registry as operators read it (`Backend.workers`, `/admin/workers`): every process
whose heartbeat wrote it, the types it handles, and whether it beat within its own lease."""

from __future__ import annotations

from pipeline.backends import Backend

from .kit import forget, outlive, renew


async def test_every_worker_process_with_its_types_and_whether_it_lives(backend: Backend) -> None:
    assert await backend.workers() == []
    await renew(backend, "host:1:aa", ["send_email", "echo"], [], lease_seconds=0.3)
    await outlive(0.3)
    await renew(backend, "host:2:bb", ["echo"], [], lease_seconds=60.0)
    found = await backend.workers()
    assert [(w.owner, w.job_types, w.alive) for w in found] == [
        ("host:2:bb", ("echo",), True),  # the most recent heartbeat first
        ("host:1:aa", ("echo", "send_email"), False),  # its lease ran out: a process that died
    ]
    assert found[0].heartbeat_at > found[1].heartbeat_at
    await forget(backend, "host:2:bb")  # a graceful stop leaves the registry
    assert [w.owner for w in await backend.workers()] == ["host:1:aa"]
