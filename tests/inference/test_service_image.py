"""A service's replicas may run a container image: validated like a job's, refused with a
field error where the queue's pool cannot run images, carried to every replica job, and a
change of image is a new spec version."""

import pytest

from inference.models import Service
from inference.services import service_reconcile, service_update
from scheduling.choices import ExecutorKind
from scheduling.models import Job

pytestmark = pytest.mark.usefixtures("dispatch_requests")

URL = "/api/v1/services/"
IMAGE = "registry.example.com/team/server:1.0"


def _body(world, serving, **overrides):
    return {
        "project": world.project.pk,
        "queue": serving.queue.pk,
        "name": "chat",
        "command": ["python", "-m", "server"],
        **overrides,
    }


def _runs_images(serving):
    pool = serving.queue.pool
    pool.executor = ExecutorKind.KUBERNETES
    pool.save()


def test_an_image_on_an_agent_pool_is_a_400_naming_the_field(api, world, serving):
    response = api(world.member).post(URL, _body(world, serving, image=IMAGE), format="json")
    assert response.status_code == 400, response.content
    data = response.json()
    assert data["code"] == "image_not_supported"
    assert "cannot run container images" in " ".join(data["errors"]["image"])
    assert not Service.objects.exists()


def test_a_malformed_image_is_a_400_naming_the_field(api, world, serving):
    _runs_images(serving)
    response = api(world.member).post(
        URL, _body(world, serving, image="Not An Image"), format="json"
    )
    assert response.status_code == 400
    assert "image" in response.json()["errors"]


def test_the_replicas_carry_the_image_and_a_new_image_is_a_new_version(api, world, serving):
    _runs_images(serving)
    body = _body(world, serving, image=IMAGE, image_pull_policy="Always")
    response = api(world.member).post(URL, body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["image"] == IMAGE
    service = Service.objects.get()
    Service.objects.filter(pk=service.pk).update(desired_replicas=1)
    service.refresh_from_db()
    result = service_reconcile(service=service)
    job = Job.objects.get(pk=result.submitted[0])
    assert (job.image, job.image_pull_policy) == (IMAGE, "Always")

    updated = service_update(
        user=world.member, service=service, changes={"image": IMAGE.replace("1.0", "1.1")}
    )
    assert updated.spec_version == service.spec_version + 1
