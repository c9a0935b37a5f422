"""``<table>.attempts`` (each execution's earlier attempts, JSON) and ``<table>_pauses`` (the
paused jobs and queues), each made unless ``0001_initial`` made it already."""

from django.db import migrations

from celery_outbox.contrib.django.schema import AddAttemptsColumn, CreatePausesTable


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_outbox", "0007_revoked_sessions")]
    operations = [AddAttemptsColumn(), CreatePausesTable()]
