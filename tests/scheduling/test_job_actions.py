"""Cancel, hold and release (``/api/v1/jobs/{id}/cancel|hold|release``) and their rights."""

import pytest

from audit.models import AuditEvent
from portal.errors import BusinessError, NotFoundError, PermissionDeniedError
from scheduling.choices import JobState, StopReason
from scheduling.models import JobEvent
from scheduling.services.jobs import job_cancel, job_hold, job_release
from tests import factories as f


@pytest.fixture
def job(world):
    """A pending job of the member."""
    return f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)


@pytest.fixture
def running(world):
    """A running job of the member holding two GPUs of gpu-01."""
    gpus = list(world.nodes[0].gpus.order_by("index")[:2])
    return f.placed_job(
        gpus=gpus, queue=world.queue, project=world.project, submitted_by=world.member
    )


def post(api, user, job, step, **data):
    return api(user).post(f"/api/v1/jobs/{job.pk}/{step}", data, format="json")


def test_owner_cancels_a_pending_job(world, api, job, dispatch_requests):
    response = post(api, world.member, job, "cancel")

    assert response.status_code == 200, response.json()
    assert response.json()["state"] == "CANCELLED"
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert job.finished_at is not None
    event = JobEvent.objects.get(job=job)
    assert event.kind == "cancelled"
    assert event.actor == world.member
    assert not AuditEvent.objects.exists()  # the owner's own step is not audited


def test_tenant_admin_cancel_is_audited_with_the_reason(world, api, job, dispatch_requests):
    response = post(api, world.tenant_admin, job, "cancel", reason="blocking the demo")

    assert response.status_code == 200
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    audit = AuditEvent.objects.get()
    assert audit.action == "job.cancel"
    assert audit.actor == world.tenant_admin
    assert audit.tenant == world.tenant
    assert audit.before == {"state": "PENDING"}
    assert audit.after == {"state": "CANCELLED"}
    assert audit.reason == "blocking the demo"
    assert "blocking the demo" in JobEvent.objects.get(job=job).message


def test_platform_admin_may_cancel_any_job(world, api, job, dispatch_requests):
    assert post(api, world.platform_admin, job, "cancel").status_code == 200
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert AuditEvent.objects.get().action == "job.cancel"


@pytest.mark.parametrize("step", ["cancel", "hold", "release"])
@pytest.mark.parametrize(("who", "status"), [("viewer", 403), ("outsider", 404)])
def test_viewer_and_outsider_cannot_act(world, api, job, step, who, status):
    if step == "release":
        job.state = JobState.HELD
        job.save()
    before = job.state

    response = post(api, getattr(world, who), job, step)

    assert response.status_code == status
    job.refresh_from_db()
    assert job.state == before
    assert not JobEvent.objects.exists()
    assert not AuditEvent.objects.exists()


@pytest.mark.parametrize("step", ["cancel", "hold", "release"])
def test_another_member_cannot_act_on_someone_elses_job(world, api, job, step):
    colleague = f.UserFactory(username="colleague")
    f.MembershipFactory(user=colleague, tenant=world.tenant, role="member")
    if step == "release":
        job.state = JobState.HELD
        job.save()
    before = job.state

    response = post(api, colleague, job, step)

    assert response.status_code == 403
    assert "owner or a tenant admin" in response.json()["detail"]
    job.refresh_from_db()
    assert job.state == before
    assert not JobEvent.objects.exists()


