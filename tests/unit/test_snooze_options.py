"""Snooze's input checks and its counting, no database: ``max_snoozes`` validated at
decoration, ``Snooze`` / ``ctx.snooze`` refusing a delay that is no positive timedelta
(naming ``delay``), and the metrics counting a snooze as a snooze, never as a retry."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import BaseModel

from celery_outbox import ConfigurationError, JobContext, JobRegistry, Snooze, outbox_job
from celery_outbox.registry import DEFAULT_MAX_SNOOZES


class Item(BaseModel):
    n: int


def declare(**options: Any) -> Any:
    return outbox_job(schema=Item, name="t.snooze", registry=JobRegistry(), **options)(
        lambda ctx: None)


def test_max_snoozes_defaults_to_100_and_is_checked() -> None:
    assert declare().spec.max_snoozes == DEFAULT_MAX_SNOOZES == 100
    assert declare(max_snoozes=0).spec.max_snoozes == 0
    assert declare(max_snoozes=1_000_000).spec.max_snoozes == 1_000_000
    for bad in (-1, 1_000_001, True, "3", 2.0, None):
        with pytest.raises(ConfigurationError, match=r"option 'max_snoozes' must be an int "
                                                     r"in 0\.\.1000000"):
            declare(max_snoozes=bad)


@pytest.mark.parametrize("delay", [timedelta(0), timedelta(seconds=-1), 5, "5m", None])
def test_a_snooze_needs_a_positive_timedelta(delay: Any) -> None:
    ctx: JobContext[None] = JobContext(payload=None, execution_id=uuid.uuid4(), job_name="t",
                                       attempt=1, max_attempts=1,
                                       now=datetime.now(timezone.utc),
                                       log=logging.getLogger("t"))
    for snooze in (lambda: Snooze(delay), lambda: ctx.snooze(delay)):
        with pytest.raises(ConfigurationError, match="Snooze delay must be a positive "
                                                     "timedelta") as raised:
            snooze()
        assert raised.value.field == "delay"
    with pytest.raises(Snooze) as snoozed:
        ctx.snooze(timedelta(seconds=3), "not yet")
    assert (snoozed.value.delay, snoozed.value.reason, str(snoozed.value)) == (
        timedelta(seconds=3), "not yet", "not yet")
    assert str(Snooze(timedelta(minutes=1))) == "snoozed for 0:01:00"


def test_the_metrics_count_a_snooze_and_no_retry() -> None:
    pytest.importorskip("prometheus_client")
    from celery_outbox import metrics as prometheus
    from celery_outbox import signals

    def value(name: str, **labels: str) -> float:
        return prometheus.EVENTS.get_sample_value(f"celery_outbox_{name}", labels) or 0.0

    job = f"t.metrics.{uuid.uuid4().hex[:6]}"
    prometheus.enable()
    try:
        execution_id = uuid.uuid4()
        signals.job_begin.send(sender=job, execution_id=execution_id, attempt=1,
                               max_attempts=1, due_at=None)
        signals.job_snooze.send(sender=job, execution_id=execution_id, attempt=1,
                                delay=timedelta(seconds=1), snoozes=1)
        signals.job_end.send(sender=job, execution_id=execution_id, attempt=1,
                             status="scheduled")
    finally:
        prometheus.disable()
    assert value("snoozes_total", job_name=job) == 1
    assert value("retries_total", job_name=job, error="unknown") == 0
    assert value("handler_duration_seconds_count", job_name=job) == 1
