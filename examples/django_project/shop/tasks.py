"""The shop's tasks: plain Django tasks, nothing of the pipeline's in them."""

import logging

try:
    from django.tasks import task  # Django 6
except ImportError:
    from django_tasks import task  # the backport, Django 4.2-5.2

from .models import Order

log = logging.getLogger(__name__)


class PaymentDeclined(Exception):
    pass


@task(queue_name="emails", priority=10)
def send_receipt(order_id: int) -> dict:
    order = Order.objects.get(id=order_id)  # the order committed with the task: it is there
    order.receipt_sent = True
    order.save(update_fields=["receipt_sent"])
    log.info("receipt sent for order %s", order_id)
    return {"order": order_id, "email": order.email, "total": str(order.total)}


@task
def add(a: int, b: int) -> int:
    return a + b


@task
async def add_async(a: int, b: int) -> int:
    return a + b


@task
def charge(order_id: int) -> None:
    raise PaymentDeclined(f"card declined for order {order_id}")


@task(takes_context=True)
def whoami(context) -> dict:
    return {"id": context.task_result.id, "attempt": context.attempt}


@task
def count_orders() -> int:
    return Order.objects.count()


@task
def fresh_connection() -> bool:
    """True when the task starts without an open connection: the worker closes a task's connections
    after it, as Django does after a request (CONN_MAX_AGE=0, the default)."""
    from django.db import connection

    fresh = connection.connection is None
    Order.objects.exists()  # opens it: the worker must close it again
    return fresh
