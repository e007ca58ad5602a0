"""Drop the DRF tokens (``rest_framework.authtoken``), which were stored in plain text.

They cannot become hashed tokens: a hash can be made from a key, but the point is that
no key stays in the database, and a DRF key keeps working for whoever copied it. So every
old token stops working here; users make new ones (/account/tokens/ or
POST /api/v1/auth/token). The table goes, and with it the record of its migrations, so the
app could be installed again cleanly.
"""

from django.db import migrations

LEGACY_TABLE = "authtoken_token"


def drop_plaintext_tokens(apps, schema_editor):
    connection = schema_editor.connection
    if LEGACY_TABLE not in connection.introspection.table_names():
        return
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*) FROM {schema_editor.quote_name(LEGACY_TABLE)}")
        count = cursor.fetchone()[0]
    schema_editor.execute(f"DROP TABLE {schema_editor.quote_name(LEGACY_TABLE)}")
    schema_editor.execute("DELETE FROM django_migrations WHERE app = %s", ["authtoken"])
    if count:
        print(
            f"\n  Dropped {count} plain-text DRF API token(s); their users must make new "
            "tokens (see README, Credentials)."
        )


class Migration(migrations.Migration):
    dependencies = [("accounts", "0001_initial")]

    operations = [migrations.RunPython(drop_plaintext_tokens, migrations.RunPython.noop)]
