"""The app of ``python -m bench txn`` (imported by the benchmark and by its worker,
``celery -A bench.txn_app worker``): :mod:`bench.app` (same settings from the environment)
with two jobs that each write one row of their own to :data:`EFFECTS`, in the outbox's
database, then count themselves done:

- ``bench.tx_separate``: the row in a transaction of the handler's own; the worker writes the
  outcome after it, in its own statement (what a handler does without transactional
  completion);
- ``bench.tx_joined``: the row in ``ctx.transaction()``, the outcome written and committed in
  the same transaction (transactional completion).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Integer, MetaData, Table, insert

from bench.app import COUNTER, Item, app, counter, outbox, registry
from celery_outbox import JobContext, outbox_job

__all__ = ["EFFECTS", "app", "outbox", "tx_joined", "tx_separate"]

EFFECTS = Table("bench_tx_effects", MetaData(),
                Column("id", BigInteger, primary_key=True, autoincrement=True),
                Column("n", Integer, nullable=False))


@outbox_job(schema=Item, name="bench.tx_separate", registry=registry)
def tx_separate(ctx: JobContext[Item]) -> None:
    """The handler's row in its own transaction; the outcome written after, by the worker."""
    with outbox.engine.begin() as conn:
        conn.execute(insert(EFFECTS).values(n=ctx.payload.n))
    counter().incr(COUNTER)


@outbox_job(schema=Item, name="bench.tx_joined", registry=registry)
def tx_joined(ctx: JobContext[Item]) -> None:
    """The handler's row and the outcome in one transaction (``ctx.transaction()``)."""
    with ctx.transaction() as session:
        session.execute(insert(EFFECTS).values(n=ctx.payload.n))
    counter().incr(COUNTER)
