"""Push-time argument checks that need no database.

The outbox points at a port nobody listens on: an error that surfaces as PayloadInvalid or
ConfigurationError (not StorageError) was raised before any connection was tried, so nothing
can have been written; the recording dispatcher shows nothing was dispatched either.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from pydantic import BaseModel, Field

from celery_outbox import (
    ConfigurationError,
    JobContext,
    JobRegistry,
    Outbox,
    OutboxJob,
    PayloadInvalid,
    outbox_job,
)
from tests.unit.fakes import Recording

UNREACHABLE = "postgresql+psycopg://root@127.0.0.1:1/x"


class Address(BaseModel):
    city: str


class Order(BaseModel):
    order_id: int
    email: str = Field(min_length=3)
    address: Address | None = None


class Other(BaseModel):
    order_id: str


@pytest.fixture
def job(recording: Recording) -> OutboxJob[Order]:
    registry = JobRegistry()

    @outbox_job(schema=Order, name="shop.receipt", registry=registry)
    def receipt(ctx: JobContext[Order]) -> None:
        return None

    Outbox(Celery("payload", broker="memory://"), database_url=UNREACHABLE,
           registry=registry, dispatcher=recording)
    return receipt


def test_invalid_payload_names_the_field(job: OutboxJob[Order], recording: Recording) -> None:
    with pytest.raises(PayloadInvalid, match="order_id") as info:
        job.push({"order_id": "not a number", "email": "a@b.c"})
    err = info.value
    assert err.job_name == "shop.receipt"
    assert [e["loc"] for e in err.errors] == [("order_id",)]
    assert "shop.receipt" in str(err)
    assert recording.items == []


def test_missing_and_nested_fields_are_each_named(job: OutboxJob[Order]) -> None:
    with pytest.raises(PayloadInvalid) as info:
        job.push({"email": "x", "address": {"town": "Lyon"}})
    locs = {tuple(e["loc"]) for e in info.value.errors}
    assert locs == {("order_id",), ("email",), ("address", "city")}
    assert "address.city" in str(info.value)


def test_another_model_is_revalidated(job: OutboxJob[Order]) -> None:
    with pytest.raises(PayloadInvalid, match="order_id"):
        job.push(Other(order_id="abc"))  # type: ignore[arg-type]


def test_push_many_names_the_item_index(job: OutboxJob[Order], recording: Recording) -> None:
    items: list[Any] = [
        {"order_id": 1, "email": "a@b.c"},
        {"order_id": 2, "email": "a@b.c"},
        {"order_id": "x", "email": "a@b.c"},
    ]
    with pytest.raises(PayloadInvalid, match=r"items\[2\]\.order_id") as info:
        job.push_many(items)
    assert [e["loc"] for e in info.value.errors] == [("items[2]", "order_id")]
    assert recording.items == []


def test_push_many_of_one_item_still_names_its_index(job: OutboxJob[Order]) -> None:
    with pytest.raises(PayloadInvalid, match=r"items\[0\]\.order_id"):
        job.push_many([{"order_id": "x", "email": "a@b.c"}])


def test_push_does_not_name_an_index(job: OutboxJob[Order]) -> None:
    with pytest.raises(PayloadInvalid) as info:
        job.push({"order_id": "x", "email": "a@b.c"})
    assert "items[" not in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"delay": timedelta(seconds=-1)}, "delay must be"),
        ({"delay": 5}, "delay must be"),
        ({"delay": timedelta.max}, "delay must be"),  # was an OverflowError
        ({"scheduled_at": datetime(2030, 1, 1)}, "aware datetime"),
        ({"delay": timedelta(1), "scheduled_at": datetime(2030, 1, 1)}, "not both"),
        ({"priority": "urgent"}, "option 'priority'"),
        ({"key": ""}, "key must be a non-empty string"),
    ],
)
def test_bad_push_arguments_fail_before_the_database(
    job: OutboxJob[Order], recording: Recording, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        job.push({"order_id": 1, "email": "a@b.c"}, **kwargs)
    assert recording.items == []


def test_keys_must_match_items(job: OutboxJob[Order]) -> None:
    with pytest.raises(ConfigurationError, match="2 keys for 1 payloads"):
        job.push_many([{"order_id": 1, "email": "a@b.c"}], keys=["a", "b"])


def test_session_and_connection_together_fail(job: OutboxJob[Order]) -> None:
    with pytest.raises(ConfigurationError, match="not both"):
        job.push({"order_id": 1, "email": "a@b.c"}, session=object(),  # type: ignore[arg-type]
                 connection=object())  # type: ignore[arg-type]
