"""Slow checks that are one subprocess each (mypy on the package, the benchmark scripts' tiny runs,
the wheel's build), started as the run begins, when their test was collected (conftest's
pytest_collection_finish), so that each runs beside the rest of the suite: the suite leaves one core
of two idle for much of its time (it waits on services, leases and clocks). Its test then waits for
that process and asserts what it asserted before. A test run without the hook (or whose process was
not started) starts its own then.

A module declares its command at import (collection): ``early.command(TEST, argv)``, TEST being
the test function's node id relative to tests/ ("test_types.py::test_mypy..."); ``argv`` is given
the folder the command may write in (one per command, removed at exit), which is also its working
directory unless ``cwd`` says otherwise.
"""

from __future__ import annotations

import atexit
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import attrs


@attrs.define
class Command:
    argv: Callable[[Path], list[str]]
    cwd: Path | None  # None: the folder
    env: Mapping[str, str] | None
    folder: Path | None = None
    proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        if self.proc is not None:
            return
        self.folder = Path(tempfile.mkdtemp(prefix="early-"))
        atexit.register(shutil.rmtree, self.folder, True)
        self.proc = subprocess.Popen(self.argv(self.folder), cwd=self.cwd or self.folder, env=self.env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


COMMANDS: dict[str, Command] = {}


def command(test: str, argv: Callable[[Path], list[str]], *, cwd: Path | None = None,
            env: Mapping[str, str] | None = None) -> None:
    COMMANDS[test] = Command(argv, cwd, env)


def start_for(nodeids: Iterable[str]) -> None:
    """Start the commands of the tests among ``nodeids`` (as pytest names them: "tests/x.py::f")."""
    wanted = {nodeid.removeprefix("tests/").split("[")[0] for nodeid in nodeids}
    for test, cmd in COMMANDS.items():
        if test in wanted:
            cmd.start()


def stop_all() -> None:
    """At the session's end: none left running (a test that failed before waiting for its own)."""
    for cmd in COMMANDS.values():
        cmd.stop()


def result(test: str, timeout: float) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The finished process of ``test``'s command (started now if it was not), and its folder."""
    cmd = COMMANDS[test]
    cmd.start()
    assert cmd.proc is not None and cmd.folder is not None
    try:
        out, err = cmd.proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        cmd.stop()
        raise
    return subprocess.CompletedProcess(cmd.proc.args, cmd.proc.returncode, out, err), cmd.folder
