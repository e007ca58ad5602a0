"""Serving jobs: ``serve`` on submission, its checks, and where it shows.

A serving job is an HTTP replica: its node's agent gives it a port and scrapes the paths of
``serve``. Only inference, batch inference and interactive jobs may serve.
"""

import pytest

from portal.errors import BusinessError
from scheduling.choices import WorkloadType
from scheduling.models import Job
from scheduling.services.jobs import JobSpec, job_submit, job_submit_bulk

URL = "/api/v1/jobs"


def body(world, **overrides) -> dict:
    return {
        "project": world.project.pk,
        "queue": world.queue.pk,
        "workload_type": "inference",
        "command": ["python", "-m", "server"],
        **overrides,
    }


def spec(world, **overrides) -> JobSpec:
    values = {
        "queue": world.queue,
        "project": world.project,
        "name": "",
        "workload_type": WorkloadType.INFERENCE,
        "command": ["python", "-m", "server"],
        **overrides,
    }
    return JobSpec(**values)


def test_a_serving_job_is_stored_with_its_paths_and_shows_them(world, api):
    response = api(world.member).post(
        URL, body(world, serve={"health_path": "/ready", "metrics_path": "/m"}), format="json"
    )
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.serve == {"health_path": "/ready", "metrics_path": "/m"}
    assert job.serve_port is None and job.serve_ready is False
    shown = api(world.member).get(f"{URL}/{job.pk}").json()
    assert shown["serve"] == {"health_path": "/ready", "metrics_path": "/m"}
    assert shown["serve_port"] is None
    assert shown["serve_ready"] is False


def test_missing_paths_get_the_defaults(world):
    job = job_submit(user=world.member, spec=spec(world, serve={"metrics_path": "/stats"}))
    job.refresh_from_db()
    assert job.serve == {"health_path": "/health", "metrics_path": "/stats"}


def test_a_job_without_serve_is_not_a_serving_job(world, api):
    response = api(world.member).post(URL, body(world), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["serve"] == {}
    assert Job.objects.get().serve == {}


@pytest.mark.parametrize("workload_type", ["batch_inference", "interactive"])
def test_batch_inference_and_interactive_jobs_may_serve(world, workload_type):
    job = job_submit(
        user=world.member, spec=spec(world, workload_type=workload_type, serve={"health_path": "/"})
    )
    assert Job.objects.get(pk=job.pk).serve["health_path"] == "/"


@pytest.mark.parametrize("workload_type", ["training", "fine_tuning", "evaluation"])
def test_other_workload_types_cannot_serve(world, api, workload_type):
    response = api(world.member).post(
        URL, body(world, workload_type=workload_type, serve={}), format="json"
    )
    assert response.status_code == 201  # an empty serve is no serving job
    response = api(world.member).post(
        URL,
        body(world, workload_type=workload_type, serve={"health_path": "/health"}),
        format="json",
    )
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert "serve" in errors and workload_type in errors["serve"][0]
    assert Job.objects.count() == 1


@pytest.mark.parametrize(
    "serve",
    [
        {"health_path": "health"},
        {"metrics_path": ""},
        {"health_path": "/" + "x" * 200},
        {"health_path": 5},
        {"health_path": "/a b"},
        {"metrics_path": "/m\x00"},
        {"port": 8000},
        ["/health"],
        "/health",
    ],
)
def test_malformed_serve_is_refused_with_the_field_named(world, api, serve):
    response = api(world.member).post(URL, body(world, serve=serve), format="json")
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert errors and all(key.split(".")[0] == "serve" for key in errors), errors
    assert not Job.objects.exists()


def test_a_path_of_200_characters_is_allowed(world):
    path = "/" + "x" * 199
    job = job_submit(user=world.member, spec=spec(world, serve={"health_path": path}))
    assert Job.objects.get(pk=job.pk).serve["health_path"] == path


def test_bulk_submission_takes_serve_and_names_the_failing_job(world, api):
    ok = body(world, serve={"health_path": "/h"}, array=2)
    response = api(world.member).post(f"{URL}/bulk", {"jobs": [ok]}, format="json")
    assert response.status_code == 201, response.content
    assert [j.serve for j in Job.objects.order_by("id")] == [
        {"health_path": "/h", "metrics_path": "/metrics"}
    ] * 2
    bad = body(world, workload_type="training", serve={"health_path": "/h"})
    response = api(world.member).post(f"{URL}/bulk", {"jobs": [body(world), bad]}, format="json")
    assert response.status_code == 400, response.content
    assert "jobs[1].serve" in response.json()["errors"]
    assert Job.objects.count() == 2


def test_service_refuses_serve_on_training(world):
    with pytest.raises(BusinessError) as caught:
        job_submit_bulk(
            user=world.member,
            specs=[spec(world, workload_type=WorkloadType.TRAINING, serve={"health_path": "/"})],
        )
    assert "jobs[0].serve" in caught.value.errors
