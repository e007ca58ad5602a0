"""On SQLite too, reject UPDATE and DELETE on the audit table in the database itself."""

from django.db import migrations

from audit import db as audit_db


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for statement in audit_db.SQLITE_CREATE:
            schema_editor.execute(statement, params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for statement in audit_db.SQLITE_DROP:
            schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):
    dependencies = [("audit", "0004_seal_plain_chain")]
    operations = [migrations.RunPython(forwards, backwards)]
