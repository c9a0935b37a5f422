"""``<table>.concurrency_key`` and ``<table>.waiting`` (a row's limit key and why it waits),
``<table>_slots`` (the taken concurrency slots) and ``<table>_rates`` (the rate windows), as
the Alembic revision ``celery_outbox_0016``, with ``ix_<table>_waiting`` (the rows a limit holds
back, by job, priority and age); each made unless ``0001_initial`` made it
already; then ``ANALYZE`` (PostgreSQL)."""

from django.db import migrations

from celery_outbox.contrib.django.schema import (
    AddConcurrencyKeyColumn,
    AddWaitingColumn,
    AnalyzeOutboxTables,
    CreateRatesTable,
    CreateSlotsTable,
    ReplaceOutboxIndexes,
)


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_outbox", "0011_finished_key_index")]
    operations = [AddConcurrencyKeyColumn(), AddWaitingColumn(),
                  ReplaceOutboxIndexes(add=[("waiting", ("job_name", "priority", "created_at",
                                                         "id"), "waiting IS NOT NULL")],
                                       remove=[]),
                  CreateSlotsTable(), CreateRatesTable(), AnalyzeOutboxTables()]
