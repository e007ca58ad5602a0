"""portal.sqlrows: instances read from hand-written rows, and inserts with their SQL built
once, are the same as the ORM's (the submission path uses both)."""

import pytest
from django.db import connection
from django.forms.models import model_to_dict
from django.utils import timezone

from portal.sqlrows import ModelColumns, ModelInsert, row_instances
from scheduling.models import Job, JobEvent, PriorityClass
from tenants.models import Membership, Project, Tenant
from tests import factories as f

pytestmark = pytest.mark.django_db


def _values(obj) -> dict:
    return {field.attname: getattr(obj, field.attname) for field in obj._meta.concrete_fields}


def test_an_inserted_job_reads_back_as_the_orm_stores_it(world):
    queue = world.queue
    values = {
        "tenant": world.tenant,
        "project": world.project,
        "queue": queue,
        "submitted_by": world.member,
        "name": "train",
        "workload_type": "training",
        "base_priority_class": world.normal,
        "priority_class": world.normal,
        "command": ["python", "train.py", "--lr", "0.1"],
        "env": {"A": "1", "UNICODE": "grüße"},
        "labels": {"team": "nlp"},
        "gpu_models": ["H100-80GB"],
        "gpus_per_node": 2,
        "max_runtime_seconds": 3600,
        "submitted_at": timezone.now(),
        "serve": {},
    }
    raw = ModelInsert(Job).create(**values)
    orm = Job.objects.create(**values)
    assert raw.pk is not None and raw.pk != orm.pk
    assert not raw._state.adding and raw._state.db == "default"
    stored_raw, stored_orm = Job.objects.get(pk=raw.pk), Job.objects.get(pk=orm.pk)
    assert {**_values(stored_raw), "id": None} == {**_values(stored_orm), "id": None}
    # The instance returned holds what was stored (defaults filled as the ORM fills them).
    assert {**_values(raw), "id": None} == {**_values(stored_orm), "id": None}


def test_an_inserted_event_takes_part_in_the_transaction(world):
    job = f.JobFactory(queue=world.queue, project=world.project)
    insert = ModelInsert(JobEvent)
    event = insert.create(job=job, created_at=timezone.now(), kind="submitted", message="m")
    assert JobEvent.objects.get(pk=event.pk).message == "m"
    assert insert.create(job=job, created_at=timezone.now(), kind="x", message="n").pk > event.pk


def test_a_model_without_an_auto_key_is_refused():
    from django.contrib.sessions.models import Session

    with pytest.raises(ValueError, match="no auto primary key"):
        ModelInsert(Session)


def test_rows_read_back_into_instances_equal_to_the_orms(world):
    readers = [
        ModelColumns(Project, "p"),
        ModelColumns(Tenant, "t"),
        ModelColumns(PriorityClass, "c"),
    ]
    quote = connection.ops.quote_name
    sql = (
        f"SELECT {', '.join(r.select(connection) for r in readers)} "
        f"FROM {quote(Project._meta.db_table)} p "
        f"JOIN {quote(Tenant._meta.db_table)} t ON t.id = p.tenant_id "
        f"LEFT JOIN {quote(PriorityClass._meta.db_table)} c ON c.id = %s "
        "WHERE p.id = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [10**6, world.project.pk])
        row = cursor.fetchone()
    project, tenant, missing = row_instances(row, readers)
    assert missing is None  # an outer join that matched nothing
    assert model_to_dict(project) == model_to_dict(Project.objects.get(pk=world.project.pk))
    assert _values(tenant) == _values(Tenant.objects.get(pk=world.tenant.pk))
    assert not project._state.adding


def test_columns_follow_the_models_field_order():
    reader = ModelColumns(Membership, "m")
    assert len(reader) == len(Membership._meta.concrete_fields)
    assert reader.select(connection).startswith("m.")


def test_empty_nullable_columns_are_left_out_and_stay_null(world):
    """A new job's NULLs are not sent (the column's default is NULL): fewer parameters,
    the same row; a value given for a nullable column is sent."""
    job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
    insert = ModelInsert(JobEvent)
    now = timezone.now()
    plain = insert.create(job=job, created_at=now, kind="a", message="m")
    with_actor = insert.create(job=job, created_at=now, kind="b", message="m", actor=world.member)
    assert JobEvent.objects.get(pk=plain.pk).actor_id is None
    assert JobEvent.objects.get(pk=with_actor.pk).actor_id == world.member.pk
    statements = {sql for sql, _ in insert._sql.values()}
    assert len(statements) == 2
    assert any('"actor_id"' not in sql for sql in statements)


def test_a_callers_own_statement_from_the_columns_stores_the_same_row(world):
    """``columns_and_values`` gives what ``insert`` sends, less the fields the caller gives
    itself: an INSERT written from them stores the row ``insert`` stores."""
    job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
    insert = ModelInsert(JobEvent)
    now = timezone.now()
    fields = {"created_at": now, "kind": "submitted", "message": "m", "actor": world.member}
    columns, values = insert.columns_and_values(JobEvent(**fields), leave_out=("job",))
    assert '"job_id"' not in columns and '"actor_id"' in columns
    assert len(columns) == len(values)
    table = connection.ops.quote_name(JobEvent._meta.db_table)
    marks = ", ".join(["%s"] * (len(values) + 1))
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO {table} ("job_id", {", ".join(columns)}) VALUES ({marks})',
            [job.pk, *values],
        )
    written = insert.create(job=job, **fields)
    own, theirs = JobEvent.objects.exclude(pk=written.pk).get(), JobEvent.objects.get(pk=written.pk)
    assert {**_values(own), "id": None} == {**_values(theirs), "id": None}
    # A nullable column left empty is not among them, as insert leaves it out.
    columns, _ = insert.columns_and_values(JobEvent(created_at=now, kind="k", message=""))
    assert '"actor_id"' not in columns and '"job_id"' in columns
