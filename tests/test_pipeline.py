"""The actors end to end, embedded in a trio program, on a real SQLite file."""

from __future__ import annotations

import json
import sqlite3
import time

import pytest
import trio
from conftest import fast_config
from jobkit import Echo, echo, registry, wait_status

import pipeline
from pipeline import Config
from pipeline.backends import open_backend
from pipeline.clock import now_ts, to_epoch
from pipeline.site import UserRegistered


async def test_enqueue_returns_once_committed(config: Config, db_path) -> None:
    async with pipeline.open_pipeline(config, registry()) as p:
        job_id = await p.enqueue(Echo("hi"), run_after=time.time() + 3600)
        # another connection, as another process would see it
        row = sqlite3.connect(db_path).execute("SELECT job_type, payload, status FROM jobs WHERE id = ?", (job_id,)).fetchone()
        assert row == ("echo", json.dumps({"text": "hi", "sleep": 0.0, "fail_times": 0, "mode": "ok"}, separators=(",", ":")), "pending")


async def test_application_job_type_runs_to_completion(config: Config) -> None:
    async with pipeline.open_pipeline(config, registry()) as p:
        job_id = await p.enqueue(Echo("hello"))
        job = await wait_status(p, job_id, "completed")
        assert (job.attempts, job.error) == (1, None)


async def test_failures_retry_with_backoff_then_succeed(config: Config) -> None:
    async with pipeline.open_pipeline(config, registry()) as p:
        job_id = await p.enqueue(Echo("flaky", fail_times=2), max_attempts=3)
        job = await wait_status(p, job_id, "completed")
        assert job.attempts == 3
        assert "failing on purpose, attempt 2" in job.error  # the last error is kept


async def test_out_of_attempts_goes_dead(config: Config) -> None:
    async with pipeline.open_pipeline(config, registry()) as p:
        job_id = await p.enqueue(Echo("doomed", fail_times=99), max_attempts=2)
        job = await wait_status(p, job_id, "dead")
        assert job.attempts == 2 and "RuntimeError: failing on purpose, attempt 2" in job.error


async def test_backoff_delay_is_recorded_in_run_after(db_path) -> None:
    config = fast_config(db_path, worker_backoff_base_ms=60_000)
    async with pipeline.open_pipeline(config, registry()) as p:
        job_id = await p.enqueue(Echo("flaky", fail_times=1))
        with trio.fail_after(10):
            while (job := await p.backend.get(job_id)).error is None:
                await trio.sleep(0.01)
        assert job.status == "pending" and job.attempts == 1
        delay = to_epoch(job.run_after) - to_epoch(job.updated_at)
        assert 60 * 0.85 - 0.01 <= delay <= 60 * 1.15 + 0.01


async def test_permanent_error_is_dead_at_once(config: Config) -> None:
    async with pipeline.open_pipeline(config, registry()) as p:
        job_id = await p.enqueue(Echo("x", mode="permanent"), max_attempts=5)
        job = await wait_status(p, job_id, "dead")
        assert job.attempts == 1 and job.error == "permanent error: this can never work"


async def test_retry_later_uses_the_delay_asked_for(config: Config) -> None:
    async with pipeline.open_pipeline(config, registry()) as p:
        job_id = await p.enqueue(Echo("x", mode="retry_later"), max_attempts=5)
        with trio.fail_after(10):
            while (job := await p.backend.get(job_id)).error is None:
                await trio.sleep(0.01)
        assert job.status == "pending" and job.error == "come back later"
        assert 59.9 <= to_epoch(job.run_after) - to_epoch(job.updated_at) <= 60.1


async def test_timeout_fails_the_job_and_others_keep_moving(db_path) -> None:
    config = fast_config(db_path, worker_job_timeout_seconds=0.2)
    async with pipeline.open_pipeline(config, registry(concurrency=1)) as p:
        slow = await p.enqueue(Echo("slow", mode="hang"), max_attempts=1)
        fast = await p.enqueue(Echo("fast"))
        job = await wait_status(p, slow, "dead")
        assert job.error.startswith("timed out after 0.2 s")
        await wait_status(p, fast, "completed")


