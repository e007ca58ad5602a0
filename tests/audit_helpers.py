"""Playing the attacker with write access to the database: past the append-only guard.

SQLite has no privileges: whoever can write the file can drop its triggers. On PostgreSQL the
table owner can disable the trigger. Tampering tests do that first, then change rows, and
check that ``audit_verify`` still finds out.
"""

from __future__ import annotations

from contextlib import contextmanager

from django.db import connection

from portal.audit import db as audit_db


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
