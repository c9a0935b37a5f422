"""The shop's outbox job: ``send_receipt`` writes a Receipt row through Django's ORM, on the
alias the worker's outbox uses."""

from __future__ import annotations

import os

from pydantic import BaseModel

from celery_outbox import JobContext, JobRegistry, outbox_job
from celery_outbox.contrib.django.conf import outbox_settings
from tests.djangoproj.shop.models import Receipt

REGISTRY = JobRegistry()


class ReceiptFor(BaseModel):
    order_id: int


@outbox_job(name="shop.send_receipt", schema=ReceiptFor, registry=REGISTRY)
def send_receipt(ctx: JobContext[ReceiptFor]) -> None:
    alias = outbox_settings().get("database", "default")
    Receipt.objects.using(alias).create(order_id=ctx.payload.order_id,
                                        execution_id=ctx.execution_id, worker_pid=os.getpid())
