"""A push before the outbox's tables exist (a new project's first push) raises StorageError
saying how they are made, on SQLite and PostgreSQL; before, only the driver's "no such
table" / "relation ... does not exist"."""

from __future__ import annotations

import re
import uuid

import pytest
from celery import Celery
from pydantic import BaseModel

from celery_outbox import JobContext, Outbox, StorageError, outbox_job
from celery_outbox.registry import JobRegistry


class Note(BaseModel):
    n: int


def test_a_push_before_the_schema_says_how_to_create_it(db_url: str) -> None:
    registry = JobRegistry()

    @outbox_job(schema=Note, registry=registry)
    def note(ctx: JobContext[Note]) -> None:
        pass

    table = f"nu_missing_{uuid.uuid4().hex[:8]}"  # never created
    outbox = Outbox(Celery(f"ns-{uuid.uuid4().hex[:8]}", broker="memory://"),
                    database_url=db_url, registry=registry, table_name=table)
    try:
        hint = re.escape("create the schema: outbox.create_schema()")
        with pytest.raises(StorageError, match=hint):
            note.push(Note(n=1))
    finally:
        outbox.engine.dispose()
