"""Debounced and coalesced pushes (as the Alembic revision ``celery_outbox_0017``):
``<table>.debounce_deadline`` (a debounced row's latest run time), ``<table>.follow_key``
(a coalesced key's follow-up row) and the unique ``uq_<table>_follow_key`` on
``(job_name, follow_key)`` over the active rows that have one; each added unless present
(a database the current ``0001_initial`` made has them)."""

from typing import Any

from django.db import migrations
from sqlalchemy import Index, text
from sqlalchemy.schema import CreateIndex, DropIndex

from celery_outbox.contrib.django.executor import dialect_for
from celery_outbox.contrib.django.schema import (
    _AddExecutionsColumn,
    _OutboxOperation,
    configured_tables,
)

FOLLOW_KEY = "status IN ('pending', 'running', 'scheduled') AND follow_key IS NOT NULL"


class AddDebounceDeadlineColumn(_AddExecutionsColumn):
    """Add ``<table>.debounce_deadline`` (timestamp, nullable) unless present."""

    column = "debounce_deadline"


class AddFollowKeyColumn(_AddExecutionsColumn):
    """Add ``<table>.follow_key`` (VARCHAR(255), nullable) unless present."""

    column = "follow_key"


class AddFollowKeyIndex(_OutboxOperation):
    """Create ``uq_<table>_follow_key`` unless present; reversed, drop it."""

    def _index(self) -> Index:
        t = configured_tables().executions
        where: dict[str, Any] = {"postgresql_where": text(FOLLOW_KEY),
                                 "sqlite_where": text(FOLLOW_KEY)}
        return Index(f"uq_{t.name}_follow_key", t.c.job_name, t.c.follow_key, unique=True,
                     **where)

    def forwards(self, vendor: str) -> list[str]:
        return [str(CreateIndex(self._index(), if_not_exists=True)
                    .compile(dialect=dialect_for(vendor))).strip()]

    def backwards(self, vendor: str) -> list[str]:
        return [str(DropIndex(self._index(), if_exists=True)
                    .compile(dialect=dialect_for(vendor))).strip()]

    def describe(self) -> str:
        return "Add the celery_outbox index uq_<table>_follow_key"


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_outbox", "0012_limits")]
    operations = [AddDebounceDeadlineColumn(), AddFollowKeyColumn(), AddFollowKeyIndex()]
