"""A FastAPI app that places orders from a sync endpoint and from an async one, each pushing
``send_receipt`` in the order's transaction, and lists the job's executions from an admin
endpoint through the admin's async twins.

- ``POST /orders`` (a plain ``def``, run in FastAPI's thread pool): a SQLAlchemy ``Session``,
  ``send_receipt.push(..., session=session)``.
- ``POST /async/orders`` (``async def``): an ``AsyncSession``,
  ``await send_receipt.apush(..., session=session)``.
- Both refuse a customer in :data:`DECLINED` after the push (402): the transaction rolls
  back, the order and its push together.
- ``GET /orders/{id}``: the order, with how many receipts the worker sent for it.
- ``GET /admin/executions?status=...``: ``await outbox.admin.alist_executions(...)``.

The worker: ``celery -A examples.fastapi_app.app:celery worker -Q fastapi-example``.
Settings from the environment: ``FASTAPI_EXAMPLE_DATABASE_URL`` (sync; default: a SQLite
file in ``FASTAPI_EXAMPLE_DATA_DIR``, by default this directory),
``FASTAPI_EXAMPLE_ASYNC_DATABASE_URL`` (the same database through an async driver; default:
``sqlite+aiosqlite`` for SQLite, ``postgresql+asyncpg`` for PostgreSQL),
``FASTAPI_EXAMPLE_BROKER_URL`` (default: kombu's SQLAlchemy transport on another SQLite
file), ``FASTAPI_EXAMPLE_QUEUE`` (default ``fastapi-example``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any
from uuid import UUID

from celery import Celery
from fastapi import Depends, FastAPI, HTTPException
from pydantic import BaseModel
from sqlalchemy import String
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from celery_outbox import ConfigurationError, JobContext, JobRegistry, Outbox, outbox_job

DATA_DIR = Path(os.environ.get("FASTAPI_EXAMPLE_DATA_DIR") or Path(__file__).resolve().parent)
DATABASE_URL = (os.environ.get("FASTAPI_EXAMPLE_DATABASE_URL")
                or f"sqlite:///{DATA_DIR / 'fastapi_example.sqlite3'}")
BROKER_URL = (os.environ.get("FASTAPI_EXAMPLE_BROKER_URL")
              or f"sqla+sqlite:///{DATA_DIR / 'fastapi_broker.sqlite3'}")
QUEUE = os.environ.get("FASTAPI_EXAMPLE_QUEUE") or "fastapi-example"
OUTBOX_TABLE = "fastapi_example_outbox"
DECLINED = frozenset({"mallory"})
"""Customers whose payment is declined: their order rolls back, with its push."""


def async_url(url: str) -> str:
    """The async driver's URL for the sync ``url``'s database."""
    scheme, rest = url.split("://", 1)
    if scheme.startswith("sqlite"):
        return f"sqlite+aiosqlite://{rest}"
    if scheme.startswith("postgresql"):
        return f"postgresql+asyncpg://{rest}"
    raise ValueError(f"no async driver known for {scheme}")


ASYNC_DATABASE_URL = os.environ.get("FASTAPI_EXAMPLE_ASYNC_DATABASE_URL") or async_url(
    DATABASE_URL)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "fastapi_example_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(100))
    placed_from: Mapped[str] = mapped_column(String(10))  # "sync" or "async"
    receipts: Mapped[int] = mapped_column(default=0)
    """How many receipts the worker sent for this order."""
    receipt_pid: Mapped[int | None] = mapped_column(default=None)


class Receipt(BaseModel):
    order_id: int


class OrderIn(BaseModel):
    customer: str


class OrderOut(BaseModel):
    id: int
    execution_id: UUID


REGISTRY = JobRegistry()
celery = Celery("fastapi_example", broker=BROKER_URL)
celery.conf.update(task_default_queue=QUEUE, broker_connection_retry_on_startup=True)
outbox = Outbox(celery, database_url=DATABASE_URL, registry=REGISTRY, table_name=OUTBOX_TABLE)
"""The outbox keeps a sync engine (``outbox.engine``): the sync endpoint's sessions use it,
and so do the worker, the sweep and the admin."""
async_engine = create_async_engine(
    ASYNC_DATABASE_URL,
    **({"connect_args": {"timeout": 30}} if ASYNC_DATABASE_URL.startswith("sqlite") else {}),
)


@outbox_job(name="fastapi_example.send_receipt", schema=Receipt, record="all",
            registry=REGISTRY)
def send_receipt(ctx: JobContext[Receipt]) -> None:
    """"Send" the receipt: count it on the order (in the worker, on the outbox's engine)."""
    with Session(outbox.engine) as session, session.begin():
        order = session.get(Order, ctx.payload.order_id)
        if order is None:  # cannot happen: the order committed with the push
            raise LookupError(f"no order {ctx.payload.order_id}")
        order.receipts += 1
        order.receipt_pid = os.getpid()
    ctx.log.info("receipt sent for order %s", ctx.payload.order_id)


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    yield
    await async_engine.dispose()


app = FastAPI(title="celery_outbox FastAPI example", lifespan=lifespan)


def sync_session() -> Iterator[Session]:
    with Session(outbox.engine) as session:
        yield session


async def async_session() -> AsyncIterator[AsyncSession]:
    async with AsyncSession(async_engine) as session:
        yield session


def charge(customer: str) -> None:
    """The payment, after the push: a decline must take the push back too."""
    if customer in DECLINED:
        raise HTTPException(402, f"payment declined for {customer}")


@app.post("/orders", status_code=201)
def place_order(body: OrderIn, session: Annotated[Session, Depends(sync_session)]) -> OrderOut:
    with session.begin():  # commits on success; rolls back on any exception (the 402 too)
        order = Order(customer=body.customer, placed_from="sync")
        session.add(order)
        session.flush()  # the id, for the payload
        execution_id = send_receipt.push(Receipt(order_id=order.id), session=session)
        charge(body.customer)
        order_id = order.id
    return OrderOut(id=order_id, execution_id=execution_id)  # dispatched after the commit


@app.post("/async/orders", status_code=201)
async def place_order_async(
    body: OrderIn, session: Annotated[AsyncSession, Depends(async_session)]
) -> OrderOut:
    async with session.begin():
        order = Order(customer=body.customer, placed_from="async")
        session.add(order)
        await session.flush()
        execution_id = await send_receipt.apush(Receipt(order_id=order.id), session=session)
        charge(body.customer)
        order_id = order.id
    return OrderOut(id=order_id, execution_id=execution_id)


@app.get("/orders/{order_id}")
async def show_order(
    order_id: int, session: Annotated[AsyncSession, Depends(async_session)]
) -> dict[str, Any]:
    order = await session.get(Order, order_id)
    if order is None:
        raise HTTPException(404, f"no order {order_id}")
    return {"id": order.id, "customer": order.customer, "placed_from": order.placed_from,
            "receipts": order.receipts, "receipt_pid": order.receipt_pid}


@app.get("/admin/executions")
async def list_executions(status: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
    """The receipts' executions, newest first: the admin's async twin runs the read in a
    worker thread, so the event loop never waits on the database."""
    try:
        views = await outbox.admin.alist_executions(send_receipt.name, status=status,
                                                     limit=limit)
    except ConfigurationError as exc:  # a status that is none, a limit out of 1..200
        raise HTTPException(422, str(exc)) from exc
    return [view.to_dict() for view in views]


def create_tables() -> None:
    """The app's tables and the outbox's (drop first: the demo starts empty)."""
    outbox.drop_schema()
    Base.metadata.drop_all(outbox.engine)
    Base.metadata.create_all(outbox.engine)
    outbox.create_schema()
