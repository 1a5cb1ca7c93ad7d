"""Durable functions (docs/durable.md): what a signal is as callers send it, checked once for every
door (the Pipeline and its clients, the CLI, the admin API, a signed link).

The handler's side (``ctx.step``, ``ctx.sleep``, ``ctx.wait_for``) is in context.py and
engine/steps.py; the store's in each backend (Backend.steps, take_signal, signal, wake_suspended).
"""

from __future__ import annotations

import json
from typing import Any

from .errors import UsageError
from .texts import check_name, check_text

MAX_SIGNAL_NAME_CHARS = 200  # a name says what is awaited ("approval", "payment-received"), not data
MAX_SIGNAL_PAYLOAD_BYTES = 1_000_000  # a signal carries a decision and its details, not a file


def check_signal_name(value: Any) -> str:
    """A signal's name as given: non-empty text of at most MAX_SIGNAL_NAME_CHARS characters that every
    store can hold; UsageError naming the problem otherwise."""
    return check_name(value, "a signal's name", MAX_SIGNAL_NAME_CHARS)


def encode_signal_payload(payload: Any) -> str | None:
    """A signal's payload as the JSON text the store keeps (None: none). Any JSON value; UsageError for
    what JSON cannot hold (a set, NaN, an object), or one larger than MAX_SIGNAL_PAYLOAD_BYTES."""
    if payload is None:
        return None
    try:
        text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise UsageError(f"a signal's payload must be a JSON value (objects, lists, text, numbers, true/false, "
                         f"null): {exc}") from None
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SIGNAL_PAYLOAD_BYTES:
        raise UsageError(f"a signal's payload must be at most {MAX_SIGNAL_PAYLOAD_BYTES:,} bytes as JSON")
    return check_text(text, "the signal's payload")


def parse_signal_payload(text: str | None, what: str = "the payload") -> str | None:
    """A payload given as JSON text (the CLI's --payload, an HTTP body): the canonical JSON text to store;
    None for none (no text, or empty). UsageError naming ``what`` if it is not JSON."""
    if text is None or not text.strip():
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{what} must be JSON (any JSON value; empty for none): {exc}") from None
    return encode_signal_payload(value)
