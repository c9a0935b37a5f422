"""A handler that cancels itself with a reason that is no string (an exception it caught, a
number) still ends its row cancelled, its reason recorded as text, and the outcomes held
with it are written. Before the fix building the outcome's write raised TypeError
(``reason[:200]``) outside the row's isolation: every outcome held with it was lost (their
rows left running for the rescuer to run again), and ``Runner.run`` raised TypeError."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from celery_outbox import JobContext, JobRegistry, outbox_job
from tests.integration.conftest import MakeOutbox, Order
from tests.integration.fakes import RecordingDispatcher


@pytest.mark.parametrize("window", [timedelta(0), timedelta(seconds=5)],
                         ids=["at-once", "together"])
def test_a_cancel_reason_that_is_no_string_is_recorded_and_loses_no_outcome(
    db_url: str, make_outbox: MakeOutbox, recording: RecordingDispatcher, window: timedelta,
) -> None:
    registry = JobRegistry()

    @outbox_job(name="reason.job", schema=Order, record="all", registry=registry)
    def handler(ctx: JobContext[Order]) -> None:
        if ctx.payload.order_id == 1:
            try:
                raise LookupError("order 1 is gone")
            except LookupError as exc:
                reason: Any = exc  # the type says str; Python lets the handler pass anything
                ctx.cancel(reason)

    box = make_outbox(db_url, registry, recording, outcome_window=window)
    ids = handler.push_many([{"order_id": n} for n in range(3)])
    result = box.runner.run(handler.name, ids)

    assert (result.succeeded, result.cancelled) == (2, 1), result
    assert [box.store.status_of(i) for i in ids] == ["succeeded", "cancelled", "succeeded"]
    row = box.store.get(ids[1])
    assert row is not None and row["cancelled_by_name"] == "order 1 is gone"
