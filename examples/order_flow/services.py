"""The outside world of the order flow: a payment provider and a warehouse, faked in one SQLite file.

They stand for the HTTP APIs a real shop calls (Stripe's, a logistics partner's), and keep what a real
provider keeps, so that what happened can be read afterwards (``sqlite3 orders.db``, or the tests):

    payment_requests   every request the payment provider received, replays included (its request log)
    charges            the charges it made: one per idempotency key, as a real provider answers a replay
                       with the first charge instead of charging again
    shipments          what the warehouse shipped, one row per order

Both are called from the job's steps. A step is at least once (docs/durable.md): a process killed after
the provider charged and before the step's value was committed runs the step again, and only the
idempotency key keeps that from being a second charge. The request log shows every such replay.

sqlite3 blocks, so every call runs in a thread (``trio.to_thread``) behind a limiter of its own: these
threads never take the ones the job store uses. A connection per call, in a transaction of its own
(``BEGIN IMMEDIATE``): several worker processes may share the file.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import secrets
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import trio

SCHEMA = """
CREATE TABLE IF NOT EXISTS payment_requests (
    n               INTEGER PRIMARY KEY,
    at              TEXT NOT NULL,
    operation       TEXT NOT NULL,   -- charge | refund
    idempotency_key TEXT,
    body            TEXT NOT NULL    -- the request's arguments, as JSON
);
CREATE TABLE IF NOT EXISTS charges (
    id              TEXT PRIMARY KEY,
    idempotency_key TEXT NOT NULL UNIQUE,
    card            TEXT NOT NULL,
    amount_cents    INTEGER NOT NULL,
    created_at      TEXT NOT NULL,
    refunded_at     TEXT
);
CREATE TABLE IF NOT EXISTS shipments (
    order_id        TEXT PRIMARY KEY,
    tracking        TEXT NOT NULL,
    shipped_at      TEXT NOT NULL
);
"""


@attrs.frozen
class Charge:
    """A charge, as the provider answers it (and as the "charge" step's value is read back)."""

    id: str
    amount_cents: int
    refunded: bool = False


@attrs.frozen
class Shipment:
    order_id: str
    tracking: str


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


@contextlib.contextmanager
def transaction(path: Path) -> Iterator[sqlite3.Connection]:
    """One connection, one write transaction: committed if the block ends, rolled back if it raises."""
    db = sqlite3.connect(path, timeout=10, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
    finally:
        db.close()


def create_tables(path: Path) -> None:
    db = sqlite3.connect(path, timeout=10, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")  # the tests (and you) read it while a worker writes
        db.executescript(SCHEMA)
    finally:
        db.close()


@attrs.frozen
class Payments:
    """The payment provider's API: ``charge`` and ``refund``."""

    path: Path
    limiter: trio.CapacityLimiter

    async def charge(self, card: str, amount_cents: int, *, idempotency_key: str) -> Charge:
        """Charge ``amount_cents`` to ``card`` (the provider's token for it), once per ``idempotency_key``:
        a replay answers the first charge."""
        return await trio.to_thread.run_sync(self._charge, card, amount_cents, idempotency_key, limiter=self.limiter)

    async def refund(self, charge_id: str) -> Charge:
        """Refund a charge in full; refunding it again answers the same refund."""
        return await trio.to_thread.run_sync(self._refund, charge_id, limiter=self.limiter)

    def _charge(self, card: str, amount_cents: int, key: str) -> Charge:
        with transaction(self.path) as db:
            _log_request(db, "charge", key, {"card": card, "amount_cents": amount_cents})
            row = db.execute("SELECT id, amount_cents, refunded_at FROM charges WHERE idempotency_key = ?", (key,)).fetchone()
            if row is not None:
                return Charge(row[0], row[1], row[2] is not None)
            charge = Charge("ch_" + secrets.token_hex(8), amount_cents)
            db.execute("INSERT INTO charges (id, idempotency_key, card, amount_cents, created_at) VALUES (?, ?, ?, ?, ?)",
                       (charge.id, key, card, amount_cents, _now()))
            return charge

    def _refund(self, charge_id: str) -> Charge:
        with transaction(self.path) as db:
            _log_request(db, "refund", None, {"charge": charge_id})
            row = db.execute("SELECT amount_cents FROM charges WHERE id = ?", (charge_id,)).fetchone()
            if row is None:
                raise LookupError(f"payments: no charge {charge_id}")
            db.execute("UPDATE charges SET refunded_at = coalesce(refunded_at, ?) WHERE id = ?", (_now(), charge_id))
            return Charge(charge_id, row[0], refunded=True)


@attrs.frozen
class Warehouse:
    """The warehouse's API: ``ship``, once per order."""

    path: Path
    limiter: trio.CapacityLimiter

    async def ship(self, order_id: str) -> Shipment:
        return await trio.to_thread.run_sync(self._ship, order_id, limiter=self.limiter)

    def _ship(self, order_id: str) -> Shipment:
        with transaction(self.path) as db:
            db.execute("INSERT INTO shipments (order_id, tracking, shipped_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                       (order_id, "TRK" + secrets.token_hex(5).upper(), _now()))
            (tracking,) = db.execute("SELECT tracking FROM shipments WHERE order_id = ?", (order_id,)).fetchone()
            return Shipment(order_id, tracking)


def _log_request(db: sqlite3.Connection, operation: str, key: str | None, body: dict[str, Any]) -> None:
    db.execute("INSERT INTO payment_requests (at, operation, idempotency_key, body) VALUES (?, ?, ?, ?)",
               (_now(), operation, key, json.dumps(body)))
