"""The demo's loopback receivers: an SMTP sink and an HTTP sink, both trio tasks.

They are just enough of each protocol for what the pipeline's own clients send (smtplib
without TLS or AUTH; httpx POSTs with a Content-Length), so the demo needs no server
package and sends nothing off this machine. Each connection is read with a size cap and
a deadline; what arrives is kept in memory for the report. Not for anything but the demo.
"""

from __future__ import annotations

import base64
import email
import email.message
import email.policy
import hashlib
import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

log = logging.getLogger("pipeline.demo")

MAX_BYTES = 8 * 1024 * 1024  # per SMTP message or HTTP request
IDLE_SECONDS = 30.0  # a connection silent this long is dropped


@attrs.frozen
class ReceivedMail:
    mail_from: str
    rcpt_tos: tuple[str, ...]
    message: email.message.EmailMessage

    @property
    def content_types(self) -> list[str]:
        return [part.get_content_type() for part in self.message.walk() if not part.is_multipart()]


@attrs.frozen
class ReceivedRequest:
    method: str
    target: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    signature_ok: bool | None  # None: no secret to check against

    def json(self) -> Any:
        return json.loads(self.body)


class _Lines:
    """CRLF-terminated lines from a stream, with a cap on what one connection may send."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buffer = bytearray()
        self.total = 0

    async def line(self) -> bytes | None:
        while True:
            end = self.buffer.find(b"\r\n")
            if end >= 0:
                line = bytes(self.buffer[:end])
                del self.buffer[: end + 2]
                return line
            if not await self._fill():
                return None

    async def exactly(self, n: int) -> bytes | None:
        while len(self.buffer) < n:
            if not await self._fill():
                return None
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        return data

    async def _fill(self) -> bool:
        with trio.move_on_after(IDLE_SECONDS):
            chunk = await self.stream.receive_some(65536)
            self.total += len(chunk)
            if not chunk or self.total > MAX_BYTES:
                return False
            self.buffer += chunk
            return True
        return False


@attrs.define(eq=False)
class SmtpSink:
    """Accepts every message (no relay, no auth, no TLS) and keeps it."""

    host: str = "127.0.0.1"
    port: int = 0  # set once listening
    received: list[ReceivedMail] = attrs.field(factory=list)

    async def run(self, *, task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host=self.host)
        self.port = listeners[0].socket.getsockname()[1]
        await trio.serve_listeners(_tolerant(self._session), listeners, task_status=task_status)

    async def _session(self, stream: trio.SocketStream) -> None:
        async with stream:
            lines = _Lines(stream)
            reply = stream.send_all
            await reply(b"220 pipeline-demo SMTP sink\r\n")
            mail_from, rcpts = "", list[str]()
            while (line := await lines.line()) is not None:
                verb, _, arg = line.decode("utf-8", "replace").partition(" ")
                verb = verb.upper()
                if verb == "EHLO":
                    await reply(b"250-pipeline-demo\r\n250-8BITMIME\r\n250-SMTPUTF8\r\n250 SIZE %d\r\n" % MAX_BYTES)
                elif verb == "HELO":
                    await reply(b"250 pipeline-demo\r\n")
                elif verb == "MAIL":
                    mail_from, rcpts = _address(arg), []
                    await reply(b"250 OK\r\n")
                elif verb == "RCPT":
                    rcpts.append(_address(arg))
                    await reply(b"250 OK\r\n")
                elif verb == "DATA":
                    await reply(b"354 end with <CRLF>.<CRLF>\r\n")
                    body = []
                    while (data := await lines.line()) is not None and data != b".":
                        body.append(data[1:] if data.startswith(b".") else data)  # undo dot-stuffing
                    if data is None:
                        return
                    message = email.message_from_bytes(b"\n".join(body) + b"\n", policy=email.policy.default)
                    self.received.append(ReceivedMail(mail_from, tuple(rcpts), message))
                    await reply(b"250 OK: kept by the demo\r\n")
                elif verb in ("RSET", "NOOP"):
                    mail_from, rcpts = ("", []) if verb == "RSET" else (mail_from, rcpts)
                    await reply(b"250 OK\r\n")
                elif verb == "QUIT":
                    await reply(b"221 bye\r\n")
                    return
                else:
                    await reply(b"502 not implemented by the demo sink\r\n")


def _tolerant(session: Callable[[trio.SocketStream], Awaitable[None]]) -> Callable[[trio.SocketStream], Awaitable[None]]:
    """A client that hangs up mid-conversation ends its own connection, not the sink (serve_listeners
    would otherwise let the error cancel every other connection, and the demo)."""

    async def guarded(stream: trio.SocketStream) -> None:
        try:
            await session(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ValueError) as exc:
            log.debug("demo sink: connection dropped: %r", exc)

    return guarded


def _address(arg: str) -> str:
    """``FROM:<a@b> SIZE=12`` -> ``a@b``."""
    value = arg.partition(":")[2].strip()
    return value.partition(">")[0].lstrip("<") if value.startswith("<") else value.split(" ")[0]


@attrs.define(eq=False)
class HttpSink:
    """Answers every request 200 and keeps it; checks Standard Webhooks signatures when given the secret."""

    secret: str = ""  # whsec_<base64 key>
    host: str = "127.0.0.1"
    port: int = 0
    received: list[ReceivedRequest] = attrs.field(factory=list)

    async def run(self, *, task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host=self.host)
        self.port = listeners[0].socket.getsockname()[1]
        await trio.serve_listeners(_tolerant(self._session), listeners, task_status=task_status)

    def url(self, path: str = "/") -> str:
        return f"http://{self.host}:{self.port}{path}"

    async def _session(self, stream: trio.SocketStream) -> None:
        async with stream:
            lines = _Lines(stream)
            request = await lines.line()
            if request is None:
                return
            headers = {}
            while (line := await lines.line()) not in (None, b""):
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            method, target, *_ = request.decode("latin-1").split(" ") + ["", ""]
            try:
                length = int(headers.get("content-length", "0"))
            except ValueError:
                length = -1
            body = await lines.exactly(length) if 0 <= length <= MAX_BYTES else None
            if body is None:
                await stream.send_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            ok = verify_signature(self.secret, headers, body) if self.secret else None
            self.received.append(ReceivedRequest(method, target, headers, body, ok))
            await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n")


def verify_signature(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """Standard Webhooks: ``v1,<base64 HMAC-SHA256(key, "id.timestamp.body")>`` among the signatures."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers.get('webhook-id', '')}.{headers.get('webhook-timestamp', '')}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(
        version == "v1" and hmac.compare_digest(value, expected)
        for version, _, value in (sig.partition(",") for sig in headers.get("webhook-signature", "").split())
    )
