"""The dashboard's revoked sessions: ``<table>_revoked_sessions`` (a logout ends the session
on every process and host), created unless ``0001_initial`` made it already."""

from django.db import migrations

from celery_outbox.contrib.django.schema import CreateRevokedSessionsTable


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_outbox", "0006_tenant_indexes")]
    operations = [CreateRevokedSessionsTable()]
