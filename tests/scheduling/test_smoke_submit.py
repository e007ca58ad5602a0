from scheduling.choices import JobState
from scheduling.models import Job


def test_member_submits_job_through_api(world, api):
    body = {"project": world.project.pk, "queue": world.queue.pk, "workload_type": "training",
            "command": ["python", "-c", "print(1)"], "gpus_per_node": 2}
    response = api(world.member).post("/api/v1/jobs", body, format="json")
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert job.state in (JobState.PENDING, JobState.ADMITTED)
