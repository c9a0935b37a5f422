"""``<table>.batch_id``, ``<table>_batches`` (batches with callbacks) and the triggers that
count a batch's members, each made unless ``0001_initial`` made it already."""

from django.db import migrations

from celery_outbox.contrib.django.schema import (
    AddBatchIdColumn,
    CreateBatchesTable,
    CreateBatchTriggers,
)


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_outbox", "0013_debounce")]
    operations = [AddBatchIdColumn(), CreateBatchesTable(), CreateBatchTriggers()]
