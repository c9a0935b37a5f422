"""A user's tests under pytest-django, on the project in ``tests/testing/djangosite``."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction

from celery_outbox.testing import OutboxTester, assert_not_pushed, assert_pushed
from tests.testing.djangosite.orders.jobs import send_receipt
from tests.testing.djangosite.orders.models import Order, Receipt


def test_a_delayed_receipt(outbox_tester: OutboxTester) -> None:
    with transaction.atomic():
        order = Order.objects.create(customer="alice")
        send_receipt.push({"order_id": order.id}, delay=timedelta(minutes=5))
    assert_pushed(send_receipt, payload={"order_id": order.id}, status="scheduled")
    assert outbox_tester.drain().claimed == 0
    outbox_tester.advance(minutes=5)
    assert outbox_tester.drain().succeeded == 1
    assert Receipt.objects.filter(order=order).count() == 1


def test_each_test_starts_clean(outbox_tester: OutboxTester) -> None:
    assert_not_pushed(send_receipt)
