"""An order flow as a durable function (docs/durable.md): charge the card, mail a person a link to approve
or reject the order, wait for their answer (days if need be, holding no worker), then ship or refund.

    python -m pipeline --app examples.order_flow.app:registry

Each piece of work is a step (``ctx.step``): its value is committed with the job, so when the job runs
again from the top (after the wait, a retry, or a crash of the process) a step done before returns its
value without running again: the card is charged once, the mail is sent once. The approver's answer is a
signal (``ctx.wait_for("approval")``) sent by a signed link on the admin server (pipeline.admin.links),
which works without the admin token, once, until it expires.

Settings (environment variables, or a .env file; README.md has a session to copy):

    ADMIN_SIGNING_KEY        signs the links (required); ADMIN_HOST/ADMIN_PORT or ADMIN_PUBLIC_URL: their address
    SMTP_HOST, SMTP_PORT     the mail server the links are sent through (required; port 25 by default)
    MAIL_FROM                the sender (required)
    ORDER_APPROVER           who approves orders (required)
    ORDER_APPROVAL_TIMEOUT   seconds to wait for an answer before refunding (default 2 days); the links expire then
    ORDERS_DATABASE          the SQLite file of the fake payment provider and warehouse (default orders.db)

(SMTP_HOST, SMTP_PORT and MAIL_FROM are the variables the bundled site's mail uses, docs/configuration.md.
This example speaks plain SMTP, as to a relay on the same machine; pipeline/site/mail.py shows STARTTLS, TLS
and a login.)
"""

from __future__ import annotations

import email.utils
import html
import smtplib
from collections.abc import AsyncIterator
from email.message import EmailMessage
from pathlib import Path

import attrs
import trio

import pipeline
from pipeline.admin.links import base_url, require_key, signal_link
from pipeline.config import port, positive_seconds, setting, text

from .services import Charge, Payments, Warehouse, create_tables

registry = pipeline.Registry()


@attrs.frozen
class OrderFlowSettings:
    """The example's own settings: ``config.section(OrderFlowSettings)``."""

    smtp_host: str = setting("", "SMTP_HOST", text)
    smtp_port: int = setting(25, "SMTP_PORT", port)
    smtp_timeout: float = setting(30.0, "SMTP_TIMEOUT", positive_seconds)
    mail_from: str = setting("", "MAIL_FROM", text)
    approver: str = setting("", "ORDER_APPROVER", text)
    approval_timeout: float = setting(2 * 86400.0, "ORDER_APPROVAL_TIMEOUT", positive_seconds)
    database: str = setting("orders.db", "ORDERS_DATABASE", text)


@attrs.frozen
class Order:
    """The job's payload: ``enqueue place_order --payload '{"id": "o-1", "card": "tok_visa", "amount_cents": 4200}'``."""

    id: str
    card: str  # the payment provider's token for the customer's card, never its number
    amount_cents: int = attrs.field(validator=attrs.validators.gt(0))


@attrs.frozen
class Shop:
    """What the steps use, opened once per worker process by the lifespan (``ctx.state``)."""

    config: pipeline.Config
    settings: OrderFlowSettings
    payments: Payments
    warehouse: Warehouse
    mail_limiter: trio.CapacityLimiter  # smtplib blocks: its threads are its own

    async def mail_approval_links(self, job_id: str, order: Order, charge: Charge) -> dict[str, str]:
        """Mail the approver a link that approves the order and one that rejects it; answers where it went.

        A step's value is shown by ``jobs show`` and the dashboard: the links are credentials, so they are
        mailed and not returned. Each call makes new links; as a step, it is called once (at least once:
        a process killed during the send mails again, with new links, under the same Message-ID)."""
        expires_in = self.settings.approval_timeout
        approve = signal_link(self.config, job_id, "approval", {"approved": True}, expires_in=expires_in)
        reject = signal_link(self.config, job_id, "approval", {"approved": False}, expires_in=expires_in)
        message = approval_mail(self.settings, job_id, order, charge, approve, reject)
        await trio.to_thread.run_sync(self._send, message, limiter=self.mail_limiter)
        return {"to": self.settings.approver, "message_id": message["Message-ID"]}

    def _send(self, message: EmailMessage) -> None:
        # a failure (no server, a refusal) raises: the step commits nothing and the job's retries apply
        with smtplib.SMTP(self.settings.smtp_host, self.settings.smtp_port, timeout=self.settings.smtp_timeout) as smtp:
            smtp.send_message(message)


