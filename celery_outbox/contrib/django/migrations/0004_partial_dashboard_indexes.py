"""The dashboard's indexes partial, active rows apart from finished ones (as the Alembic
revision ``celery_outbox_0008``): a push, a claim and a heartbeat write no entry into the
finished rows' indexes, an outcome none into the active rows'. On a database whose tables an
older ``0001_initial`` made, the three indexes over every row give way to the four partial
ones (built first, in the migration's transaction: writes to the table wait for the builds);
on one the current ``0001_initial`` made, nothing changes. Then ``ANALYZE`` (PostgreSQL)."""

from django.db import migrations

from celery_outbox.contrib.django.schema import AnalyzeOutboxTables, ReplaceOutboxIndexes

ACTIVE = "status IN ('pending', 'running', 'scheduled')"
FINISHED = "status IN ('cancelled', 'failed', 'succeeded')"


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_outbox", "0003_loop_runs")]
    operations = [
        ReplaceOutboxIndexes(
            add=[
                ("active_job_created", ("job_name", "status", "created_at", "id"), ACTIVE),
                ("active_created", ("created_at", "id"), ACTIVE),
                ("finished_job_created", ("job_name", "status", "created_at", "id"), FINISHED),
                ("finished_created", ("created_at", "id"), FINISHED),
            ],
            remove=[
                ("job_created", ("job_name", "created_at"), None),
                ("job_status_created", ("job_name", "status", "created_at", "id"), None),
                ("created", ("created_at", "id"), None),
            ],
        ),
        AnalyzeOutboxTables(),
    ]
