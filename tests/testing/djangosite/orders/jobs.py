"""The project's jobs: a receipt written through the ORM, and a job that fails once."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel

from celery_outbox import JobContext, RetryPolicy, outbox_job
from tests.testing.djangosite.orders.models import Receipt


class ReceiptFor(BaseModel):
    order_id: int


@outbox_job(name="orders.send_receipt", schema=ReceiptFor,
            retry=RetryPolicy(retries=2, backoff=timedelta(minutes=1)))
def send_receipt(ctx: JobContext[ReceiptFor]) -> None:
    if ctx.attempt == 1 and ctx.payload.order_id < 0:
        raise RuntimeError("the mail server is down")
    Receipt.objects.create(order_id=abs(ctx.payload.order_id), attempt=ctx.attempt)
