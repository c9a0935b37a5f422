"""``<table>_stats`` (the dashboard's per-minute throughput, wait and run times and backlog),
made unless ``0001_initial`` made it already."""

from django.db import migrations

from celery_outbox.contrib.django.schema import CreateStatsTable


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_outbox", "0008_attempts_pauses")]
    operations = [CreateStatsTable()]
