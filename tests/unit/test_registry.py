"""@outbox_job option checks at decoration time, and the registry's duplicate-name rule."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from celery_outbox import (
    ConfigurationError,
    JobContext,
    JobNameAmbiguous,
    JobNotRegistered,
    JobRegistry,
    RetryPolicy,
    outbox_job,
)
from celery_outbox.config import OutboxConfig
from celery_outbox.states import Priority


class Payload(BaseModel):
    order_id: int


def handler(ctx: JobContext[Any]) -> None:
    return None


def declare(**options: Any) -> Any:
    return outbox_job(registry=JobRegistry(), **options)(handler)


def test_queue_job_defaults() -> None:
    job = declare(schema=Payload)
    spec = job.spec
    assert job.name == f"{__name__}.handler"
    assert spec.mode == "queue"
    assert spec.priority is Priority.NORMAL
    assert spec.record == "errors"
    assert spec.retry.max_attempts == 1
    assert (spec.timeout, spec.queue, spec.keep, spec.lock) == (None, None, None, True)


def test_all_queue_options_are_kept() -> None:
    policy = RetryPolicy(retries=3)
    job = declare(
        schema=Payload, name="shop.receipt", retry=policy, timeout=timedelta(seconds=30),
        priority="high", queue="emails", lock=False, record="all",
        keep={"succeeded": 2, "failed": 5}, description="send it",
    )
    spec = job.spec
    assert job.name == "shop.receipt"
    assert spec.retry is policy
    assert spec.timeout == timedelta(seconds=30)
    assert spec.priority is Priority.HIGH
    assert (spec.queue, spec.lock, spec.record, spec.description) == (
        "emails", False, "all", "send it",
    )
    config = OutboxConfig.load({})
    assert spec.keeps(config) == (2, 5)
    assert spec.lease(config) == timedelta(seconds=60)  # 2 x timeout
    assert spec.keep_succeeded_row(config)


def test_record_modes_decide_which_finished_rows_stay() -> None:
    config = OutboxConfig.load({})
    errors, every, none = (declare(schema=Payload, record=r).spec
                           for r in ("errors", "all", "none"))
    assert (errors.keep_succeeded_row(config), errors.keep_failed_row()) == (False, True)
    assert (every.keep_succeeded_row(config), every.keep_failed_row()) == (True, True)
    assert (none.keep_succeeded_row(config), none.keep_failed_row()) == (False, False)
    zero = declare(schema=Payload, record="all", keep={"succeeded": 0}).spec
    assert not zero.keep_succeeded_row(config)
    assert declare(schema=Payload).spec.lease(config) == config.lease


def test_unknown_option_is_named_at_decoration() -> None:
    registry = JobRegistry()
    with pytest.raises(ConfigurationError, match=r"\['retries'\]") as info:
        outbox_job(schema=Payload, retries=3, registry=registry)(handler)
    assert "known options" in str(info.value)
    assert len(registry) == 0


def test_schema_and_cron_together_fail() -> None:
    with pytest.raises(ConfigurationError, match="exactly one of 'schema'"):
        declare(schema=Payload, cron="* * * * *")


def test_neither_schema_nor_cron_fails() -> None:
    with pytest.raises(ConfigurationError, match="exactly one of 'schema'"):
        declare()


BAD_OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("schema", {"schema": dict}),
    ("schema", {"schema": Payload(order_id=1)}),
    ("priority", {"priority": "urgent"}),
    ("priority", {"priority": 7}),
    ("record", {"record": "some"}),
    ("keep", {"keep": 3}),
    ("keep", {"keep": {"succeded": 1}}),
    ("keep['failed']", {"keep": {"failed": -1}}),
    ("keep['succeeded']", {"keep": {"succeeded": "2"}}),
    ("timeout", {"timeout": 30}),
    ("timeout", {"timeout": timedelta(0)}),
    ("timeout", {"timeout": timedelta(seconds=-5)}),
    ("timeout", {"timeout": timedelta.max}),  # its lease, 2 x timeout, overflowed at claim
    ("timeout", {"timeout": timedelta(days=1826)}),
    ("keep['succeeded']", {"keep": {"succeeded": 2**40}}),
    ("retry", {"retry": 3}),
    ("retry", {"retry": {"retries": 3}}),
    ("queue", {"queue": ""}),
    ("lock", {"lock": "yes"}),
    ("timezone", {"timezone": "Europe/Paris"}),
]


@pytest.mark.parametrize(("option", "options"), BAD_OPTIONS)
def test_bad_option_value_names_the_option(option: str, options: dict[str, Any]) -> None:
    registry = JobRegistry()
    options = {"schema": Payload, **options}
    with pytest.raises(ConfigurationError, match=f"option '{option}'" if "[" not in option
                       else "option 'keep\\["):
        outbox_job(registry=registry, **options)(handler)
    assert len(registry) == 0


def test_bad_cron_and_timezone_are_named() -> None:
    with pytest.raises(ConfigurationError, match="option 'cron'"):
        declare(cron="every day")
    with pytest.raises(ConfigurationError, match="option 'timezone'"):
        declare(cron="0 3 * * *", timezone="Mars/Olympus")


def test_cron_job_defaults() -> None:
    spec = declare(cron="0 3 * * *", timezone="Europe/Paris").spec
    assert (spec.mode, spec.cron, spec.timezone, spec.record) == (
        "cron", "0 3 * * *", "Europe/Paris", "all",
    )


def test_duplicate_name_from_another_function_fails() -> None:
    registry = JobRegistry()
    outbox_job(schema=Payload, name="dup", registry=registry)(handler)

    def other(ctx: JobContext[Any]) -> None:
        return None

    with pytest.raises(ConfigurationError, match=r"'dup' is already registered by .*handler"):
        outbox_job(schema=Payload, name="dup", registry=registry)(other)
    assert registry.get("dup").handler is handler


def _make_handler() -> Callable[[JobContext[Any]], None]:
    def reloaded(ctx: JobContext[Any]) -> None:
        return None

    return reloaded


def test_redeclaring_the_same_function_replaces_it() -> None:
    # A module imported twice (or reloaded) declares a new function object of the same name.
    registry = JobRegistry()
    first, second = _make_handler(), _make_handler()
    outbox_job(schema=Payload, registry=registry)(first)
    job = outbox_job(schema=Payload, registry=registry)(second)
    assert len(registry) == 1
    assert registry.get(job.name).handler is second


def test_registry_lookup() -> None:
    registry = JobRegistry()
    job = outbox_job(schema=Payload, name="a.b", registry=registry)(handler)
    assert "a.b" in registry
    assert [s.name for s in registry] == ["a.b"]
    assert registry.get("a.b") is job.spec
    with pytest.raises(JobNotRegistered, match="'nope'") as info:
        registry.get("nope")
    assert info.value.job_name == "nope"


def test_job_without_installed_outbox_says_so() -> None:
    job = declare(schema=Payload, name="lonely")
    with pytest.raises(ConfigurationError, match="no Outbox is installed"):
        job.push({"order_id": 1})


def test_cron_job_cannot_be_pushed() -> None:
    job = declare(cron="* * * * *", name="tick")
    with pytest.raises(ConfigurationError, match="cron job"):
        job.push(None)


def test_find_takes_a_full_or_a_unique_short_name() -> None:
    registry = JobRegistry()
    for name in ("shop.jobs.receipt", "billing.receipt", "shop.jobs.refund", "report"):
        outbox_job(schema=Payload, name=name, registry=registry)(handler)

    assert registry.find("shop.jobs.refund").name == "shop.jobs.refund"
    assert registry.find("refund").name == "shop.jobs.refund"  # the last dotted part
    assert registry.find("jobs.receipt").name == "shop.jobs.receipt"  # any dotted suffix
    assert registry.find(" report ").name == "report"
    with pytest.raises(JobNameAmbiguous) as ambiguous:
        registry.find("receipt")
    assert ambiguous.value.candidates == ("billing.receipt", "shop.jobs.receipt")
    assert str(ambiguous.value) == (
        "job name 'receipt' is ambiguous: it could be billing.receipt, shop.jobs.receipt; "
        "give more of the name")
    def close_to(name: str) -> tuple[str, ...]:
        with pytest.raises(JobNotRegistered) as missing:
            registry.find(name)
        assert missing.value.job_name == name
        return missing.value.close

    assert close_to("recipt")[:2] == ("billing.receipt", "shop.jobs.receipt")  # a typo
    assert close_to("Refund") == ("shop.jobs.refund",)  # another case
    assert set(close_to("ceipt")) == {"billing.receipt", "shop.jobs.receipt"}  # a part
    assert close_to("nothing.like.it") == ()
    with pytest.raises(JobNotRegistered, match=r"'Refund' is registered; did you mean "
                                               r"shop\.jobs\.refund\?$"):
        registry.find("Refund")
    with pytest.raises(JobNotRegistered, match=r"^no outbox job named 'zzz' is registered$"):
        registry.find("zzz")
    with pytest.raises(JobNotRegistered):
        registry.find("")  # never every job's suffix
