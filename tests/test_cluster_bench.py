"""benchmarks/cluster.py runs end to end on a tiny backlog, on Postgres and on Redis, and prints its table.

Not a timed test: the figures are the benchmark's to report (docs/scaling.md). What is checked is
that one and two services each drain the store (every job completed, or the script fails), and that
the table has its columns and figures that can be real: a rate, the server's CPU per job above zero
(read from the server's processes or its INFO), each service's CPU per job, and the projection.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import early
import pytest

CLUSTER = Path(__file__).resolve().parent.parent / "benchmarks" / "cluster.py"
TESTS = {backend: f"test_cluster_bench.py::test_cluster_bench_on_{backend}" for backend in ("postgres", "redis")}
for backend, test in TESTS.items():  # started as the run begins (early.py)
    early.command(test, lambda folder, backend=backend: [sys.executable, str(CLUSTER), "--backend", backend,
                                                          "--services", "1,2", "--jobs", "500", "--rounds", "1"])

HEAD = {"postgres": ["services", "jobs/s", "server µs/job", "of which backends", "shared processes", "each service µs/job",
                     "all services µs/job", "server cores busy"],
        "redis": ["services", "jobs/s", "server µs/job", "each service µs/job", "all services µs/job", "server cores busy"]}


def number(cell: str) -> float:
    """A cell's median (the figure before any range in parentheses)."""
    found = re.match(r"-?[\d,]+(\.\d+)?", cell.strip())
    assert found, f"not a figure: {cell!r}"
    return float(found.group(0).replace(",", ""))


def rows_of(out: str, head: list[str]) -> dict[int, dict[str, str]]:
    """The rows of the table whose header is ``head``, by service count."""
    lines = out.splitlines()
    start = lines.index("| " + " | ".join(head) + " |")  # (ValueError: the table or a column is missing)
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("| "):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[int(cells[0])] = dict(zip(head, cells))
    return rows


def check(backend: str) -> None:
    proc, _ = early.result(TESTS[backend], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    rows = rows_of(out, HEAD[backend])
    assert sorted(rows) == [1, 2], out
    for count, row in rows.items():
        assert number(row["jobs/s"]) > 0, row
        assert 0 < number(row["server µs/job"]) < 100_000, row
        each = [number(v) for v in row["each service µs/job"].split(", ")]
        assert len(each) == count and all(0 < v < 100_000 for v in each), row
        assert 0 < number(row["all services µs/job"]) < 100_000, row
    if backend == "postgres":
        assert number(rows[1]["of which backends"]) > 0, rows[1]
        assert re.search(r"^one server of 8 cores sustains [\d,]+ jobs/s at 80% CPU", out, re.M), out
    else:
        assert re.search(r"^one Redis server sustains [\d,]+ jobs/s at 80% of its main thread", out, re.M), out
    # every job of each run was completed by the services together (the script checks the store too)
    assert re.search(r"^round 1, 2 service\(s\): .*\(jobs: [\d,]+, [\d,]+\)$", out, re.M), out
    for jobs in re.findall(r"^round 1, \d service\(s\): .*\(jobs: ([\d, ]+)\)$", out, re.M):
        assert sum(int(n.replace(",", "")) for n in jobs.split(", ")) == 500, out


@pytest.mark.slow
def test_cluster_bench_on_postgres() -> None:
    check("postgres")


@pytest.mark.slow
def test_cluster_bench_on_redis() -> None:
    check("redis")
