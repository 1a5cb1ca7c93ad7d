"""Slow checks that are one subprocess each (mypy on the package, the benchmark scripts' tiny runs,
the wheel's build), started as the run begins, when their test was collected, so that each runs beside
the rest of the suite (which waits on services, leases and clocks much of its time). Its test then
waits for that process and asserts what it asserted before. A test run without the hook (or whose
process was not started) starts its own then.

A module declares its command at import (collection): ``early.command(TEST, argv)``, TEST being
the test function's node id relative to tests/ ("test_types.py::test_mypy..."); ``argv`` is given
the folder the command may write in (one per command), which is also its working directory unless
``cwd`` says otherwise.

The suite runs in two pytest-xdist workers (pyproject's addopts), which both collect every test: the
first to make a command's folder starts it, and the worker that runs its test may be the other one.
So every command's output, exit status and folder live under one folder per run
(``PIPELINE_EARLY_DIR``, made by the controller before its workers start, which inherit it):
``<test>/pid``, ``<test>/out``, ``<test>/err``, ``<test>/rc`` (written when it has ended) and
``<test>/work``; a test waits for ``rc``. The process that made the run's folder (the controller, or
pytest without workers) kills what is still running at the session's end and removes the folder.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import attrs

FOLDER_VARIABLE = "PIPELINE_EARLY_DIR"
# the command, its output to files, then its exit status to rc, written whole (a reader sees none or all)
_WRAP = '"$@" >"$EARLY_OUT" 2>"$EARLY_ERR"; echo $? >"$EARLY_RC.part" && mv "$EARLY_RC.part" "$EARLY_RC"'


def root() -> Path:
    """The run's folder of commands: the controller's (inherited), or one made now and removed at exit."""
    folder = os.environ.get(FOLDER_VARIABLE)
    if folder is None:
        folder = tempfile.mkdtemp(prefix="early-")
        os.environ[FOLDER_VARIABLE] = folder
        atexit.register(shutil.rmtree, folder, True)
    return Path(folder)


@attrs.define
class Command:
    test: str
    argv: Callable[[Path], list[str]]
    cwd: Path | None  # None: its work folder
    env: Mapping[str, str] | None
    proc: subprocess.Popen[bytes] | None = None  # when this process started it

    @property
    def folder(self) -> Path:
        return root() / re.sub(r"[^A-Za-z0-9_.-]", "_", self.test)

    def start(self) -> None:
        """Start the command unless this or another process of the run has."""
        try:
            self.folder.mkdir()
        except FileExistsError:
            return
        work = self.folder / "work"
        work.mkdir()
        env = dict(os.environ if self.env is None else self.env)
        env.update(EARLY_OUT=str(self.folder / "out"), EARLY_ERR=str(self.folder / "err"), EARLY_RC=str(self.folder / "rc"))
        self.proc = subprocess.Popen(["sh", "-c", _WRAP, "sh", *self.argv(work)], cwd=self.cwd or work, env=env,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        (self.folder / "pid").write_text(str(self.proc.pid))


COMMANDS: dict[str, Command] = {}


def command(test: str, argv: Callable[[Path], list[str]], *, cwd: Path | None = None,
            env: Mapping[str, str] | None = None) -> None:
    COMMANDS[test] = Command(test, argv, cwd, env)


def start_for(nodeids: Iterable[str]) -> None:
    """Start the commands of the tests among ``nodeids`` (as pytest names them: "tests/x.py::f")."""
    wanted = {nodeid.removeprefix("tests/").split("[")[0] for nodeid in nodeids}
    for test, cmd in COMMANDS.items():
        if test in wanted:
            cmd.start()


def stop_all() -> None:
    """At the session's end, by the process that made the run's folder: none left running (a test
    that failed before waiting for its own, or was not run), whichever process started it."""
    for folder in root().iterdir():
        if not (folder / "rc").exists() and (folder / "pid").exists():
            _kill(int((folder / "pid").read_text()))
    for cmd in COMMANDS.values():
        if cmd.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                cmd.proc.wait(5)  # (reaped)


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the wrapper and the command it runs (a session of their own)
    except ProcessLookupError:
        pass


def result(test: str, timeout: float) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The finished command of ``test`` (started now if it was not), and its work folder."""
    cmd = COMMANDS[test]
    cmd.start()
    rc = cmd.folder / "rc"
    deadline = time.monotonic() + timeout
    while not rc.exists():
        if time.monotonic() > deadline:
            _kill(int((cmd.folder / "pid").read_text()))
            raise subprocess.TimeoutExpired(cmd.argv(cmd.folder / "work"), timeout)
        time.sleep(0.05)
    out, err = ((cmd.folder / name).read_text(errors="replace") for name in ("out", "err"))
    returncode = int(rc.read_text())
    return subprocess.CompletedProcess(cmd.argv(cmd.folder / "work"), returncode, out, err), cmd.folder / "work"
