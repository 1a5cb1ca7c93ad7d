"""The admin guard's defence in depth (issue 15): CSRF beyond Origin, the Host header's
form, WebSocket scopes, a body that never arrives, response headers, clipped echoes.
Served for real by Hypercorn on a loopback port, except the WebSocket scope, which no
route serves: that test drives the guard as the ASGI middleware it is."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from admin_harness import seed
from conftest import fast_config
from test_admin_api import TOKEN, api_config, assert_error, served

from pipeline.admin import api as admin_api
from pipeline.admin.security import AdminGuard


@pytest.fixture
async def seeded(db_path: Any) -> dict[str, list[str]]:
    return await seed(fast_config(db_path))


async def _raw(port: int, request: bytes, *, wait: float = 5.0) -> bytes:
    """Send ``request`` as is on a fresh connection; the answer, read until the server closes
    or ``wait`` seconds pass (then what came so far)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        answer = b""
        with trio.move_on_after(wait):
            while chunk := await stream.receive_some(65536):
                answer += chunk
                if b"\r\n\r\n" in answer and b'"error"' in answer or answer.endswith(b"}"):
                    break
        return answer


async def test_writes_need_same_site_and_json(db_path: Any, seeded: dict[str, list[str]]) -> None:
    async with served(api_config(db_path)) as (_, client):
        job_id = seeded["dead"][0]
        retry = f"/admin/jobs/{job_id}/retry"
        for site in ("cross-site", "same-site", "Cross-Site"):
            assert_error(await client.post(retry, headers={"Sec-Fetch-Site": site}), 403, "Sec-Fetch-Site")
            assert_error(await client.delete(f"/admin/jobs/{job_id}", headers={"Sec-Fetch-Site": site}), 403)
            assert_error(await client.post("/admin/jobs", json={"job_type": "generate_sitemap"},
                                           headers={"Sec-Fetch-Site": site}), 403)
        # what an HTML form or a no-cors fetch can send without a preflight
        for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""):
            r = await client.post(retry, headers={"Content-Type": content_type})
            assert_error(r, 415, "Content-Type: application/json")
        no_type = client.build_request("POST", retry)
        del no_type.headers["Content-Type"]
        assert_error(await client.send(no_type), 415, "Content-Type: application/json")
        assert (await client.get(f"/admin/jobs/{job_id}")).json()["status"] == "dead"  # nothing changed
        # a same-origin page, a tool (no Sec-Fetch-Site), a typed-in address: served
        r = await client.post(retry, headers={"Sec-Fetch-Site": "same-origin", "Content-Type": "application/json; charset=utf-8"})
        assert r.status_code == 200, r.text
        assert (await client.get("/admin/jobs", headers={"Sec-Fetch-Site": "cross-site"})).status_code == 200  # reads: CORS applies


async def test_the_host_header_is_required_and_must_be_a_name_and_digits(db_path: Any) -> None:
    for cfg in (api_config(db_path), api_config(db_path, admin_token=TOKEN)):
        async with served(cfg) as (_, client):
            port = client.base_url.port
            auth = f"Authorization: Bearer {TOKEN}\r\n".encode() if cfg.admin.token else b""
            answer = await _raw(port, b"GET /admin/jobs HTTP/1.0\r\n" + auth + b"\r\n")
            assert answer.startswith(b"HTTP/1.0 400") or answer.startswith(b"HTTP/1.1 400"), answer[:200]
            assert b"Host header is required" in answer
            for host in ("localhost:1@evil.example", f"127.0.0.1:{port}@evil.example", "localhost:80x", "localhost:",
                         "evil.example/x", "[::1]x", "local host"):
                assert_error(await client.get("/admin/jobs", headers={"Host": host}), 400, "Host"), host
            assert (await client.get("/admin/jobs", headers={"Host": f"localhost:{port}"})).status_code == 200


