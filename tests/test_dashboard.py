"""The dashboard in a real headless Chromium (Debian's), driven with Playwright.

Playwright's own browser downloads are never used: the test launches the system browser
at CHROMIUM. It skips with the reason when no browser is installed, unless
PIPELINE_REQUIRE_SERVICES=1 (CI), where a missing browser fails it.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from admin_harness import seed, serve_in_thread
from conftest import REQUIRE_SERVICES, fast_config

from pipeline.backends.base import ScheduleRecord

CHROMIUM = os.environ.get("PIPELINE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
TOKEN = "dashboard-token"
WIDTHS = (1280, 1400, 1920)  # issue 21: the cron table overflowed its card from 1400 to 1920 px


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


def _page(browser: Any, *, timezone: str | None = None) -> Any:
    """A page 1280 px wide; ``timezone``: the browser's own zone (the machine's by default)."""
    page = browser.new_context(viewport={"width": 1280, "height": 900}, timezone_id=timezone).new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.errors = errors
    return page


def utc_text(iso: str, *, full: bool = False) -> str:
    """A stored time as the dashboard shows every time: UTC, labelled so, the date unless it is today's
    (``full``: always, with milliseconds)."""
    at = dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone(dt.UTC)
    if full:
        return at.strftime("%Y-%m-%d %H:%M:%S.") + f"{at.microsecond // 1000:03d} UTC"
    today = dt.datetime.now(dt.UTC).date()
    return at.strftime("%H:%M:%S UTC" if at.date() == today else "%Y-%m-%d %H:%M:%S UTC")


def _put_schedules(db: Path) -> str:
    """Three schedules: every minute in a long zone name, nightly in Paris, hourly paused; the nightly one's next run."""
    from pipeline.backends import open_backend
    from pipeline.schedules import make_schedule
    from pipeline.site import types_registry

    registry = types_registry()
    schedules = [
        make_schedule(registry, "every-minute-cache-invalidation", "* * * * *", "invalidate_cache", {"keys": ["a"]},
                      "America/Argentina/Buenos_Aires"),
        make_schedule(registry, "nightly-sitemap", "0 3 * * *", "generate_sitemap", {}, "Europe/Paris"),
        make_schedule(registry, "hourly-sitemap", "0 * * * *", "generate_sitemap", {}),
    ]

    async def store() -> str:
        async with open_backend(fast_config(db)) as backend:
            added = [await backend.put_schedule(ScheduleRecord.of(s, origin="operator")) for s in schedules]
            await backend.set_schedule_enabled("hourly-sitemap", False)
            return added[1].next_run

    return trio.run(store)


def _stored_schedules(db: Path) -> dict[str, bool]:
    """name -> enabled, as the store holds them (read with sqlite3, not through the pipeline)."""
    conn = sqlite3.connect(db)
    try:
        return {name: bool(enabled) for name, enabled in conn.execute("SELECT name, enabled FROM scheduled_jobs")}
    finally:
        conn.close()


@pytest.fixture
def scheduled_url(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The seeded store with _put_schedules' three schedules, served with workers on (so a worker row is
    listed); yields the URL and the nightly schedule's next run."""
    db = tmp_path / "scheduled.db"
    trio.run(seed, fast_config(db))
    next_run = _put_schedules(db)
    with serve_in_thread(fast_config(db, admin_port=0, worker_lease_seconds=30.0)) as url:
        yield url, next_run


# what overflows at the page's width: a card or a table's scroll box wider inside than its box, or the page
_OVERFLOWS = """() => {
  const over = [];
  for (const box of document.querySelectorAll(".card, .scroll")) {
    if (box.scrollWidth > box.clientWidth) over.push(`${box.className} in ${box.closest("section").getAttribute("aria-labelledby")}: ${box.scrollWidth} > ${box.clientWidth}`);
  }
  const page = document.documentElement;
  if (page.scrollWidth > page.clientWidth) over.push(`page: ${page.scrollWidth} > ${page.clientWidth}`);
  const card = document.getElementById("schedules-body").closest(".card").getBoundingClientRect();
  for (const cell of document.querySelectorAll("#schedules-body td")) {
    const box = cell.getBoundingClientRect();
    if (box.right > card.right || box.left < card.left) over.push(`cell ${cell.textContent} outside its card`);
  }
  return over;
}"""

# how many lines each cell's text takes (a text's client rects are one per line)
_LINES = """(selector) => [...document.querySelectorAll(selector)].map((cell) => {
  const range = document.createRange();
  range.selectNodeContents(cell);
  const tops = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
  return [cell.textContent, tops.size];
})"""


def test_dashboard_tables_fit_their_cards_at_1280_1400_and_1920_px(browser: Any, scheduled_url: tuple[str, str],
                                                                     tmp_path: Path) -> None:
    """Issue 21: at 1400-1920 px the cron table overflowed its card (its state column clipped) and
    `* * * * *` wrapped over three lines."""
    from playwright.sync_api import expect

    url, _ = scheduled_url
    page = _page(browser)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(url + "/admin")
        expect(page.locator("#schedules-body tr")).to_have_count(3)
        expect(page.locator("#workers-body")).to_contain_text("alive")
        # the seven seeded jobs, and one more for each minute the every-minute schedule saw begin
        expect(page.locator("#job-rows tr[data-id]").nth(6)).to_be_attached()
        assert page.evaluate(_OVERFLOWS) == [], width
        for selector in ("#schedules-body td.cron", "#schedules-body td.zone", "#schedules-body td.time",
                         "#schedules-body td.state", "#workers-body td.time", "#job-rows td.time"):
            cells = page.evaluate(_LINES, selector)
            assert cells and all(lines == 1 for _, lines in cells), (width, selector, cells)
        tops = page.evaluate("() => [...document.querySelectorAll('#schedules-body td.buttons button')]"
                             ".map((b) => Math.round(b.getBoundingClientRect().top))")
        assert len(tops) == 6 and len(set(tops[:2])) == 1, (width, tops)  # each row's two buttons side by side
        expect(page.locator('#schedules-body tr[data-name="every-minute-cache-invalidation"] td.cron')).to_have_text("* * * * *")
        page.screenshot(path=str(tmp_path / f"dashboard-{width}.png"), full_page=True)
    assert page.errors == []