@registry.lifespan
async def lifespan(config: pipeline.Config) -> AsyncIterator[Shop]:
    """Checks the settings (a process that cannot mail a link stops at start, naming the variable) and
    creates the fake services' tables."""
    settings = config.section(OrderFlowSettings)
    for variable, value in (("SMTP_HOST", settings.smtp_host), ("MAIL_FROM", settings.mail_from),
                            ("ORDER_APPROVER", settings.approver)):
        if not value:
            raise pipeline.ConfigError(f"{variable} is not set: the order flow mails approval links "
                                       "(examples/order_flow/README.md)")
    require_key(config)  # ADMIN_SIGNING_KEY
    base_url(config)  # the links' address: ADMIN_PUBLIC_URL, or ADMIN_HOST:ADMIN_PORT if a person can open it
    path = Path(settings.database)
    await trio.to_thread.run_sync(create_tables, path)
    services = trio.CapacityLimiter(2)
    yield Shop(config, settings, Payments(path, services), Warehouse(path, services), trio.CapacityLimiter(4))


def approval_mail(settings: OrderFlowSettings, job_id: str, order: Order, charge: Charge, approve: str,
                  reject: str) -> EmailMessage:
    message = EmailMessage()
    amount = f"{order.amount_cents / 100:.2f}"
    message["Subject"] = f"Approve order {order.id} ({amount})?"
    message["From"] = settings.mail_from
    message["To"] = settings.approver
    message["Date"] = email.utils.formatdate(localtime=False)
    # the same for every send of this job's mail: a resent one is recognised as the same message
    domain = settings.mail_from.rpartition("@")[2] or "localhost"
    message["Message-ID"] = f"<{job_id}.approval@{domain}>"
    message.set_content(
        f"Order {order.id}: {amount} charged ({charge.id}).\n\n"
        f"Approve (it ships):\n{approve}\n\n"
        f"Reject (it is refunded):\n{reject}\n\n"
        "Each link opens a page that asks you to confirm; it works once.\n"
    )
    message.add_alternative(
        f"<p>Order <b>{html.escape(order.id)}</b>: {amount} charged ({html.escape(charge.id)}).</p>"
        f'<p><a href="{html.escape(approve)}">Approve</a> (it ships) &middot; '
        f'<a href="{html.escape(reject)}">Reject</a> (it is refunded)</p>'
        "<p>Each link opens a page that asks you to confirm; it works once.</p>",
        subtype="html",
    )
    return message


# -- the durable function -------------------------------------------------------------------------


@registry.job(max_attempts=5)
async def place_order(order: Order, ctx: pipeline.JobContext) -> str:
    shop: Shop = ctx.state
    charge = await ctx.step("charge", shop.payments.charge, order.card, order.amount_cents, idempotency_key=ctx.id)
    await ctx.step("mail approver", shop.mail_approval_links, ctx.id, order, charge)
    try:
        decision = await ctx.wait_for("approval", timeout=shop.settings.approval_timeout)
    except pipeline.SignalTimeout:
        await ctx.step("refund", shop.payments.refund, charge.id)
        return "expired"
    if not decision["approved"]:
        await ctx.step("refund", shop.payments.refund, charge.id)
        return "rejected"
    await ctx.step("ship", shop.warehouse.ship, order.id)
    return "shipped"
