"""The maintenance loop's last runs: ``<table>_loop`` (when the sweep and the trim last ran,
on any host), created unless ``0001_initial`` made it already."""

from django.db import migrations

from celery_outbox.contrib.django.schema import CreateLoopTable


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_outbox", "0002_analyze")]
    operations = [CreateLoopTable()]
