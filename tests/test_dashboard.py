"""The dashboard in a real headless Chromium (Debian's), driven with Playwright.

Playwright's own browser downloads are never used: the test launches the system browser
at CHROMIUM. It skips with the reason when no browser is installed, unless
PIPELINE_REQUIRE_SERVICES=1 (CI), where a missing browser fails it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from admin_harness import seed, serve_in_thread
from conftest import REQUIRE_SERVICES, fast_config

CHROMIUM = os.environ.get("PIPELINE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
TOKEN = "dashboard-token"


def _require_browser() -> None:
    if Path(CHROMIUM).exists():
        return
    message = f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium chromium-driver; .ci/run does)"
    if REQUIRE_SERVICES:
        pytest.fail(f"{message}, and PIPELINE_REQUIRE_SERVICES=1 says it must be there")
    pytest.skip(message)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    _require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def seeded_url(tmp_path: Path) -> Iterator[tuple[str, dict[str, list[str]]]]:
    """A store with 3 completed, 2 dead and 2 pending jobs, served with workers off
    (so a retried job stays pending for the test to see)."""
    db = tmp_path / "dash.db"
    ids = trio.run(seed, fast_config(db))
    with serve_in_thread(fast_config(db, admin_port=0, worker_enabled=False)) as url:
        yield url, ids


def _page(browser: Any) -> Any:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.errors = errors
    return page


def test_dashboard_counts_filter_detail_and_retry(browser: Any, seeded_url: tuple[str, dict[str, list[str]]], tmp_path: Path) -> None:
    from playwright.sync_api import expect

    url, ids = seeded_url
    page = _page(browser)
    page.goto(url + "/admin")

    # the counts per status, the per-type table, the chart of the last hour
    expect(page.locator("#count-completed")).to_have_text("3")
    expect(page.locator("#count-dead")).to_have_text("2")
    expect(page.locator("#count-pending")).to_have_text("2")
    expect(page.locator("#count-total")).to_have_text("7")
    expect(page.locator("#types-body")).to_contain_text("send_email")
    expect(page.locator("#workers-body")).to_contain_text("none has beaten yet")  # served with workers off
    expect(page.locator("#finished-hour")).to_have_text("5 in the last hour")
    assert page.locator("#chart rect.completed").count() >= 1 and page.locator("#chart rect.dead").count() >= 1
    rows = page.locator("#job-rows tr[data-id]")
    expect(rows).to_have_count(7)
    page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)

    # filter by status: only the dead jobs
    page.select_option("#f-status", "dead")
    expect(rows).to_have_count(2)
    assert {rows.nth(i).get_attribute("data-id") for i in range(2)} == set(ids["dead"])
    assert "status=dead" in page.url
    # by type, from the select; then back to any status by clicking the "all jobs" count
    page.select_option("#f-status", "")
    page.select_option("#f-type", "generate_sitemap")
    expect(rows).to_have_count(2)
    page.select_option("#f-type", "")
    # the pending jobs in claim order (same priority: the oldest first), then newest first; each with its priority
    page.select_option("#f-status", "pending")
    page.select_option("#f-order", "claim")
    expect(page.locator("#jobs-order")).to_contain_text("claim order")
    expect(rows.nth(0)).to_have_attribute("data-id", ids["pending"][0])
    assert [rows.nth(i).get_attribute("data-id") for i in range(2)] == ids["pending"]
    assert "order=claim" in page.url
    expect(rows.nth(0).locator("td.priority")).to_have_text("5")
    page.select_option("#f-order", "newest")
    expect(rows.nth(0)).to_have_attribute("data-id", ids["pending"][1])
    page.click("#counts .count.dead")
    expect(rows).to_have_count(2)

    # open a dead job: payload, error, attempts, times; retry is offered
    job_id = ids["dead"][0]
    page.click(f'#job-rows tr[data-id="{job_id}"]')
    detail = page.locator("#detail")
    expect(detail).to_be_visible()
    expect(page.locator("#d-id")).to_have_text(job_id)
    expect(page.locator("#d-status")).to_have_text("dead")
    expect(page.locator("#d-payload")).to_contain_text('"to": "gone0@example.com"')
    expect(page.locator("#d-error")).to_contain_text("550 mailbox gone0@example.com unavailable")
    expect(page.locator("#d-attempts")).to_have_text("1 of 3")
    expect(page.locator("#d-unique-key")).to_have_text("—")  # it has none
    expect(page.locator("#d-created")).to_have_text(re.compile(r"^\d{4}-\d\d-\d\dT"))
    expect(page.locator("#d-retry")).to_be_enabled()
    page.screenshot(path=str(tmp_path / "detail.png"))

    # retry: the job becomes pending, attempts reset; the list and counts follow
    page.click("#d-retry")
    expect(page.locator("#d-status")).to_have_text("pending")
    expect(page.locator("#d-attempts")).to_have_text("0 of 3")
    expect(page.locator("#d-retry")).to_be_disabled()
    expect(page.locator("#count-dead")).to_have_text("1")
    expect(page.locator("#count-pending")).to_have_text("3")
    page.click("#d-close")
    expect(detail).to_be_hidden()
    expect(rows).to_have_count(1)  # the dead filter now holds one job

    # a job with a unique key shows it (as text)
    page.select_option("#f-status", "")
    page.select_option("#f-type", "generate_sitemap")
    page.click(f'#job-rows tr[data-id="{ids["pending"][0]}"]')
    expect(page.locator("#d-unique-key")).to_have_text("sitemap-0")
    assert page.errors == []


def test_dashboard_deletes_and_pages(browser: Any, seeded_url: tuple[str, dict[str, list[str]]]) -> None:
    from playwright.sync_api import expect

    url, ids = seeded_url
    page = _page(browser)
    page.goto(url + "/admin#per_page=25")
    rows = page.locator("#job-rows tr[data-id]")
    expect(rows).to_have_count(7)
    expect(page.locator("#page-info")).to_contain_text("1–7 of 7")
    expect(page.locator("#next")).to_be_disabled()

    page.on("dialog", lambda dialog: dialog.accept())  # the "Delete job …?" confirmation
    job_id = ids["completed"][0]
    page.click(f'#job-rows tr[data-id="{job_id}"]')
    expect(page.locator("#d-retry")).to_be_disabled()  # completed: nothing to retry
    page.click("#d-delete")
    expect(page.locator("#detail")).to_be_hidden()
    expect(rows).to_have_count(6)
    expect(page.locator("#count-total")).to_have_text("6")
    assert page.locator(f'#job-rows tr[data-id="{job_id}"]').count() == 0
    assert page.errors == []


def test_dashboard_asks_for_the_token(browser: Any, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    db = tmp_path / "token.db"
    trio.run(seed, fast_config(db))
    with serve_in_thread(fast_config(db, admin_port=0, worker_enabled=False, admin_token=TOKEN)) as url:
        page = _page(browser)
        page.goto(url + "/admin")
        expect(page.locator("#auth")).to_be_visible()
        expect(page.locator("#count-total")).to_have_text("–")
        page.fill("#token", "wrong")
        page.click("#auth button")
        expect(page.locator("#auth")).to_be_visible()
        page.fill("#token", TOKEN)
        page.click("#auth button")
        expect(page.locator("#count-total")).to_have_text("7")
        expect(page.locator("#auth")).to_be_hidden()
        assert page.errors == []


def test_dashboard_lists_the_cron_schedules_with_their_next_run(browser: Any, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    from pipeline.backends import open_backend
    from pipeline.schedules import make_schedule
    from pipeline.site import types_registry

    db = tmp_path / "schedules.db"
    nightly = make_schedule(types_registry(), "nightly-sitemap", "0 3 * * *", "generate_sitemap", {}, "Europe/Paris")
    hourly = make_schedule(types_registry(), "hourly-sitemap", "0 * * * *", "generate_sitemap", {})

    async def store() -> str:
        async with open_backend(fast_config(db)) as backend:
            added = await backend.put_schedule(nightly.record(origin="operator"))
            await backend.put_schedule(hourly.record(origin="operator"))
            await backend.set_schedule_enabled("hourly-sitemap", False)
            return added.next_run

    next_run = trio.run(store)
    with serve_in_thread(fast_config(db, admin_port=0, worker_enabled=False)) as url:
        page = _page(browser)
        page.goto(url + "/admin")
        rows = page.locator("#schedules-body tr")
        expect(rows).to_have_count(2)
        expect(rows.nth(0)).to_contain_text("hourly-sitemap")
        expect(rows.nth(0)).to_contain_text("paused")
        expect(rows.nth(1)).to_contain_text("nightly-sitemap")
        expect(rows.nth(1)).to_contain_text("0 3 * * * (Europe/Paris)")
        expect(rows.nth(1)).to_contain_text(next_run)
        expect(rows.nth(1)).to_contain_text("active")
        assert page.errors == []