async def test_dns_rebinding_names_that_only_look_like_loopback_are_refused(db_path: Any) -> None:
    """Without ADMIN_TOKEN only loopback names are served: localhost, *.localhost, 127.0.0.0/8 and
    ::1, compared exactly. A name that merely starts like one (``localhost.example.com``, which
    an attacker's DNS can point at 127.0.0.1) is refused, as are spellings of an address that
    are not one (``127.1``, ``2130706433``: a browser sends them normalised)."""
    async with served(api_config(db_path)) as (_, client):
        port = client.base_url.port
        for host in ("localhost.example.com", f"localhost.example.com:{port}", "localhostevil.test", f"localhost-admin.example:{port}",
                     "localhost.localdomain", f"127.0.0.1.nip.io:{port}", "127.1", "2130706433", "0x7f000001", "0.0.0.0",
                     f"[::]:{port}", "evil.localhost.example"):
            assert_error(await client.get("/admin/jobs", headers={"Host": host}), 403, "loopback"), host
            assert_error(await client.post("/admin/jobs/cleanup", headers={"Host": host}), 403, "loopback"), host
        for host in ("LOCALHOST", f"localhost.:{port}", f"app.localhost:{port}", "a.b.localhost.", f"127.0.0.2:{port}",
                     "127.255.255.254", f"[::1]:{port}", "[0:0:0:0:0:0:0:1]"):
            assert (await client.get("/admin/jobs", headers={"Host": host})).status_code == 200, host


async def test_a_websocket_scope_gets_the_same_checks() -> None:
    reached: list[dict[str, Any]] = []
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope)

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    def scope(headers: dict[str, str], path: str = "/admin/jobs") -> dict[str, Any]:
        return {"type": "websocket", "path": path, "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}

    tokenless = AdminGuard(app, token="", max_body=1024, admin_host="127.0.0.1")
    with_token = AdminGuard(app, token=TOKEN, max_body=1024, admin_host="127.0.0.1")
    refused = [
        (tokenless, scope({"Host": "evil.example"})),  # DNS rebinding
        (tokenless, scope({})),  # no Host
        (tokenless, scope({"Host": "localhost", "Origin": "http://evil.example"})),  # cross-site WebSocket hijacking
        (tokenless, scope({"Host": "localhost", "Sec-Fetch-Site": "cross-site"})),
        (with_token, scope({"Host": "admin.example"})),  # no token
    ]
    for guard, s in refused:
        await guard(s, receive, send)
        assert not reached, s
        assert sent.pop()["type"] == "websocket.close"
    await tokenless(scope({"Host": "localhost", "Origin": "http://localhost"}), receive, send)
    await with_token(scope({"Host": "admin.example", "Authorization": f"Bearer {TOKEN}"}), receive, send)
    assert len(reached) == 2 and not sent
    await tokenless({"type": "lifespan"}, receive, send)  # the app's start-up and shut-down pass
    assert len(reached) == 3


async def test_a_body_that_never_arrives_is_answered_408(db_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admin_api, "BODY_TIMEOUT", 0.5, raising=False)
    async with served(api_config(db_path, admin_token=TOKEN)) as (_, client):
        request = (b"POST /admin/jobs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                   b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: 100\r\n\r\n{\"job_type\":")
        with trio.fail_after(5):
            answer = await _raw(client.base_url.port, request, wait=4)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"did not arrive within 0.5 s" in answer
        assert (await client.get("/admin/jobs")).json()["total"] == 0  # nothing written


async def test_every_response_says_nosniff_and_json_is_not_stored(db_path: Any) -> None:
    async with served(api_config(db_path, admin_token=TOKEN)) as (_, client):
        for path in ("/admin/jobs", "/admin/stats", "/healthz", "/metrics", "/openapi.json", "/admin/jobs/nope",
                     "/admin/nothing"):
            r = await client.get(path)
            assert r.headers["x-content-type-options"] == "nosniff", path
            assert r.headers["cache-control"] == "no-store", path
        r = await client.get("/admin/jobs", headers={"Authorization": "Bearer wrong"})  # the guard's own answers too
        assert r.status_code == 401 and r.headers["cache-control"] == "no-store" and r.headers["x-content-type-options"] == "nosniff"
        page = await client.get("/admin")
        assert page.headers["x-content-type-options"] == "nosniff" and page.headers["cache-control"] == "no-cache"


async def test_unknown_names_are_clipped_in_the_422(db_path: Any) -> None:
    async with served(api_config(db_path, admin_max_body_bytes=4 * 1024 * 1024)) as (_, client):
        huge = "x" * 1_000_000
        r = await client.post("/admin/jobs", json={"job_type": huge, "payload": {}})
        assert_error(r, 422, "unknown job type 'xxxx")
        assert len(r.content) < 2000, len(r.content)
        r = await client.post("/admin/events", json={"event": huge, "data": {}})
        assert_error(r, 422, "unknown event 'xxxx")
        assert len(r.content) < 2000, len(r.content)
