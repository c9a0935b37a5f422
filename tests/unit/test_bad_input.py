"""Input the database would refuse is refused at push, naming the job or the option.

PostgreSQL refuses NaN and Infinity in JSON, the NUL character in JSON and text, and strings
longer than their column; pydantic refuses to serialise undecodable bytes or arbitrary
objects. Each must surface as PayloadInvalid or ConfigurationError before any connection (the
outbox points at a port nobody listens on, as in test_payload), never as a StorageError from
the database, which inside a caller's PostgreSQL transaction would also abort that
transaction.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any

import pytest
from celery import Celery
from pydantic import BaseModel

from celery_outbox import (
    ConfigurationError,
    JobContext,
    JobRegistry,
    Outbox,
    OutboxJob,
    PayloadInvalid,
    StorageError,
    outbox_job,
)
from tests.unit.fakes import Recording

UNREACHABLE = "postgresql+psycopg://root@127.0.0.1:1/x"


class Reading(BaseModel):
    value: float
    label: str = ""
    raw: Any = None


@pytest.fixture
def job(recording: Recording) -> OutboxJob[Reading]:
    registry = JobRegistry()

    @outbox_job(schema=Reading, name="lab.reading", registry=registry)
    def reading(ctx: JobContext[Reading]) -> None:
        return None

    Outbox(Celery("bad-input", broker="memory://"), database_url=UNREACHABLE,
           registry=registry, dispatcher=recording)
    return reading


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"value": float("nan")}, "Out of range float"),
        ({"value": float("inf")}, "Out of range float"),
        ({"value": 1.0, "label": "a\x00b"}, "NUL"),
        ({"value": 1.0, "raw": b"\xff\xfe"}, "utf-8"),
        ({"value": 1.0, "raw": object()}, "serialize"),
    ],
)
def test_payload_the_database_cannot_store_is_invalid(
    job: OutboxJob[Reading], recording: Recording, payload: dict[str, Any], message: str
) -> None:
    with pytest.raises(PayloadInvalid, match=message) as info:
        job.push(payload)
    assert info.value.job_name == "lab.reading"
    assert "lab.reading" in str(info.value)
    assert recording.items == []


def test_push_many_names_the_item_that_cannot_be_stored(job: OutboxJob[Reading]) -> None:
    with pytest.raises(PayloadInvalid, match=r"items\[1\]"):
        job.push_many([{"value": 1.0}, {"value": float("nan")}])


def test_an_escaped_backslash_before_u0000_is_not_a_nul(
    job: OutboxJob[Reading], recording: Recording
) -> None:
    # Passes the payload checks, so it reaches the (unreachable) database.
    with pytest.raises(StorageError):
        job.push({"value": 1.0, "label": "C:\\u0000"})


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"key": "k" * 256}, "key"),
        ({"key": "a\x00b"}, "key"),
        ({"organization_id": "o" * 65}, "organization_id"),
        ({"organization_id": 42}, "organization_id"),
        ({"triggered_by": "t" * 201}, "triggered_by"),
        ({"triggered_by_name": "n" * 201}, "triggered_by_name"),
    ],
)
def test_push_arguments_longer_than_their_column_fail_before_the_database(
    job: OutboxJob[Reading], recording: Recording, kwargs: dict[str, Any], option: str
) -> None:
    with pytest.raises(ConfigurationError, match=f"option '{option}'"):
        job.push({"value": 1.0}, **kwargs)
    assert recording.items == []


def test_push_arguments_at_their_column_length_pass_the_checks(job: OutboxJob[Reading]) -> None:
    # Accepted by the checks, so the push goes on to the (unreachable) database.
    with pytest.raises(StorageError):
        job.push({"value": 1.0}, key="k" * 255, organization_id="o" * 64,
                 triggered_by="t" * 200, triggered_by_name="n" * 200)


def test_a_job_name_longer_than_its_column_fails_at_declaration() -> None:
    with pytest.raises(ConfigurationError, match="at most 200"):
        @outbox_job(schema=Reading, name="n" * 201, registry=JobRegistry())
        def too_long(ctx: JobContext[Reading]) -> None:
            return None

    @outbox_job(schema=Reading, name="n" * 200, registry=JobRegistry())
    def just_fits(ctx: JobContext[Reading]) -> None:
        return None

    assert len(just_fits.name) == 200


UNDECODABLE = b"\xff".decode("utf-8", "surrogateescape")  # '\udcff', as os.listdir gives it


@pytest.mark.parametrize(
    ("payload", "where"),
    [
        ({"value": 1.0, "label": f"report-{UNDECODABLE}.csv"}, "label"),
        ({"value": 1.0, "raw": {"files": ["ok", UNDECODABLE]}}, "raw.files.1"),
        ({"value": 1.0, "raw": {f"k{UNDECODABLE}": 1}}, "raw.k\ufffd"),
        ({"value": 1.0, "label": "\ud83d\ude00"}, "label"),  # a pair's halves, apart: no 😀
        ({"value": 1.0, "raw": ["\x00"]}, "raw.0"),
    ],
)
def test_a_payload_with_a_lone_surrogate_or_nul_is_invalid_naming_the_field(
    job: OutboxJob[Reading], recording: Recording, payload: dict[str, Any], where: str,
) -> None:
    """Such payloads were written (SQLite) or failed in the database
    (PostgreSQL), and their detail view answered 500 / 503."""
    with pytest.raises(PayloadInvalid) as info:
        job.push(payload)
    [error] = info.value.errors
    assert ".".join(map(str, error["loc"])) == where
    assert "surrogate" in error["msg"] or "NUL" in error["msg"]
    str(info.value).encode("utf-8")  # printable, and sendable as JSON: the key made storable
    assert recording.items == []
    with pytest.raises(PayloadInvalid, match=rf"items\[1\]\.{where.split('.')[0]}"):
        job.push_many([{"value": 1.0}, payload])


def test_a_character_beyond_the_bmp_and_a_backslash_u_text_are_stored(
    job: OutboxJob[Reading],
) -> None:
    # JSON escapes 😀 as a surrogate pair and keeps "\\udcff" (six characters) as text: both
    # storable, so the push goes on to the (unreachable) database.
    for label in ("🚀 😀", "C:\\udcff"):
        with pytest.raises(StorageError):
            job.push({"value": 1.0, "label": label})


@pytest.mark.parametrize("option", ["key", "organization_id", "triggered_by",
                                    "triggered_by_name"])
def test_push_arguments_with_a_lone_surrogate_fail_before_the_database(
    job: OutboxJob[Reading], recording: Recording, option: str,
) -> None:
    with pytest.raises(ConfigurationError, match=f"option '{option}'.*surrogate"):
        job.push({"value": 1.0}, **{option: f"a{UNDECODABLE}"})
    assert recording.items == []


class _NoOffset(tzinfo):
    def utcoffset(self, dt: datetime | None) -> timedelta | None:
        return None


@pytest.mark.parametrize("when", [
    datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-5))),  # year 10000 in UTC
    datetime(1, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=14))),  # year 0 in UTC
    datetime(2030, 1, 1, tzinfo=_NoOffset()),  # a tzinfo that gives no offset: naive
])
def test_a_scheduled_at_without_a_utc_time_is_a_configuration_error_naming_it(
    job: OutboxJob[Reading], recording: Recording, when: datetime,
) -> None:
    """Year 10000 in UTC was an unclear StorageError."""
    with pytest.raises(ConfigurationError, match="scheduled_at"):
        job.push({"value": 1.0}, scheduled_at=when)
    assert recording.items == []


def test_a_scheduled_at_at_the_last_utc_time_passes_the_checks(job: OutboxJob[Reading]) -> None:
    last = datetime(9999, 12, 31, 18, 59, tzinfo=timezone(timedelta(hours=-5)))
    with pytest.raises(StorageError):  # accepted: on to the (unreachable) database
        job.push({"value": 1.0}, scheduled_at=last)
