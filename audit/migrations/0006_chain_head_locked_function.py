"""On PostgreSQL, a function that locks the audit chain and answers its newest hash in one
call (``audit.services.audit_chain_head_locked_sql``): a writer that appends an event
inside a statement it runs anyway saves the separate lock statement."""

from django.db import migrations

# VOLATILE (the default): the SELECT after the lock takes a fresh snapshot, so it sees
# every event committed by the writers the lock waited for. A STABLE function would read
# with the calling statement's snapshot, taken before the lock was granted.
CREATE = """
CREATE OR REPLACE FUNCTION audit_chain_head_locked(lock_key bigint) RETURNS varchar AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(lock_key);
    RETURN (SELECT hash FROM audit_auditevent ORDER BY id DESC LIMIT 1);
END;
$$ LANGUAGE plpgsql VOLATILE;
"""
DROP = "DROP FUNCTION IF EXISTS audit_chain_head_locked(bigint);"


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("audit", "0005_sqlite_append_only_triggers")]
    operations = [migrations.RunPython(forwards, backwards)]
