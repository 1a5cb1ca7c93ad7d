"""examples/order_flow/ (docs/durable.md, issue 35): charge → wait for approval with a link mailed to a
person → ship or refund, run as a user runs it. Real parts throughout: aiosmtpd on loopback is the mail
server, the worker is ``python -m pipeline --app examples.order_flow.app:registry`` in a process of its own
with its admin server on a port of the test's, and httpx is the approver's browser: it opens the mailed
link (GET: nothing is sent) and presses the page's button (POST: the signal is sent, once). What the job did
to the outside world is read from the example's fake payment provider and warehouse (orders.db), what it
did in the store from the admin API."""

from __future__ import annotations

import asyncio
import base64
import email
import email.message
import email.policy
import html.parser
import json
import re
import secrets
import socket
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from aiosmtpd.controller import Controller
from app_harness import ROOT, Service, app_env
from backends import stores

APP = "examples.order_flow.app:registry"
ORDER = {"id": "o-1", "card": "tok_visa", "amount_cents": 4200}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Inbox:
    """The approver's mailbox: an aiosmtpd handler keeping the mails it accepts. ``hold_next`` makes it
    take the next mail's data and give no answer until ``release`` (the sender is killed meanwhile)."""

    def __init__(self) -> None:
        self.changed = threading.Condition()  # the server's thread appends, the test waits
        self.messages: list[email.message.EmailMessage] = []
        self.hold_next = False
        self.held = threading.Event()  # a mail's data arrived and is being held
        self.release = threading.Event()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if self.hold_next:
            self.hold_next = False
            self.held.set()
            await asyncio.to_thread(self.release.wait, 60)
            return "451 4.3.0 not accepted, try again later"
        message = email.message_from_bytes(envelope.content.replace(b"\r\n", b"\n"), policy=email.policy.default)
        with self.changed:
            self.messages.append(message)
            self.changed.notify_all()
        return "250 OK: queued"

    def wait(self, count: int, timeout: float = 15.0) -> list[email.message.EmailMessage]:
        with self.changed:
            if not self.changed.wait_for(lambda: len(self.messages) >= count, timeout):
                raise AssertionError(f"{count} mails not received within {timeout} s: {len(self.messages)} were")
            return list(self.messages)


@pytest.fixture
def smtp() -> Iterator[tuple[Inbox, int]]:
    inbox, port = Inbox(), free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, port
    finally:
        inbox.release.set()
        controller.stop()


