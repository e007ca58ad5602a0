"""Set-based writes the ORM has no cheap form for.

``bulk_update`` builds one ``CASE WHEN id = … THEN …`` per row and field: about a
millisecond per row of Python and SQL for the thousands of waiting jobs a dispatch cycle
may touch. ``rows_update`` sends the new values as one table instead: ``UPDATE … FROM
(VALUES …)`` on PostgreSQL, a prepared statement run over all rows elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection, models

#: Rows per statement on PostgreSQL (its limit is 65,535 parameters per statement).
CHUNK_ROWS = 2000


def rows_update(model: type[models.Model], columns: Sequence[str], rows: Sequence[Sequence]) -> int:
    """Set ``columns`` (model field names) of each row ``(pk, value, …)``; returns the
    number of rows given. Values are prepared as the fields save them; no signals, no
    ``save()``: the caller's transaction and checks apply."""
    if not rows:
        return 0
    meta = model._meta
    fields = [meta.get_field(name) for name in columns]
    pk = meta.pk
    prepared = [
        [pk.get_db_prep_save(row[0], connection)]
        + [
            field.get_db_prep_save(value, connection)
            for field, value in zip(fields, row[1:], strict=True)
        ]
        for row in rows
    ]
    quote = connection.ops.quote_name
    table = quote(meta.db_table)
    names = [quote(field.column) for field in fields]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            types = [pk.db_type(connection)] + [field.db_type(connection) for field in fields]
            casts = "(" + ", ".join(f"%s::{t}" for t in types) + ")"
            sets = ", ".join(f"{name} = v.{name}" for name in names)
            alias = ", ".join(["id", *names])
            for start in range(0, len(prepared), CHUNK_ROWS):
                chunk = prepared[start : start + CHUNK_ROWS]
                values = ", ".join([casts] * len(chunk))
                cursor.execute(
                    f"UPDATE {table} AS t SET {sets} FROM (VALUES {values}) AS v({alias}) "
                    f"WHERE t.{quote(pk.column)} = v.id",
                    [value for row in chunk for value in row],
                )
        else:
            sets = ", ".join(f"{name} = %s" for name in names)
            cursor.executemany(
                f"UPDATE {table} SET {sets} WHERE {quote(pk.column)} = %s",
                [row[1:] + row[:1] for row in prepared],
            )
    return len(rows)
