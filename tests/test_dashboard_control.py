"""Issue 23's control in the dashboard, in a real headless Chromium (Debian's, through Playwright, as
tests/test_dashboard.py): Cancel on a pending and on a running job's view, Retry on a cancelled one,
the progress bar of a running job, the result of a completed one, the job types' panel with Pause,
Resume and "Retry dead", and cancelled in the counts, the filter and the chart. The store's states are
made through the Backend protocol (tests/test_admin_control.py's control_seed); workers are off."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from admin_harness import serve_in_thread
from conftest import fast_config
from test_admin_control import control_seed
from test_cli_control import job as stored  # the job as the store holds it (a second backend on the file)
from test_cli_control import paused
from test_dashboard import _OVERFLOWS, WIDTHS, _page, browser  # noqa: F401 -- browser: the module's Chromium


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path, dict[str, list[str]]]]:
    db = tmp_path / "control.db"
    ids = trio.run(control_seed, fast_config(db))
    with serve_in_thread(fast_config(db, admin_port=0, worker_enabled=False)) as url:
        yield url, db, ids


def test_cancel_a_pending_job_then_retry_it(browser: Any, served: tuple[str, Path, dict[str, list[str]]]) -> None:  # noqa: F811
    from playwright.sync_api import expect

    url, db, ids = served
    page = _page(browser)
    page.goto(url + "/admin")
    expect(page.locator("#count-cancelled")).to_have_text("1")
    job_id = ids["pending"][0]
    page.click(f'#job-rows tr[data-id="{job_id}"]')
    expect(page.locator("#d-status")).to_have_text("pending")
    expect(page.locator("#d-cancel")).to_be_enabled()
    expect(page.locator("#d-retry")).to_be_disabled()
    expect(page.locator("#d-expires")).to_have_text("never")

    page.once("dialog", lambda dialog: dialog.dismiss())  # "Cancel job …?" answered no: nothing changes
    page.click("#d-cancel")
    expect(page.locator("#d-status")).to_have_text("pending")
    assert stored(db, job_id).status == "pending"  # type: ignore[union-attr]
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#d-cancel")
    expect(page.locator("#d-status")).to_have_text("cancelled")
    expect(page.locator("#d-message")).to_have_text("cancelled")
    expect(page.locator("#d-error")).to_have_text("cancelled before it started: by an operator through the admin API")
    expect(page.locator("#d-cancel")).to_be_disabled()
    expect(page.locator("#count-cancelled")).to_have_text("2")
    assert stored(db, job_id).status == "cancelled"  # type: ignore[union-attr]

    expect(page.locator("#d-retry")).to_be_enabled()  # a cancelled job is retried like a dead one
    page.click("#d-retry")
    expect(page.locator("#d-status")).to_have_text("pending")
    expect(page.locator("#count-cancelled")).to_have_text("1")
    assert stored(db, job_id).status == "pending"  # type: ignore[union-attr]

    # the filter knows cancelled
    page.click("#d-close")
    page.select_option("#f-status", "cancelled")
    rows = page.locator("#job-rows tr[data-id]")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-id", ids["cancelled"][0])
    assert "status=cancelled" in page.url
    assert page.errors == []


def test_a_running_job_shows_its_progress_and_its_cancel_is_requested(
        browser: Any, served: tuple[str, Path, dict[str, list[str]]], tmp_path: Path) -> None:  # noqa: F811
    from playwright.sync_api import expect

    url, db, ids = served
    page = _page(browser)
    page.goto(url + "/admin")
    job_id = ids["running"][0]
    row = page.locator(f'#job-rows tr[data-id="{job_id}"]')
    expect(row.locator("progress.list-progress")).to_have_attribute("title", "40% · 40 of 100 keys")
    assert row.locator("progress.list-progress").evaluate("(bar) => bar.value") == pytest.approx(0.4)
    row.click()
    expect(page.locator("#d-status")).to_have_text("running")
    expect(page.locator("#d-progress-row")).to_be_visible()
    expect(page.locator("#d-progress-text")).to_have_text("40% · 40 of 100 keys")
    assert page.locator("#d-progress").evaluate("(bar) => bar.value") == pytest.approx(0.4)
    expect(page.locator("#d-cancel-requested")).to_be_hidden()
    expect(page.locator("#d-result-box")).to_be_hidden()  # no result while it runs
    expect(page.locator("#d-delete")).to_be_disabled()
    page.screenshot(path=str(tmp_path / "running.png"))

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#d-cancel")
    expect(page.locator("#d-message")).to_have_text("cancel requested: its worker stops it")
    expect(page.locator("#d-status")).to_have_text("running")
    expect(page.locator("#d-cancel-requested")).to_be_visible()
    expect(page.locator("#d-cancel")).to_be_disabled()
    assert stored(db, job_id).cancel_requested  # type: ignore[union-attr]
    assert page.errors == []


def test_a_completed_job_shows_its_result(browser: Any, served: tuple[str, Path, dict[str, list[str]]]) -> None:  # noqa: F811
    from playwright.sync_api import expect

    url, _, ids = served
    page = _page(browser)
    page.goto(url + "/admin#job=" + ids["completed"][0])
    expect(page.locator("#d-status")).to_have_text("completed")
    expect(page.locator("#d-result-box")).to_be_visible()
    expect(page.locator("#d-result")).to_have_text('{\n  "sent": 1,\n  "to": "ok@example.com"\n}')
    expect(page.locator("#d-progress-row")).to_be_hidden()
    expect(page.locator("#d-cancel")).to_be_disabled()
    expect(page.locator("#d-retry")).to_be_disabled()
    page.click("#d-close")
    page.click(f'#job-rows tr[data-id="{ids["dead"][0]}"]')
    expect(page.locator("#d-status")).to_have_text("dead")
    expect(page.locator("#d-result-box")).to_be_hidden()  # a dead job has none
    assert page.errors == []


def test_the_types_panel_pauses_resumes_and_retries_the_dead(
        browser: Any, served: tuple[str, Path, dict[str, list[str]]], tmp_path: Path) -> None:  # noqa: F811
    from playwright.sync_api import expect

    url, db, ids = served
    page = _page(browser)
    page.goto(url + "/admin")
    message = page.locator("#types-message")
    email = page.locator('#types-body tr[data-type="send_email"]')
    expect(email.locator("td.state")).to_have_text("active")
    expect(email.locator("td.num.dead")).to_have_text("2")
    expect(email.locator("td.num.cancelled")).to_have_text("0")
    expect(page.locator('#types-body tr[data-type="generate_sitemap"] td.num.cancelled')).to_have_text("1")
    expect(page.locator('#types-body tr[data-type="generate_sitemap"] button.retry-dead')).to_be_disabled()
    page.screenshot(path=str(tmp_path / "types.png"), full_page=True)

    email.locator("button.pause").click()
    expect(message).to_have_text("send_email paused")
    expect(email.locator("td.state")).to_have_text("paused")
    assert paused(db) == {"send_email"}
    assert "type=" not in page.url  # the button's click is not the row's (which filters by type)
    email.locator("button.resume").click()
    expect(message).to_have_text("send_email resumed")
    expect(email.locator("td.state")).to_have_text("active")
    assert paused(db) == set()

    page.once("dialog", lambda dialog: dialog.dismiss())  # "Retry every dead send_email job (2 now)?" no
    email.locator("button.retry-dead").click()
    expect(email.locator("td.num.dead")).to_have_text("2")
    page.once("dialog", lambda dialog: dialog.accept())
    email.locator("button.retry-dead").click()
    expect(message).to_have_text("send_email: 2 dead jobs back to pending")
    expect(email.locator("td.num.dead")).to_have_text("0")
    expect(email.locator("button.retry-dead")).to_be_disabled()
    expect(page.locator("#count-dead")).to_have_text("0")
    assert {stored(db, i).status for i in ids["dead"]} == {"pending"}  # type: ignore[union-attr]

    email.locator("td.name").click()  # the row filters the jobs by its type
    expect(page.locator("#f-type")).to_have_value("send_email")
    expect(page.locator("#job-rows tr[data-id]")).to_have_count(5)
    assert page.errors == []


def test_the_new_columns_fit_at_every_width(browser: Any, served: tuple[str, Path, dict[str, list[str]]]) -> None:  # noqa: F811
    """The counts' sixth card, the types' eleven columns and the wide chart fit from 1280 to 1920 px,
    and the chart's bars stack the cancelled jobs."""
    from playwright.sync_api import expect

    url, _, _ = served
    page = _page(browser)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(url + "/admin")
        expect(page.locator("#types-body tr[data-type]")).to_have_count(10)
        expect(page.locator("#job-rows tr[data-id]")).to_have_count(8)
        assert page.evaluate(_OVERFLOWS) == [], width
        assert page.locator("#chart rect.cancelled").count() == 1
        expect(page.locator("#finished-hour")).to_have_text("4 in the last hour")
        titles = page.evaluate("() => [...document.querySelectorAll('#chart g.bar title')].map((t) => t.textContent)")
        totals = [sum(int(title.split(": ")[1].split(", ")[i].split()[0]) for title in titles) for i in range(3)]
        assert totals == [1, 2, 1] and titles[-1].split(": ")[1].endswith(" cancelled"), titles[-1]
        chart = page.locator("#chart").bounding_box()
        assert chart is not None and chart["height"] == 180
        assert page.locator("#chart").get_attribute("viewBox") == f"0 0 {round(chart['width'])} 180"
    assert page.errors == []