def _one_worker_registry(ran: list[str], timeout: float) -> pipeline.Registry:
    """echo on one worker: "hang" sleeps forever, "swallow" catches its timeout's cancellation and
    returns, "wait" sleeps job.sleep; each run that returns is noted in ``ran``."""

    async def handler(job: Echo, ctx: pipeline.JobContext) -> None:
        if job.mode == "hang":
            await trio.sleep_forever()
        elif job.mode == "swallow":
            try:
                await trio.sleep(10)
            except trio.Cancelled:  # its timeout's cancellation, caught: it returns, its scope cancelled
                pass
        elif job.mode == "wait":
            await trio.sleep(job.sleep)  # a whole run, under its own deadline
        ran.append(job.text)

    reg = pipeline.site.types_registry()
    reg.register("echo", Echo, handler, concurrency=1, timeout=timeout)
    return reg


async def test_one_worker_runs_each_job_whole_after_a_timeout_and_a_late_finish(db_path) -> None:
    """A worker's jobs share one cancel scope (pools.run_worker): after a run it cancelled (a timeout)
    or a run whose cancellation it caught and returned (a late finish), the next job on the same
    worker runs whole under a new scope, and each gets its own deadline."""
    ran: list[str] = []
    async with pipeline.open_pipeline(fast_config(db_path), _one_worker_registry(ran, 0.3)) as p:
        ids = [await p.enqueue(Echo(text, mode=mode, sleep=0.05), max_attempts=1)  # (0.25 s to spare)
               for text, mode in (("hang", "hang"), ("after-timeout", "wait"), ("swallow", "swallow"), ("after-late", "wait"),
                                  ("last", "wait"))]
        jobs = [await wait_status(p, job_id, "completed", "dead", "cancelled") for job_id in ids]
    assert [job.status for job in jobs] == ["dead", "completed", "completed", "completed", "completed"]
    assert jobs[0].error.startswith("timed out after 0.3 s")
    assert ran == ["after-timeout", "swallow", "after-late", "last"]


async def test_a_cancel_ends_the_job_cancelled_on_a_worker_whose_last_job_completed(db_path) -> None:
    """The cancel request of a job that runs after a completed one under the same worker's scope: it
    ends cancelled, never retried, and the job after it runs whole. (Its worker once judged such a run
    by the last job's outcome: it took the cancellation for a timeout, and the job was retried.)"""
    ran: list[str] = []
    async with pipeline.open_pipeline(fast_config(db_path), _one_worker_registry(ran, 30.0)) as p:
        ids = [await p.enqueue(Echo(text, mode=mode, sleep=0.05), max_attempts=3)
               for text, mode in (("first", "wait"), ("cancelled", "hang"), ("after-cancel", "wait"))]
        await wait_status(p, ids[1], "running")
        await p.backend.cancel([ids[1]], reason="test")
        jobs = [await wait_status(p, job_id, "completed", "dead", "cancelled") for job_id in ids]
    assert [job.status for job in jobs] == ["completed", "cancelled", "completed"]
    assert (jobs[1].attempts, jobs[1].error) == (1, "cancelled while running (cancel requested during attempt 1)")
    assert ran == ["first", "after-cancel"]


async def test_a_run_that_outlasts_the_stops_grace_is_waited_for_without_the_timeout_watch_spinning(db_path) -> None:
    """Past a stop's grace no new run starts and every deadline has passed: the pool's timeout watch
    (pools.run_timeouts) waits for the last worker then, instead of looking again at once, over and
    over, while a handler that shields itself from the cancellation finishes."""
    steps = 0

    class Count(trio.abc.Instrument):
        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            nonlocal steps
            steps += task.name.endswith("run_timeouts")

    async def stubborn(job: Echo, ctx: pipeline.JobContext) -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            with trio.CancelScope(shield=True):
                await trio.sleep(0.6)  # past the grace, the cancellation held off
            raise

    reg = pipeline.site.types_registry()
    reg.register("echo", Echo, stubborn, concurrency=1)
    async with pipeline.open_pipeline(fast_config(db_path, worker_shutdown_timeout=0.1), reg) as p:
        job_id = await p.enqueue(Echo("x"))
        await wait_status(p, job_id, "running")
        trio.lowlevel.add_instrument(Count())
    assert steps < 20, steps  # (it looked again at once: thousands)
    async with open_backend(fast_config(db_path)) as backend:
        assert (await backend.get(job_id)).status == "pending"  # type: ignore[union-attr]  # released at the end of the grace


