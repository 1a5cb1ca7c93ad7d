"""What embedding the pipeline costs a FastAPI endpoint (issue 33, "Figures"): the request latency of an
endpoint that enqueues a job, against the same endpoint doing nothing, under the same load, in one uvicorn
process that embeds the pipeline with ``pipeline.aio.open_pipeline`` on SQLite and runs the jobs itself.

    python benchmarks/aio_embedding.py [--clients 50] [--seconds 5] [--rounds 3] [--client wrk|httpx]
                                       [--synchronous full|normal] [--no-workers]

The server: uvicorn (its default loop: uvloop when installed; no access log) serving ``POST /nothing``
(answers ``{"ok": true}``) and ``POST /enqueue`` (``await p.enqueue(Noop(n))``, answers the job's id once
it is committed), the no-op handler on the app's own asyncio loop (``runtime="asyncio"``), the store a
fresh SQLite file with ``synchronous=FULL`` (the default: every commit fsynced). Beside it, for reference,
the same app without the pipeline (``/nothing`` of an app that embeds nothing). The load: ``--clients``
concurrent connections, each sending its next request once the last one answered, for ``--seconds`` per
endpoint after a second's warm-up, the endpoints in turn within each round (the order alternating between
rounds): ``wrk`` (Debian's package; the default when it is on PATH, 2 threads) or httpx.AsyncClient in
this process (heavier: the clients then take much of the machine's CPU). Each round prints, per endpoint,
the p50 and p99 latency the clients saw, the requests per second, and the server's CPU per request (from
/proc); the last lines give the medians of the rounds. At the end, every job enqueued has run (the app
counts them; before each run, the jobs enqueued so far have run). ``--no-workers``: the app's pipeline only enqueues (WORKER_ENABLED=false), so the enqueue's
own cost shows apart from running the jobs in the same process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# what is measured: (the server, the endpoint)
RUNS = (("bare", "/nothing"), ("embedded", "/nothing"), ("embedded", "/enqueue"))
NAMES = {("bare", "/nothing"): "/nothing, no pipeline in the app", ("embedded", "/nothing"): "/nothing",
         ("embedded", "/enqueue"): "/enqueue"}


# -- the server (run as a process of its own: --serve PORT) ----------------------------------------------


def serve(port: int, embedded: bool) -> None:
    import uvicorn
    from fastapi import FastAPI

    import pipeline
    import pipeline.aio

    @dataclasses.dataclass
    class Noop:
        n: int

    registry = pipeline.Registry(runtime="asyncio")
    counts = {"enqueued": 0, "ran": 0}
    opened: list[pipeline.aio.Pipeline] = []  # (no `request: Request` parameters: under this module's
    # `from __future__ import annotations` FastAPI cannot resolve a name imported inside this function)

    async def noop(job: Noop, ctx: pipeline.JobContext) -> None:
        counts["ran"] += 1

    registry.register("noop", Noop, noop, concurrency=16)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not embedded:
            yield
            return
        async with pipeline.aio.open_pipeline(registry=registry) as p:  # Config.from_env(): the parent's settings
            opened.append(p)
            yield

    app = FastAPI(lifespan=lifespan)

    @app.post("/nothing")
    async def nothing() -> dict[str, Any]:
        return {"ok": True}

    @app.post("/enqueue")
    async def enqueue() -> dict[str, Any]:
        counts["enqueued"] += 1
        return {"id": await opened[0].enqueue(Noop(counts["enqueued"]))}

    @app.get("/counts")
    async def counted() -> dict[str, int]:
        return counts

    uvicorn.run(app, host="127.0.0.1", port=port, access_log=False, log_level="warning")


# -- the load ----------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def cpu_of(pid: int) -> float:
    """The process's user + system CPU seconds, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(url: str, clients: int, seconds: float, server: int, script: Path) -> dict[str, float]:
    """``wrk`` with ``clients`` connections on ``url`` for a second (not counted), then ``seconds``."""
    base = ["wrk", f"-t{min(2, clients)}", f"-c{clients}", "-s", str(script), "--latency"]
    subprocess.run([*base, "-d1s", url], check=True, capture_output=True)
    cpu_began = cpu_of(server)
    out = subprocess.run([*base, f"-d{seconds:g}s", url], check=True, capture_output=True, text=True).stdout
    cpu = cpu_of(server) - cpu_began

    def ms(label: str) -> float:
        match = re.search(rf"^\s+{label}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        if match is None:
            raise SystemExit(f"no {label}% latency in wrk's output:\n{out}")
        return float(match.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[match.group(2)]

    total = re.search(r"^\s*(\d+) requests in", out, re.M)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: .*", out)
    if total is None or errors is not None:
        raise SystemExit(f"wrk saw errors (or no requests):\n{out}")
    requests = int(total.group(1))
    return {"p50": ms("50"), "p99": ms("99"), "rate": requests / seconds, "cpu": cpu / requests * 1e6}


async def load(url: str, clients: int, seconds: float, server: int) -> dict[str, float]:
    """httpx: ``clients`` concurrent clients on ``url`` for a second (not counted), then ``seconds``."""
    import httpx

    latencies: list[float] = []
    counting = False

    async def client(http: httpx.AsyncClient, stop_at: float) -> None:
        while (start := time.perf_counter()) < stop_at:
            response = await http.post(url)
            took = time.perf_counter() - start
            response.raise_for_status()
            if counting:
                latencies.append(took)

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=60) as http:
        stop_at = time.perf_counter() + 1.0 + seconds
        tasks = [asyncio.create_task(client(http, stop_at)) for _ in range(clients)]
        await asyncio.sleep(1.0)
        counting, began, cpu_began = True, time.perf_counter(), cpu_of(server)
        await asyncio.gather(*tasks)
        elapsed, cpu = time.perf_counter() - began, cpu_of(server) - cpu_began
    latencies.sort()
    return {"p50": statistics.median(latencies) * 1e3, "p99": latencies[int(len(latencies) * 0.99)] * 1e3,
            "rate": len(latencies) / elapsed, "cpu": cpu / len(latencies) * 1e6}


def wait_until_up(url: str, proc: subprocess.Popen[bytes]) -> None:
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}) before it answered")
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(f"{url}/counts", timeout=1).raise_for_status()
            return
        time.sleep(0.1)
    raise SystemExit("the server did not answer within 60 s")


