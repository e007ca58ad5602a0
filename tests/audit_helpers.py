"""Playing the attacker with write access to the database: past the append-only guard.

SQLite has no privileges: whoever can write the file can drop its triggers. On PostgreSQL the
table owner can disable the trigger. Tampering tests do that first, then change rows, and
check that ``audit_verify`` still finds out.
"""

from __future__ import annotations

from contextlib import contextmanager

from django.db import connection

from audit import db as audit_db


@contextmanager
def append_only_guard_dropped():
    """Inside: raw UPDATE and DELETE on the audit table succeed. After: the guard is back."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # ALTER TABLE waits for no deferred foreign-key check of this transaction's inserts.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute(
                f"ALTER TABLE {audit_db.TABLE} DISABLE TRIGGER {audit_db.POSTGRESQL_TRIGGER}"
            )
        else:
            for statement in audit_db.SQLITE_DROP:
                cursor.execute(statement)
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
                cursor.execute(
                    f"ALTER TABLE {audit_db.TABLE} ENABLE TRIGGER {audit_db.POSTGRESQL_TRIGGER}"
                )
                cursor.execute("SET CONSTRAINTS ALL DEFERRED")
            else:
                for statement in audit_db.SQLITE_CREATE:
                    cursor.execute(statement)


def tamper(sql: str, params: list | None = None) -> None:
    """Run one raw statement on the audit table with the guard out of the way."""
    with append_only_guard_dropped(), connection.cursor() as cursor:
        cursor.execute(sql, params or [])


@contextmanager
def flushes_past_the_audit_guard():
    """Inside: live-server tests (browser, CLI) can empty the database after each test
    although the audit log is append-only.

    On SQLite Django empties tables with DELETE, which the audit table's triggers refuse:
    they are dropped for the flush and created again in the same transaction (both
    statements are idempotent). PostgreSQL empties tables with TRUNCATE, which its trigger
    lets through: nothing to do there."""
    import pytest

    if connection.vendor != "sqlite":
        yield
        return

    from django.db.backends.sqlite3.base import DatabaseOperations

    sql_flush = DatabaseOperations.sql_flush

    def flush_with_the_guard_lifted(self, style, tables, **kwargs):
        statements = sql_flush(self, style, tables, **kwargs)
        if audit_db.TABLE not in tables:
            return statements
        return [*audit_db.SQLITE_DROP, *statements, *audit_db.SQLITE_CREATE]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DatabaseOperations, "sql_flush", flush_with_the_guard_lifted)
        yield


def audit_ids_never_used() -> None:
    """The audit log's id counter as in a database never written to. On PostgreSQL a
    sequence is not rolled back with the test transactions of the tests before (SQLite's
    counter is), so a test about a brand-new log starts its own counter afresh."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT setval(pg_get_serial_sequence(%s, 'id'), 1, false)", [audit_db.TABLE]
            )
