"""Issue 35 in the dashboard, in a real headless Chromium (Debian's, through Playwright, as
tests/test_dashboard.py): the inbox of jobs waiting for a signal (their payload and steps; sleeping jobs left
out) and its buttons (Approve: true, Reject: false, Send: the JSON typed), which send through the admin API
with the token the person gave; the suspended status in the counts, the filter and the types' table; a
durable job's view (its awaited signal, its steps, Cancel). The store's states are made through the Backend
protocol (tests/test_signals_admin.py's signal_seed); workers are off, so a woken job stays pending for the
test to read, and the signal it was sent is read back as its resumed wait would take it."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from admin_harness import serve_in_thread
from conftest import fast_config
from test_dashboard import _OVERFLOWS, WIDTHS, _page, browser  # noqa: F401 -- browser: the module's Chromium
from test_signals_admin import email, settle, signal_seed, start
from test_signals_cli import stored, taken

from pipeline import Config
from pipeline.backends import Settlement, open_backend
from pipeline.states import Transition

ANY = re.compile(".*")  # a cell whose text another test checks (a time)


async def inbox_seed(config: Config) -> dict[str, str]:
    """signal_seed's jobs, and two more waiting for "approval" (``second``, ``third``: the newest), the last
    with a long payload and no steps."""
    ids = await signal_seed(config)
    async with open_backend(config) as backend:
        for name, to in (("second", "second@example.com"), ("third", "x" * 300 + "@example.com")):
            lease = await start(backend, email(to))
            await settle(backend, Settlement(lease.id, lease.token, Transition.SUSPEND, delay=math.inf,
                                             awaiting="approval"))
            ids[name] = lease.id
    return ids


@pytest.fixture
def served(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str, Path, dict[str, str]]]:
    db = tmp_path / "inbox.db"
    ids = trio.run(inbox_seed, fast_config(db))
    token = getattr(request, "param", "")
    with serve_in_thread(fast_config(db, admin_port=0, worker_enabled=False, admin_token=token)) as url:
        yield url, db, ids


def test_the_inbox_lists_the_jobs_waiting_for_a_signal_with_payload_and_steps(
        browser: Any, served: tuple[str, Path, dict[str, str]], tmp_path: Path) -> None:  # noqa: F811
    from playwright.sync_api import expect

    url, _, ids = served
    page = _page(browser)
    page.goto(url + "/admin")
    expect(page.locator("#inbox-count")).to_have_text("3")
    expect(page.locator("#inbox-empty")).to_be_hidden()
    items = page.locator("#inbox-items article.inbox-item")
    expect(items).to_have_count(3)
    assert items.evaluate_all("(nodes) => nodes.map((n) => n.dataset.id)") == [ids["third"], ids["second"], ids["waiting"]]
    waiting = page.locator(f'article.inbox-item[data-id="{ids["waiting"]}"]')
    expect(waiting.locator("code.signal")).to_have_text("approval")
    expect(waiting.locator(".type")).to_have_text("send_email")
    expect(waiting.locator(".timeout")).to_have_text("· no timeout")
    expect(waiting.locator("pre.payload")).to_contain_text('"to": "buyer@example.com"')
    steps = waiting.locator("table.steps tbody tr")
    expect(steps).to_have_count(2)
    expect(steps.nth(0).locator("td")).to_have_text(["charge", "completed", ANY, ANY, '{"charge_id":"ch_1"}'])
    expect(steps.nth(1).locator("td")).to_have_text(["approval", "waiting", ANY, "–", "–"])
    expect(page.locator(f'article.inbox-item[data-id="{ids["third"]}"] .inbox-steps')).to_be_hidden()  # none yet
    expect(page.locator(f'article.inbox-item[data-id="{ids["sleeping"]}"]')).to_have_count(0)  # asleep: no signal

    # suspended everywhere a status is: the counts, the filter, the types' table
    expect(page.locator("#count-suspended")).to_have_text("4")
    expect(page.locator('#types-body tr[data-type="send_email"] td.num.suspended')).to_have_text("4")
    page.click("#counts .count.suspended")
    expect(page.locator("#job-rows tr[data-id]")).to_have_count(4)
    assert "status=suspended" in page.url
    for width in WIDTHS:  # a long payload stays inside its box
        page.set_viewport_size({"width": width, "height": 900})
        expect(items).to_have_count(3)
        assert page.evaluate(_OVERFLOWS) == [], width
    page.screenshot(path=str(tmp_path / "inbox.png"), full_page=True)
    assert page.errors == []


def test_approve_reject_and_a_typed_payload_send_the_awaited_signal(
        browser: Any, served: tuple[str, Path, dict[str, str]]) -> None:  # noqa: F811
    from playwright.sync_api import expect

    url, db, ids = served
    page = _page(browser)
    page.goto(url + "/admin")
    message = page.locator("#inbox-message")
    item = page.locator(f'article.inbox-item[data-id="{ids["waiting"]}"]')
    item.locator("button.approve").click()
    expect(message).to_have_text(f"approval sent to {ids['waiting']} (approve): woken, it resumes")
    expect(item).to_have_count(0)
    expect(page.locator("#inbox-count")).to_have_text("2")

    second = page.locator(f'article.inbox-item[data-id="{ids["second"]}"]')
    second.locator("button.reject").click()
    expect(message).to_have_text(f"approval sent to {ids['second']} (reject): woken, it resumes")

    third = page.locator(f'article.inbox-item[data-id="{ids["third"]}"]')
    third.locator("input.signal-json").fill("{not json")
    third.locator("button.send").click()
    expect(third.locator(".item-message")).to_contain_text("not JSON")
    assert stored(db, ids["third"]).status == "suspended"  # nothing was sent
    third.locator("input.signal-json").fill('{"approved": false, "note": "<b>over budget</b>"}')
    third.locator("input.signal-json").press("Enter")
    expect(message).to_have_text(f"approval sent to {ids['third']} (payload): woken, it resumes")
    expect(page.locator("#inbox-empty")).to_be_visible()
    expect(page.locator("#inbox-count")).to_have_text("0")
    assert page.errors == []

    assert [stored(db, ids[n]).status for n in ("waiting", "second", "third")] == ["pending"] * 3
    assert taken(db, ids["waiting"], "approval") == [(True, "true"), (False, None)]
    assert taken(db, ids["second"], "approval") == [(True, "false"), (False, None)]
    assert taken(db, ids["third"], "approval") == [(True, '{"approved":false,"note":"<b>over budget</b>"}'), (False, None)]


def test_what_is_typed_survives_a_refresh(browser: Any, served: tuple[str, Path, dict[str, str]]) -> None:  # noqa: F811
    from playwright.sync_api import expect

    url, _, ids = served
    page = _page(browser)
    page.goto(url + "/admin")
    field = page.locator(f'article.inbox-item[data-id="{ids["second"]}"] input.signal-json')
    field.fill('{"half": "typed"')
    with page.expect_response(lambda r: "/admin/jobs?status=suspended" in r.url):
        page.click("#refresh")
    page.wait_for_function("() => document.getElementById('refreshed').textContent.startsWith('updated')")
    expect(field).to_have_value('{"half": "typed"')
    assert page.errors == []


@pytest.mark.parametrize("served", ["the-admin-token"], indirect=True)
def test_the_inbox_sends_with_the_admin_token(browser: Any, served: tuple[str, Path, dict[str, str]]) -> None:  # noqa: F811
    from playwright.sync_api import expect

    url, db, ids = served
    page = _page(browser)
    page.goto(url + "/admin")
    expect(page.locator("#auth")).to_be_visible()
    page.fill("#token", "the-admin-token")
    page.click("#auth button[type=submit]")
    item = page.locator(f'article.inbox-item[data-id="{ids["waiting"]}"]')
    item.locator("button.approve").click()
    expect(page.locator("#inbox-message")).to_have_text(f"approval sent to {ids['waiting']} (approve): woken, it resumes")
    assert stored(db, ids["waiting"]).status == "pending"
    assert page.errors == []


def test_a_durable_jobs_view_shows_its_awaited_signal_and_steps_and_cancels_it(
        browser: Any, served: tuple[str, Path, dict[str, str]]) -> None:  # noqa: F811
    from playwright.sync_api import expect

    url, db, ids = served
    page = _page(browser)
    page.goto(url + "/admin#job=" + ids["waiting"])
    expect(page.locator("#d-status")).to_have_text("suspended")
    expect(page.locator("#d-awaiting")).to_have_text("approval")
    expect(page.locator("#d-run-after")).to_have_text("when its signal comes (no timeout)")
    expect(page.locator("#d-steps tr")).to_have_count(2)
    expect(page.locator('#d-steps tr[data-step="charge"] td.value')).to_have_text('{"charge_id":"ch_1"}')
    expect(page.locator("#d-cancel")).to_be_enabled()
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#d-cancel")
    expect(page.locator("#d-status")).to_have_text("cancelled")
    expect(page.locator("#d-awaiting")).to_be_hidden()
    assert stored(db, ids["waiting"]).status == "cancelled"
    expect(page.locator("#inbox-count")).to_have_text("2")

    page.goto(url + "/admin#job=" + ids["completed"])  # a plain job's view: no steps box unless it has steps
    expect(page.locator("#d-steps tr")).to_have_count(3)
    page.goto(url + "/admin#job=" + ids["pending"])
    expect(page.locator("#d-status")).to_have_text("pending")
    expect(page.locator("#d-steps-box")).to_be_hidden()
    assert page.errors == []
