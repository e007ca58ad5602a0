"""The indexes the million-job lists read (migration 0021): the waiting jobs' ranks per
queue with the id (positions counted index only), a tenant's jobs by id, and the jobs of
a state by GPUs."""

import pytest
from django.db import connection

from scheduling.models import Job


def _indexes() -> dict:
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, Job._meta.db_table)
    return {name: spec["columns"] for name, spec in found.items() if spec["index"]}


@pytest.mark.django_db
@pytest.mark.parametrize(
    "name, columns",
    [
        ("job_waiting_rank", ["queue_id", "pending_rank", "id"]),
        ("job_tenant_id", ["tenant_id", "id"]),
        ("job_state_gpus", ["state", "gpus_per_node", "id"]),
    ],
)
def test_the_list_indexes_exist(name, columns):
    assert _indexes().get(name) == columns


@pytest.mark.django_db
def test_the_waiting_rank_index_holds_only_waiting_jobs():
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT sql FROM sqlite_master WHERE name = 'job_waiting_rank'")
        else:
            cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'job_waiting_rank'")
        (definition,) = cursor.fetchone()
    assert "pending_rank" in definition and "IS NOT NULL" in definition
    assert "PENDING" in definition and "HELD" in definition
    assert "job_pending_rank" not in _indexes()  # replaced