async def test_malformed_row_goes_dead_and_the_worker_carries_on(config: Config, db_path) -> None:
    async with pipeline.open_pipeline(config, registry(concurrency=1)) as p:
        conn = sqlite3.connect(db_path)
        conn.execute("INSERT INTO jobs (id, job_type, payload) VALUES ('bad-json', 'echo', '{not json')")
        conn.execute("INSERT INTO jobs (id, job_type, payload) VALUES ('bad-shape', 'echo', '{\"text\": 5}')")
        conn.commit()
        good = await p.enqueue(Echo("fine"))
        bad_json = await wait_status(p, "bad-json", "dead")
        bad_shape = await wait_status(p, "bad-shape", "dead")
        assert "payload no longer decodes" in bad_json.error and "not valid JSON" in bad_json.error
        assert "expected a string, got int @ $.text" in bad_shape.error
        await wait_status(p, good, "completed")


async def test_unknown_job_type_goes_dead_with_the_reason_after_a_grace_period(db_path) -> None:
    config = fast_config(db_path, worker_unknown_type_grace_seconds=1.5)
    async with pipeline.open_pipeline(config, registry()) as p:
        conn = sqlite3.connect(db_path)
        conn.execute("INSERT INTO jobs (id, job_type, payload) VALUES ('ghost', 'no_such_type', '{}')")
        conn.commit()
        await trio.sleep(1.0)
        assert (await p.backend.get("ghost")).status == "pending"  # another process may still take it
        job = await wait_status(p, "ghost", "dead", timeout=15)
        assert "no worker handles job type 'no_such_type'" in job.error


async def test_types_without_a_handler_here_are_not_claimed(config: Config) -> None:
    async with pipeline.open_pipeline(config, registry()) as p:
        mail = await p.enqueue(pipeline.site.SendEmail(to="a@example.com", subject="s", body="b"))
        done = await p.enqueue(Echo("x"))
        await wait_status(p, done, "completed")
        await trio.sleep(config.worker.poll_interval * 5)
        assert (await p.backend.get(mail)).status == "pending"  # another process may run it


async def test_outbox_insert_in_the_applications_transaction(config: Config, db_path) -> None:
    reg = registry()
    async with pipeline.open_pipeline(config, reg) as p:
        conn = sqlite3.connect(db_path, isolation_level=None)
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO orders (id) VALUES (1)")
        kept = pipeline.enqueue_in_transaction(conn, Echo("kept"), registry=reg)
        conn.execute("COMMIT")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO orders (id) VALUES (2)")
        dropped = pipeline.enqueue_in_transaction(conn, Echo("dropped"), registry=reg)
        conn.execute("ROLLBACK")
        await wait_status(p, kept, "completed")  # found by polling: another connection wrote it
        assert await p.backend.get(dropped) is None
        assert conn.execute("SELECT id FROM orders").fetchall() == [(1,)]


async def test_emit_returns_the_committed_ids_of_the_routed_jobs(config: Config, db_path) -> None:
    async with pipeline.open_pipeline(config, registry()) as p:
        ids = await p.emit(UserRegistered(user_id="u1", email="ann@example.com", username="ann"))
        assert len(ids) == 1
        job = await p.backend.get(ids[0])
        assert job.job_type == "send_welcome_email"
        assert json.loads(job.payload) == {"user_id": "u1", "email": "ann@example.com", "username": "ann"}
        media = await p.emit(pipeline.site.MediaUploaded(id="m1"))
        types = sorted([(await p.backend.get(i)).job_type for i in media])
        assert types == ["convert_webp", "generate_thumbnail"]


async def test_many_concurrent_emits_are_all_committed(config: Config) -> None:
    async with pipeline.open_pipeline(config, registry()) as p:
        results: list[list[str]] = []

        async def one(i: int) -> None:
            results.append(await p.emit(pipeline.site.MediaUploaded(id=f"m{i}")))

        async with trio.open_nursery() as tn:
            for i in range(200):
                tn.start_soon(one, i)
        assert len(results) == 200 and all(len(r) == 2 for r in results)
        stats = await p.backend.stats()
        assert stats["by_type"]["generate_thumbnail"]["pending"] == 200


