"""new_ids: many random UUIDs from one read of the random source, each a version 4 UUID as
uuid4() makes it."""

from __future__ import annotations

from uuid import RFC_4122

from celery_outbox.store import new_ids


def test_new_ids_are_distinct_version_4_uuids() -> None:
    ids = new_ids(10_000)
    assert len(ids) == 10_000
    assert len(set(ids)) == 10_000
    assert {(i.version, i.variant) for i in ids} == {(4, RFC_4122)}
    assert new_ids(0) == []