def drained(url: str) -> dict[str, int]:
    """Once every job the app enqueued has run (a backlog would take the CPU of the next run): its counts."""
    import httpx

    deadline = time.monotonic() + 120
    while (counts := httpx.get(f"{url}/counts").json())["ran"] < counts["enqueued"]:
        if time.monotonic() > deadline:
            raise SystemExit(f"not every job ran within 120 s: {counts}")
        time.sleep(0.05)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--client", choices=("wrk", "httpx"), default="wrk" if shutil.which("wrk") else "httpx")
    parser.add_argument("--synchronous", choices=("full", "normal"), default="full", help="SQLITE_SYNCHRONOUS")
    parser.add_argument("--no-workers", action="store_true", help="WORKER_ENABLED=false: the app only enqueues")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the server processes' own
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, embedded=not args.bare)
        return

    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "post.lua"
        script.write_text('wrk.method = "POST"\n')
        env = {k: v for k, v in os.environ.items() if not k.startswith(("WORKER_", "SQLITE_", "LOG_", "ADMIN_"))}
        env.update(DATABASE_URL=f"sqlite:///{folder}/bench.db", SQLITE_SYNCHRONOUS=args.synchronous.upper(),
                   WORKER_ENABLED="false" if args.no_workers else "true")
        servers: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
        try:
            for kind in ("bare", "embedded"):
                port = free_port()
                argv = [sys.executable, __file__, "--serve", str(port)] + (["--bare"] if kind == "bare" else [])
                servers[kind] = (subprocess.Popen(argv, env=env), f"http://127.0.0.1:{port}")
                wait_until_up(servers[kind][1], servers[kind][0])
            rows: dict[tuple[str, str], list[dict[str, float]]] = {run: [] for run in RUNS}
            print(f"{args.clients} clients ({args.client}), {args.seconds:g} s per endpoint, SQLite synchronous="
                  f"{args.synchronous.upper()}, {'no workers' if args.no_workers else 'the jobs run in the app'}, "
                  f"load average {os.getloadavg()[0]:.1f}", flush=True)
            for n in range(args.rounds):
                for kind, path in RUNS if n % 2 == 0 else RUNS[::-1]:  # none always goes first
                    if not args.no_workers:
                        drained(servers["embedded"][1])
                    proc, url = servers[kind]
                    if args.client == "wrk":
                        row = wrk(url + path, args.clients, args.seconds, proc.pid, script)
                    else:
                        row = asyncio.run(load(url + path, args.clients, args.seconds, proc.pid))
                    rows[(kind, path)].append(row)
                print(f"round {n + 1}:", flush=True)
                for run, r in rows.items():
                    print(f"  {NAMES[run]}: p50 {r[-1]['p50']:.2f} ms, p99 {r[-1]['p99']:.2f} ms, {r[-1]['rate']:,.0f} req/s, "
                          f"{r[-1]['cpu']:.0f} us CPU/req", flush=True)
            print(f"medians of {args.rounds} rounds:")
            for run, r in rows.items():
                med = {key: statistics.median(row[key] for row in r) for key in r[0]}
                print(f"  {NAMES[run]}: p50 {med['p50']:.2f} ms, p99 {med['p99']:.2f} ms, {med['rate']:,.0f} req/s, "
                      f"{med['cpu']:.0f} us CPU per request")
            if not args.no_workers:
                print(f"every job enqueued ran in the server's process: {drained(servers['embedded'][1])['ran']:,}")
        finally:
            for proc, _ in servers.values():
                proc.send_signal(signal.SIGTERM)
            for proc, _ in servers.values():
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()

if __name__ == "__main__":
    main()
