"""The shop's background work: three outbox jobs and one ordinary Celery task.

- ``send_receipt``: pushed with every order, in the order's transaction.
- ``notify_warehouse``: flaky on purpose: the first attempt fails, the retry succeeds.
- ``build_sales_report``: keyed by day, so pushing it twice leaves one execution.
- ``audit``: a plain ``@app.task`` called with ``.delay()``, served by the same worker.

Every job keeps its finished rows (``record="all"``) so the demo can show them.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

from pydantic import BaseModel
from sqlalchemy import func, insert, literal, select, update

from celery_outbox import JobContext, RetryPolicy, outbox_job
from example_project.celery_app import app, outbox
from example_project.models import audit_log, orders, sales_reports


class Receipt(BaseModel):
    order_id: int


class Shipment(BaseModel):
    order_id: int


class SalesDay(BaseModel):
    day: date


@outbox_job(schema=Receipt, retry=RetryPolicy(retries=3, backoff=timedelta(seconds=1)),
            timeout=timedelta(seconds=30), priority="high", record="all")
def send_receipt(ctx: JobContext[Receipt]) -> None:
    """'Email' the receipt: here, stamp ``orders.receipt_sent_at``."""
    with outbox.engine.begin() as conn:  # write first: on SQLite a read-then-write can't wait
        customer = conn.execute(
            update(orders).where(orders.c.id == ctx.payload.order_id)
            .values(receipt_sent_at=datetime.now(timezone.utc)).returning(orders.c.customer)
        ).scalar_one()
    ctx.log.info("receipt for order %d sent to %s", ctx.payload.order_id, customer)


@outbox_job(schema=Shipment, record="all",
            retry=RetryPolicy(retries=2, backoff=timedelta(seconds=1), jitter=False))
def notify_warehouse(ctx: JobContext[Shipment]) -> None:
    """Tell the warehouse to ship. Attempt 1 fails (a simulated timeout); the retry works."""
    if ctx.attempt == 1:
        raise ConnectionError("warehouse API timed out (simulated, attempt 1)")
    with outbox.engine.begin() as conn:
        conn.execute(update(orders).where(orders.c.id == ctx.payload.order_id)
                     .values(warehouse_notified_at=datetime.now(timezone.utc)))
    ctx.log.info("warehouse notified for order %d on attempt %d", ctx.payload.order_id,
                 ctx.attempt)


@outbox_job(schema=SalesDay, record="all")
def build_sales_report(ctx: JobContext[SalesDay]) -> None:
    """Summarise the day's orders into one ``sales_reports`` row."""
    summary = select(
        literal(ctx.payload.day.isoformat()), func.count(),
        func.coalesce(func.sum(orders.c.total_cents), 0), literal(str(ctx.execution_id)),
    ).select_from(orders)
    with outbox.engine.begin() as conn:  # one INSERT ... SELECT: a write from the start
        count, total = conn.execute(
            insert(sales_reports)
            .from_select(["day", "orders", "total_cents", "execution_id"], summary)
            .returning(sales_reports.c.orders, sales_reports.c.total_cents)
        ).one()
    ctx.log.info("sales report for %s: %d orders, %.2f", ctx.payload.day, count, total / 100)


@app.task(name="example_project.audit", ignore_result=True)
def audit(message: str) -> None:
    """An ordinary Celery task, beside the outbox jobs."""
    with outbox.engine.begin() as conn:
        conn.execute(insert(audit_log).values(message=message))
