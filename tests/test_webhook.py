"""webhook_notify against a real HTTP server on loopback, run through a real pipeline.

The receiver is the standard library's ThreadingHTTPServer on 127.0.0.1 in a thread; it
checks every signature with the Standard Webhooks reference verifier (the
``standardwebhooks`` package), records each request, and answers from a per-path script.
No test sends traffic anywhere but loopback: the private-range URLs are refused before
any connection, and one test proves that with a recording wrapper around the real
network backend.
"""

from __future__ import annotations

import base64
import email.utils
import ipaddress
import json
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import attrs
import httpcore
import pytest
import standardwebhooks
import trio
import trustme
from conftest import fast_config
from hypothesis import given
from hypothesis import strategies as st
from jobkit import wait_status

import pipeline
from pipeline import Registry, site
from pipeline.site import PostCreated, default_registry, webhook
from pipeline.site.egress import DestinationRefused, GuardedNetworkBackend, parse_ip_literal, refusal_reason
from pipeline.site.jobs import WebhookNotify
from pipeline.site.webhook import open_http_client, retry_after_seconds, sign

SECRET = "whsec_" + base64.b64encode(b"test key: 32 bytes of randomness").decode()


# -- the receiver ------------------------------------------------------------------------------


@attrs.frozen
class Reply:
    status: int = 200
    headers: dict[str, str] = attrs.field(factory=dict)
    body: bytes = b"ok"
    delay: float = 0.0  # seconds before answering (the timeout test)


@attrs.frozen
class Received:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: bytes
    verified: str  # "yes", "unsigned", or the verifier's complaint
    at: float  # time.monotonic()
    sni: str | None
    client: tuple[str, int]  # the connection's source address: the same one means a reused connection


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients that hang up (timeouts, pipeline shutdown) are expected here