class Form(html.parser.HTMLParser):
    """The page's forms, as a browser reads them: (method, action, {input name: value})."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[tuple[str, str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attributes: list[tuple[str, str | None]]) -> None:
        given = {name: value or "" for name, value in attributes}
        if tag == "form":
            self.forms.append((given.get("method", "get").lower(), given.get("action", ""), {}))
        elif tag in ("input", "button") and self.forms and given.get("name"):
            self.forms[-1][2][given["name"]] = given.get("value", "")


class Approver:
    """A person with a browser: opens a link, and presses the button of the page it shows."""

    def __init__(self) -> None:
        self.http = httpx.Client(timeout=10, follow_redirects=False)

    def __enter__(self) -> Approver:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.http.close()

    def open(self, url: str) -> httpx.Response:
        return self.http.get(url, headers={"Accept": "text/html"})

    def press(self, url: str, page: httpx.Response) -> httpx.Response:
        """The button of ``page`` (opened at ``url``): its form sent as a browser sends it."""
        parser = Form()
        parser.feed(page.text)
        ((method, action, fields),) = parser.forms
        assert method == "post", page.text
        return self.post(httpx.URL(url).join(action) if action else httpx.URL(url), fields)

    def post(self, url: str | httpx.URL, fields: dict[str, str] | None = None) -> httpx.Response:
        target = httpx.URL(url)
        origin = f"{target.scheme}://{target.netloc.decode()}"  # what a browser sends with a form's POST
        return self.http.post(target, data=fields or {}, headers={
            "Accept": "text/html", "Origin": origin, "Content-Type": "application/x-www-form-urlencoded"})


class OrderFlow:
    """The example in a folder of its own (the working directory): its worker, its mail server, its job
    store, its orders.db."""

    def __init__(self, folder: Path, database_url: str, smtp_port: int, **settings: str) -> None:
        self.folder = folder
        self.orders = folder / "orders.db"
        self.env = app_env(folder, database_url, ADMIN_SIGNING_KEY=secrets.token_urlsafe(32), ADMIN_HOST="127.0.0.1",
                           ADMIN_PORT=str(free_port()), SMTP_HOST="127.0.0.1", SMTP_PORT=str(smtp_port),
                           MAIL_FROM="shop@example.com", ORDER_APPROVER="boss@example.com",
                           ORDERS_DATABASE=str(self.orders), WORKER_POLL_INTERVAL_MS="50",
                           WORKER_BACKOFF_BASE_MS="50", SQLITE_SYNCHRONOUS="normal", REDIS_ALLOW_NON_DURABLE="true",
                           **settings)
        self.admin = httpx.Client(base_url=f"http://127.0.0.1:{self.env['ADMIN_PORT']}", timeout=10)
        self.service: Service | None = None

    def start(self) -> Service:
        """The worker, ready; another free port if the one picked was taken meanwhile (the links name the
        port, so a restart keeps it)."""
        for _ in range(3):
            service = Service(self.folder, self.env, "--app", APP)
            try:
                service.ready(1, "place_order")
            except AssertionError:
                service.kill()
                if self.service is not None or not any("cannot listen on" in line for line in service.lines):
                    raise
                self.env["ADMIN_PORT"] = str(free_port())
                self.admin = httpx.Client(base_url=f"http://127.0.0.1:{self.env['ADMIN_PORT']}", timeout=10)
                continue
            assert service.admin_url() == str(self.admin.base_url).rstrip("/"), service.lines
            self.service = service
            return service
        raise AssertionError("no free port for the admin server in three tries")

    def kill(self) -> None:
        """SIGKILL: the worker ends at once, with nothing written."""
        assert self.service is not None
        self.service.proc.kill()
        self.service.proc.wait()

    def stop(self) -> None:
        if self.service is not None and self.service.proc.poll() is None:
            assert self.service.stop() == 0, self.service.lines[-20:]
        self.admin.close()

    def end(self) -> None:
        if self.service is not None:
            self.service.kill()
        self.admin.close()

    def place_order(self) -> str:
        answer = self.admin.post("/admin/jobs", json={"job_type": "place_order", "payload": ORDER})
        assert answer.status_code == 201, answer.text
        return str(answer.json()["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.admin.get(f"/admin/jobs/{job_id}").raise_for_status().json())

    def until(self, job_id: str, done: Callable[[dict[str, Any]], bool], what: str, timeout: float = 15.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not done(job := self.job(job_id)):
            assert time.monotonic() < deadline, f"job {job_id}: not {what} within {timeout} s: {job}"
            time.sleep(0.02)
        return job

    def suspended(self, job_id: str) -> dict[str, Any]:
        return self.until(job_id, lambda j: j["status"] == "suspended", "suspended")

    def finished(self, job_id: str) -> dict[str, Any]:
        return self.until(job_id, lambda j: j["status"] in ("completed", "dead", "cancelled"), "finished")

    def read(self, sql: str) -> list[tuple[Any, ...]]:
        """The fake payment provider's and warehouse's records."""
        db = sqlite3.connect(self.orders)
        try:
            return db.execute(sql).fetchall()
        finally:
            db.close()


def links(message: email.message.EmailMessage) -> dict[str, str]:
    """The approve and reject links of the approval mail."""
    text = message.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    found = dict(re.findall(r"^(Approve|Reject) \(.*\):\n(\S+)$", text, re.M))
    assert set(found) == {"Approve", "Reject"}, text
    return found


def claims(link: str) -> dict[str, Any]:
    """What a link's token says (pipeline/admin/links.py: base64url JSON, then its signature)."""
    encoded = link.rpartition("/")[2].rpartition(".")[0]
    return dict(json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))))


def step_names(job: dict[str, Any]) -> list[str]:
    return [step["name"] for step in job["steps"]]


@asynccontextmanager
async def job_store(kind: str, folder: Path) -> AsyncIterator[str]:
    """A fresh job store's DATABASE_URL: a SQLite file in the folder, or a schema of the test Postgres."""
    if kind == "sqlite":
        yield f"sqlite:///{folder / 'jobs.db'}"
        return
    async with stores.migrated_postgres_store(folder) as config:
        yield config.database_url


