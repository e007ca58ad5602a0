"""Container images in the job spec: validated, stored, shown, carried in the launch
message, and refused with a field error on a pool whose executor cannot run images."""

import pytest

from portal.errors import BusinessError
from scheduling.choices import ContainerRuntime, ExecutorKind
from scheduling.models import Job
from scheduling.services.dispatch import launch_messages
from scheduling.services.jobs import JobSpec, job_submit
from tests.scheduling.test_job_submit import body, refused

URL = "/api/v1/jobs"
IMAGE = "registry.example.com/team/train:2.1"


@pytest.fixture
def nothing_stored():
    """Asserts, after the test, that no job was stored."""
    yield
    assert Job.objects.count() == 0


def _pool_runs(world, executor, container_runtime=""):
    world.pool.executor = executor
    world.pool.container_runtime = container_runtime
    world.pool.save()


def _errors(data, field):
    return " ".join(m for key, ms in data["errors"].items() if key == field for m in ms)


def test_an_agent_pool_refuses_an_image_with_a_field_error(world, api, nothing_stored):
    data = refused(api, world.member, body(world, image=IMAGE))
    assert data["code"] == "image_not_supported"
    assert "node agent" in _errors(data, "image")
    assert "cannot run container images" in _errors(data, "image")


def test_a_slurm_pool_runs_images_only_with_pyxis(world, api):
    _pool_runs(world, ExecutorKind.SLURM)
    data = refused(api, world.member, body(world, image=IMAGE))
    assert "pyxis" in _errors(data, "image")
    _pool_runs(world, ExecutorKind.SLURM, ContainerRuntime.PYXIS)
    response = api(world.member).post(URL, body(world, image=IMAGE), format="json")
    assert response.status_code == 201, response.content
    assert Job.objects.get(pk=response.json()["id"]).image == IMAGE


def test_a_kubernetes_pool_stores_shows_and_launches_the_image(world, api):
    _pool_runs(world, ExecutorKind.KUBERNETES)
    digest = "registry.example.com:5000/team/train@sha256:" + "a" * 64
    payload = body(
        world, image=digest, image_pull_policy="IfNotPresent", image_pull_secret="team-registry"
    )
    response = api(world.member).post(URL, payload, format="json")
    assert response.status_code == 201, response.content
    answer = api(world.member).get(f"{URL}/{response.json()['id']}").json()
    assert answer["image"] == digest
    assert answer["image_pull_policy"] == "IfNotPresent"
    assert answer["image_pull_secret"] == "team-registry"
    job = Job.objects.get(pk=answer["id"])
    [(node, message)] = launch_messages(job, {"gpu-01": [(0, "GPU-0")]}, None, "sluice-nlp")
    assert message["image"] == digest
    assert message["image_pull_policy"] == "IfNotPresent"
    assert message["image_pull_secret"] == "team-registry"


def test_a_job_without_an_image_launches_without_image_fields(world):
    job = job_submit(
        user=world.member,
        spec=JobSpec(
            queue=world.queue,
            project=world.project,
            name="",
            workload_type="training",
            command=["python", "train.py"],
        ),
    )
    [(_, message)] = launch_messages(job, {"gpu-01": [(0, "GPU-0")]}, None, "sluice-nlp")
    assert "image" not in message


@pytest.mark.parametrize(
    ("overrides", "field", "fragment"),
    [
        ({"image": "Registry.example.com/UPPER/img"}, "image", "not an image reference"),
        ({"image": "img:tag with space"}, "image", "not an image reference"),
        ({"image": "img@sha256:xyz"}, "image", "not an image reference"),
        ({"image": "team//img"}, "image", "not an image reference"),
        ({"image": "r.example.com/" + "a" * 250}, "image", ""),
        ({"image": IMAGE, "image_pull_policy": "Sometimes"}, "image_pull_policy", ""),
        ({"image": IMAGE, "image_pull_secret": "Not_A_Name"}, "image_pull_secret", "secret"),
        ({"image_pull_policy": "Always"}, "image_pull_policy", "needs an image"),
        ({"image_pull_secret": "creds"}, "image_pull_secret", "needs an image"),
    ],
)
def test_malformed_image_fields_are_a_400_naming_the_field(
    world, api, nothing_stored, overrides, field, fragment
):
    _pool_runs(world, ExecutorKind.KUBERNETES)
    data = refused(api, world.member, body(world, **overrides))
    assert field in data["errors"], data
    assert fragment in _errors(data, field)


@pytest.mark.parametrize(
    "image",
    [
        "ubuntu",
        "ubuntu:22.04",
        "nvcr.io/nvidia/pytorch:24.01-py3",
        "localhost:5000/a/b/c",
        "team/img@sha256:" + "0123456789abcdef" * 4,
        "team/img:v1@sha256:" + "0123456789abcdef" * 4,
    ],
)
def test_well_formed_references_are_accepted(world, image):
    _pool_runs(world, ExecutorKind.KUBERNETES)
    job = job_submit(
        user=world.member,
        spec=JobSpec(
            queue=world.queue,
            project=world.project,
            name="",
            workload_type="training",
            command=["x"],
            image=image,
        ),
    )
    assert job.image == image


def test_the_service_refuses_an_image_on_an_agent_pool(world):
    with pytest.raises(BusinessError) as caught:
        job_submit(
            user=world.member,
            spec=JobSpec(
                queue=world.queue,
                project=world.project,
                name="",
                workload_type="training",
                command=["x"],
                image=IMAGE,
            ),
        )
    assert "image" in caught.value.errors and caught.value.code == "image_not_supported"
