"""Model instances from the columns of a hand-written SELECT.

A hot read that joins several tables in one statement (a job submission's project, queue,
pool, classes and policy) pays the ORM's compilation of the query every call,
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


class ModelInsert:
    """``Model.objects.create`` for one hot model without the ORM compiling the statement
    each time: the INSERT's text is built once per database (and per set of empty nullable
    columns, which it leaves out), the values prepared as the ORM prepares them
    (``pre_save`` with ``add=True``, then ``get_db_prep_save``), the primary key read
    back. For models without signal receivers on save (none is sent) whose primary key is
    an auto field; the instance ends as one ``save()`` left."""

    def __init__(self, model: type[models.Model]) -> None:
        meta = model._meta
        if meta.auto_field is None:
            raise ValueError(f"{model.__name__} has no auto primary key")
        self.model = model
        self.fields = [
            f for f in meta.local_concrete_fields if f is not meta.auto_field and not f.generated
        ]
        custom = [f.name for f in self.fields if hasattr(f, "get_placeholder")]
        if custom:
            raise ValueError(f"{model.__name__}: fields with their own placeholder: {custom}")
        # Fields whose NULL may be left out of the statement: nullable, and no default in
        # the database (Django makes none unless asked), so the column's default is NULL.
        self._nullable = [f.null and f.db_default is models.NOT_PROVIDED for f in self.fields]
        self._sql: dict[tuple[str, tuple[bool, ...]], tuple[str, bool]] = {}
        self._columns: dict[tuple, tuple[list[str], list[int]]] = {}

    def _statement(self, connection, sent: tuple[bool, ...]) -> tuple[str, bool]:
        """The INSERT of the fields ``sent`` flags, and whether it returns the key."""
        found = self._sql.get((connection.alias, sent))
        if found is None:
            meta = self.model._meta
            quote = connection.ops.quote_name
            fields = [f for f, send in zip(self.fields, sent, strict=True) if send]
            columns = ", ".join(quote(f.column) for f in fields)
            marks = ", ".join(["%s"] * len(fields))
            sql = f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES ({marks})"
            returning = bool(connection.features.can_return_columns_from_insert)
            if returning:
                clause, _ = connection.ops.return_insert_columns([meta.pk])
                sql = f"{sql} {clause}"
            found = self._sql[(connection.alias, sent)] = (sql, returning)
        return found

    def create(self, using: str = "default", **values) -> models.Model:
        """A new instance from ``values``, inserted; as ``Model.objects.create(**values)``."""
        return self.insert(self.model(**values), using)

    def _prepared(self, obj: models.Model, connection) -> tuple[tuple[bool, ...], list]:
        """The flags of the fields sent and their values, prepared as the ORM prepares them."""
        if obj.pk is not None or not obj._state.adding:
            raise ValueError("only a new instance is inserted")
        prepared = [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in self.fields]
        # NULLs the column's default gives anyway are not sent: a new job leaves a third of
        # its columns empty, and the statement's parameters are what the driver and the
        # server spend on (psycopg caches the parsing of a statement of 50 at most).
        sent = tuple(
            value is not None or not nullable
            for value, nullable in zip(prepared, self._nullable, strict=True)
        )
        return sent, [value for value, send in zip(prepared, sent, strict=True) if send]

    def insert(self, obj: models.Model, using: str = "default") -> models.Model:
        """Insert ``obj``, a new instance (no primary key yet), as ``obj.save()`` would."""
        connection = connections[using]
        sent, params = self._prepared(obj, connection)
        sql, returning = self._statement(connection, sent)
        meta = self.model._meta
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            if returning:
                pk = cursor.fetchone()[0]
            else:
                pk = connection.ops.last_insert_id(cursor, meta.db_table, meta.pk.column)
        return self.inserted(obj, pk, using)

    def inserted(self, obj: models.Model, pk, using: str = "default") -> models.Model:
        """``obj`` as ``save()`` leaves it, once a statement of the caller's own inserted it
        (``columns_and_values``) and gave it the key ``pk``."""
        obj.pk = pk
        obj._state.adding = False
        obj._state.db = using
        return obj

    def columns_and_values(
        self, obj: models.Model, using: str = "default", *, leave_out: tuple[str, ...] = ()
    ) -> tuple[list[str], list]:
        """The quoted columns and prepared values of ``obj``'s insert, as ``insert`` sends
        them, for a caller that writes the statement itself (several inserts in one
        statement); the fields named in ``leave_out`` are the caller's to give."""
        connection = connections[using]
        sent, params = self._prepared(obj, connection)
        key = (connection.alias, sent, leave_out)
        found = self._columns.get(key)
        if found is None:
            quote = connection.ops.quote_name
            fields = [f for f, send in zip(self.fields, sent, strict=True) if send]
            kept = [i for i, f in enumerate(fields) if f.name not in leave_out]
            found = self._columns[key] = ([quote(fields[i].column) for i in kept], kept)
        columns, kept = found
        return columns, [params[i] for i in kept]
