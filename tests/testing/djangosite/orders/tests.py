"""The project's own tests, run by Django's test runner (``python -m django test``): the
outbox follows the runner's rename of the database, and ``celery_outbox.testing`` drives it.
"""

from __future__ import annotations

import time
from datetime import timedelta

from django.db import connection, transaction
from django.test import TestCase, TransactionTestCase

from celery_outbox.testing import OutboxTester
from tests.testing.djangosite.celery import app, outbox
from tests.testing.djangosite.orders.jobs import send_receipt
from tests.testing.djangosite.orders.models import Order, Receipt


def place_order(customer: str, *, order_id_sign: int = 1,
                delay: timedelta | None = None) -> Order:
    """The application's code under test: an order and its receipt in one transaction."""
    with transaction.atomic():
        order = Order.objects.create(customer=customer)
        send_receipt.push({"order_id": order_id_sign * order.id}, delay=delay)
    return order


class OutboxTests(TransactionTestCase):
    """Committed transactions: what a worker (here: drain) sees."""

    def setUp(self) -> None:
        self.outbox = OutboxTester(outbox, create_schema=False)  # migrate made the tables
        self.outbox.start()
        self.addCleanup(self.outbox.close)

    def test_the_outbox_reads_the_test_database(self) -> None:
        name = connection.settings_dict["NAME"]
        with outbox.engine.connect() as conn:
            if connection.vendor == "postgresql":
                found = conn.exec_driver_sql("SELECT current_database()").scalar()
                self.assertEqual(found, name)
                self.assertTrue(str(found).startswith("test_"))
            else:  # Django's SQLite test database: in memory, shared by URI
                self.assertIn("memory", name)
                conn.exec_driver_sql("SELECT count(*) FROM orders_order").scalar()

    def test_a_push_is_asserted_then_drained_through_the_real_runner(self) -> None:
        order = place_order("alice")
        self.outbox.assert_pushed(send_receipt, payload={"order_id": order.id}, count=1)
        self.assertEqual([i.execution_id for i in self.outbox.dispatched],
                         [self.outbox.pushed(send_receipt)[0].id])
        result = self.outbox.drain()
        self.assertEqual((result.claimed, result.succeeded), (1, 1))
        self.assertEqual(list(Receipt.objects.values_list("order_id", "attempt")),
                         [(order.id, 1)])
        self.outbox.assert_not_pushed(send_receipt)  # a success deletes its row

    def test_a_rolled_back_push_is_not_pushed(self) -> None:
        with transaction.atomic():
            Order.objects.create(customer="bob")
            send_receipt.push({"order_id": 1})
            transaction.set_rollback(True)
        self.outbox.assert_not_pushed(send_receipt)
        self.assertEqual(self.outbox.drain().claimed, 0)

    def test_a_retry_and_a_delay_run_when_the_clock_gets_there(self) -> None:
        failing = place_order("carol", order_id_sign=-1)
        later = place_order("dave", delay=timedelta(hours=1))
        first = self.outbox.drain()
        self.assertEqual((first.retried, first.succeeded), (1, 0))
        self.outbox.assert_pushed(send_receipt, status="scheduled", count=2)
        self.outbox.advance(minutes=1)  # the retry's backoff (jittered: at most 1 min)
        self.assertEqual(self.outbox.drain().succeeded, 1)
        self.assertEqual(self.outbox.drain().claimed, 0)  # the delayed one: not yet
        self.outbox.advance(hours=1)
        self.assertEqual(self.outbox.drain().succeeded, 1)
        self.assertEqual(sorted(Receipt.objects.values_list("order_id", "attempt")),
                         sorted([(failing.id, 2), (later.id, 1)]))


class EagerTests(TransactionTestCase):
    """``task_always_eager`` set in the test, after the project's ``install(app)``."""

    def setUp(self) -> None:
        tester = OutboxTester(outbox, create_schema=False, record=False)
        tester.start()
        self.addCleanup(tester.close)
        app.conf.task_always_eager = True
        self.addCleanup(setattr, app.conf, "task_always_eager", False)

    def test_a_push_runs_at_the_commit(self) -> None:
        order = place_order("erin")
        self.assertEqual(list(Receipt.objects.values_list("order_id", flat=True)), [order.id])

    def test_a_delayed_push_runs_when_it_is_due(self) -> None:
        pushed_at = time.monotonic()
        order = place_order("frank", delay=timedelta(milliseconds=300))
        self.assertFalse(Receipt.objects.exists())
        deadline = time.monotonic() + 10
        while not Receipt.objects.filter(order_id=order.id).exists():
            self.assertLess(time.monotonic(), deadline, "the delayed push never ran")
            time.sleep(0.02)  # polling with a deadline
        self.assertGreaterEqual(time.monotonic() - pushed_at, 0.3)


class InATestCase(TestCase):
    """A TestCase's transaction never commits: assert_pushed reads it through Django's
    connection, the tester cleans in it, and drain, which claims on the outbox's own
    connection as a worker does, says why it cannot run them."""

    def setUp(self) -> None:
        self.outbox = OutboxTester(outbox, create_schema=False).start()
        self.addCleanup(self.outbox.close)

    def test_assert_pushed_sees_the_tests_transaction(self) -> None:
        order = place_order("grace")
        self.outbox.assert_pushed(send_receipt, payload={"order_id": order.id})
        with self.assertRaisesRegex(AssertionError, "TransactionTestCase"):
            self.outbox.drain()
        self.outbox.assert_pushed(send_receipt, count=1)  # untouched
