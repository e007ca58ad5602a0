"""Container images on the pages: the submit form refuses an image on an agent pool with a
field error and takes one on a Kubernetes pool; the job page shows it; the nodes page says
which executor runs each pool and what it enforces."""

import pytest

from scheduling.choices import ExecutorKind
from scheduling.models import Job, Node
from tests.scheduling.test_job_pages import form

IMAGE = "registry.example.com/team/train:1.0"


@pytest.fixture
def member_client(world, client):
    client.force_login(world.member)
    return client


def test_the_form_refuses_an_image_on_an_agent_pool_with_a_field_error(world, member_client):
    response = member_client.post("/jobs/new/", form(world, image=IMAGE))
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert "image" in errors and "cannot run container images" in errors["image"][0]
    assert not Job.objects.exists()


def test_the_form_submits_an_image_and_the_job_page_shows_it(world, member_client):
    world.pool.executor = ExecutorKind.KUBERNETES
    world.pool.save()
    payload = form(world, image=IMAGE, image_pull_policy="Always", image_pull_secret="creds")
    response = member_client.post("/jobs/new/", payload, follow=True)
    assert response.status_code == 200
    job = Job.objects.get()
    assert (job.image, job.image_pull_policy, job.image_pull_secret) == (IMAGE, "Always", "creds")
    page = member_client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="job-image"' in page and IMAGE in page and "pull Always" in page
    # "Submit again with changes" keeps the image.
    again = member_client.get(f"/jobs/new/?from={job.pk}")
    assert again.context["form"].initial["image"] == IMAGE


def test_the_form_names_a_bad_pull_policy(world, member_client):
    response = member_client.post(
        "/jobs/new/", form(world, image=IMAGE, image_pull_policy="Sometimes")
    )
    assert "image_pull_policy" in response.context["form"].errors


def test_the_nodes_page_says_which_executor_runs_each_pool(world, member_client):
    Node.objects.filter(name="gpu-01").update(labels={"topology": "nvlink-a"})
    page = member_client.get("/nodes/").content.decode()
    assert 'id="pool-executors"' in page
    assert 'id="executor-training"' in page
    assert "Node agent" in page and "(not registered)" in page
    assert "CUDA_VISIBLE_DEVICES only" in page
    assert "topology=nvlink-a" in page
