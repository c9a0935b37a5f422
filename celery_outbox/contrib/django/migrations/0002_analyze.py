"""Statistics for the planner: ``ANALYZE`` of the outbox's tables on PostgreSQL, as
``outbox.create_schema()`` ends (nothing on SQLite)."""

from django.db import migrations

from celery_outbox.contrib.django.schema import AnalyzeOutboxTables


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_outbox", "0001_initial")]
    operations = [AnalyzeOutboxTables()]
