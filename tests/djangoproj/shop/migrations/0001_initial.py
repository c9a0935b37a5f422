from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [
        migrations.CreateModel(
            name="Order",
            fields=[("id", models.AutoField(primary_key=True, serialize=False)),
                    ("customer", models.CharField(max_length=100))],
        ),
        migrations.CreateModel(
            name="Receipt",
            fields=[("id", models.AutoField(primary_key=True, serialize=False)),
                    ("order_id", models.IntegerField()),
                    ("execution_id", models.UUIDField()),
                    ("worker_pid", models.IntegerField())],
        ),
    ]
