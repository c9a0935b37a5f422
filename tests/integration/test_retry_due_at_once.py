"""A retry due at once (``RetryLater(timedelta(0))``, a policy without backoff) is claimed by
the message that carries it, however soon that message runs: on SQLite the database's clock
reads to the millisecond while ``scheduled_at`` is stored to the microsecond, so a claim in the
same millisecond as the failed attempt must still find the row due."""

from __future__ import annotations

from datetime import timedelta

from celery_outbox import JobContext, JobRegistry, RetryLater, RetryPolicy, outbox_job
from tests.integration.conftest import MakeOutbox, Order

ROUNDS = 40


def test_a_retry_due_at_once_runs_at_once_under_eager(
    sqlite_url: str, registry: JobRegistry, make_outbox: MakeOutbox,
) -> None:
    attempts: list[tuple[int, int]] = []

    @outbox_job(schema=Order, name="retry.at_once", registry=registry,
                retry=RetryPolicy(retries=1))
    def handler(ctx: JobContext[Order]) -> None:
        attempts.append((ctx.payload.order_id, ctx.attempt))
        if ctx.attempt == 1:
            raise RetryLater(timedelta(0))

    box = make_outbox(sqlite_url, registry, eager=True)
    ids = [handler.push({"order_id": i}) for i in range(ROUNDS)]

    statuses = [box.store.status_of(i) for i in ids]
    assert statuses.count("scheduled") == 0, (
        f"{statuses.count('scheduled')} of {ROUNDS} retries due at once left scheduled")
    assert sorted(attempts) == sorted((i, n) for i in range(ROUNDS) for n in (1, 2))
