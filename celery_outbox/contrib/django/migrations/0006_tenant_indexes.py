"""The dashboard's indexes for one tenant, led by ``organization_id`` (as the Alembic
revision ``celery_outbox_0010``): five partial indexes of the tenanted rows only
(``organization_id IS NOT NULL``), so a tenant's reads cost its own rows, never the other
tenants'; a row of no tenant takes no entry in them. Created unless present (a database the
current ``0001_initial`` made has them), in the migration's transaction: writes to the table
wait for the builds. Then ``ANALYZE`` (PostgreSQL)."""

from django.db import migrations

from celery_outbox.contrib.django.schema import AnalyzeOutboxTables, ReplaceOutboxIndexes

ACTIVE = "status IN ('pending', 'running', 'scheduled') AND organization_id IS NOT NULL"
FINISHED = "status IN ('cancelled', 'failed', 'succeeded') AND organization_id IS NOT NULL"


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_outbox", "0005_traceparent")]
    operations = [
        ReplaceOutboxIndexes(
            add=[
                ("org_active_job_created",
                 ("organization_id", "job_name", "status", "created_at", "id"), ACTIVE),
                ("org_active_created", ("organization_id", "created_at", "id"), ACTIVE),
                ("org_finished",
                 ("organization_id", "job_name", "status", "finished_at", "id"), FINISHED),
                ("org_finished_job_created",
                 ("organization_id", "job_name", "status", "created_at", "id"), FINISHED),
                ("org_finished_created", ("organization_id", "created_at", "id"), FINISHED),
            ],
            remove=[],
        ),
        AnalyzeOutboxTables(),
    ]
