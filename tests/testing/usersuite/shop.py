"""A user's application: a Celery app, its Outbox, its jobs and the code that pushes."""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from celery import Celery
from pydantic import BaseModel
from sqlalchemy import Column, Integer, MetaData, String, Table
from sqlalchemy.orm import Session

from celery_outbox import JobContext, Outbox, RetryPolicy, outbox_job

app = Celery("shop", broker="memory://")
outbox = Outbox(app, database_url=os.environ["SHOP_DB"])

metadata = MetaData()
orders = Table("orders", metadata, Column("id", Integer, primary_key=True),
               Column("customer", String(50)))

SENT: list[tuple[int, int]] = []
NIGHTLY: list[datetime] = []


class Receipt(BaseModel):
    order_id: int


@outbox_job(name="shop.send_receipt", schema=Receipt,
            retry=RetryPolicy(retries=2, backoff=timedelta(seconds=30), jitter=False))
def send_receipt(ctx: JobContext[Receipt]) -> None:
    if ctx.payload.order_id == 13 and ctx.attempt == 1:
        raise RuntimeError("unlucky order")
    SENT.append((ctx.payload.order_id, ctx.attempt))


@outbox_job(name="shop.thank", schema=Receipt)
def thank(ctx: JobContext[Receipt]) -> None:
    """Pushes a follow-up: a receipt for ten times the order."""
    send_receipt.push(Receipt(order_id=ctx.payload.order_id * 10))


@outbox_job(name="shop.nightly", cron="0 3 * * *", timezone="UTC")
def nightly(ctx: JobContext[None]) -> None:
    NIGHTLY.append(ctx.now)


def place_order(session: Session, customer: str, *,
                delay: timedelta | None = None) -> int:
    order_id = int(session.execute(orders.insert().values(customer=customer))
                   .inserted_primary_key[0])
    send_receipt.push(Receipt(order_id=order_id), session=session, delay=delay)
    return order_id