class Receiver:
    """A real HTTP server on 127.0.0.1: scripted replies per path, every request recorded."""

    def __init__(self, secret: str, tls: ssl.SSLContext | None = None) -> None:
        self.verifier = standardwebhooks.Webhook(secret)
        self.script: dict[str, list[Reply]] = {}
        self.received: list[Received] = []
        self.lock = threading.Lock()
        self.sni: dict[Any, str | None] = {}  # client address -> the name it asked for in TLS
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                if "webhook-signature" not in headers:
                    verified = "unsigned"
                else:
                    try:
                        receiver.verifier.verify(body, headers)
                        verified = "yes"
                    except standardwebhooks.WebhookVerificationError as exc:
                        verified = f"no: {exc}"
                with receiver.lock:
                    path = self.path
                    receiver.received.append(Received(
                        self.command, path, headers, body, verified, time.monotonic(),
                        receiver.sni.get(self.client_address), self.client_address,
                    ))
                    replies = receiver.script.get(path, [])
                    reply = replies.pop(0) if len(replies) > 1 else (replies[0] if replies else Reply())
                if reply.delay:
                    time.sleep(reply.delay)
                try:
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("content-length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                except OSError:
                    pass  # the client gave up (the timeout test)

            do_POST = do_GET = _serve

            def log_message(self, *args: Any) -> None:
                pass

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            def remember_sni(sock: Any, name: str | None, ctx: Any) -> None:
                receiver.sni[sock.getpeername()] = name

            tls.sni_callback = remember_sni
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def url(self, path: str = "/hook", host: str = "127.0.0.1", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"

    def on(self, path: str, *replies: Reply) -> str:
        """Answer ``path`` with these replies in turn (the last one repeats); returns its URL."""
        with self.lock:
            self.script[path] = list(replies)
        return self.url(path)

    def requests(self, path: str | None = None) -> list[Received]:
        with self.lock:
            return [r for r in self.received if path is None or r.path == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver(SECRET)
    yield server
    server.close()


def webhook_config(db_path: Path, **overrides: Any) -> pipeline.Config:
    values: dict[str, Any] = dict(webhook_allow_private_networks=True, webhook_secret=SECRET, webhook_timeout_seconds=2.0)
    values.update(overrides)
    return fast_config(db_path, **values)


@asynccontextmanager
async def running(config: pipeline.Config, registry: Registry | None = None) -> AsyncIterator[pipeline.Pipeline]:
    async with pipeline.open_pipeline(config, registry or default_registry(config)) as p:
        yield p


async def deliver(config: pipeline.Config, url: str, payload: Any = None, *, until: str = "completed", max_attempts: int = 3) -> Any:
    """Run one webhook job in a real pipeline until it settles as ``until``; returns its row."""
    async with running(config) as p:
        job_id = await p.enqueue(WebhookNotify(url=url, payload=payload or {"hello": "world"}), max_attempts=max_attempts)
        return await wait_status(p, job_id, until, "dead" if until == "completed" else "completed")


# -- delivery and signing ------------------------------------------------------------------------


async def test_signed_body_arrives_and_verifies(db_path: Path, receiver: Receiver) -> None:
    payload = {"event": "PostCreated", "data": {"id": "p1", "title": "Grüße ✓", "tags": [1, 2.5, None, True]}}
    async with running(webhook_config(db_path)) as p:
        job_id = await p.enqueue(WebhookNotify(url=receiver.url(), payload=payload))
        job = await wait_status(p, job_id, "completed", "dead")
    assert job.status == "completed", job.error
    (request,) = receiver.requests()
    assert request.method == "POST" and request.verified == "yes"
    assert json.loads(request.body) == payload
    assert request.body == json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    assert request.headers["content-type"] == "application/json"
    assert request.headers["webhook-id"] == job_id
    assert abs(int(request.headers["webhook-timestamp"]) - time.time()) < 60
    assert request.headers["webhook-signature"].startswith("v1,")


async def test_connections_are_pooled_across_jobs(db_path: Path, receiver: Receiver) -> None:
    async with running(webhook_config(db_path)) as p:
        client = p.resources["http"]
        for n in range(3):
            job_id = await p.enqueue(WebhookNotify(url=receiver.url(), payload={"n": n}))
            assert (await wait_status(p, job_id, "completed", "dead")).status == "completed"
        assert not client.is_closed
    assert len({r.client for r in receiver.requests()}) == 1  # one keep-alive connection, three requests
    assert client.is_closed  # the resource is closed when the pipeline stops


async def test_without_a_secret_nothing_is_signed(db_path: Path, receiver: Receiver) -> None:
    job = await deliver(webhook_config(db_path, webhook_secret=""), receiver.url())
    assert job.status == "completed"
    (request,) = receiver.requests()
    assert request.verified == "unsigned"
    assert not any(name.startswith("webhook-") for name in request.headers)


def test_signature_matches_the_reference_implementation() -> None:
    body = '{"a":"ü"}'.encode()
    ours = sign(SECRET, "msg_1", 1_700_000_000, body)
    import datetime as dt

    theirs = standardwebhooks.Webhook(SECRET).sign("msg_1", dt.datetime.fromtimestamp(1_700_000_000, dt.UTC), body.decode())
    assert ours == {"webhook-id": "msg_1", "webhook-timestamp": "1700000000", "webhook-signature": theirs}


async def test_500_then_200_is_retried_then_completed(db_path: Path, receiver: Receiver) -> None:
    url = receiver.on("/flaky", Reply(500, body=b"database on fire"), Reply(200))
    job = await deliver(webhook_config(db_path), url)
    assert job.status == "completed" and job.attempts == 2
    first, second = receiver.requests("/flaky")
    assert first.verified == second.verified == "yes"
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == job.id  # receivers can dedupe


async def test_500_error_names_url_status_and_body(db_path: Path, receiver: Receiver) -> None:
    url = receiver.on("/down", Reply(503, body=b"  maintenance\nwindow  "))
    job = await deliver(webhook_config(db_path), url, until="dead", max_attempts=2)
    assert job.attempts == 2
    assert url in job.error and "503" in job.error and "maintenance window" in job.error


async def test_429_retry_after_is_honoured(db_path: Path, receiver: Receiver) -> None:
    url = receiver.on("/busy", Reply(429, headers={"Retry-After": "1"}, body=b"slow down"), Reply(200))
    errors: list[str] = []
    async with running(webhook_config(db_path)) as p:  # backoff base 10 ms: only Retry-After waits a second
        p.add_observer(lambda fields: errors.append(fields["error"]) if fields["error"] else None)
        job_id = await p.enqueue(WebhookNotify(url=url, payload={}))
        job = await wait_status(p, job_id, "completed", "dead")
    assert job.status == "completed" and job.attempts == 2
    first, second = receiver.requests("/busy")
    assert second.at - first.at >= 0.95
    assert errors == [f"POST {url} answered 429 Too Many Requests; retrying in 1 s as its Retry-After asks: slow down"]


@pytest.mark.parametrize("status", [410, 404, 400, 401, 422])
async def test_410_and_other_4xx_are_dead_at_once(db_path: Path, receiver: Receiver, status: int) -> None:
    url = receiver.on("/gone", Reply(status, body=b"no such hook"))
    job = await deliver(webhook_config(db_path), url, until="dead")
    assert job.attempts == 1
    assert f"POST {url} answered {status}" in job.error
    assert len(receiver.requests("/gone")) == 1


@pytest.mark.parametrize("status", [408, 502])
async def test_408_and_5xx_are_retried(db_path: Path, receiver: Receiver, status: int) -> None:
    url = receiver.on("/again", Reply(status), Reply(204))
    job = await deliver(webhook_config(db_path), url)
    assert job.status == "completed" and job.attempts == 2


async def test_302_is_a_failure_and_not_followed(db_path: Path, receiver: Receiver) -> None:
    target = receiver.url("/elsewhere")
    url = receiver.on("/moved", Reply(302, headers={"Location": target}))
    job = await deliver(webhook_config(db_path), url, until="dead", max_attempts=2)
    assert job.attempts == 2  # an ordinary failure: retried, then dead
    assert f"POST {url} answered 302" in job.error and target in job.error
    assert len(receiver.requests("/moved")) == 2
    assert receiver.requests("/elsewhere") == []


async def test_timeout_is_retried(db_path: Path, receiver: Receiver) -> None:
    url = receiver.on("/slow", Reply(200, delay=1.5), Reply(200))
    errors: list[str] = []
    async with running(webhook_config(db_path, webhook_timeout_seconds=0.3)) as p:
        p.add_observer(lambda fields: errors.append(fields["error"]) if fields["error"] else None)
        job_id = await p.enqueue(WebhookNotify(url=url, payload={}))
        job = await wait_status(p, job_id, "completed", "dead")
    assert job.status == "completed" and job.attempts == 2
    assert len(errors) == 1 and url in errors[0] and "WEBHOOK_TIMEOUT_SECONDS=0.3" in errors[0]


async def test_connection_refused_is_retried(db_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    job = await deliver(webhook_config(db_path), f"http://127.0.0.1:{port}/", until="dead", max_attempts=2)
    assert job.attempts == 2 and "ConnectError" in job.error and f"127.0.0.1:{port}" in job.error


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("ftp://example.com/hook", "must be http:// or https://"),
        ("file:///etc/passwd", "must be http:// or https://"),
        ("http://", "has no host"),
        ("http://[::1/", "not a valid URL"),
    ],
)
async def test_bad_urls_are_dead_at_once(db_path: Path, url: str, expected: str) -> None:
    job = await deliver(webhook_config(db_path, webhook_allow_private_networks=False), url, until="dead")
    assert job.attempts == 1 and expected in job.error, job.error


# -- the destination guard, end to end ----------------------------------------------------------


REFUSED_HOSTS = [
    ("127.0.0.1", "loopback"),
    ("localhost", "localhost resolves to"),
    ("LocalHost", "localhost resolves to"),
    ("[::1]", "loopback"),
    ("10.0.0.1", "RFC 1918"),
    ("172.16.5.4", "RFC 1918"),
    ("192.168.1.1", "RFC 1918"),
    ("169.254.169.254", "link-local"),
    ("100.64.0.1", "carrier-grade NAT"),
    ("0.0.0.0", "unspecified"),
    ("0", "unspecified"),
    ("2130706433", "2130706433 (that is 127.0.0.1)"),
    ("0177.0.0.1", "0177.0.0.1 (that is 127.0.0.1)"),
    ("0x7f000001", "0x7f000001 (that is 127.0.0.1)"),
    ("0x7f.1", "loopback"),
    ("127.1", "loopback"),
    ("127.0.0.1.", "loopback"),
    ("[::ffff:127.0.0.1]", "IPv4-mapped form of 127.0.0.1"),
    ("[::ffff:a9fe:a9fe]", "IPv4-mapped form of 169.254.169.254"),
    ("[64:ff9b::a00:1]", "NAT64 form of 10.0.0.1"),
    ("[::127.0.0.1]", "IPv4-compatible"),
    ("[fd00::1]", "unique-local"),
    ("[fe80::1]", "link-local"),
    ("[ff02::1]", "multicast"),
    ("224.0.0.1", "multicast"),
    ("255.255.255.255", "reserved"),
    ("198.18.0.1", "benchmarking"),
    ("192.0.2.1", "documentation"),
]


@pytest.mark.parametrize(("host", "reason"), REFUSED_HOSTS)
async def test_guard_refuses_private_destinations(db_path: Path, receiver: Receiver, host: str, reason: str) -> None:
    url = receiver.url("/hook", host=host)
    job = await deliver(webhook_config(db_path, webhook_allow_private_networks=False), url, until="dead")
    assert job.attempts == 1
    assert "refused" in job.error and reason in job.error and "WEBHOOK_ALLOW_PRIVATE_NETWORKS" in job.error, job.error
    assert receiver.requests() == []


@pytest.mark.parametrize("url", [
    "ftp://hook:S3CR%45T-pw@example.com/",  # not http(s)
    "http://hook:S3CR%45T-pw@0177.0.0.1/",  # an IPv4 spelling httpx refuses to parse, said as what it means
    "http://hook:S3CR%45T-pw@[::1/",  # not a valid URL
    "http://hook:S3CR%45T-pw@/path",  # no host
])
async def test_a_url_that_can_never_be_sent_is_dead_without_its_password(db_path: Path, url: str) -> None:
    job = await deliver(webhook_config(db_path, webhook_allow_private_networks=False), url, until="dead")
    assert job.attempts == 1 and "***" in job.error, job.error
    assert "S3CR%45T" not in job.error and "S3CRET" not in job.error, job.error  # as written, nor decoded


@attrs.define
class RecordingBackend(httpcore.AsyncNetworkBackend):
    """The real trio backend, noting every host it is asked to connect to."""

    inner: httpcore.AsyncNetworkBackend = attrs.field(factory=httpcore.TrioBackend)
    connects: list[str] = attrs.field(factory=list)

    async def connect_tcp(self, host: str, port: int, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        self.connects.append(host)
        return await self.inner.connect_tcp(host, port, **kwargs)

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


@pytest.mark.parametrize(
    "host", ["10.0.0.1", "169.254.169.254", "100.64.0.1", "2130706433", "0x7f.1", "127.1", "localhost", "::ffff:10.1.2.3", "fd12::1"]
)
async def test_guard_refuses_before_any_connect(receiver: Receiver, host: str) -> None:
    recording = RecordingBackend()
    backend = GuardedNetworkBackend(recording, allow_private=False)
    with pytest.raises(DestinationRefused):
        await backend.connect_tcp(host, receiver.port, timeout=2.0)
    assert recording.connects == []
    assert receiver.requests() == []


async def test_the_connection_goes_to_the_resolved_number_not_the_name(receiver: Receiver) -> None:
    # with the guard off the backend still resolves once and hands the inner backend
    # numbers only: there is no second lookup a rebinding DNS server could answer
    recording = RecordingBackend()
    backend = GuardedNetworkBackend(recording, allow_private=True)
    stream = await backend.connect_tcp("localhost", receiver.port, timeout=2.0)
    await stream.aclose()
    assert recording.connects and all(ipaddress.ip_address(host.split("%")[0]) for host in recording.connects)
    assert recording.connects[-1] == "127.0.0.1"  # /etc/hosts: localhost is 127.0.0.1 here


@pytest.mark.parametrize("host", ["localhost", "2130706433", "0x7f000001", "127.1", "[::ffff:127.0.0.1]", "[::1]"])
async def test_client_refuses_even_without_the_handlers_precheck(db_path: Path, receiver: Receiver, host: str) -> None:
    # straight through httpx: only the network backend stands between the URL and the socket
    config = webhook_config(db_path, webhook_allow_private_networks=False)
    async with open_http_client(config) as client:
        with pytest.raises(DestinationRefused):
            await client.post(receiver.url("/hook", host=host), content=b"{}")
    assert receiver.requests() == []


# -- https: the pinned number is connected, the name is verified --------------------------------


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


async def test_https_verifies_the_host_name_while_connecting_to_the_checked_number(db_path: Path, ca: trustme.CA) -> None:
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_tls)
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    server = Receiver(SECRET, tls=server_tls)
    try:
        config = webhook_config(db_path)
        registry = site.types_registry()
        webhook.install(registry, config, ssl_context=client_tls)
        async with running(config, registry) as p:
            good = await p.enqueue(WebhookNotify(url=server.url(host="localhost", scheme="https"), payload={"n": 1}))
            bad = await p.enqueue(WebhookNotify(url=server.url(host="127.0.0.1", scheme="https"), payload={"n": 2}), max_attempts=1)
            good_job = await wait_status(p, good, "completed", "dead")
            bad_job = await wait_status(p, bad, "completed", "dead")
    finally:
        server.close()
    assert good_job.status == "completed", good_job.error
    (request,) = server.requests()
    assert request.verified == "yes" and request.sni == "localhost" and json.loads(request.body) == {"n": 1}
    # the certificate names localhost only: asked for 127.0.0.1, verification fails
    assert bad_job.status == "dead" and "certificate verify failed" in bad_job.error, bad_job.error


# -- routing: PostCreated → one webhook per WEBHOOK_URLS entry -----------------------------------


async def test_post_created_sends_one_webhook_per_url(db_path: Path, receiver: Receiver) -> None:
    urls = (receiver.url("/a"), receiver.url("/b"))
    async with running(webhook_config(db_path, webhook_urls=urls)) as p:
        job_ids = await p.emit(PostCreated(id="42"))
        webhook_ids = [i for i in job_ids if (await p.backend.get(i)).job_type == "webhook_notify"]
        assert len(webhook_ids) == 2
        for job_id in webhook_ids:
            job = await wait_status(p, job_id, "completed", "dead")
            assert job.status == "completed", job.error
    for path in ("/a", "/b"):
        (request,) = receiver.requests(path)
        assert json.loads(request.body) == {"event": "PostCreated", "data": {"id": "42"}}
        assert request.verified == "yes" and request.headers["webhook-id"] in webhook_ids


# -- units: the address classifier --------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0X7F.0.0.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("127.0.1", "127.0.0.1"),
        ("0", "0.0.0.0"),
        ("0x", "0.0.0.0"),
        ("017700000001", "127.0.0.1"),
        ("10.0.0.1.", "10.0.0.1"),
        ("169.254.43518", "169.254.169.254"),
        ("[::1]", "::1"),
        ("::ffff:127.0.0.1", "::ffff:7f00:1"),
        ("fe80::1%eth0", "fe80::1"),
        ("example.com", None),
        ("127.0.0.256", None),
        ("256.0.0.1", None),
        ("4294967296", None),
        ("08.0.0.1", None),
        ("1.2.3.4.5", None),
        ("١٢٧.0.0.1", None),
        ("", None),
        ("..", None),
        ("::zz", None),
    ],
)
def test_ip_literal_notations(host: str, address: str | None) -> None:
    assert parse_ip_literal(host) == (None if address is None else ipaddress.ip_address(address))


