"""``<table>_slots.lease_expires_at`` (a concurrency slot's own lease, renewed by the
heartbeat of the worker process running its handler), added unless ``0001_initial`` or
``0012_limits`` made it already."""

from django.db import migrations

from celery_outbox.contrib.django.schema import AddSlotLeaseColumn


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_outbox", "0014_batches")]
    operations = [AddSlotLeaseColumn()]
