"""What one submission writes, whichever way its statements are put together: on
PostgreSQL the job, its event, the audit chain's lock and head and the audit row (hashed
by the database) go in one statement (scheduling.services.jobs._job_event_audit_insert);
elsewhere one statement each.
The rows are the same, and the audit chain stays one chain under concurrent submissions."""

import threading

import pytest
from django.db import connection

from audit.models import AuditEvent
from audit.services import audit_record, audit_verify_chain
from portal.errors import BusinessError
from scheduling.choices import JobState
from scheduling.models import Job, JobEvent
from scheduling.services.jobs import JobSpec, job_submit

URL = "/api/v1/jobs"


def _spec(world, **overrides) -> JobSpec:
    values = {
        "project": world.project,
        "queue": world.queue,
        "name": "train",
        "workload_type": "training",
        "command": ["python", "train.py"],
        **overrides,
    }
    return JobSpec(**values)


def test_a_submission_stores_its_job_event_and_audit_row(world, api, dispatch_requests):
    audit_record(action="test.note", target_type="thing", target_id=1, actor=world.platform_admin)
    before = AuditEvent.objects.order_by("-id").first()
    body = {
        "project": world.project.pk,
        "queue": world.queue.pk,
        "workload_type": "training",
        "command": ["python", "train.py"],
        "env": {"EPOCHS": "3"},
        "labels": {"team": "nlp"},
        "gpus_per_node": 2,
        "seed": 11,
    }
    response = api(world.member).post(URL, body, format="json")
    assert response.status_code == 201, response.content

    job = Job.objects.get(pk=response.json()["id"])
    assert job.state == JobState.PENDING
    assert (job.env, job.labels, job.gpus_per_node, job.seed) == (
        {"EPOCHS": "3"},
        {"team": "nlp"},
        2,
        11,
    )
    assert response.json()["submitted_at"] is not None
    [event] = JobEvent.objects.filter(job=job)
    assert (event.kind, event.actor_id, event.created_at, event.data) == (
        "submitted",
        world.member.pk,
        job.submitted_at,
        {},
    )
    assert event.message == f"Submitted to queue {world.queue} by {world.member.username}."
    audit = AuditEvent.objects.get(action="job.submit")
    assert (audit.target_id, audit.actor_id, audit.tenant_id) == (
        str(job.pk),
        world.member.pk,
        world.tenant.pk,
    )
    assert audit.prev_hash == before.hash
    assert audit.after == {"queue": str(world.queue), "gpus": 2, "priority_class": "normal"}
    assert audit_verify_chain()[1] is None


@pytest.mark.parametrize(
    "name",
    ['quote " backslash \\ tab\t', "accents éß and 日本", "<key 00> <head 00> %s %% {}"],
)
def test_the_audit_row_of_a_submission_hashes_as_the_chain_checks_it(
    world, dispatch_requests, name
):
    """The audit row's hash (made by the database on PostgreSQL) is the one the chain's
    check recomputes, whatever the job's name holds (JSON escapes, non-ASCII text, SQL
    and marker look-alikes), and its label and target are the job's."""
    job = job_submit(user=world.member, spec=_spec(world, name=name))
    audit = AuditEvent.objects.get(action="job.submit")
    assert (audit.target_type, audit.target_id, audit.target_label) == (
        "scheduling.job",
        str(job.pk),
        str(job),
    )
    assert audit.hash == audit.compute_hash()
    assert audit_verify_chain()[1] is None


def test_a_refused_submission_stores_nothing(world, dispatch_requests):
    jobs, events, audits = Job.objects.count(), JobEvent.objects.count(), AuditEvent.objects.count()
    with pytest.raises(BusinessError):
        job_submit(user=world.member, spec=_spec(world, gpus_per_node=10_000))
    assert (Job.objects.count(), JobEvent.objects.count(), AuditEvent.objects.count()) == (
        jobs,
        events,
        audits,
    )


def test_submissions_in_a_row_chain_their_audit_rows(world, dispatch_requests):
    jobs = [job_submit(user=world.member, spec=_spec(world, name=f"j{i}")) for i in range(3)]
    rows = list(AuditEvent.objects.filter(action="job.submit").order_by("id"))
    assert [r.target_id for r in rows] == [str(j.pk) for j in jobs]
    assert [r.prev_hash for r in rows[1:]] == [r.hash for r in rows[:-1]]
    assert audit_verify_chain()[1] is None


@pytest.mark.django_db(transaction=True)
def test_concurrent_submissions_keep_one_audit_chain_on_postgresql(world):
    """Each submission reads the chain's head with a snapshot taken once it holds the
    chain's lock, so one that waited for the lock sees the event appended meanwhile: no
    two events chain onto the same one."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite serialises writers; this needs PostgreSQL (the CI suite runs it)")
    threads_count, per_thread = 4, 5
    barrier = threading.Barrier(threads_count)
    errors: list = []

    def submit_some():
        try:
            barrier.wait()
            for i in range(per_thread):
                job_submit(user=world.member, spec=_spec(world, name=f"race-{i}"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=submit_some) for _ in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    rows = list(AuditEvent.objects.order_by("id"))
    submitted = [r for r in rows if r.action == "job.submit"]
    assert len(submitted) == threads_count * per_thread
    assert len({r.prev_hash for r in rows}) == len(rows)
    checked, broken, why = audit_verify_chain()
    assert (checked, broken) == (len(rows), None), why
    assert JobEvent.objects.filter(kind="submitted").count() == threads_count * per_thread


def test_a_submission_statement_is_parsed_once_on_postgresql(world, dispatch_requests, monkeypatch):
    """psycopg keeps the parsing of the submission's statement (its parameters are more
    than psycopg's own limit of 50): a submission parses none of its statements again."""
    if connection.vendor != "postgresql":
        pytest.skip("the statement is PostgreSQL's (the CI suite runs it)")
    from psycopg import _queries

    job_submit(user=world.member, spec=_spec(world, name="first"))
    parsed: list[bytes] = []
    uncached = _queries._query2pg_nocache

    def parse(query, encoding):
        parsed.append(query)
        return uncached(query, encoding)

    # psycopg calls the uncached parser itself only for statements it does not keep.
    monkeypatch.setattr(_queries, "_query2pg_nocache", parse)
    job_submit(user=world.member, spec=_spec(world, name="second"))
    assert parsed == []
