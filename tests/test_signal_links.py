"""Issue 35's approval links: `jobs signal-link` prints a URL signed with ADMIN_SIGNING_KEY; the admin server's
page for it (``/signal-links/{token}``) shows what it sends and changes nothing on GET, sends the signal on
POST once (keyed by the link's nonce), without the admin token; an altered token is refused (403), a used or
expired link is gone (410), an unknown job is 404 and a finished one 409. Served for real by Hypercorn on a
loopback port, driven with httpx and, for the page's button, a real headless Chromium; what a link did is read
back from the store (the job's status, and the signal consumed by ``take_signal`` as a resumed wait does)."""

from __future__ import annotations

import calendar
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from admin_harness import serve_in_thread
from conftest import fast_config
from test_admin_api import served
from test_cli import run
from test_dashboard import _page, browser  # noqa: F401 -- browser: the module's Chromium
from test_signals_admin import signal_seed, store, take  # noqa: F401 -- store: each backend's fixture
from test_signals_cli import stored, taken

from pipeline import Config
from pipeline.admin import links
from pipeline.admin.link_page import HEADERS
from pipeline.backends import open_backend
from pipeline.cli.parsing import duration

KEY = "k" * 16 + "-a-test-signing-key-of-40-chars"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}  # what the page's form sends
JSON_ACCEPT = {"Accept": "application/json"}


def link_config(db: Path, **overrides: Any) -> Config:
    return fast_config(db, **{"admin_port": 0, "worker_enabled": False, "admin_signing_key": KEY, **overrides})


def token(job_id: str, name: str = "approval", payload: Any = None, *, key: str = KEY, **options: Any) -> str:
    return links.sign(key, links.make_claims(job_id, name, payload, **options))


def page_text(response: httpx.Response) -> str:
    """The page's text as a person reads it: tags dropped, entities left as they are, spaces collapsed."""
    return " ".join(re.sub(r"<[^>]+>", " ", response.text).split())


# -- the command -------------------------------------------------------------------------------------------


