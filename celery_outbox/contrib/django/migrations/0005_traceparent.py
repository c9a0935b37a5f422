"""``<table>.traceparent``: the W3C trace context of the code that pushed each execution
(VARCHAR(55), nullable), which the worker's spans continue."""

from django.db import migrations

from celery_outbox.contrib.django.schema import AddTraceparentColumn


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_outbox", "0004_partial_dashboard_indexes")]
    operations = [AddTraceparentColumn()]