@pytest.fixture
def flows() -> Iterator[list[OrderFlow]]:
    """The flows a test made: their workers killed at its end, if it failed before stopping them."""
    made: list[OrderFlow] = []
    yield made
    for flow in made:
        flow.end()


# -- the tests ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("store", ["sqlite", "postgres"])
async def test_the_approval_link_ships_the_order_once_and_only_when_its_button_is_pressed(
        store: str, tmp_path: Path, smtp: tuple[Inbox, int], flows: list[OrderFlow]) -> None:
    inbox, smtp_port = smtp
    async with job_store(store, tmp_path) as url:
        flow = OrderFlow(tmp_path, url, smtp_port)
        flows.append(flow)
        try:
            await trio.to_thread.run_sync(approve, flow, inbox)
        finally:  # before the store goes: a worker left by a failure lets its schema be dropped
            flow.end()


def approve(flow: OrderFlow, inbox: Inbox) -> None:
    flow.start()
    job_id = flow.place_order()
    (mail,) = inbox.wait(1)
    assert (mail["To"], mail["From"]) == ("boss@example.com", "shop@example.com")
    assert mail["Message-ID"] == f"<{job_id}.approval@example.com>"
    link, reject = links(mail)["Approve"], links(mail)["Reject"]
    assert link.startswith(f"{flow.admin.base_url}/signal-links/"), link
    job = flow.suspended(job_id)
    assert job["awaiting_signal"] == "approval" and step_names(job) == ["charge", "mail approver", "@wait:approval#1"], job
    # charged once, nothing shipped yet
    assert flow.read("SELECT operation, idempotency_key FROM payment_requests") == [("charge", job_id)]
    assert flow.read("SELECT amount_cents, refunded_at FROM charges") == [(4200, None)]

    with Approver() as approver:
        # opening the link (as a mail scanner would) sends nothing: the job still waits
        page = approver.open(link)
        assert page.status_code == 200, page.text
        assert "Send approval" in page.text and "&quot;approved&quot;: true" in page.text, page.text
        assert flow.job(job_id)["status"] == "suspended"
        assert flow.read("SELECT count(*) FROM shipments") == [(0,)]

        sent = approver.press(link, page)
        assert sent.status_code == 200 and "Sent: approval" in sent.text, sent.text
        job = flow.finished(job_id)
        assert (job["status"], job["result"]) == ("completed", "shipped"), job
        assert step_names(job) == ["charge", "mail approver", "@wait:approval#1", "ship"], job
        assert flow.read("SELECT order_id FROM shipments") == [("o-1",)]
        assert flow.read("SELECT operation FROM payment_requests") == [("charge",)]  # no second charge, no refund

        # the mail's other link finds the job finished and sends nothing
        late = approver.open(reject)
        assert late.status_code == 409 and "is completed" in late.text, late.text
        assert approver.post(reject).status_code == 409  # (its button, on a page opened before the approval)
        assert flow.read("SELECT refunded_at FROM charges") == [(None,)]
        assert len(inbox.wait(1)) == 1

        # the link works once: pressed again (a double click, the page's form sent again) it is gone
        again = approver.press(link, page)
        assert again.status_code == 410 and "used already" in again.text, again.text
    flow.stop()


@pytest.mark.slow
def test_the_rejection_link_refunds_the_charge(tmp_path: Path, smtp: tuple[Inbox, int], flows: list[OrderFlow]) -> None:
    inbox, smtp_port = smtp
    flow = OrderFlow(tmp_path, f"sqlite:///{tmp_path / 'jobs.db'}", smtp_port)
    flows.append(flow)
    flow.start()
    job_id = flow.place_order()
    (mail,) = inbox.wait(1)
    flow.suspended(job_id)
    link = links(mail)["Reject"]
    with Approver() as approver:
        page = approver.open(link)
        assert page.status_code == 200 and "&quot;approved&quot;: false" in page.text, page.text
        assert approver.press(link, page).status_code == 200

    job = flow.finished(job_id)
    assert (job["status"], job["result"]) == ("completed", "rejected"), job
    assert step_names(job) == ["charge", "mail approver", "@wait:approval#1", "refund"], job
    ((charge_id, refunded_at),) = flow.read("SELECT id, refunded_at FROM charges")
    assert refunded_at is not None
    assert flow.read("SELECT operation, body FROM payment_requests ORDER BY n")[1] == ("refund", json.dumps({"charge": charge_id}))
    assert flow.read("SELECT count(*) FROM shipments") == [(0,)]
    flow.stop()