def _render(value: int, style: str) -> str:
    return {"dec": str(value), "oct": "0" + format(value, "o"), "hex": "0x" + format(value, "x"), "HEX": "0X" + format(value, "X")}[style]


@given(
    st.integers(0, 2**32 - 1),
    st.integers(1, 4),
    st.lists(st.sampled_from(["dec", "oct", "hex", "HEX"]), min_size=4, max_size=4),
)
def test_every_ipv4_notation_means_what_the_c_resolver_says(value: int, parts: int, styles: list[str]) -> None:
    raw = value.to_bytes(4, "big")
    numbers = list(raw[: parts - 1]) + [int.from_bytes(raw[parts - 1 :], "big")]
    text = ".".join(_render(n, style) for n, style in zip(numbers, styles))
    assert parse_ip_literal(text) == ipaddress.IPv4Address(value)
    assert socket.inet_aton(text) == raw  # glibc's parser, which getaddrinfo uses, agrees


@given(st.text(alphabet="0123456789abcdefxX.:[]%", max_size=24))
def test_parsing_never_raises(text: str) -> None:
    parse_ip_literal(text)


@given(st.ip_addresses(v=4))
def test_ipv4_not_globally_reachable_is_refused(address: ipaddress.IPv4Address) -> None:
    if not address.is_global or address.is_multicast:
        assert refusal_reason(address) is not None


