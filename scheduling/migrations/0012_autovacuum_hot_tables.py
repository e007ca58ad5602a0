"""PostgreSQL: autovacuum thresholds for the tables every job rewrites.

A job's row is updated four or five times in its life (admitted, started, ended, reasons
while it waits) and its allocations twice. With PostgreSQL's defaults a table is vacuumed
once a fifth of its rows are dead: on a job table of a million finished jobs, 200,000
dead versions pile up first, and the dispatch loop's reads of the few thousand live jobs
(the waiting jobs' partial index, the state index) walk them all. These tables are
vacuumed and analysed after a fixed number of changed rows instead, whatever their size.
Nothing on SQLite, which has no vacuum thresholds.
"""

from django.db import migrations

#: (table, vacuum after N dead rows, analyse after N changed rows)
HOT_TABLES = (
    ("scheduling_job", 2000, 2000),
    ("scheduling_allocation", 2000, 5000),
)


def _alter(apps, schema_editor, reset: bool) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for table, vacuum_rows, analyze_rows in HOT_TABLES:
        if reset:
            schema_editor.execute(
                f"ALTER TABLE {table} RESET (autovacuum_vacuum_scale_factor, "
                "autovacuum_vacuum_threshold, autovacuum_analyze_scale_factor, "
                "autovacuum_analyze_threshold)"
            )
        else:
            schema_editor.execute(
                f"ALTER TABLE {table} SET (autovacuum_vacuum_scale_factor = 0, "
                f"autovacuum_vacuum_threshold = {vacuum_rows}, "
                f"autovacuum_analyze_scale_factor = 0, "
                f"autovacuum_analyze_threshold = {analyze_rows})"
            )


def forwards(apps, schema_editor):
    _alter(apps, schema_editor, reset=False)


def backwards(apps, schema_editor):
    _alter(apps, schema_editor, reset=True)


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0011_job_state_finished_index"),
    ]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
