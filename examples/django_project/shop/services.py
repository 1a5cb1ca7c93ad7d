from decimal import Decimal

from django.db import transaction

from .models import Order
from .tasks import send_receipt


def place_order(email: str, total: str) -> tuple[Order, object]:
    """The order and its receipt's task commit together (or neither: the task is in the transaction)."""
    with transaction.atomic():
        order = Order.objects.create(email=email, total=Decimal(total))
        result = send_receipt.enqueue(order.id)
    return order, result