async def test_priority_then_due_time_orders_the_claims(db_path) -> None:
    order: list[str] = []

    async def record(job: Echo, ctx: pipeline.JobContext) -> None:
        order.append(job.text)

    reg = pipeline.site.types_registry()
    reg.register("echo", Echo, record, concurrency=1)
    config = fast_config(db_path, worker_prefetch=0)
    async with pipeline.open_pipeline(config, reg) as p:
        # all in one transaction, so the claims see them together
        jobs = [p.new_job(Echo(t), priority=prio) for t, prio in [("low", 9), ("mid", 5), ("high", 1), ("mid2", 5)]]
        await p.backend.insert(jobs)
        ids = [job.id for job in jobs]
        for job_id in ids:
            await wait_status(p, job_id, "completed")
    assert order == ["high", "mid", "mid2", "low"]


async def test_delayed_job_waits_for_its_time(config: Config) -> None:
    async with pipeline.open_pipeline(config, registry()) as p:
        job_id = await p.enqueue(Echo("later"), run_after=time.time() + 0.5)
        await trio.sleep(0.25)
        assert (await p.backend.get(job_id)).status == "pending"
        job = await wait_status(p, job_id, "completed")
        assert to_epoch(job.updated_at) >= to_epoch(job.run_after)


async def test_concurrency_is_bounded_per_type(config: Config) -> None:
    running = 0
    peak = 0

    async def track(job: Echo, ctx: pipeline.JobContext) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await trio.sleep(0.02)
        running -= 1

    reg = pipeline.site.types_registry()
    reg.register("echo", Echo, track, concurrency=3)
    async with pipeline.open_pipeline(config, reg) as p:
        ids = await p.enqueue_many([Echo(str(i)) for i in range(30)])
        for job_id in ids:
            await wait_status(p, job_id, "completed")
    assert peak == 3


async def test_ledger_groups_a_burst_into_few_transactions(db_path) -> None:
    config = fast_config(db_path, worker_concurrency=64)
    async with pipeline.open_pipeline(config, registry()) as p:
        ids = await p.enqueue_many([Echo(str(i)) for i in range(2000)])
        await wait_status(p, ids[-1], "completed")
        with trio.fail_after(10):
            while (await p.backend.stats())["by_status"]["completed"] < 2000:
                await trio.sleep(0.01)
        # 2000 claims + 2000 outcomes + the insert: grouped, far fewer commits than jobs
        assert p.backend.ledger_stats.commands >= 2000
        assert p.backend.ledger_stats.batches < 2000 / 4, p.backend.ledger_stats


async def test_long_job_keeps_its_lease_while_it_runs(db_path) -> None:
    config = fast_config(db_path, worker_lease_seconds=0.6)
    # the rescuer is another pipeline on the file, with an owner of its own (a pipeline never
    # rescues its own leases) and no handler for `echo` (it cannot take the job by claiming)
    rescuer = pipeline.open_pipeline(fast_config(db_path, worker_lease_seconds=0.6), pipeline.site.types_registry())
    async with pipeline.open_pipeline(config, registry()) as p, rescuer as other:
        assert other.owner != p.owner
        job_id = await p.enqueue(Echo("long", sleep=2.0))  # more than three leases
        job = await wait_status(p, job_id, "completed")
        assert job.attempts == 1 and job.error is None  # renewed, never rescued


async def test_graceful_shutdown_returns_unfinished_jobs_uncounted(db_path) -> None:
    config = fast_config(db_path, worker_shutdown_timeout=1.0)  # the quick job's 0.1 s, with room for a loaded machine
    started_runs: dict[str, trio.Event] = {"hung": trio.Event(), "quick": trio.Event()}

    async def run(job: Echo, ctx: pipeline.JobContext) -> None:
        started_runs[job.text].set()
        await echo(job, ctx)

    reg = pipeline.site.types_registry()
    reg.register("echo", Echo, run, concurrency=2)
    async with pipeline.open_pipeline(config, reg) as p:
        hung = await p.enqueue(Echo("hung", mode="hang"))
        quick = await p.enqueue(Echo("quick", sleep=0.1))
        for event in started_runs.values():  # both handlers are running (not just claimed)
            await event.wait()
        started = trio.current_time()
    assert trio.current_time() - started < 1.0 + 1.0
    conn = sqlite3.connect(db_path)
    rows = dict(conn.execute("SELECT id, status || '/' || attempts FROM jobs"))
    assert rows[hung] == "pending/0"  # returned, attempt not counted
    assert rows[quick] == "completed/1"  # finished within the grace period


