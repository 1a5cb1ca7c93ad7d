"""TLS passes through to the driver: ``rediss://`` and Postgres's ``sslmode``/``sslrootcert``, on
servers of the test's own that take nothing but TLS (a throw-away CA from trustme).

Each test runs the CLI and the service as a user would, with the CA named in DATABASE_URL (the
drivers' own query parameters: libpq's ``sslmode=verify-full&sslrootcert=…``, redis-py's
``ssl_ca_certs=…``): a job enqueued over TLS runs to completion. Without the CA the certificate
is refused, and the error says so.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from conftest import REQUIRE_SERVICES
from test_backends_end_to_end import ROOT, Cli, wait_for

pytestmark = pytest.mark.slow

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def missing(what: str) -> None:
    if REQUIRE_SERVICES:
        pytest.fail(f"{what}, and PIPELINE_REQUIRE_SERVICES=1 says it must be there")
    pytest.skip(what)


@pytest.fixture
def certificates(tmp_path: Path) -> dict[str, Path]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    files = {"ca": tmp_path / "ca.pem", "cert": tmp_path / "cert.pem", "key": tmp_path / "key.pem"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    cert.cert_chain_pems[0].write_to_path(str(files["cert"]))
    cert.private_key_pem.write_to_path(str(files["key"]))
    return files


def environment(url: str) -> dict[str, str]:
    values = {k: v for k, v in os.environ.items() if not k.startswith(("ADMIN_", "WORKER_", "LOG_", "DATABASE_", "REDIS_"))}
    values.update(DATABASE_URL=url, PYTHONPATH=str(ROOT), WORKER_PROCESSES="1", WORKER_POLL_INTERVAL_MS="50",
                  ADMIN_PORT="0", REDIS_ALLOW_NON_DURABLE="true")
    return values


def a_job_runs_over(url: str, cwd: Path) -> None:
    """Enqueue with the CLI, run the service until the job is completed, stop it."""
    cli = Cli(environment(url), cwd)
    job_id = cli.run("enqueue", "invalidate_cache", "--payload", '{"keys": ["tls"]}').strip().splitlines()[-1]
    service = subprocess.Popen([sys.executable, "-m", "pipeline"], env=environment(url), cwd=cwd,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: cli.json("jobs", "show", job_id)["status"] == "completed", "the job completed over TLS", 30)
    finally:
        service.terminate()
        assert service.wait(30) == 0


@pytest.fixture
def tls_redis(tmp_path: Path, certificates: dict[str, Path]) -> Iterator[int]:
    """redis-server listening on TLS only (no plain port), keeping nothing on disk."""
    server = shutil.which("redis-server")
    if server is None:
        missing("redis-server is not installed")
    port = free_port()
    proc = subprocess.Popen(
        [str(server), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(certificates["cert"]), "--tls-key-file", str(certificates["key"]),
         "--tls-ca-cert-file", str(certificates["ca"]), "--tls-auth-clients", "no",
         "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0, "redis-server with TLS listening")
        yield port
    finally:
        proc.kill()
        proc.wait()


def test_rediss_url_runs_a_job_over_tls_and_refuses_an_unknown_ca(tls_redis: int, certificates: dict[str, Path], tmp_path: Path) -> None:
    url = f"rediss://127.0.0.1:{tls_redis}/0?ssl_ca_certs={certificates['ca']}&prefix=tls"
    a_job_runs_over(url, tmp_path)
    # the same server without the CA: the driver refuses its certificate, and the error says so
    refused = Cli(environment(f"rediss://127.0.0.1:{tls_redis}/0?prefix=tls"), tmp_path).run("stats", code=1)
    assert "certificate verify failed" in refused and "TLS handshake failed" in refused and "retry later" not in refused
    # and plain redis:// cannot talk to a TLS port
    Cli(environment(f"redis://127.0.0.1:{tls_redis}/0?prefix=tls"), tmp_path).run("stats", code=1)


@pytest.fixture
def tls_postgres(certificates: dict[str, Path]) -> Iterator[int]:
    """A PostgreSQL 15 cluster of the test's own whose pg_hba.conf rejects every connection
    that is not TLS."""
    if not (PG_BIN / "initdb").exists():
        missing(f"PostgreSQL 15's server programs are not in {PG_BIN}")
    as_postgres: list[str] = []
    # a folder of its own outside pytest's (whose parents only root may enter)
    folder = Path(tempfile.mkdtemp(prefix="pipeline-tls-pg-"))
    for name in ("cert", "key"):
        shutil.copy(certificates[name], folder / f"{name}.pem")
    (folder / "key.pem").chmod(0o600)
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root
        as_postgres = ["runuser", "-u", "postgres", "--"]
        for path in (folder, folder / "cert.pem", folder / "key.pem"):
            shutil.chown(path, "postgres")
    data = folder / "data"
    subprocess.run([*as_postgres, str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"],
                   check=True, capture_output=True)
    (data / "pg_hba.conf").write_text("hostssl all all 127.0.0.1/32 trust\nhostnossl all all 127.0.0.1/32 reject\n")
    port = free_port()
    options = (f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c ssl=on -c fsync=off "
               f"-c ssl_cert_file={folder / 'cert.pem'} -c ssl_key_file={folder / 'key.pem'}")
    subprocess.run([*as_postgres, str(PG_BIN / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(folder / "log"), "-w", "start"],
                   check=True, capture_output=True)
    try:
        yield port
    finally:
        subprocess.run([*as_postgres, str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def test_postgres_sslmode_runs_a_job_over_tls_and_refuses_an_unknown_ca(tls_postgres: int, certificates: dict[str, Path], tmp_path: Path) -> None:
    base = f"postgresql://postgres@127.0.0.1:{tls_postgres}/postgres"
    a_job_runs_over(f"{base}?sslmode=verify-full&sslrootcert={certificates['ca']}", tmp_path)
    # verify-full without the CA: the server's certificate is refused, and the error says so
    other = trustme.CA()
    other.cert_pem.write_to_path(str(tmp_path / "other-ca.pem"))
    refused, took = timed(Cli(environment(f"{base}?sslmode=verify-full&sslrootcert={tmp_path / 'other-ca.pem'}"), tmp_path), "stats")
    assert "certificate verify failed" in refused and "check sslmode and sslrootcert" in refused
    # said at once, as a refusal: not after the pool's 10 s of retries, as for a server not up yet
    assert took < REFUSED_AT_ONCE, f"the refused certificate was said after {took:.1f} s"
    # without TLS the server's pg_hba.conf rejects the connection: the one above was TLS
    refused, took = timed(Cli(environment(f"{base}?sslmode=disable"), tmp_path), "stats")
    assert "no encryption" in refused
    assert took < REFUSED_AT_ONCE, f"pg_hba.conf's refusal was said after {took:.1f} s"


# A refusal takes the CLI's start and one connection (1-2 s; 6.3 s once on a machine loaded three
# times over); one taken for retryable waits for the pool's 10 s first (12 s in all)
REFUSED_AT_ONCE = 9.0


def timed(cli: Cli, *argv: str) -> tuple[str, float]:
    """The command's error output (it must fail), and how long it took."""
    t0 = time.monotonic()
    said = cli.run(*argv, code=1)
    return said, time.monotonic() - t0
