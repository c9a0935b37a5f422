"""An index of the finished rows by unique key (as the Alembic revision
``celery_outbox_0015``): ``ix_<table>_finished_key`` on ``(unique_key, created_at, id)`` of
the finished rows that have a key, so the dashboard's key search costs the rows of that key,
not every finished row. Created unless present (a database the current ``0001_initial`` made
has it), in the migration's transaction: writes to the table wait for the build. Then
``ANALYZE`` (PostgreSQL)."""

from django.db import migrations

from celery_outbox.contrib.django.schema import AnalyzeOutboxTables, ReplaceOutboxIndexes

FINISHED_KEY = "status IN ('cancelled', 'failed', 'succeeded') AND unique_key IS NOT NULL"


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_outbox", "0010_snoozes")]
    operations = [
        ReplaceOutboxIndexes(
            add=[("finished_key", ("unique_key", "created_at", "id"), FINISHED_KEY)],
            remove=[],
        ),
        AnalyzeOutboxTables(),
    ]
