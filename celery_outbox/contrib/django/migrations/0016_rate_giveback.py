"""The triggers that give a rate booking back (the statement that takes a booked row off
its booking, whoever writes it, takes its start off the window's count), made unless
``0001_initial`` made them already."""

from django.db import migrations

from celery_outbox.contrib.django.schema import CreateRateTriggers


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_outbox", "0015_slot_leases")]
    operations = [CreateRateTriggers()]