def test_a_printed_link_shows_without_sending_then_sends_once(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = trio.run(signal_seed, fast_config(db))
    waiting = ids["waiting"]
    with serve_in_thread(link_config(db)) as url:
        monkeypatch.setenv("ADMIN_SIGNING_KEY", KEY)
        monkeypatch.setenv("ADMIN_PUBLIC_URL", url + "/")  # as people reach the server (the / is dropped)
        code, out = run("jobs", "signal-link", waiting, "approval", "--payload", '{"approved": true}',
                        "--expires-in", "2d")
        assert code == 0
        link = out.strip()
        assert link.startswith(url + "/signal-links/") and "\n" not in link

        page = httpx.get(link)
        assert page.status_code == 200, page.text
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        shown = page_text(page)
        assert f"job {waiting} (send_email)" in shown
        assert "its state waiting for this signal: it resumes when it is sent" in shown
        assert "signal approval" in shown and "payload { &quot;approved&quot;: true }" in shown
        assert '<form method="post">' in page.text and "Send approval" in shown
        httpx.head(link)
        job = stored(db, waiting)
        assert (job.status, job.awaiting_signal) == ("suspended", "approval")  # looking changed nothing

        sent = httpx.post(link, headers={**FORM, "Origin": url})  # the page's button, from the page's origin
        assert sent.status_code == 200, sent.text
        assert "Sent: approval" in page_text(sent) and "The job was waiting for it and resumes now." in page_text(sent)
        assert stored(db, waiting).status == "pending"

        again = httpx.post(link, headers={**FORM, "Origin": url})
        assert again.status_code == 410
        assert "this link was used already: it sends its signal once" in page_text(again)
        opened = httpx.get(link)  # and opened again: the page says so at once, with no button
        assert opened.status_code == 410 and "this link was used already" in page_text(opened)
        assert '<form method="post">' not in opened.text
    assert taken(db, waiting, "approval") == [(True, '{"approved":true}'), (False, None)]  # sent once


def test_signal_link_refuses_what_it_cannot_sign(db: Path, seeded_links: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    waiting = seeded_links["waiting"]
    capsys.readouterr()
    monkeypatch.delenv("ADMIN_SIGNING_KEY", raising=False)
    assert run("jobs", "signal-link", waiting, "approval") == (1, "")
    assert "error: ADMIN_SIGNING_KEY is not set" in capsys.readouterr().err

    monkeypatch.setenv("ADMIN_SIGNING_KEY", KEY)
    code, out = run("jobs", "signal-link", waiting, "approval", "--json")  # ADMIN_HOST:ADMIN_PORT by default
    assert code == 0
    made = json.loads(out)
    assert made["url"].startswith("http://127.0.0.1:8000/signal-links/")
    assert (made["job_id"], made["name"], made["payload"]) == (waiting, "approval", None)
    expires = calendar.timegm(time.strptime(made["expires_at"], "%Y-%m-%dT%H:%M:%SZ"))
    assert abs(expires - (time.time() + 7 * 86400)) < 5  # 7 days by default

    for argv, code, message in [
        (("no-such-job", "approval"), 1, "error: no job with id 'no-such-job'"),
        ((seeded_links["completed"], "approval"), 1, f"job {seeded_links['completed']} is completed: a finished job takes no signal"),
        ((waiting, "approval", "--expires-in", "soon"), 2, "--expires-in must be a number of seconds, or a number with a unit"),
        ((waiting, "approval", "--expires-in", "0m"), 2, "--expires-in must be more than 0"),
        ((waiting, "approval", "--expires-in", "400d"), 2, "a link's expiry must be more than 0 s and at most 366 days"),
        ((waiting, "approval", "--payload", "{no"), 2, "--payload is not valid JSON"),
        ((waiting, "approval", "--payload", json.dumps("x" * 3000)), 2, "a link's payload must be at most 2,048 bytes"),
    ]:
        assert run("jobs", "signal-link", *argv) == (code, ""), argv
        assert message in capsys.readouterr().err, argv

    monkeypatch.setenv("ADMIN_HOST", "0.0.0.0")
    monkeypatch.setenv("ADMIN_TOKEN", "a-token")
    assert run("jobs", "signal-link", waiting, "approval") == (1, "")
    assert "ADMIN_HOST=0.0.0.0 is where the server listens" in capsys.readouterr().err
    monkeypatch.setenv("ADMIN_PUBLIC_URL", "https://jobs.example.com/pipeline")
    code, out = run("jobs", "signal-link", waiting, "approval")
    assert code == 0 and out.startswith("https://jobs.example.com/pipeline/signal-links/")


@pytest.fixture
def seeded_links(db: Path) -> dict[str, str]:
    return trio.run(signal_seed, fast_config(db))


@pytest.mark.parametrize(("text", "seconds"), [("30m", 1800), ("2h", 7200), ("2d", 172800), ("1w", 604800),
                                               ("90", 90), ("90s", 90), ("1.5h", 5400), (" 2D ", 172800)])
def test_durations_read_as_the_cli_writes_them(text: str, seconds: float) -> None:
    assert duration(text, "--expires-in") == seconds


# -- the page ----------------------------------------------------------------------------------------------


async def test_a_link_is_refused_when_altered_expired_used_or_its_job_unknown_or_finished(store: Config) -> None:  # noqa: F811
    config = store.replace(admin=link_config(Path("x.db")).admin)  # on each backend
    ids = await signal_seed(config)
    waiting = ids["waiting"]
    good = token(waiting, payload=True)
    claims, mac = good.rsplit(".", 1)
    flipped = claims[:-1] + ("A" if claims[-1] != "A" else "B")
    expired = links.sign(KEY, links.make_claims(waiting, "approval", True, expires_in=60, now=time.time() - 61))
    async with served(config) as (pipeline, client):
        for bad in (f"{flipped}.{mac}", f"{claims}.{mac[:-2]}", claims, "not-a-link", token(waiting, key="another-" + KEY)):
            for method in ("GET", "POST"):
                r = await client.request(method, f"/signal-links/{bad}", headers=FORM)
                assert r.status_code == 403, (bad, method, r.text)
                assert "this link is not valid: it was altered, cut short, or signed with another key" in r.text
        for method in ("GET", "POST"):
            r = await client.request(method, f"/signal-links/{expired}", headers=FORM)
            assert r.status_code == 410 and "this link expired at 20" in page_text(r)
            r = await client.request(method, f"/signal-links/{token('no-such-job')}", headers=FORM)
            assert r.status_code == 404 and "job no-such-job no longer exists" in page_text(r)
            done = ids["completed"]
            r = await client.request(method, f"/signal-links/{token(done)}", headers=FORM)
            assert r.status_code == 409 and f"job {done} is completed: a finished job takes no signal" in page_text(r)
        got = await pipeline.backend.get(waiting)
        assert (got.status, got.awaiting_signal) == ("suspended", "approval")  # none of them sent anything

        # a client that asks for JSON gets the admin API's shapes
        r = await client.get(f"/signal-links/{good}", headers=JSON_ACCEPT)
        assert (r.status_code, r.json()["link"]["payload"], r.json()["job"]["id"]) == (200, True, waiting)
        r = await client.post(f"/signal-links/{good}", headers=JSON_ACCEPT)
        assert (r.status_code, r.json()["outcome"], r.json()["job"]["status"]) == (200, "woken", "pending")
        r = await client.post(f"/signal-links/{good}", headers=JSON_ACCEPT)
        assert r.status_code == 410
        assert r.json() == {"error": {"code": "gone", "message": "this link was used already: it sends its signal once"}}
        r = await client.get(f"/signal-links/{expired}", headers=JSON_ACCEPT)
        assert (r.status_code, r.json()["error"]["code"]) == (410, "gone")
        assert await take(pipeline.backend, waiting, "approval", times=2) == [(True, "true"), (False, None)]


async def test_a_second_link_for_the_same_job_is_its_own_and_a_kept_signal_waits(tmp_path: Path) -> None:
    config = link_config(tmp_path / "links.db")
    ids = await signal_seed(config)
    async with served(config) as (pipeline, client):
        pending = ids["pending"]  # not at its wait yet: the link's signal is kept for it
        first, second = token(pending, payload="yes"), token(pending, payload="no")
        r = await client.post(f"/signal-links/{first}", headers=FORM)
        assert r.status_code == 200 and "not waiting for it yet: it takes it when it gets there" in page_text(r)
        assert (await client.post(f"/signal-links/{second}", headers=FORM)).status_code == 200  # another nonce
        assert (await client.post(f"/signal-links/{first}", headers=FORM)).status_code == 410
        # its page too, while the job still waits for a signal of that name (the job is not finished)
        assert (await client.get(f"/signal-links/{first}")).status_code == 410
        assert (await client.get(f"/signal-links/{token(pending, payload='maybe')}")).status_code == 200  # a fresh one
        # two signals kept, taken oldest first, each once
        assert await take(pipeline.backend, pending, "approval", times=3) == [(True, '"yes"'), (True, '"no"'), (False, None)]


async def test_a_link_needs_no_admin_token_but_its_post_must_come_from_its_own_page(tmp_path: Path) -> None:
    config = link_config(tmp_path / "links.db", admin_token="the-admin-token")
    ids = await signal_seed(config)
    waiting = ids["waiting"]
    link = f"/signal-links/{token(waiting, payload=True)}"
    async with served(config, auth=False) as (pipeline, client):
        assert (await client.get(f"/admin/jobs/{waiting}")).status_code == 401  # the API still needs the token
        assert (await client.get(link)).status_code == 200
        r = await client.post(link, headers={**FORM, "Origin": "https://evil.example"})
        assert r.status_code == 403 and "cross-origin write from 'https://evil.example' refused" in r.text
        r = await client.post(link, headers={**FORM, "Sec-Fetch-Site": "cross-site"})
        assert r.status_code == 403
        r = await client.post(link, headers={"Content-Type": "text/plain"})
        assert r.status_code == 415 and "a signed link's POST must be its page's form" in r.text
        got = await pipeline.backend.get(waiting)
        assert (got.status, got.awaiting_signal) == ("suspended", "approval")
        r = await client.post(link, headers={**FORM, "Origin": str(client.base_url).rstrip("/"), "Sec-Fetch-Site": "same-origin"})
        assert r.status_code == 200, r.text
        assert (await pipeline.backend.get(waiting)).status == "pending"


async def test_a_server_without_the_signing_key_takes_no_link(tmp_path: Path) -> None:
    config = fast_config(tmp_path / "links.db", admin_port=0, worker_enabled=False)
    ids = await signal_seed(config)
    async with served(config) as (pipeline, client):
        for method in ("GET", "POST"):
            r = await client.request(method, f"/signal-links/{token(ids['waiting'])}", headers=FORM)
            assert r.status_code == 403 and "its ADMIN_SIGNING_KEY is not set" in page_text(r)
        assert (await pipeline.backend.get(ids["waiting"])).status == "suspended"


async def test_the_page_escapes_what_it_shows_and_cannot_be_framed(tmp_path: Path) -> None:
    config = link_config(tmp_path / "links.db")
    ids = await signal_seed(config)
    name, payload = "<script>alert(1)</script>", {"note": "<img src=x onerror=alert(2)> & \"quotes\""}
    async with served(config) as (pipeline, client):
        r = await client.get(f"/signal-links/{token(ids['waiting'], name, payload)}")
        assert r.status_code == 200
        assert "<script>" not in r.text and "<img" not in r.text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in r.text and "&lt;img src=x onerror=alert(2)&gt; &amp;" in r.text
        for header, value in HEADERS.items():
            assert r.headers[header] == value
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
        assert "script-src" not in r.headers["content-security-policy"]  # default-src 'none': no script at all
        assert r.headers["cache-control"] == "no-store"
        sent = await client.post(f"/signal-links/{token(ids['waiting'], name, payload)}", headers=FORM)
        assert sent.status_code == 200 and "<script>" not in sent.text
        assert (await pipeline.backend.get(ids["waiting"])).status == "suspended"  # another name: kept, still waiting


# -- in a browser --------------------------------------------------------------------------------------------


@pytest.fixture
def link_served(tmp_path: Path) -> Iterator[tuple[str, Path, dict[str, str]]]:
    db = tmp_path / "browser.db"
    ids = trio.run(signal_seed, fast_config(db))
    with serve_in_thread(link_config(db)) as url:
        yield url, db, ids


def test_the_button_of_the_page_sends_the_signal_in_a_browser(browser: Any,  # noqa: F811
                                                              link_served: tuple[str, Path, dict[str, str]]) -> None:
    from playwright.sync_api import expect

    url, db, ids = link_served
    waiting = ids["waiting"]
    page = _page(browser)
    violations: list[str] = []
    page.on("console", lambda message: violations.append(message.text) if "Content Security Policy" in message.text else None)
    link = f"{url}/signal-links/{token(waiting, payload={'approved': True})}"
    page.goto(link)
    expect(page.locator("h1")).to_have_text("Send the signal 'approval' to this job?")
    expect(page.locator("pre")).to_have_text('{\n  "approved": true\n}')
    assert stored(db, waiting).status == "suspended"  # looking changed nothing
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_have_text("Sent: approval")
    assert stored(db, waiting).status == "pending"
    page.goto(link)  # the link opened again from the mail: its page says at once that it was used
    expect(page.locator("h1")).to_have_text("This link no longer works")
    assert page.locator("button[type=submit]").count() == 0
    expect(page.locator("main")).to_contain_text("this link was used already")
    assert violations == [] and page.errors == []  # the CSP let the page's style in, and nothing else was asked

    async def consumed() -> Any:
        async with open_backend(fast_config(db)) as backend:
            return await take(backend, waiting, "approval", times=2)

    assert trio.run(consumed) == [(True, '{"approved":true}'), (False, None)]


def test_the_signing_key_is_never_shown(db: Path, seeded_links: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """ADMIN_SIGNING_KEY is a secret (docs/security.md): not in a config's repr, nor in the error for a bad
    value, nor in what signal-link prints (a MAC made with it, not it), nor on the link's page."""
    from pipeline.errors import ConfigError

    config = link_config(db)
    assert KEY not in repr(config) and KEY not in repr(config.admin)
    with pytest.raises(ConfigError) as refused:
        link_config(db, admin_signing_key="short-" + KEY[:10])
    assert KEY[:10] not in str(refused.value) and "ADMIN_SIGNING_KEY" in str(refused.value)
    monkeypatch.setenv("ADMIN_SIGNING_KEY", KEY)
    code, out = run("jobs", "signal-link", seeded_links["waiting"], "approval", "--json")
    assert code == 0 and KEY not in out + capsys.readouterr().err
    link = json.loads(out)["url"]

    async def page() -> str:
        async with served(link_config(db)) as (_, client):
            return (await client.get(link.removeprefix("http://127.0.0.1:8000"))).text

    assert KEY not in trio.run(page)