def test_cancel_of_a_running_job_stops_it_on_its_node(
    world, api, running, outbox, dispatch_requests, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = post(api, world.member, running, "cancel")

    assert response.status_code == 200
    running.refresh_from_db()
    assert running.state == JobState.STOPPING
    assert running.stop_reason == StopReason.CANCELLED
    assert running.stop_requested_at is not None
    event = JobEvent.objects.get(job=running)
    assert event.kind == "stop_cancelled"
    assert event.data["grace_seconds"] == 5  # the training policy's grace
    assert len(outbox) == 1
    node, message = outbox[0]
    assert node == "gpu-01"
    assert message["type"] == "stop"
    assert message["job_id"] == running.pk
    assert message["reason"] == "cancelled"
    assert message["grace_seconds"] == 5
    assert message["attempt"] == 0
    # the GPUs stay allocated until the node reports the exit
    assert running.allocations.filter(released_at__isnull=True).count() == 2


def test_no_stop_message_leaves_when_the_transaction_rolls_back(
    world, running, outbox, dispatch_requests, django_capture_on_commit_callbacks
):
    from django.db import transaction

    with (
        django_capture_on_commit_callbacks(execute=True) as callbacks,
        pytest.raises(RuntimeError),
        transaction.atomic(),
    ):
        job_cancel(user=world.member, job=running)
        raise RuntimeError("rolled back")

    assert callbacks == []
    assert outbox == []
    running.refresh_from_db()
    assert running.state == JobState.RUNNING


def test_multi_node_job_gets_one_stop_message_per_node(
    world, outbox, dispatch_requests, django_capture_on_commit_callbacks
):
    gpus = [world.nodes[0].gpus.get(index=0), world.nodes[1].gpus.get(index=0)]
    job = f.placed_job(
        gpus=gpus, queue=world.queue, project=world.project, submitted_by=world.member
    )

    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(user=world.member, job=job)

    assert sorted(node for node, _ in outbox) == ["gpu-01", "gpu-02"]


def test_cancel_of_an_admitted_job_also_stops_it(
    world, outbox, dispatch_requests, django_capture_on_commit_callbacks
):
    job = f.placed_job(
        gpus=[world.nodes[0].gpus.get(index=3)],
        state=JobState.ADMITTED,
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
    )

    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(user=world.member, job=job)

    job.refresh_from_db()
    assert job.state == JobState.STOPPING
    assert [m["type"] for _, m in outbox] == ["stop"]


def test_cancel_of_a_stopping_job_only_notes_the_request(world, running, outbox):
    running.state = JobState.STOPPING
    running.save()

    job_cancel(user=world.member, job=running)

    running.refresh_from_db()
    assert running.state == JobState.STOPPING
    assert JobEvent.objects.get().kind == "cancel_requested"


@pytest.mark.parametrize("state", [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED])
def test_cancel_of_an_ended_job_is_a_400(world, api, job, state):
    job.state = state
    job.save()

    response = post(api, world.member, job, "cancel")

    assert response.status_code == 400
    assert "already ended" in response.json()["detail"]
    job.refresh_from_db()
    assert job.state == state
    assert not JobEvent.objects.exists()


def test_hold_and_release_by_the_owner(
    world, api, job, dispatch_requests, django_capture_on_commit_callbacks
):
    held = post(api, world.member, job, "hold", reason="wait for data")

    assert held.status_code == 200
    job.refresh_from_db()
    assert job.state == JobState.HELD
    assert job.pending_reason_code == "HELD"

    with django_capture_on_commit_callbacks(execute=True):
        released = post(api, world.member, job, "release")

    assert released.status_code == 200
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert job.pending_reason_code == ""
    assert list(JobEvent.objects.values_list("kind", flat=True)) == ["held", "released"]
    assert not AuditEvent.objects.exists()
    assert dispatch_requests == [1]  # a release asks the scheduler to look again


def test_hold_and_release_by_a_tenant_admin_are_audited(world, api, job, dispatch_requests):
    post(api, world.tenant_admin, job, "hold")
    post(api, world.tenant_admin, job, "release")

    actions = list(AuditEvent.objects.order_by("id").values_list("action", "before", "after"))
    assert actions == [
        ("job.hold", {"state": "PENDING"}, {"state": "HELD"}),
        ("job.release", {"state": "HELD"}, {"state": "PENDING"}),
    ]


def test_hold_of_a_running_job_is_a_400(world, api, running):
    response = post(api, world.member, running, "hold")

    assert response.status_code == 400
    assert "state" in response.json()["errors"]
    running.refresh_from_db()
    assert running.state == JobState.RUNNING


def test_release_of_a_pending_job_is_a_400(world, api, job):
    response = post(api, world.member, job, "release")

    assert response.status_code == 400
    job.refresh_from_db()
    assert job.state == JobState.PENDING


def test_reason_must_be_short_text(world, api, job):
    response = post(api, world.member, job, "cancel", reason="r" * 1001)

    assert response.status_code == 400
    assert "reason" in response.json()["errors"]
    job.refresh_from_db()
    assert job.state == JobState.PENDING


def test_services_enforce_the_same_rights(world, job):
    with pytest.raises(NotFoundError):
        job_cancel(user=world.outsider, job=job)
    with pytest.raises(PermissionDeniedError):
        job_hold(user=world.viewer, job=job)
    with pytest.raises(BusinessError):
        job_release(user=world.member, job=job)
    job.refresh_from_db()
    assert job.state == JobState.PENDING


def test_events_endpoint_lists_the_timeline(world, api, job, dispatch_requests):
    post(api, world.member, job, "hold")
    post(api, world.member, job, "release")

    response = api(world.viewer).get(f"/api/v1/jobs/{job.pk}/events")

    assert response.status_code == 200
    rows = response.json()["results"]
    assert [r["kind"] for r in rows] == ["held", "released"]
    assert rows[0]["actor"] == "nlp-member"
    assert api(world.outsider).get(f"/api/v1/jobs/{job.pk}/events").status_code == 404


def test_logs_endpoint_returns_the_tail(world, api, job, settings, tmp_path):
    settings.SLUICE_LOG_DIR = tmp_path
    path = tmp_path / str(job.pk) / "attempt-0.log"
    path.parent.mkdir(parents=True)
    path.write_text("line 1\nline 2\n")

    response = api(world.member).get(f"/api/v1/jobs/{job.pk}/logs", {"tail": 7})

    assert response.status_code == 200
    data = response.json()
    assert data["text"] == "line 2\n"
    assert data["size"] == 14
    assert data["truncated"] is True
    assert data["running"] is False


def test_logs_of_a_job_without_output(world, api, job, settings, tmp_path):
    settings.SLUICE_LOG_DIR = tmp_path  # other tests' jobs may have had the same id

    response = api(world.member).get(f"/api/v1/jobs/{job.pk}/logs")

    assert response.status_code == 200
    assert response.json()["text"] == ""


def test_logs_with_bad_tail_is_a_400(world, api, job):
    response = api(world.member).get(f"/api/v1/jobs/{job.pk}/logs", {"tail": "end"})

    assert response.status_code == 400
    assert api(world.outsider).get(f"/api/v1/jobs/{job.pk}/logs").status_code == 404