def test_dashboard_shows_every_time_in_utc_saying_so(browser: Any, scheduled_url: tuple[str, str]) -> None:
    """Issue 21: job times were the browser's local time while the worker and schedule tables showed
    UTC ISO text. Every time is UTC, labelled so, the stored text in its title; the browser here is in
    New York, so a local rendering would be 5 hours off."""
    from playwright.sync_api import expect

    url, next_run = scheduled_url
    page = _page(browser, timezone="America/New_York")
    assert page.evaluate("() => new Date(Date.UTC(2026, 0, 1, 12)).getHours()") == 7  # the browser is not in UTC
    page.goto(url + "/admin")
    rows = page.locator("#job-rows tr[data-id]")
    expect(rows.nth(6)).to_be_attached()  # the seed's 7 jobs, and an 8th if the every-minute schedule fired
    expect(page.locator("#workers-body")).to_contain_text("alive")
    expect(page.locator("#refreshed")).to_have_text(re.compile(r"^updated \d\d:\d\d:\d\d UTC$"))

    cells = page.evaluate("() => [...document.querySelectorAll('td.time[title]')].map((c) => [c.textContent, c.title])")
    assert len(cells) >= 7 * 2 + 1 + 2  # run after and updated of each job, a heartbeat, two next runs
    for text, title in cells:
        assert text == utc_text(title.split("\n")[0]), (text, title)
    nightly = page.locator('#schedules-body tr[data-name="nightly-sitemap"] td.time').first
    expect(nightly).to_have_text(utc_text(next_run))
    expect(nightly).to_have_attribute("title", re.compile(r" 0?3:00:00 .* in Europe/Paris$"))  # its wall time, in its zone
    assert page.locator("#chart g.bar title").first.text_content().split(": ")[0].endswith(" UTC")

    rows.first.click()
    for field in ("d-run-after", "d-created", "d-updated"):
        shown = page.locator("#" + field)
        expect(shown).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC$"))
        assert shown.text_content() == utc_text(shown.get_attribute("title"), full=True)
    assert page.errors == []


def test_dashboard_pauses_resumes_and_removes_a_schedule(browser: Any, tmp_path: Path) -> None:
    """Issue 21: the schedules had no buttons. Each click changes the store; a dismissed removal changes nothing."""
    from playwright.sync_api import expect

    db = tmp_path / "buttons.db"
    _put_schedules(db)
    with serve_in_thread(fast_config(db, admin_port=0, worker_enabled=False)) as url:
        page = _page(browser)
        page.goto(url + "/admin")
        message = page.locator("#schedules-message")
        nightly = page.locator('#schedules-body tr[data-name="nightly-sitemap"]')
        expect(nightly.locator("td.state")).to_have_text("active")

        nightly.locator("button.pause").click()
        expect(message).to_have_text("nightly-sitemap paused")
        assert _stored_schedules(db)["nightly-sitemap"] is False
        expect(nightly.locator("td.state")).to_have_text("paused")

        nightly.locator("button.resume").click()
        expect(message).to_have_text("nightly-sitemap resumed")
        assert _stored_schedules(db)["nightly-sitemap"] is True
        expect(nightly.locator("td.state")).to_have_text("active")

        page.once("dialog", lambda dialog: dialog.dismiss())  # "Remove schedule …?" answered no
        nightly.locator("button.remove").click()
        expect(nightly.locator("td.state")).to_have_text("active")
        assert "nightly-sitemap" in _stored_schedules(db)
        page.once("dialog", lambda dialog: dialog.accept())
        nightly.locator("button.remove").click()
        expect(message).to_have_text("nightly-sitemap removed")
        expect(nightly).to_have_count(0)
        assert _stored_schedules(db) == {"every-minute-cache-invalidation": True, "hourly-sitemap": False}
        assert page.errors == []


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
    expect(page.locator("#d-created")).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC$"))
    created = page.locator("#d-created").get_attribute("title")
    assert page.locator("#d-created").text_content() == utc_text(created, full=True)
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
            added = await backend.put_schedule(ScheduleRecord.of(nightly, origin="operator"))
            await backend.put_schedule(ScheduleRecord.of(hourly, origin="operator"))
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
        expect(rows.nth(1).locator("td.cron")).to_have_text("0 3 * * *")
        expect(rows.nth(1).locator("td.zone")).to_have_text("Europe/Paris")
        expect(rows.nth(1).locator("td.time").first).to_have_text(utc_text(next_run))
        expect(rows.nth(1).locator("td.time").first).to_have_attribute("title", re.compile("^" + re.escape(next_run)))
        expect(rows.nth(1)).to_contain_text("active")
        assert page.errors == []
