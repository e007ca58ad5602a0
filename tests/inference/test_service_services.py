"""service_create / update / pause / resume / delete: who may, what is checked, what is
audited, what makes a new spec version."""

import pytest

from audit.models import AuditEvent
from inference.choices import ServiceState
from inference.models import Service
from inference.services import (
    ServiceSpec,
    service_create,
    service_delete,
    service_pause,
    service_resume,
    service_update,
)
from portal.errors import BusinessError, NotFoundError, PermissionDeniedError
from scheduling.choices import JobState
from tests.inference.factories import replica, set_job

pytestmark = pytest.mark.usefixtures("dispatch_requests")


def _spec(world, serving, **overrides):
    values = {
        "project": world.project,
        "queue": serving.queue,
        "name": "chat",
        "command": ["python", "-m", "server"],
        "min_replicas": 1,
        "max_replicas": 3,
    }
    values.update(overrides)
    return ServiceSpec(**values)


@pytest.mark.parametrize("who", ["platform_admin", "tenant_admin", "member"])
def test_writers_create_and_it_is_audited(world, serving, who):
    user = getattr(world, who)
    service = service_create(user=user, spec=_spec(world, serving))
    assert service.tenant == world.tenant and service.created_by == user
    assert service.spec_version == 1 and service.state == ServiceState.ACTIVE
    event = AuditEvent.objects.get(action="service.create")
    assert event.actor == user and event.tenant == world.tenant
    assert event.after["max_replicas"] == 3 and event.after["queue"] == "nlp/serve"


def test_viewer_gets_403_and_outsider_404(world, serving):
    with pytest.raises(PermissionDeniedError):
        service_create(user=world.viewer, spec=_spec(world, serving))
    with pytest.raises(NotFoundError):
        service_create(user=world.outsider, spec=_spec(world, serving))
    assert not Service.objects.exists()


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"min_replicas": 5, "max_replicas": 2}, "min_replicas"),
        ({"min_replicas": 0}, "min_replicas"),  # 0 needs scale to zero
        ({"scale_to_zero": True, "min_replicas": 1}, "min_replicas"),
        ({"target_running_per_replica": 0}, "target_running_per_replica"),
        ({"panic_window_s": 60, "stable_window_s": 60}, "panic_window_s"),
        ({"panic_threshold": 1.0}, "panic_threshold"),
        ({"error_rate_max": 1.5}, "error_rate_max"),
        ({"gpu_util_max": 0}, "gpu_util_max"),
        ({"health_path": "health"}, "health_path"),
        ({"gpus_per_node": 9}, "gpus_per_node"),  # larger than any node of the pool
        ({"gpu_models": ["H100-80GB"]}, "gpu_models"),  # not in the inference pool
        ({"env": {"SLUICE_X": "1"}}, "env"),
        ({"command": "python server.py"}, "command"),
    ],
)
def test_bad_input_names_the_field(world, serving, overrides, field):
    with pytest.raises(BusinessError) as err:
        service_create(user=world.member, spec=_spec(world, serving, **overrides))
    assert err.value.status_code == 400
    assert field in err.value.errors, err.value.errors


def test_the_queue_must_take_inference(world, serving):
    world.queue.allowed_workload_types = ["training"]
    world.queue.save()
    with pytest.raises(BusinessError) as err:
        service_create(user=world.member, spec=_spec(world, serving, queue=world.queue))
    assert "queue" in err.value.errors


def test_names_are_unique_per_project_until_deleted(world, serving):
    first = service_create(user=world.member, spec=_spec(world, serving))
    with pytest.raises(BusinessError) as err:
        service_create(user=world.member, spec=_spec(world, serving))
    assert "name" in err.value.errors
    service_delete(user=world.member, service=first)
    assert service_create(user=world.member, spec=_spec(world, serving)).pk != first.pk


def test_a_spec_change_makes_a_new_version_a_scaling_change_does_not(world, serving):
    service = service_create(user=world.member, spec=_spec(world, serving))
    service = service_update(user=world.member, service=service, changes={"max_replicas": 4})
    assert (service.max_replicas, service.spec_version) == (4, 1)
    service = service_update(
        user=world.tenant_admin, service=service, changes={"env": {"MODEL": "7b"}}
    )
    assert service.spec_version == 2
    event = AuditEvent.objects.filter(action="service.update").latest("id")
    assert event.before == {"env": {}} and event.after["spec_version"] == 2
    # nothing changed: nothing written
    count = AuditEvent.objects.count()
    service_update(user=world.member, service=service, changes={"env": {"MODEL": "7b"}})
    assert AuditEvent.objects.count() == count


def test_update_checks_the_combined_values(world, serving):
    service = service_create(user=world.member, spec=_spec(world, serving))
    with pytest.raises(BusinessError) as err:
        service_update(user=world.member, service=service, changes={"min_replicas": 4})
    assert "min_replicas" in err.value.errors
    with pytest.raises(PermissionDeniedError):
        service_update(user=world.viewer, service=service, changes={"max_replicas": 4})
    with pytest.raises(NotFoundError):
        service_update(user=world.outsider, service=service, changes={"max_replicas": 4})


def test_pause_resume_delete(world, serving, service):
    running = replica(service, state=JobState.RUNNING, ready=True)
    with pytest.raises(PermissionDeniedError):
        service_pause(user=world.viewer, service=service)
    service = service_pause(user=world.member, service=service, reason="maintenance")
    assert service.state == ServiceState.PAUSED
    assert AuditEvent.objects.get(action="service.pause").reason == "maintenance"
    service = service_resume(user=world.member, service=service)
    assert service.state == ServiceState.ACTIVE
    service_delete(user=world.tenant_admin, service=service)
    service.refresh_from_db()
    assert service.state == ServiceState.DELETED
    assert set_job(running).state == JobState.STOPPING  # its replicas are cancelled at once
    running.refresh_from_db()
    assert running.retired_at is not None
    with pytest.raises(NotFoundError):
        service_update(user=world.member, service=service, changes={"max_replicas": 2})
