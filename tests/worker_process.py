"""A worker process for the multi-process tests: `python tests/worker_process.py DB_PATH [KEY=VALUE ...]`.

Runs the service (signals and all) with the `echo` job type of jobkit.py. Settings come
from KEY=VALUE arguments over fast test defaults, with ``sqlite_synchronous=full``: these
processes are the ones the tests SIGKILL, and docs/reliability.md says those tests run with
the default durability. Prints ``ready synchronous=<setting>`` once every actor runs.
"""

from __future__ import annotations

import functools
import logging
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).parent))

from conftest import fast_config  # noqa: E402
from jobkit import registry  # noqa: E402

import pipeline  # noqa: E402


def main() -> None:
    db_path = Path(sys.argv[1])
    overrides: dict[str, object] = {"sqlite_synchronous": "full"}
    for arg in sys.argv[2:]:
        key, value = arg.split("=", 1)
        overrides[key] = value  # text, as Config.from_env reads it
    logging.basicConfig(level=logging.WARNING, format=f"[worker {db_path.name}] %(levelname)s %(message)s")
    config = fast_config(db_path, admin_enabled=False, **overrides)

    def ready(p: pipeline.Pipeline) -> None:
        print(f"ready synchronous={p.config.sqlite.synchronous}", flush=True)

    trio.run(functools.partial(pipeline.serve, config, registry(), ready=ready))


if __name__ == "__main__":
    main()
