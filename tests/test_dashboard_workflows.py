"""Issue 24's workflows in the dashboard, in a real headless Chromium (Debian's, through Playwright, as
tests/test_dashboard.py): waiting in the counts and the filter, a job's parents, children and batch as
links, a batch's view (its counts, its callback, its graph of jobs → callback, its jobs), reached from a
job of the batch and from the address, and Cancel on a waiting job. One scenario (each Chromium test
costs seconds), over tests/test_admin_workflows.py's workflow_seed; workers are off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from admin_harness import serve_in_thread
from conftest import fast_config
from test_admin_workflows import workflow_seed
from test_cli_control import job as stored  # the job as the store holds it (a second backend on the file)
from test_dashboard import _page, browser  # noqa: F401 -- browser: the module's Chromium

_BATCH_OVERFLOWS = """() => [...document.querySelectorAll("#batch-view, #batch-view .scroll")]
  .filter((box) => box.scrollWidth > box.clientWidth).map((box) => `${box.id || box.className}: ${box.scrollWidth} > ${box.clientWidth}`)"""

# the page's fetch, slowed for one job's answer (and only that): the network of an operator far away
_SLOW_JOB_ANSWERS = """(id) => {
  const fetch = window.fetch;
  window.slowAnswered = false;
  window.fetch = (path, options) => String(path).endsWith(`/admin/jobs/${id}`)
    ? new Promise((resolve) => setTimeout(resolve, 600)).then(() => fetch(path, options)).finally(() => { window.slowAnswered = true; })
    : fetch(path, options);
}"""


def test_a_workflow_in_the_job_and_batch_views(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    from playwright.sync_api import expect

    db = tmp_path / "flow.db"
    ids = trio.run(workflow_seed, fast_config(db))
    members, batch_id, callback = ids["members"], ids["batch"], ids["callback"]
    with serve_in_thread(fast_config(db, admin_port=0, worker_enabled=False)) as url:
        page = _page(browser)
        page.goto(url + "/admin")
        expect(page.locator("#count-waiting")).to_have_text("2")
        page.click('#counts .count[data-status="waiting"]')  # the count filters, as the others do
        expect(page.locator("#f-status")).to_have_value("waiting")
        rows = page.locator("#job-rows tr[data-id]")
        expect(rows).to_have_count(2)
        assert "status=waiting" in page.url

        # the child: waiting for one of its two parents, each a link to its view
        page.click(f'#job-rows tr[data-id="{ids["child"]}"]')
        expect(page.locator("#d-status")).to_have_text("waiting")
        expect(page.locator("#d-flow")).to_be_visible()
        expect(page.locator("#d-waiting")).to_have_text("1 of its 2 parents")
        expect(page.locator("#d-parents a")).to_have_text([ids["done"], ids["pending"]])
        expect(page.locator("#d-on-failure")).to_have_text("cancel it (and the jobs waiting for it)")
        expect(page.locator("#d-children")).to_be_hidden()
        expect(page.locator("#d-batch")).to_be_hidden()
        expect(page.locator("#d-cancel")).to_be_enabled()
        page.click(f'#d-parents a[data-job="{ids["pending"]}"]')
        expect(page.locator("#d-id")).to_have_text(ids["pending"])
        expect(page.locator("#d-status")).to_have_text("pending")
        expect(page.locator("#d-children a")).to_have_text([ids["child"]])
        expect(page.locator("#d-parents")).to_be_hidden()
        assert f"job={ids['pending']}" in page.url

        # a job of the batch links to the batch's view: counts, callback, graph, jobs
        page.goto(f"{url}/admin#job={members[2]}")
        expect(page.locator("#d-id")).to_have_text(members[2])
        expect(page.locator("#d-children a")).to_have_text([callback])
        page.click(f'#d-batch a[data-batch="{batch_id}"]')
        view = page.locator("#batch-view")
        expect(view).to_be_visible()
        expect(page.locator("#detail")).to_be_hidden()
        expect(page.locator("#b-id")).to_have_text(batch_id)
        expect(page.locator("#b-total")).to_have_text("3, 2 finished")
        expect(page.locator("#b-counts .count-item")).to_have_text(["1 pending", "1 completed", "1 dead"])
        expect(page.locator("#b-callback a")).to_have_text(callback)
        expect(page.locator("#b-callback .badge")).to_have_text("waiting")
        graph = page.locator("#b-graph")
        expect(graph.locator("g.member")).to_have_count(3)
        assert graph.locator("g.member rect").evaluate_all("(rects) => rects.map((r) => r.getAttribute('class'))") == [
            "completed", "dead", "pending"]
        assert graph.locator("g.member title").all_text_contents() == [
            f"{members[0]} · send_email · completed", f"{members[1]} · send_email · dead",
            f"{members[2]} · invalidate_cache · pending"]
        expect(graph.locator("g.callback text")).to_have_text("callback · waiting")
        assert graph.locator("line.edge").count() == 5  # one down from each of the three, the bar, the arrow
        expect(page.locator("#b-rows tr")).to_have_count(3)
        expect(page.locator("#b-rows tr td.error-cell").nth(1)).to_have_text("550 mailbox unavailable")
        expect(page.locator("#b-page-info")).to_have_text("1–3 of 3 jobs, in the order enqueued")
        assert f"batch={batch_id}" in page.url and "job=" not in page.url
        assert page.evaluate(_BATCH_OVERFLOWS) == []
        page.screenshot(path=str(tmp_path / "batch.png"))

        # the callback, from the graph: it waits for every job of the batch and runs whatever they end as
        graph.locator("g.callback").click()
        expect(page.locator("#d-id")).to_have_text(callback)
        expect(view).to_be_hidden()
        expect(page.locator("#d-parents a")).to_have_text(members)
        expect(page.locator("#d-waiting")).to_have_text("1 of its 3 parents")
        expect(page.locator("#d-on-failure")).to_have_text("run it anyway, once every parent has ended")
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("#d-cancel")
        expect(page.locator("#d-status")).to_have_text("cancelled")
        expect(page.locator("#count-waiting")).to_have_text("1")
        assert stored(db, callback).status == "cancelled"  # type: ignore[union-attr]

        # the batch's view from the address, as a shared link opens it
        page.goto(f"{url}/admin#batch={batch_id}")
        expect(view).to_be_visible()
        expect(page.locator("#b-callback .badge")).to_have_text("cancelled")
        expect(graph.locator("g.callback text")).to_have_text("callback · cancelled")
        page.keyboard.press("Escape")
        expect(view).to_be_hidden()
        assert "batch=" not in page.url

        # an answer that comes after the operator moved on is dropped: the job's view, asked for and
        # left for the batch's before its answer came, does not open over the batch's
        page.evaluate(_SLOW_JOB_ANSWERS, members[0])
        page.evaluate("(id) => { location.hash = `job=${id}`; }", members[0])
        page.evaluate("(id) => { location.hash = `batch=${id}`; }", batch_id)
        assert page.evaluate("() => window.slowAnswered") is False  # the batch was asked for first
        expect(view).to_be_visible()
        page.wait_for_function("() => window.slowAnswered === true")
        page.wait_for_timeout(100)  # the answer has been handed to the page's code
        expect(page.locator("#detail")).to_be_hidden()
        expect(view).to_be_visible()
        assert "batch=" in page.url
        assert page.errors == []
