"""The audit table's append-only guard inside the database: triggers that refuse UPDATE and DELETE.

PostgreSQL: one plpgsql trigger (migration 0002). TRUNCATE stays possible for the table owner
(test database flushes). SQLite: two triggers that RAISE(ABORT) (migration 0005). SQLite has
no privileges, so whoever can write the file can drop them; that is what the keyed hash and
the anchor file are for. On SQLite, ``manage.py flush`` is refused while audit events exist
(it empties tables with DELETE); ``make demo-reset`` removes the whole database instead.

SQLite rebuilds a table (and drops its triggers) for many schema changes, so the guard is
put back after every ``migrate`` (``apps.py``), and ``audit_verify`` reports it missing.
"""

from __future__ import annotations

TABLE = "audit_auditevent"

POSTGRESQL_TRIGGER = "audit_event_append_only"
POSTGRESQL_CREATE = f"""
CREATE OR REPLACE FUNCTION audit_event_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '{TABLE} is append-only: % is not allowed', TG_OP;
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS {POSTGRESQL_TRIGGER} ON {TABLE};
CREATE TRIGGER {POSTGRESQL_TRIGGER} BEFORE UPDATE OR DELETE ON {TABLE}
    FOR EACH ROW EXECUTE FUNCTION audit_event_append_only();
"""

# One statement each: Python's sqlite3 runs one statement per execute().
SQLITE_TRIGGERS = {
    "audit_event_no_update": "UPDATE",
    "audit_event_no_delete": "DELETE",
}
SQLITE_CREATE = [
    f"CREATE TRIGGER IF NOT EXISTS {name} BEFORE {op} ON {TABLE} "
    f"BEGIN SELECT RAISE(ABORT, '{TABLE} is append-only: {op} is not allowed'); END"
    for name, op in SQLITE_TRIGGERS.items()
]
SQLITE_DROP = [f"DROP TRIGGER IF EXISTS {name}" for name in SQLITE_TRIGGERS]


def _table_exists(connection) -> bool:
    with connection.cursor() as cursor:
        return TABLE in connection.introspection.table_names(cursor)


def append_only_guard_ensure(connection) -> None:
    """Create the guard's triggers if they are missing (idempotent)."""
    if not _table_exists(connection):
        return
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            if not append_only_guard_missing(connection):
                return
            cursor.execute(POSTGRESQL_CREATE)
        elif connection.vendor == "sqlite":
            for statement in SQLITE_CREATE:
                cursor.execute(statement)


def append_only_guard_missing(connection) -> list[str]:
    """The guard's triggers this database should have and lacks (or has disabled)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND tgenabled <> 'D'",
                [TABLE],
            )
            present = {row[0] for row in cursor.fetchall()}
            expected = [POSTGRESQL_TRIGGER]
        elif connection.vendor == "sqlite":
            cursor.execute(
                "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = %s", [TABLE]
            )
            present = {row[0] for row in cursor.fetchall()}
            expected = list(SQLITE_TRIGGERS)
        else:
            return []
    return [name for name in expected if name not in present]


def highest_id_ever_used(connection) -> int:
    """The highest event id the database ever handed out, also for events since deleted.

    SQLite keeps it in ``sqlite_sequence`` (the id column is AUTOINCREMENT), PostgreSQL in
    the id's sequence. An empty log whose ids were used once had its events deleted; one
    that could also reset the counter could also have deleted the anchor's copy, which is
    why the copy belongs somewhere else.
    """
    if not _table_exists(connection):
        return 0
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT name FROM sqlite_master WHERE name = 'sqlite_sequence'")
            if cursor.fetchone() is None:
                return 0
            cursor.execute("SELECT seq FROM sqlite_sequence WHERE name = %s", [TABLE])
            row = cursor.fetchone()
            return int(row[0]) if row and row[0] else 0
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [TABLE])
            sequence = cursor.fetchone()[0]
            if not sequence:
                return 0
            cursor.execute(f"SELECT last_value, is_called FROM {sequence}")
            last_value, is_called = cursor.fetchone()
            return int(last_value) if is_called else 0
    return 0
