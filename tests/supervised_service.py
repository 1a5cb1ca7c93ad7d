"""The service with the test job types, as an application's own entry point would run it:
`python tests/supervised_service.py [run] [--processes N]` (settings from the environment).
The supervisor starts its worker processes with this same command line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from jobkit import registry  # noqa: E402

from pipeline import supervisor  # noqa: E402
from pipeline.cli import main  # noqa: E402

if __name__ == "__main__":
    # the supervisor's bounds, shortened by the tests that wait for them
    if "TEST_SUPERVISOR_SILENCE_LIMIT" in os.environ:
        supervisor.SILENCE_LIMIT = float(os.environ["TEST_SUPERVISOR_SILENCE_LIMIT"])
    if "TEST_SUPERVISOR_STOP_MARGIN" in os.environ:
        supervisor.STOP_MARGIN = float(os.environ["TEST_SUPERVISOR_STOP_MARGIN"])
    if os.environ.get("TEST_WORKERS_FAIL_AT_START") and "PIPELINE_SUPERVISOR_PID" in os.environ:
        print("this worker process fails at start, on purpose", file=sys.stderr)
        sys.exit(3)
    sys.exit(main(registry=registry()))
