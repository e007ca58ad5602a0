"""The tables every job rewrites are vacuumed after a fixed number of dead rows on
PostgreSQL (migration 0012), not after a fifth of the table: a large history of finished
jobs must not let dead versions of the live jobs pile up."""

import pytest
from django.db import connection

from scheduling.models import Allocation, Job


@pytest.mark.django_db
def test_hot_tables_have_fixed_autovacuum_thresholds():
    if connection.vendor != "postgresql":
        pytest.skip("vacuum thresholds are PostgreSQL's (see .ci/run)")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname, reloptions FROM pg_class WHERE relname IN (%s, %s)",
            [Job._meta.db_table, Allocation._meta.db_table],
        )
        options = {name: set(opts or []) for name, opts in cursor.fetchall()}
    for table in (Job._meta.db_table, Allocation._meta.db_table):
        assert "autovacuum_vacuum_scale_factor=0" in options[table], options
        assert "autovacuum_analyze_scale_factor=0" in options[table], options
    assert "autovacuum_vacuum_threshold=2000" in options[Job._meta.db_table]
