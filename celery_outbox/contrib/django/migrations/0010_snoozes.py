"""``<table>.snoozes`` (how many times each execution was snoozed), added unless
``0001_initial`` made it already."""

from django.db import migrations

from celery_outbox.contrib.django.schema import AddSnoozesColumn


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_outbox", "0009_stats")]
    operations = [AddSnoozesColumn()]