async def test_no_new_work_after_shutdown(config: Config) -> None:
    async with pipeline.open_pipeline(config, registry()) as p:
        pass
    with pytest.raises(pipeline.PipelineClosed):
        await p.enqueue(Echo("late"))
    with pytest.raises(pipeline.PipelineClosed):
        await p.emit(UserRegistered(user_id="u", email="e@example.com", username="u"))


async def test_bad_input_is_refused_and_nothing_is_written(config: Config, db_path) -> None:
    async with pipeline.open_pipeline(config, registry()) as p:
        with pytest.raises(pipeline.UnknownJobType):
            await p.enqueue(object())
        with pytest.raises(pipeline.UsageError, match="max_attempts"):
            await p.enqueue(Echo("x"), max_attempts=0)
        with pytest.raises(pipeline.InvalidPayload, match="sleep"):
            await p.enqueue(Echo("x", sleep="soon"))  # type: ignore[arg-type]
        with pytest.raises(pipeline.UnknownEvent):
            await p.emit(Echo("not an event"))
        assert (await p.backend.stats())["total"] == 0


async def test_worker_disabled_runs_nothing(db_path) -> None:
    config = fast_config(db_path, worker_enabled=False)
    async with pipeline.open_pipeline(config, registry()) as p:
        job_id = await p.enqueue(Echo("x"))
        await trio.sleep(config.worker.poll_interval * 5)
        assert (await p.backend.get(job_id)).status == "pending"


def test_run_after_is_stored_in_the_sql_format() -> None:
    assert now_ts()[-1] == "Z" and len(now_ts()) == len("2026-01-01T00:00:00.000Z")


async def test_a_writer_holding_the_lock_delays_but_loses_nothing(db_path) -> None:
    config = fast_config(db_path, sqlite_busy_timeout_ms=200)  # much shorter than the lock is held
    async with pipeline.open_pipeline(config, registry()) as p:
        first = await p.enqueue(Echo("before"))
        await wait_status(p, first, "completed")
        other = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")  # another process's long write transaction

        async def release_later() -> None:
            await trio.sleep(1.5)
            other.execute("COMMIT")

        async with trio.open_nursery() as tn:
            tn.start_soon(release_later)
            started = trio.current_time()
            during = await p.enqueue(Echo("during"))  # waits for the lock, then commits
            assert trio.current_time() - started >= 1.0
        job = await wait_status(p, during, "completed")
        assert job.attempts == 1


async def test_a_handler_that_blocks_the_loop_fails_saying_so_and_keeps_its_lease(db_path) -> None:
    import threading

    from pipeline.backends.sqlite import store as store_mod

    async def blocking(job: Echo, ctx: pipeline.JobContext) -> None:
        time.sleep(1.5)  # by mistake: blocks the whole event loop
        await trio.sleep(1)  # where the timeout lands, late

    reg = pipeline.site.types_registry()
    reg.register("echo", Echo, blocking, timeout=0.3)
    config = fast_config(db_path, worker_lease_seconds=0.6)
    rescued: list[object] = []
    stop = threading.Event()

    def other_process() -> None:  # rescues expired leases, as any other worker would
        conn = store_mod.connect(db_path)
        while not stop.wait(0.05):
            with store_mod.write_transaction(conn):
                rescued.extend(store_mod.rescue_expired(conn, now=now_ts(), base_seconds=0.01))
        conn.close()

    async with pipeline.open_pipeline(config, reg) as p:
        thread = threading.Thread(target=other_process)
        thread.start()
        try:
            job_id = await p.enqueue(Echo("cpu"), max_attempts=1)
            job = await wait_status(p, job_id, "dead")
        finally:
            stop.set()
            thread.join()
    assert rescued == [], "the lease expired while the loop was blocked"
    assert job.attempts == 1
    assert job.error.startswith("timed out after 0.3 s") and "blocking the event loop" in job.error


