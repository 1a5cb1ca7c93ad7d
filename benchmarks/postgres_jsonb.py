"""What storing payloads as jsonb instead of text would cost the Postgres store's inserts (and claims):
`python benchmarks/postgres_jsonb.py [--url postgresql://postgres@127.0.0.1:5432/postgres] [--rounds 5]`.

Two schemas migrated by the store's own migrations, one with ``payload`` and ``result`` made jsonb;
the store's insert statement (store.insert_statement, the Ledger's and Client.enqueue's), the jsonb
one with ``payload::jsonb`` in its select list (text does not convert to jsonb on assignment). Per
payload size (typical ~70 bytes, ~1 KB, ~8 KB) and rows per statement (256: a busy Ledger's batch;
1: one enqueue at a time), rounds alternate text and jsonb on the same server. Prints the median,
per job: the server's CPU (its backend process's run time from /proc/PID/schedstat: the server must
run on this machine) and the wall time of the statements; then the claim's read of 256 payloads; then
the bytes per row of each table. The schemas are dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg  # noqa: E402

from pipeline.backends.base import NewJob  # noqa: E402
from pipeline.backends.postgres import schema, store  # noqa: E402
from pipeline.backends.postgres.db import configure  # noqa: E402
from pipeline.clock import now_ts  # noqa: E402
from pipeline.ids import UUID7Factory  # noqa: E402


def payload(size: str) -> str:
    """Canonical JSON as the engine writes it (compact, fields in the class's order)."""
    small = {"order_id": 12345, "email": "someone@example.com", "items": [1, 2, 3], "express": True}
    if size == "small":
        value: Any = small
    elif size == "1kb":
        value = {**small, "lines": [{"sku": f"SKU-{i:05d}", "qty": i % 7 + 1, "price": 19.99 + i} for i in range(14)]}
    else:
        value = {**small, "lines": [{"sku": f"SKU-{i:05d}", "qty": i % 7 + 1, "price": 19.99 + i} for i in range(120)]}
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def backend_cpu(conn: psycopg.Connection[Any]) -> float:
    """The CPU seconds the server's process for ``conn`` has run (it must be on this machine): the
    scheduler's count in nanoseconds (/proc/PID/schedstat), not utime's 10 ms ticks."""
    with open(f"/proc/{conn.info.backend_pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def measure(conn: psycopg.Connection[Any], work: Callable[[], int]) -> tuple[float, float]:
    """(server CPU µs, wall µs) per row of ``work`` (which returns its rows)."""
    cpu, wall = backend_cpu(conn), time.perf_counter()
    rows = work()
    return (backend_cpu(conn) - cpu) * 1e6 / rows, (time.perf_counter() - wall) * 1e6 / rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("PIPELINE_TEST_POSTGRES_URL",
                                                        "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=25_600, help="jobs per round and kind, batched by 256")
    args = parser.parse_args(argv)
    tag = uuid.uuid4().hex[:8]
    names = {"text": f"bench_text_{tag}", "jsonb": f"bench_jsonb_{tag}"}
    conns: dict[str, psycopg.Connection[Any]] = {}
    try:
        for kind, name in names.items():
            with psycopg.connect(args.url, autocommit=True) as admin:
                admin.execute(f"CREATE SCHEMA {name}")
            conn = psycopg.connect(args.url, autocommit=True, options=f"-csearch_path={name}")
            configure(conn)
            schema.migrate(conn, "bench")
            if kind == "jsonb":
                conn.execute("ALTER TABLE jobs ALTER COLUMN payload TYPE jsonb USING payload::jsonb, "
                             "ALTER COLUMN result TYPE jsonb USING result::jsonb")
            conn.execute("SET synchronous_commit = off")  # the disk's fsync is not what is compared
            conns[kind] = conn
        text_insert = store.insert_statement([])
        statements = {"text": text_insert,
                      "jsonb": text_insert.replace("SELECT id, job_type, payload,", "SELECT id, job_type, payload::jsonb,")}
        assert statements["jsonb"] != text_insert
        new_id = UUID7Factory()
        print(f"PostgreSQL {conns['text'].info.server_version}; {args.rounds} rounds alternating text and jsonb; "
              "per job: server CPU µs / wall µs (medians)")
        print(f"{'payload':>8} {'bytes':>6} {'rows/stmt':>9} | {'text':>15} | {'jsonb':>15} | jsonb/text (CPU, wall)")
        read_ids: dict[str, list[str]] = {}
        for size in ("small", "1kb", "8kb"):
            text = payload(size)
            for batch in (256, 1):
                total = args.jobs if batch > 1 else args.jobs // 16
                figures: dict[str, list[tuple[float, float]]] = {"text": [], "jsonb": []}
                for round_ in range(args.rounds):
                    order = ("text", "jsonb") if round_ % 2 == 0 else ("jsonb", "text")
                    for kind in order:
                        conn, sql = conns[kind], statements[kind]
                        now = now_ts()
                        chunks = [[NewJob(new_id(), "bench", text, 3, now, 100, now) for _ in range(batch)]
                                  for _ in range(total // batch)]
                        if batch > 1:
                            read_ids[kind] = [row.id for row in chunks[-1]]  # the claim's read below: 256 of them

                        def insert(conn: psycopg.Connection[Any] = conn, sql: str = sql,
                                   chunks: list[list[NewJob]] = chunks) -> int:
                            for rows in chunks:
                                conn.execute(sql, store.insert_params(rows))
                            return sum(len(rows) for rows in chunks)

                        figures[kind].append(measure(conn, insert))
                cpu = {k: statistics.median(c for c, _ in v) for k, v in figures.items()}
                wall = {k: statistics.median(w for _, w in v) for k, v in figures.items()}
                print(f"{size:>8} {len(text.encode()):>6} {batch:>9} | {cpu['text']:6.1f} / {wall['text']:6.1f} | "
                      f"{cpu['jsonb']:6.1f} / {wall['jsonb']:6.1f} | {cpu['jsonb'] / cpu['text']:.2f}, "
                      f"{wall['jsonb'] / wall['text']:.2f}")
            # the claim hands each worker its payload as text: jsonb's is made from its binary form
            reads: dict[str, list[tuple[float, float]]] = {"text": [], "jsonb": []}
            for _ in range(args.rounds):
                for kind in ("text", "jsonb"):
                    def read(conn: psycopg.Connection[Any] = conns[kind], ids: list[str] = read_ids[kind]) -> int:
                        for _ in range(50):
                            conn.execute("SELECT id, payload::text FROM jobs WHERE id = ANY(%s)", (ids,)).fetchall()
                        return 50 * len(ids)

                    reads[kind].append(measure(conns[kind], read))
            cpu = {k: statistics.median(c for c, _ in v) for k, v in reads.items()}
            wall = {k: statistics.median(w for _, w in v) for k, v in reads.items()}
            print(f"{size:>8} {'read':>6} {256:>9} | {cpu['text']:6.1f} / {wall['text']:6.1f} | "
                  f"{cpu['jsonb']:6.1f} / {wall['jsonb']:6.1f} | {cpu['jsonb'] / cpu['text']:.2f}, "
                  f"{wall['jsonb'] / wall['text']:.2f}   (the claim's read of 256 payloads)")
        for kind, conn in conns.items():
            rows, size = conn.execute("SELECT count(*), pg_total_relation_size('jobs') FROM jobs").fetchone()  # type: ignore[misc]
            print(f"{kind:>5}: {rows} rows, {size / rows:.0f} bytes per row with its indexes")
    finally:
        for conn in conns.values():
            conn.close()
        with psycopg.connect(args.url, autocommit=True) as admin:
            for name in names.values():
                admin.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
