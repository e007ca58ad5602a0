"""The launch message carries how long the job may run (``runtime_limit_seconds``), from
which Slurm and Kubernetes pools set a backstop limit of their own."""

import pytest

from scheduling.agent import protocol
from scheduling.models import WorkloadPolicy
from scheduling.services.dispatch import dispatch_cycle
from tests import factories as f


def _launch_fields(**extra):
    return protocol.launch_message(
        job_id=1, attempt=0, name="j", command=["true"], gpu_indices=[0], **extra
    )


def test_dispatch_sends_the_runtime_limit_and_the_extensions_granted_at_once(
    world, outbox, django_capture_on_commit_callbacks
):
    WorkloadPolicy.objects.filter(workload_type="training").update(extension_cap_seconds=600)
    job = f.JobFactory(
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        gpus_per_node=1,
        base_priority_class=world.normal,
        priority_class=world.normal,
        max_runtime_seconds=5400,
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert dispatch_cycle()["placed"] == 1
    [message] = [m for _, m in outbox if m["type"] == "launch" and m["job_id"] == job.pk]
    assert message["runtime_limit_seconds"] == 5400 + 600


def test_a_launch_without_a_runtime_limit_is_still_valid():
    message = _launch_fields()
    assert "runtime_limit_seconds" not in message
    assert protocol.validate_control_message(message) is message


@pytest.mark.parametrize("value", [0, -5, 1.5, "3600", True])
def test_a_runtime_limit_that_is_not_a_positive_integer_is_refused(value):
    with pytest.raises(protocol.ProtocolError, match="runtime_limit_seconds"):
        _launch_fields(runtime_limit_seconds=value)


def test_a_null_runtime_limit_means_none():
    message = _launch_fields()
    message["runtime_limit_seconds"] = None
    assert protocol.validate_control_message(message)["runtime_limit_seconds"] is None


# --- an extension granted while the job holds GPUs raises the executors' backstop ---------


def test_an_approved_extension_tells_the_job_nodes_its_new_limit(
    world, outbox, django_capture_on_commit_callbacks
):
    from scheduling.services.limits import runtime_extension_approve, runtime_extension_request
    from tests.scheduling.limits_helpers import placed

    WorkloadPolicy.objects.filter(workload_type="training").update(
        extension_cap_seconds=600, stop_grace_seconds=45
    )
    job = placed(world, max_runtime_seconds=3600)
    outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        extension = runtime_extension_request(
            user=world.member, job=job, seconds=1800, reason="one more epoch"
        )  # beyond the cap: waits for an approver, nothing sent
    assert outbox == []
    with django_capture_on_commit_callbacks(execute=True):
        runtime_extension_approve(extension=extension, user=world.tenant_admin, comment="ok")
    [(node, message)] = outbox
    assert node == world.nodes[0].name
    assert message["type"] == "extend" and message["job_id"] == job.pk
    assert message["attempt"] == job.attempt
    assert message["runtime_limit_seconds"] == 3600 + 1800 + 600
    assert message["grace_seconds"] == 45


def test_an_extension_of_a_waiting_job_sends_nothing(
    world, outbox, django_capture_on_commit_callbacks
):
    from scheduling.choices import JobState
    from scheduling.services.limits import runtime_extension_request

    WorkloadPolicy.objects.filter(workload_type="training").update(extension_cap_seconds=3600)
    job = f.JobFactory(
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        state=JobState.PENDING,
        max_runtime_seconds=3600,
    )
    outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        runtime_extension_request(user=world.member, job=job, seconds=600, reason="longer")
    assert outbox == []


@pytest.mark.parametrize("value", [0, -1, None, "60"])
def test_an_extend_message_needs_a_positive_limit(value):
    message = {
        "type": "extend",
        "job_id": 1,
        "attempt": 0,
        "runtime_limit_seconds": value,
        "grace_seconds": 30,
        "sent_at": 0.0,
    }
    with pytest.raises(protocol.ProtocolError, match="runtime_limit_seconds"):
        protocol.validate_control_message(message)
