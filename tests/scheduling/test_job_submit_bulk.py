"""``POST /api/v1/jobs/bulk`` and arrays: all or nothing."""

import pytest

from audit.models import AuditEvent
from scheduling.choices import JobState, WorkloadType
from scheduling.models import Job, JobEvent
from scheduling.services.jobs import JobSpec, job_submit, job_submit_bulk

URL = "/api/v1/jobs/bulk"


def item(world, **overrides) -> dict:
    return {
        "project": world.project.pk,
        "queue": world.queue.pk,
        "workload_type": "training",
        "command": ["python", "train.py"],
        **overrides,
    }


def test_bulk_stores_every_job_with_events_and_one_audit_row(world, api, dispatch_requests):
    jobs = [item(world, name=f"sweep-{i}") for i in range(3)]

    response = api(world.member).post(URL, {"jobs": jobs}, format="json")

    assert response.status_code == 201, response.json()
    data = response.json()
    assert data["count"] == 3
    stored = list(Job.objects.filter(pk__in=data["ids"]).order_by("id"))
    assert [j.name for j in stored] == ["sweep-0", "sweep-1", "sweep-2"]
    assert all(j.state == JobState.PENDING for j in stored)
    assert JobEvent.objects.filter(job__in=stored, kind="submitted").count() == 3
    audit = AuditEvent.objects.get(action="job.submit_bulk")
    assert audit.after == {"count": 3, "first_id": data["ids"][0], "last_id": data["ids"][-1]}
    assert audit.tenant == world.tenant


def test_bulk_accepts_a_bare_list(world, api, dispatch_requests):
    response = api(world.member).post(URL, [item(world), item(world)], format="json")

    assert response.status_code == 201
    assert Job.objects.count() == 2


@pytest.mark.parametrize(
    ("bad", "key"),
    [
        ({"command": "python train.py"}, "jobs[1].command"),  # caught by the service
        ({"gpus_per_node": 9}, "jobs[1].gpus_per_node"),
        ({"priority_class": "high"}, "jobs[1].priority_class"),
        ({"max_runtime_seconds": 10**9}, "jobs[1].max_runtime_seconds"),
        ({"gpus_per_node": "many"}, "jobs[1].gpus_per_node"),  # caught by the serializer
        ({"workload_type": "mining"}, "jobs[1].workload_type"),
        ({"priority_class": "urgent"}, "jobs[1].priority_class"),  # unknown name
    ],
)
def test_one_bad_spec_among_good_ones_stores_nothing(world, api, bad, key):
    jobs = [item(world), item(world, **bad), item(world)]

    response = api(world.member).post(URL, {"jobs": jobs}, format="json")

    assert response.status_code == 400, response.json()
    assert key in response.json()["errors"], response.json()
    assert "jobs[1]" in response.json()["detail"]
    assert Job.objects.count() == 0
    assert JobEvent.objects.count() == 0
    assert not AuditEvent.objects.exists()


def test_bulk_with_a_queue_of_another_tenant_is_404_and_stores_nothing(world, api):
    jobs = [item(world), item(world, queue=world.other_queue.pk)]

    response = api(world.member).post(URL, {"jobs": jobs}, format="json")

    assert response.status_code == 404
    assert Job.objects.count() == 0


@pytest.mark.parametrize("payload", [{"jobs": []}, {}, {"jobs": "x"}, {"jobs": [1, 2]}])
def test_bulk_needs_a_list_of_jobs(world, api, payload):
    response = api(world.member).post(URL, payload, format="json")

    assert response.status_code == 400
    assert any(k.startswith("jobs") for k in response.json()["errors"]), response.json()
    assert Job.objects.count() == 0


def test_bulk_by_a_viewer_is_403(world, api):
    response = api(world.viewer).post(URL, {"jobs": [item(world)]}, format="json")

    assert response.status_code == 403
    assert Job.objects.count() == 0


def test_array_creates_n_jobs_with_indexes_and_one_array_id(world, api, dispatch_requests):
    response = api(world.member).post(
        "/api/v1/jobs", item(world, name="hp", array=5), format="json"
    )

    assert response.status_code == 201, response.json()
    data = response.json()
    assert data["count"] == 5
    jobs = list(Job.objects.order_by("array_index"))
    assert [j.array_index for j in jobs] == [0, 1, 2, 3, 4]
    assert {j.array_id for j in jobs} == {data["array_id"]}
    assert len(data["array_id"]) == 32
    assert [j.name for j in jobs] == [f"hp[{i}]" for i in range(5)]
    assert sorted(data["ids"]) == [j.pk for j in jobs]
    assert JobEvent.objects.filter(kind="submitted").count() == 5
    filtered = api(world.member).get("/api/v1/jobs", {"array_id": data["array_id"]}).json()
    assert filtered["count"] == 5


def test_arrays_in_bulk_get_distinct_array_ids(world, api, dispatch_requests):
    response = api(world.member).post(
        URL, {"jobs": [item(world, array=2), item(world, array=3), item(world)]}, format="json"
    )

    assert response.status_code == 201
    assert response.json()["count"] == 6
    array_ids = set(Job.objects.exclude(array_id="").values_list("array_id", flat=True))
    assert len(array_ids) == 2
    assert Job.objects.filter(array_id="").count() == 1


def test_service_job_submit_with_array_expands(world, dispatch_requests):
    spec = JobSpec(
        queue=world.queue,
        project=world.project,
        name="a",
        workload_type=WorkloadType.TRAINING,
        command=["x"],
        array=3,
    )

    first = job_submit(user=world.member, spec=spec)

    assert first.array_index == 0
    assert Job.objects.filter(array_id=first.array_id).count() == 3


def test_service_bulk_refuses_an_empty_list(world):
    from portal.errors import BusinessError

    with pytest.raises(BusinessError):
        job_submit_bulk(user=world.member, specs=[])
