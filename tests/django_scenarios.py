"""What tests/test_django*.py ask of the example Django project (examples/django_project), each in a
process of its own: ``python django_scenarios.py SCENARIO [ARG]``, run in the project's directory with
DJANGO_SETTINGS_MODULE=mysite.settings; prints one JSON line, what the test checks."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sys
import time
from typing import Any

import django

django.setup()

from django.db import connection, connections, transaction  # noqa: E402
from shop.models import Order  # noqa: E402
from shop.services import place_order  # noqa: E402
from shop.tasks import add, add_async, charge, count_orders, fresh_connection, send_receipt, whoami  # noqa: E402

from pipeline.contrib.django import compat  # noqa: E402

fw = compat.PRIMARY
backend = fw.task_backends()["default"]


def _caught(fn: Any) -> str:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test reads which
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def enqueue() -> dict[str, Any]:
    """Tasks of every kind, through PipelineBackend; one enqueued in an atomic() that rolls back."""
    order, receipt = place_order("ada@example.com", "12.50")
    rolled: list[str] = []
    try:
        with transaction.atomic():
            Order.objects.create(email="gone@example.com", total="1.00")
            rolled.append(send_receipt.enqueue(999).id)
            raise RuntimeError("rolled back")
    except RuntimeError:
        pass
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    return {
        "order": order.id, "receipt": receipt.id, "receipt_status": str(receipt.status),
        "add": add.enqueue(2, 3).id, "async": add_async.enqueue(4, 5).id, "context": whoami.enqueue().id,
        "charge": charge.enqueue(7).id, "count": count_orders.enqueue().id,
        "deferred": add.using(run_after=later).enqueue(1, 1).id, "rolled_back": rolled[0],
        "rolled_back_lookup": _caught(lambda: backend.get_result(rolled[0])),
        "orders": Order.objects.count(),
        "fresh": [fresh_connection.enqueue().id for _ in range(4)],
    }


def results(ids: str) -> dict[str, Any]:
    """Each task's TaskResult once it has finished (60 s at most), read back through get_result."""
    wanted, found = json.loads(ids), {}
    deadline = time.monotonic() + 60
    for name, job_id in wanted.items():
        while True:
            result = backend.get_result(job_id)
            if result.is_finished or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        found[name] = {
            "status": str(result.status), "attempts": result.attempts, "worker_ids": result.worker_ids,
            "return_value": result.return_value if str(result.status) == "SUCCESSFUL" else None,
            "errors": [[e.exception_class_path, e.traceback] for e in result.errors],
            "error_class": result.errors[0].exception_class.__name__ if result.errors else None,
            "times": [str(t) for t in (result.enqueued_at, result.started_at, result.finished_at)],
            "task": [result.task.module_path, result.task.priority, result.task.queue_name],
        }
    found["receipt_sent"] = Order.objects.filter(receipt_sent=True).count()
    return found


def status(job_id: str) -> dict[str, Any]:
    result = backend.get_result(job_id)
    return {"status": str(result.status), "run_after": str(result.task.run_after)}


def asynchronous() -> dict[str, Any]:
    """aenqueue and aget_result from an asyncio program (an async view's)."""

    async def main() -> dict[str, Any]:
        enqueued = await add.aenqueue(20, 22)
        fetched = await add.aget_result(enqueued.id)
        return {"id": enqueued.id, "status": str(fetched.status), "same": fetched.id == enqueued.id}

    return asyncio.run(main())


def errors() -> dict[str, Any]:
    """What Django's API says for what cannot be done."""
    return {
        "unknown_id": _caught(lambda: backend.get_result("01a25159-f754-7000-8069-59cb67b31505")),
        "not_an_id": _caught(lambda: backend.get_result("nope")),
        "bad_queue": _caught(lambda: add.using(queue_name="nowhere")),
        "bad_priority": _caught(lambda: add.using(priority=101)),
        "naive_run_after": _caught(lambda: add.using(run_after=dt.datetime(2030, 1, 1))),
        "not_json": _caught(lambda: add.enqueue(object(), 1)),
        "wrong_task": _caught(lambda: charge.get_result(add.enqueue(1, 2).id)),
    }


def client_connection() -> dict[str, Any]:
    """pipeline.Client's connection= takes Django's connection inside atomic(); None is refused."""
    import attrs

    import pipeline

    @attrs.frozen
    class Note:
        text: str

    registry = pipeline.Registry()
    registry.register("note", Note)
    from pipeline.contrib.django.backend import pipeline_backends
    from pipeline.contrib.django.options import store_url

    url = store_url(pipeline_backends()["default"])
    answers: dict[str, Any] = {}
    with pipeline.Client(url, registry=registry) as client:
        connection.close()  # Django's connection.connection is None until its first query
        answers["raw_before_first_query"] = repr(connection.connection)
        answers["none"] = _caught(lambda: client.enqueue(Note("x"), connection=connection.connection))
        answers["outside_atomic"] = _caught(lambda: client.enqueue(Note("x"), connection=connection))
        with transaction.atomic():
            kept = client.enqueue(Note("kept"), connection=connection)
            Order.objects.create(email="kept@example.com", total="2.00")
        try:
            with transaction.atomic(using="default"):
                gone = client.enqueue(Note("gone"), connection=connections["default"])
                raise RuntimeError("rolled back")
        except RuntimeError:
            pass
        answers["kept"] = client.get(kept).status if client.get(kept) else None
        answers["gone"] = client.get(gone)
    return answers


if __name__ == "__main__":
    scenario, *args = sys.argv[1:]
    print(json.dumps(globals()[scenario](*args), default=str))
