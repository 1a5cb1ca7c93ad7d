"""The shop's own tests: Django's TestCase (each test a transaction, rolled back), the tasks run by
pipeline.contrib.django.run_tasks() on the test's own connection."""

from django.db import transaction
from django.test import TestCase

from pipeline.contrib.django import run_tasks

from .models import Order
from .services import place_order
from .tasks import add, add_async, charge, count_orders, send_receipt, whoami

try:
    from django.tasks import TaskResultStatus
except ImportError:
    from django_tasks import TaskResultStatus


class TaskTests(TestCase):
    def test_the_receipt_task_sees_the_order_the_test_made(self):
        order, enqueued = place_order("ada@example.com", "12.50")
        self.assertEqual(enqueued.status, TaskResultStatus.READY)
        (result,) = run_tasks()
        self.assertEqual(result.id, enqueued.id)
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        self.assertEqual(result.return_value, {"order": order.id, "email": "ada@example.com", "total": "12.50"})
        order.refresh_from_db()
        self.assertTrue(order.receipt_sent)
        self.assertEqual(send_receipt.get_result(enqueued.id).return_value["total"], "12.50")
        enqueued.refresh()
        self.assertEqual(enqueued.status, TaskResultStatus.SUCCESSFUL)

    def test_a_task_that_raises_is_failed_with_its_error(self):
        enqueued = charge.enqueue(7)
        (result,) = run_tasks()
        self.assertEqual(result.status, TaskResultStatus.FAILED)
        self.assertEqual(result.errors[0].exception_class_path, "shop.tasks.PaymentDeclined")
        self.assertIn("card declined for order 7", result.errors[0].traceback)
        with self.assertRaises(ValueError):
            result.return_value  # noqa: B018 - the property raises
        self.assertEqual(charge.get_result(enqueued.id).status, TaskResultStatus.FAILED)

    def test_a_rolled_back_atomic_leaves_no_task(self):
        try:
            with transaction.atomic():
                place_order("gone@example.com", "1.00")
                raise RuntimeError("the view failed")
        except RuntimeError:
            pass
        self.assertEqual(run_tasks(), [])
        self.assertEqual(Order.objects.count(), 0)

    def test_higher_priority_runs_first_and_every_kind_of_task_runs(self):
        low = add.using(priority=-5).enqueue(1, 2)
        high = add.using(priority=50).enqueue(3, 4)
        coroutine = add_async.enqueue(5, 6)
        context = whoami.enqueue()
        Order.objects.create(email="x@example.com", total="1.00")
        counted = count_orders.enqueue()
        results = {result.id: result for result in run_tasks()}
        self.assertEqual(list(results)[0], high.id)
        self.assertEqual(results[low.id].return_value, 3)
        self.assertEqual(results[high.id].return_value, 7)
        self.assertEqual(results[coroutine.id].return_value, 11)
        self.assertEqual(results[context.id].return_value, {"id": context.id, "attempt": 1})
        self.assertEqual(results[counted.id].return_value, 1)
        self.assertEqual(run_tasks(), [])  # each ran once
