"""The outbox's tables, indexes and trim triggers, as ``outbox.create_schema()`` makes them."""

from django.db import migrations

from celery_outbox.contrib.django.schema import CreateOutboxSchema


class Migration(migrations.Migration):  # type: ignore[misc]
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [CreateOutboxSchema()]
