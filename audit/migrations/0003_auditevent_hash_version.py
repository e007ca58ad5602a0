"""Which hash an audit event carries: 1 (plain SHA-256, every event so far) or 2 (keyed HMAC)."""
# On PostgreSQL, ADD COLUMN with a default fills existing rows without an UPDATE (the append-only
# trigger does not fire). On SQLite the table is rebuilt, which is why its triggers come after.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("audit", "0002_append_only_trigger")]

    operations = [
        migrations.AddField(
            model_name="auditevent",
            name="hash_version",
            field=models.PositiveSmallIntegerField(default=1),
            preserve_default=False,
        ),
    ]
