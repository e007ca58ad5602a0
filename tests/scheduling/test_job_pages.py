"""The submit form, my jobs, the job page and its buttons."""

import pytest

from audit.models import AuditEvent
from scheduling.choices import JobState
from scheduling.models import Job, JobEvent, Queue
from tests import factories as f


@pytest.fixture
def member_client(world, client):
    client.force_login(world.member)
    return client


def form(world, **overrides) -> dict:
    return {
        "project": world.project.pk,
        "queue": world.queue.pk,
        "name": "from-the-form",
        "workload_type": "training",
        "gpu_model": "",
        "gpus_per_node": 2,
        "nodes": 1,
        "max_runtime_seconds": "",
        "priority_class": "",
        "command": "python train.py --epochs 3 --note 'two words'",
        "env": "EPOCHS=3\nWANDB_MODE=offline",
        **overrides,
    }


def test_submit_form_lists_only_the_users_projects_and_queues(world, member_client):
    response = member_client.get("/jobs/new/")

    form_ = response.context["form"]
    assert list(form_.fields["project"].queryset) == [world.project]
    assert list(form_.fields["queue"].queryset) == [world.queue]


def test_good_form_creates_a_job_and_shows_its_page(world, member_client, dispatch_requests):
    response = member_client.post("/jobs/new/", form(world), follow=True)

    job = Job.objects.get()
    assert response.redirect_chain == [(f"/jobs/{job.pk}/", 302)]
    assert job.state == JobState.PENDING
    assert job.submitted_by == world.member
    assert job.command == ["python", "train.py", "--epochs", "3", "--note", "two words"]
    assert job.env == {"EPOCHS": "3", "WANDB_MODE": "offline"}
    assert job.gpus_per_node == 2
    assert job.max_runtime_seconds == 3600
    assert JobEvent.objects.get(job=job).kind == "submitted"
    assert AuditEvent.objects.get().action == "job.submit"
    body = response.content.decode()
    assert f"Job {job.pk} submitted." in body
    assert "from-the-form" in body
    assert 'id="job-state">PENDING' in body


def test_shell_command_is_kept_as_one_string(world, member_client, dispatch_requests):
    member_client.post("/jobs/new/", form(world, command="echo a | wc -c", shell="on"))

    job = Job.objects.get()
    assert (job.shell, job.command) == (True, ["echo a | wc -c"])


@pytest.mark.parametrize(
    ("overrides", "field", "fragment"),
    [
        ({"command": ""}, "command", "required"),
        ({"command": "python 'unclosed"}, "command", "cannot be split"),
        ({"env": "NOEQUALS"}, "env", "not NAME=value"),
        ({"env": "SLUICE_JOB_ID=1"}, "env", "set by Sluice"),
        ({"env": "1BAD=x"}, "env", "not a valid environment variable name"),
        ({"gpus_per_node": 9}, "gpus_per_node", "at most 8"),
        ({"gpus_per_node": "two"}, "gpus_per_node", "whole number"),
        ({"gpu_model": "B200"}, "gpu_model", "H100-80GB"),
        ({"max_runtime_seconds": 10**9}, "max_runtime_seconds", "maximum"),
        ({"workload_type": "mining"}, "workload_type", "valid choice"),
        ({"queue": 999999}, "queue", "valid choice"),
        ({"name": "n" * 121}, "name", "at most 120"),
    ],
)
def test_bad_form_input_shows_field_errors_and_stores_nothing(
    world, member_client, overrides, field, fragment
):
    response = member_client.post("/jobs/new/", form(world, **overrides))

    assert response.status_code == 200
    errors = response.context["form"].errors
    assert field in errors, errors
    assert fragment in " ".join(errors[field])
    assert 'class="errors"' in response.content.decode()
    assert not Job.objects.exists()
    assert not JobEvent.objects.exists()


def test_priority_above_the_self_service_maximum_is_a_form_error(world, member_client):
    response = member_client.post("/jobs/new/", form(world, priority_class=world.high.pk))

    assert "priority raise" in " ".join(response.context["form"].errors["priority_class"])
    assert not Job.objects.exists()


def test_closed_queue_is_a_form_error(world, member_client):
    Queue.objects.filter(pk=world.queue.pk).update(state="closed")

    response = member_client.post("/jobs/new/", form(world))

    assert "takes no new jobs" in " ".join(response.context["form"].errors["queue"])


def test_viewer_gets_a_form_error_not_a_403_page(world, client):
    client.force_login(world.viewer)

    response = client.post("/jobs/new/", form(world))

    assert response.status_code == 200
    assert "Viewers cannot submit" in response.content.decode()
    assert not Job.objects.exists()


