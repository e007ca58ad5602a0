"""accounts.0002: the plain-text DRF tokens of an existing database are dropped."""

import importlib
from types import SimpleNamespace

from django.db import connection
from django.db.migrations.recorder import MigrationRecorder
from django.utils import timezone

migration = importlib.import_module("accounts.migrations.0002_drop_plaintext_drf_tokens")


def _editor():
    def execute(sql, params=()):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)

    return SimpleNamespace(
        connection=connection, quote_name=connection.ops.quote_name, execute=execute
    )


def test_plain_text_tokens_and_their_migration_records_are_dropped(db, capsys):
    with connection.cursor() as cursor:
        cursor.execute('CREATE TABLE "authtoken_token" ("key" varchar(40) PRIMARY KEY)')
        cursor.execute('INSERT INTO "authtoken_token" ("key") VALUES (%s)', ["a" * 40])
    MigrationRecorder.Migration.objects.create(
        app="authtoken", name="0001_initial", applied=timezone.now()
    )

    migration.drop_plaintext_tokens(None, _editor())

    assert "authtoken_token" not in connection.introspection.table_names()
    assert not MigrationRecorder.Migration.objects.filter(app="authtoken").exists()
    assert "Dropped 1 plain-text DRF API token(s)" in capsys.readouterr().out


def test_a_database_without_drf_tokens_is_left_alone(db, capsys):
    migration.drop_plaintext_tokens(None, _editor())

    assert "authtoken_token" not in connection.introspection.table_names()
    assert capsys.readouterr().out == ""