@pytest.mark.slow
def test_an_order_nobody_answers_is_refunded_when_its_links_expire(
        tmp_path: Path, smtp: tuple[Inbox, int], flows: list[OrderFlow]) -> None:
    inbox, smtp_port = smtp
    flow = OrderFlow(tmp_path, f"sqlite:///{tmp_path / 'jobs.db'}", smtp_port, ORDER_APPROVAL_TIMEOUT="1")
    flows.append(flow)
    flow.start()
    placed_at = time.time()
    job_id = flow.place_order()
    (mail,) = inbox.wait(1)
    job = flow.finished(job_id)
    assert (job["status"], job["result"]) == ("completed", "expired"), job
    assert [(s["name"], s["status"]) for s in job["steps"]] == [
        ("charge", "completed"), ("mail approver", "completed"), ("@wait:approval#1", "timed_out"), ("refund", "completed")], job
    assert flow.read("SELECT refunded_at IS NOT NULL FROM charges") == [(1,)]
    # the links expire with the wait (to the whole second after it): pressed late, they ship nothing
    link = links(mail)["Approve"]
    expires_at = claims(link)["exp"]
    assert expires_at - placed_at <= 1 + 2, (expires_at, placed_at)
    time.sleep(max(0.0, expires_at - time.time()))
    with Approver() as approver:
        late = approver.open(link)
    assert late.status_code == 410 and "this link expired" in late.text, late.text
    assert flow.read("SELECT count(*) FROM shipments") == [(0,)]
    flow.stop()


@pytest.mark.slow
def test_a_worker_killed_during_the_mail_and_during_the_wait_charges_the_card_once(
        tmp_path: Path, smtp: tuple[Inbox, int], flows: list[OrderFlow]) -> None:
    inbox, smtp_port = smtp
    # a short lease: the job the first kill leaves running is rescued within a second or so
    flow = OrderFlow(tmp_path, f"sqlite:///{tmp_path / 'jobs.db'}", smtp_port, WORKER_LEASE_SECONDS="1")
    flows.append(flow)

    # 1. killed while the approval mail is being sent: the charge step was committed, the mail's was not
    inbox.hold_next = True
    flow.start()
    job_id = flow.place_order()
    assert inbox.held.wait(15), "the approval mail never reached the mail server"
    assert flow.job(job_id)["status"] == "running"
    flow.kill()
    inbox.release.set()  # the server answers the dead connection: that mail was not accepted

    # 2. restarted: the job is rescued, runs from the top, the charge returns its stored value, the mail is sent
    flow.start()
    (mail,) = inbox.wait(1)
    job = flow.suspended(job_id)
    assert step_names(job) == ["charge", "mail approver", "@wait:approval#1"], job

    # 3. killed while it waits, restarted: the mailed link (made before both restarts) approves it
    flow.kill()
    flow.start()
    link = links(mail)["Approve"]
    with Approver() as approver:
        page = approver.open(link)
        assert page.status_code == 200, page.text
        assert approver.press(link, page).status_code == 200
    job = flow.finished(job_id)
    assert (job["status"], job["result"]) == ("completed", "shipped"), job

    # the card was charged by one request: neither rerun of the handler called the provider again
    assert flow.read("SELECT operation, idempotency_key FROM payment_requests") == [("charge", job_id)]
    assert flow.read("SELECT count(*) FROM charges") == [(1,)]
    assert flow.read("SELECT order_id FROM shipments") == [("o-1",)]
    assert len(inbox.wait(1)) == 1  # one mail accepted: the one cut short by the kill was not
    flow.stop()


def test_the_docs_show_the_examples_own_code() -> None:
    """docs/durable.md and the example's README show place_order as examples/order_flow/app.py has it."""
    handler = re.search(r"^@registry\.job\(max_attempts=5\)\nasync def place_order\(.*?(?=\n\S|\Z)",
                        (ROOT / "examples/order_flow/app.py").read_text(), re.S | re.M)
    assert handler is not None
    for doc in ("docs/durable.md", "examples/order_flow/README.md"):
        assert f"```python\n{handler.group(0).strip()}\n```" in (ROOT / doc).read_text(), doc
