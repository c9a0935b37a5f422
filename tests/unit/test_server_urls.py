"""tests/conftest.py reads the servers' addresses from OUTBOX_TEST_PG / _REDIS / _AMQP: the
reachability check uses the URL's host and port, and a Redis URL keeps its database number."""

from __future__ import annotations

import pytest

from tests.conftest import address, with_redis_db


@pytest.mark.parametrize(
    ("url", "default", "expected"),
    [
        ("postgresql+psycopg://root@db.example:6543/test", 5432, ("db.example", 6543)),
        ("postgresql+psycopg://root@10.0.0.5/test", 5432, ("10.0.0.5", 5432)),
        ("redis://cache:6380/2", 6379, ("cache", 6380)),
        ("redis://:secret@127.0.0.2", 6379, ("127.0.0.2", 6379)),
        ("amqp://guest:guest@mq.example:5673//", 5672, ("mq.example", 5673)),
    ],
)
def test_address_is_the_urls_host_and_port(
    url: str, default: int, expected: tuple[str, int]
) -> None:
    assert address(url, default) == expected


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379/0"),
        ("redis://127.0.0.1:6379/", "redis://127.0.0.1:6379/0"),
        ("redis://127.0.0.1:6379/3", "redis://127.0.0.1:6379/3"),
        ("redis://h:6380/0", "redis://h:6380/0"),
    ],
)
def test_a_redis_db_number_is_added_only_when_missing(url: str, expected: str) -> None:
    assert with_redis_db(url) == expected
