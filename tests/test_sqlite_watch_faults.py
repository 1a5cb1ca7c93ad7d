"""The WAL watch outlives what goes wrong around it (issue 21, item 11 and a small item): a read
the disk refuses for a moment, and an inotify that cannot be set when the backend opens. Real
faults: an LD_PRELOAD shim failing a worker process's reads of the database for 0.3 s, and a
process that has no file descriptor left."""

from __future__ import annotations

import os
import resource
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from conftest import require_program
from jobkit import Echo
from test_processes import WORKER, insert_jobs, statuses

from pipeline.backends.base import Nudge
from pipeline.backends.sqlite import watch
from pipeline.backends.sqlite.db import open_database

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the WAL watch uses Linux's inotify")

FAILING_READS = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
/* While the file $FAIL_READS_FLAG exists, every read of a file whose path starts with
   $FAIL_READS_OF fails with EIO, as a disk that refuses a read for a moment. */
static int failing(int fd) {
    const char *flag = getenv("FAIL_READS_FLAG"), *prefix = getenv("FAIL_READS_OF");
    char link[64], target[4096];
    ssize_t n;
    if (!flag || !prefix || access(flag, F_OK) != 0) return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    n = readlink(link, target, sizeof target - 1);
    if (n < 0) return 0;
    target[n] = 0;
    return strncmp(target, prefix, strlen(prefix)) == 0;
}
ssize_t read(int fd, void *buf, size_t count) {
    static ssize_t (*real)(int, void *, size_t);
    if (!real) real = dlsym(RTLD_NEXT, "read");
    if (failing(fd)) { errno = EIO; return -1; }
    return real(fd, buf, count);
}
ssize_t pread(int fd, void *buf, size_t count, off_t offset) {
    static ssize_t (*real)(int, void *, size_t, off_t);
    if (!real) real = dlsym(RTLD_NEXT, "pread");
    if (failing(fd)) { errno = EIO; return -1; }
    return real(fd, buf, count, offset);
}
ssize_t pread64(int fd, void *buf, size_t count, off_t offset) {
    static ssize_t (*real)(int, void *, size_t, off_t);
    if (!real) real = dlsym(RTLD_NEXT, "pread64");
    if (failing(fd)) { errno = EIO; return -1; }
    return real(fd, buf, count, offset);
}
"""


async def wait_completed(db_path: Path, job_id: str, timeout: float) -> float:
    """Seconds until the job is completed (read by another connection, as an operator would)."""
    started = trio.current_time()
    with trio.fail_after(timeout):
        while statuses(db_path).get(job_id, ("", 0))[0] != "completed":
            await trio.sleep(0.01)
    return trio.current_time() - started


@pytest.mark.slow
async def test_a_read_error_in_the_watchs_look_does_not_stop_the_process(tmp_path: Path) -> None:
    """A worker process (a minute's poll: only the watch starts another process's jobs soon)
    whose reads of the database fail for 0.3 s just as another process commits: its watch's
    look gets "disk I/O error". Before: the error left watch_commits and took the backend's
    nursery, and the whole process, down. Now the process runs on, the job is run, and the
    next ones start at once."""
    require_program("gcc", "builds its failing-read shim; Debian: apt-get install gcc")
    shim, flag = tmp_path / "failing_reads.so", tmp_path / "reads-fail-now"
    (tmp_path / "failing_reads.c").write_text(FAILING_READS)
    await trio.run_process(["gcc", "-shared", "-fPIC", "-o", str(shim), str(tmp_path / "failing_reads.c"), "-ldl"])
    db_path = tmp_path / "jobs.db"
    env = {**os.environ, "PIPELINE_TEST_LOG": str(tmp_path / "runs.log"), "LD_PRELOAD": str(shim),
           "FAIL_READS_FLAG": str(flag), "FAIL_READS_OF": str(db_path.resolve())}
    worker = subprocess.Popen([sys.executable, str(WORKER), str(db_path), "worker_poll_interval_ms=60000",
                               "worker_lease_seconds=60"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None and worker.stdout.readline().startswith("ready")
        await trio.sleep(0.3)  # the Poller's first claim is done; it now waits for the minute
        flag.touch()
        (faulted,) = insert_jobs(db_path, [Echo("committed while the worker's reads fail")])
        await trio.sleep(0.3)
        flag.unlink()
        await trio.sleep(0.2)
        assert worker.poll() is None, f"the worker process died: {worker.communicate(timeout=5)[1][-2000:]}"
        # run by the Poller's claim after the failed look (a claim that failed too is retried within 5 s)
        await wait_completed(db_path, faulted, timeout=8.0)
        for i in range(3):
            await trio.sleep(0.1)  # the Ledger is quiet
            (job_id,) = insert_jobs(db_path, [Echo(f"after the fault {i}")])
            waited = await wait_completed(db_path, job_id, timeout=5.0)
            assert waited < 2.0, f"a job committed after the fault waited {waited:.2f} s (the poll is a minute)"
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=15)
    assert worker.returncode == 0, err
    assert "the WAL watch's look at" in err and "failed" in err, err  # the fault did hit the look


async def test_a_watch_that_could_not_be_set_is_tried_again(tmp_path: Path) -> None:
    """inotify cannot be set when the backend opens (here: no file descriptor left, EMFILE, as
    when the per-user limit of inotify instances is reached). Before: the watch was never tried
    again, and other processes' jobs waited for the poll for as long as the process lived.
    Now it is set on a later try, and another connection's commit nudges the Poller."""
    nudge_send, nudge_recv = trio.open_memory_channel[Nudge](1)
    async with open_database(tmp_path / "jobs.db", busy_timeout_ms=1000, synchronous="normal") as db, trio.open_nursery() as tn:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        filler: list[int] = []
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(int(fd) for fd in os.listdir("/proc/self/fd")) + 64, hard))
        try:
            while True:  # every descriptor taken: inotify_init1 fails with EMFILE
                filler.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        try:
            assert await tn.start(watch.watch_commits, db, nudge_send) is False
        finally:
            for fd in filler:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        with trio.fail_after(watch.SETUP_RETRY + 3.0):  # set on the next try: it nudges for what it missed
            await nudge_recv.receive()
        for _ in range(3):
            conn = sqlite3.connect(tmp_path / "jobs.db", isolation_level=None)  # another process's commit
            conn.execute("CREATE TABLE IF NOT EXISTS other (x)")
            conn.execute("INSERT INTO other VALUES (1)")
            conn.close()
            with trio.fail_after(1.0):
                await nudge_recv.receive()
        tn.cancel_scope.cancel()