def test_other_tenants_queue_is_not_a_choice(world, member_client):
    response = member_client.post("/jobs/new/", form(world, queue=world.other_queue.pk))

    assert "queue" in response.context["form"].errors
    assert not Job.objects.exists()


def test_preview_shows_how_the_job_would_run(world, member_client):
    response = member_client.post("/jobs/new/preview", form(world))

    assert response.status_code == 200
    assert "Would run as guaranteed" in response.content.decode()
    assert not Job.objects.exists()


def test_preview_shows_the_reason_a_job_is_refused(world, member_client):
    response = member_client.post("/jobs/new/preview", form(world, gpus_per_node=9))

    assert "at most 8" in response.content.decode()


def test_my_jobs_shows_my_jobs_only_by_default(world, member_client):
    mine = f.JobFactory(
        queue=world.queue, project=world.project, submitted_by=world.member, name="mine-1"
    )
    f.JobFactory(
        queue=world.queue, project=world.project, submitted_by=world.tenant_admin, name="theirs-1"
    )

    body = member_client.get("/jobs/").content.decode()

    assert f"/jobs/{mine.pk}/" in body
    assert "mine-1" in body
    assert "theirs-1" not in body
    assert "theirs-1" in member_client.get("/jobs/?mine=").content.decode()


def test_job_list_filters(world, member_client):
    own = {"queue": world.queue, "project": world.project, "submitted_by": world.member}
    f.JobFactory(name="alpha", state=JobState.FAILED, **own)
    f.JobFactory(name="beta", state=JobState.PENDING, **own)

    by_state = member_client.get("/jobs/", {"mine": "on", "state": "FAILED"}).content.decode()
    by_name = member_client.get("/jobs/", {"mine": "on", "q": "bet"}).content.decode()

    assert "alpha" in by_state and "beta" not in by_state
    assert "beta" in by_name and "alpha" not in by_name


def test_job_page_shows_reason_position_and_buttons(world, member_client):
    own = {"queue": world.queue, "project": world.project, "submitted_by": world.member}
    # Positions are counted from the sort keys of the waiting jobs (scheduling.positions):
    # one job of the queue ahead, and three of another queue of the same pool.
    f.JobFactory(pending_rank=1.0, **own)
    other = f.QueueFactory(tenant=world.tenant, name="other-q", pool=world.pool)
    for rank in (0.5, 2.0, 3.0):
        f.JobFactory(queue=other, project=world.project, pending_rank=rank)
    f.JobFactory(pending_rank=9.0, **own)
    job = f.JobFactory(
        pending_reason_code="WAITING_FOR_QUOTA",
        pending_reason_message="nlp uses 8/8 guaranteed",
        pending_rank=5.0,
        **own,
    )

    body = member_client.get(f"/jobs/{job.pk}/").content.decode()

    assert "WAITING_FOR_QUOTA" in body
    assert "nlp uses 8/8 guaranteed" in body
    assert "<strong>#2</strong> in its queue" in body
    assert "<strong>#5</strong> in pool" in body
    assert 'id="cancel-job"' in body


def test_job_page_of_someone_else_has_no_buttons_for_a_member(world, client):
    job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.tenant_admin)
    client.force_login(world.member)

    body = client.get(f"/jobs/{job.pk}/").content.decode()

    assert 'id="cancel-job"' not in body


def test_cancel_button(world, member_client, dispatch_requests):
    job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)

    response = member_client.post(f"/jobs/{job.pk}/cancel", follow=True)

    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert f"Job {job.pk}: cancel done." in response.content.decode()


def test_hold_by_another_member_shows_an_error(world, client):
    job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.tenant_admin)
    client.force_login(world.member)

    response = client.post(f"/jobs/{job.pk}/hold", follow=True)

    assert "Only the job&#x27;s owner or a tenant admin" in response.content.decode()
    job.refresh_from_db()
    assert job.state == JobState.PENDING


def test_unknown_step_is_404(world, member_client):
    job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)

    assert member_client.post(f"/jobs/{job.pk}/explode").status_code == 404


def test_outsider_cannot_act_on_the_page(world, client):
    job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
    client.force_login(world.outsider)

    assert client.post(f"/jobs/{job.pk}/cancel").status_code == 404
    job.refresh_from_db()
    assert job.state == JobState.PENDING


def test_job_log_fragment_shows_the_output(world, member_client, settings, tmp_path):
    settings.SLUICE_LOG_DIR = tmp_path
    job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
    (tmp_path / str(job.pk)).mkdir()
    (tmp_path / str(job.pk) / "attempt-0.log").write_text("epoch 1 loss 0.5\n")

    body = member_client.get(f"/jobs/{job.pk}/log").content.decode()

    assert "epoch 1 loss 0.5" in body
