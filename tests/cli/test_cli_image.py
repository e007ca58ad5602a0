"""`sluice submit --image` (and the image fields of spec files): carried to the API, shown
by `sluice show`, and refused with the API's field error on a pool that cannot run images."""

import pytest

from scheduling.choices import ExecutorKind
from scheduling.models import Job

IMAGE = "registry.example.com/team/train:1.0"


@pytest.fixture
def member_key(world, token_of):
    return token_of(world.member)


def test_submit_with_an_image_on_a_kubernetes_pool(world, sluice, member_key):
    world.pool.executor = ExecutorKind.KUBERNETES
    world.pool.save()
    run = sluice(
        "submit", "-q", "train", "--image", IMAGE, "--image-pull-policy", "IfNotPresent",
        "--image-pull-secret", "creds", "--quiet", "--", "python", "train.py",
        token=member_key,
    )  # fmt: skip
    assert run.code == 0, run.err
    job = Job.objects.get()
    assert (job.image, job.image_pull_policy, job.image_pull_secret) == (
        IMAGE,
        "IfNotPresent",
        "creds",
    )
    shown = sluice("show", str(job.pk), token=member_key)
    assert f"{IMAGE} (pull IfNotPresent)" in shown.out


def test_an_image_from_a_spec_file(world, sluice, member_key, tmp_path):
    world.pool.executor = ExecutorKind.KUBERNETES
    world.pool.save()
    spec = tmp_path / "job.yaml"
    spec.write_text(f"queue: train\ncommand: [python, eval.py]\nimage: {IMAGE}\n")
    run = sluice("submit", "-f", spec, "--quiet", token=member_key)
    assert run.code == 0, run.err
    assert Job.objects.get().image == IMAGE


def test_an_image_on_an_agent_pool_is_refused_naming_the_field(world, sluice, member_key):
    run = sluice("submit", "-q", "train", "--image", IMAGE, "--", "true", token=member_key)
    assert run.code != 0
    assert "image" in run.err and "cannot run container images" in run.err
    assert not Job.objects.exists()