@given(st.ip_addresses(v=6))
def test_ipv6_not_globally_reachable_is_refused(address: ipaddress.IPv6Address) -> None:
    if address.ipv4_mapped is None and (not address.is_global or address.is_multicast):
        assert refusal_reason(address) is not None


@given(st.ip_addresses(v=4))
def test_mapped_and_nat64_forms_follow_their_ipv4_address(address: ipaddress.IPv4Address) -> None:
    refused = refusal_reason(address) is not None
    mapped = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + address.packed)
    nat64 = ipaddress.IPv6Address(bytes.fromhex("0064ff9b") + b"\0" * 8 + address.packed)
    assert (refusal_reason(mapped) is not None) == refused
    assert (refusal_reason(nat64) is not None) == refused
    assert refusal_reason(ipaddress.IPv6Address(b"\0" * 12 + address.packed)) is not None  # IPv4-compatible: always


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "93.184.215.14", "2606:4700:4700::1111", "2a00:1450:4001::200e", "::ffff:8.8.8.8", "64:ff9b::808:808"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert refusal_reason(ipaddress.ip_address(address)) is None


# -- units: Retry-After ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("120", 120.0),
        (" 0 ", 0.0),
        (email.utils.formatdate(1_000_030, usegmt=True), 30.0),
        (email.utils.formatdate(999_000, usegmt=True), 0.0),  # in the past: now
        ("1.5", None),
        ("-5", None),
        ("soon", None),
        ("", None),
        (None, None),
    ],
)
def test_retry_after(header: str | None, expected: float | None) -> None:
    assert retry_after_seconds(header, now=1_000_000) == expected


async def test_retry_after_is_capped(db_path: Path, receiver: Receiver) -> None:
    url = receiver.on("/later", Reply(503, headers={"Retry-After": "86400"}))
    async with running(webhook_config(db_path)) as p:
        job_id = await p.enqueue(WebhookNotify(url=url, payload={}))
        with trio.fail_after(5):
            while not receiver.requests("/later"):
                await trio.sleep(0.01)
        job = await wait_status(p, job_id, "pending")
    assert "retrying in 3600 s" in job.error
    assert pipeline.clock.to_epoch(job.run_after) - time.time() == pytest.approx(3600, abs=30)
