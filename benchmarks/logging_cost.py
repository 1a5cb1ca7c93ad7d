"""What the one log line per job costs the drain: `python benchmarks/logging_cost.py`.

Drains 20,000 no-op jobs (256 workers, in-process, SQLite) three ways, alternating, four rounds,
and prints the median of each: the service's default logging (INFO, text, to a file) with the
outcome lines batched (logs.OutcomeLines, what `python -m pipeline` does); the same lines through
the `logging` module one record at a time (as before); and LOG_LEVEL=warning (no outcome lines).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import pipeline  # noqa: E402
from pipeline import logs  # noqa: E402

JOBS = 20_000
WAYS = ("logging", "batched", "off")


@attrs.frozen
class Noop:
    n: int


async def noop(job: Noop, ctx: pipeline.JobContext) -> None:
    return None


def registry() -> pipeline.Registry:
    reg = pipeline.Registry()
    reg.register("noop", Noop, noop, concurrency=256)
    return reg


async def drain(directory: Path, way: str) -> float:
    db = directory / "jobs.db"
    config = pipeline.Config.from_env(
        {"DATABASE_URL": f"sqlite:///{db}", "ADMIN_ENABLED": "false", "WORKER_ENABLED": "false"}, env_file=None
    )
    async with pipeline.open_pipeline(config, registry()) as p:
        for i in range(0, JOBS, 1000):
            await p.enqueue_many([Noop(j) for j in range(i, i + 1000)])
    config = config.replace(worker=attrs.evolve(config.worker, enabled=True))
    if way == "off":  # (the level in the config: a logger's own level would outlive the round)
        config = config.replace(log=attrs.evolve(config.log, level="warning"))
    with (directory / "service.log").open("w") as out:
        logs.configure(config, out)  # as python -m pipeline does: INFO, text
        if way == "logging":
            logs._outcomes = None  # every line through the logging module
        done, count = trio.Event(), [0]

        def seen(fields: dict[str, Any]) -> None:
            count[0] += 1
            if count[0] == JOBS:
                done.set()

        started = time.perf_counter()
        async with pipeline.open_pipeline(config, registry()) as p:
            p.add_observer(seen)
            await done.wait()
        return JOBS / (time.perf_counter() - started)


def main() -> None:
    results: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(4):
        for way in WAYS:
            with tempfile.TemporaryDirectory() as directory:
                rate = trio.run(drain, Path(directory), way)
            results[way].append(rate)
            print(f"{way}: {rate:,.0f} jobs/s", flush=True)
    medians = {way: statistics.median(rates) for way, rates in results.items()}
    print("medians, jobs/s: " + ", ".join(f"{way} {rate:,.0f}" for way, rate in medians.items()))
    print(f"outcome lines cost the drain {1 - medians['batched'] / medians['off']:.0%} batched, "
          f"{1 - medians['logging'] / medians['off']:.0%} through logging")


if __name__ == "__main__":
    main()
