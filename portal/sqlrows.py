"""Model instances from the columns of a hand-written SELECT.

A hot read that joins several tables in one statement (a job submission's project, queue,
pool, classes and policy: issue 21) pays the ORM's compilation of the query every call,
about a millisecond of CPU per query on a small machine. ``ModelColumns`` writes a model's
column list for such a statement once and turns the matching slice of a row back into an
instance exactly as the ORM would: each value goes through the backend's and the field's
converters (SQLite's datetimes and JSON text, PostgreSQL's jsonb...), then
``Model.from_db``, so the instance is the same as one the ORM loaded (``_state.adding``
False, ``_state.db`` set, deferred nothing).
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connections, models


class ModelColumns:
    """The concrete columns of ``model`` under a table alias, read from a row slice."""

    def __init__(self, model: type[models.Model], alias: str) -> None:
        self.model = model
        self.alias = alias
        self.fields = list(model._meta.concrete_fields)
        self.attnames = [field.attname for field in self.fields]
        self._pk_index = self.fields.index(model._meta.pk)
        self._converters: dict[str, list] = {}

    def __len__(self) -> int:
        return len(self.fields)

    def select(self, connection) -> str:
        """``alias.col1, alias.col2, …`` in the model's field order."""
        quote = connection.ops.quote_name
        return ", ".join(f"{self.alias}.{quote(field.column)}" for field in self.fields)

    def _converters_for(self, connection) -> list:
        found = self._converters.get(connection.alias)
        if found is None:
            found = []
            for field in self.fields:
                expression = field.get_col(self.alias)
                chain = connection.ops.get_db_converters(expression) + field.get_db_converters(
                    connection
                )
                found.append((expression, chain))
            self._converters[connection.alias] = found
        return found

    def instance(self, values: Sequence, connection) -> models.Model | None:
        """The instance the values stand for; None where the primary key is NULL (an outer
        join that matched nothing)."""
        if values[self._pk_index] is None:
            return None
        converted = []
        for value, (expression, chain) in zip(
            values, self._converters_for(connection), strict=True
        ):
            for converter in chain:
                value = converter(value, expression, connection)
            converted.append(value)
        return self.model.from_db(connection.alias, self.attnames, converted)


def row_instances(
    row: Sequence, readers: Sequence[ModelColumns], using: str = "default"
) -> list[models.Model | None]:
    """Split ``row`` into one instance per reader, in order; what is left of the row after
    the readers' columns is not read (the caller's extra columns)."""
    connection = connections[using]
    out, start = [], 0
    for reader in readers:
        end = start + len(reader)
        out.append(reader.instance(row[start:end], connection))
        start = end
    return out
