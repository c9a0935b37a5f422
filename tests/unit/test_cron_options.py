"""@outbox_job(cron=...) options: what fails at import (naming the job and the expression),
and the record / keep defaults of cron jobs versus queue jobs."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from celery_outbox import ConfigurationError, JobContext, JobRegistry, OutboxConfig, outbox_job
from celery_outbox.registry import JobSpec


class Payload(BaseModel):
    n: int


def declare(**options: Any) -> JobSpec:
    options.setdefault("name", "shop.nightly")

    def handler(ctx: JobContext[Any]) -> None:
        return None

    return outbox_job(registry=JobRegistry(), **options)(handler).spec


@pytest.mark.parametrize(("cron", "reason"), [
    ("61 * * * *", "is not a valid cron expression"),
    ("0 3 * *", "is not a valid cron expression"),
    ("at three", "is not a valid cron expression"),
    ("0 0 30 2 *", "never fires"),
    ("0 */5 * * * *", "has 6 fields"),  # Quartz's leading seconds: croniter would misread it
    ("* * * * * * 2030", "has 7 fields"),
    (3, "must be a string"),
])
def test_a_bad_expression_fails_at_import_naming_job_and_expression(
    cron: Any, reason: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        declare(cron=cron)
    message = str(info.value)
    assert "job 'shop.nightly'" in message and "option 'cron'" in message
    assert repr(cron) in message and reason in message


def test_an_unknown_timezone_fails_at_import_naming_job_zone_and_expression() -> None:
    with pytest.raises(ConfigurationError) as info:
        declare(cron="0 3 * * *", timezone="Europe/Atlantis")
    message = str(info.value)
    assert "job 'shop.nightly'" in message and "option 'timezone'" in message
    assert "'Europe/Atlantis'" in message and "'0 3 * * *'" in message


def test_croniter_forms_are_accepted() -> None:
    for cron in ("*/15 * * * *", "0 9 * * 0", "0 9 * * 7", "0 0 13 * 5", "0 0 * * MON-FRI",
                 "@hourly", "@daily", "0 0 L * *"):
        assert declare(cron=cron).cron == cron


def test_cron_jobs_keep_their_last_success_by_default() -> None:
    config = OutboxConfig()
    spec = declare(cron="0 3 * * *")
    assert (spec.record, spec.keeps(config), spec.lock) == ("all", (1, 10), True)
    assert spec.keep_succeeded_row(config) and spec.keep_failed_row()
    # A partial keep still keeps one success unless it says otherwise.
    assert declare(cron="0 3 * * *", keep={"failed": 3}).keeps(config) == (1, 3)
    assert declare(cron="0 3 * * *", keep={"succeeded": 5}).keeps(config) == (5, 10)
    # An explicit record mode is taken as given.
    explicit = declare(cron="0 3 * * *", record="errors")
    assert (explicit.record, explicit.keep_succeeded_row(config)) == ("errors", False)
    assert declare(cron="0 3 * * *", record="none").keep_failed_row() is False
    assert declare(cron="0 3 * * *", lock=False).lock is False


def test_queue_jobs_keep_no_success_unless_asked() -> None:
    config = OutboxConfig()
    spec = declare(schema=Payload)
    assert (spec.record, spec.keep, spec.keep_succeeded_row(config)) == ("errors", None, False)
    assert declare(schema=Payload, record="all").keep_succeeded_row(config)