async def test_a_handler_that_finishes_late_without_being_cancelled_is_completed_once(
    db_path, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler waiting on a thread that cannot be interrupted (a mail being sent), or one that
    never yields, finishes after its deadline: its work is done, so it is not run again."""
    done: list[str] = []

    async def in_a_thread(job: Echo, ctx: pipeline.JobContext) -> None:
        await trio.to_thread.run_sync(time.sleep, 0.8)  # not abandon_on_cancel, as the mail handler
        done.append(job.text)

    async def never_yields(job: Echo, ctx: pipeline.JobContext) -> None:
        time.sleep(1.0)
        done.append(job.text)

    async def swallows_the_cancel(job: Echo, ctx: pipeline.JobContext) -> None:
        try:
            await trio.sleep(0.8)
        except trio.Cancelled:  # a handler bug; it says it finished, and the job is not run again
            pass
        done.append(job.text)

    for handler, why in ((in_a_thread, "cannot be interrupted (a thread)"), (never_yields, "blocking the event loop"),
                         (swallows_the_cancel, "or caught the Cancelled exception")):
        done.clear()
        caplog.clear()
        reg = pipeline.site.types_registry()
        reg.register("echo", Echo, handler, timeout=0.3)
        async with pipeline.open_pipeline(fast_config(db_path), reg) as p:
            job_id = await p.enqueue(Echo(handler.__name__))
            job = await wait_status(p, job_id, "completed")
            await trio.sleep(0.3)
        assert (job.attempts, job.error, done) == (1, None, [handler.__name__])
        warning = next(r.getMessage() for r in caplog.records if "past its timeout" in r.getMessage())
        assert f"job {job_id} (echo) finished after" in warning and "timeout of 0.3 s" in warning and why in warning


async def test_a_job_finishing_in_the_shutdown_grace_can_still_emit(db_path) -> None:
    emitted: list[list[str]] = []

    async def slow_then_emit(job: Echo, ctx: pipeline.JobContext) -> None:
        await trio.sleep(0.3)  # still running when the pipeline starts shutting down
        emitted.append(await ctx.emit(pipeline.site.MediaUploaded(id=job.text)))

    started = trio.Event()

    async def run(job: Echo, ctx: pipeline.JobContext) -> None:
        started.set()
        await slow_then_emit(job, ctx)

    reg = pipeline.site.types_registry()
    reg.register("echo", Echo, run)
    config = fast_config(db_path, worker_shutdown_timeout=2.0)
    async with pipeline.open_pipeline(config, reg) as p:
        job_id = await p.enqueue(Echo("m1"))
        await started.wait()
    conn = sqlite3.connect(db_path)
    assert conn.execute("SELECT status, attempts FROM jobs WHERE id = ?", (job_id,)).fetchone() == ("completed", 1)
    assert len(emitted) == 1 and len(emitted[0]) == 2
    types = sorted(t for (t,) in conn.execute("SELECT job_type FROM jobs WHERE id != ?", (job_id,)))
    assert types == ["convert_webp", "generate_thumbnail"]


async def test_handler_errors_that_are_groups_or_hold_bad_text_settle_like_any_other(db_path) -> None:
    async def grouped(job: Echo, ctx: pipeline.JobContext) -> None:
        if job.mode == "group_timeout":  # its nursery ends with [Cancelled, ConnectionError] at the timeout
            async def uploader() -> None:
                try:
                    await trio.sleep_forever()
                finally:
                    raise ConnectionError("upload aborted half-way")

            async with trio.open_nursery() as tn:
                tn.start_soon(uploader)
                tn.start_soon(trio.sleep_forever)
        if job.mode == "group_permanent":
            raise ExceptionGroup("several", [ValueError("x"), pipeline.PermanentError("no such thing")])
        if job.mode == "bad_text":
            raise pipeline.PermanentError(b"cannot read photo-\xff.jpg".decode("utf-8", "surrogateescape"))

    reg = pipeline.site.types_registry()
    reg.register("echo", Echo, grouped, timeout=0.2)
    async with pipeline.open_pipeline(fast_config(db_path), reg) as p:
        ids = [await p.enqueue(Echo(m, mode=m), max_attempts=1) for m in ("group_timeout", "group_permanent", "bad_text")]
        fine = await p.enqueue(Echo("fine"))
        jobs = [await wait_status(p, job_id, "dead") for job_id in ids]
        await wait_status(p, fine, "completed")
    assert jobs[0].error.startswith("timed out after 0.2 s")
    assert jobs[1].error == "permanent error: no such thing"
    assert jobs[2].error == "permanent error: cannot read photo-\\udcff.jpg"
