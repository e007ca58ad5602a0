"""The what-if page: a platform admin replays the recorded jobs with changed quotas or
classes (the Celery task runs eagerly here); everybody else is refused."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from portal.errors import PermissionDeniedError
from scheduling.choices import JobState, SimulationState
from scheduling.models import Quota, SimulationRun
from scheduling.services import whatif
from tests import factories as f

pytestmark = pytest.mark.django_db


@pytest.fixture
def history(world):
    """Finished jobs of both tenants over the last hours, enough to queue on 16 GPUs."""
    now = timezone.now()
    jobs = []
    for number in range(24):
        other = number % 3 == 0
        submitted = now - timezone.timedelta(hours=10) + timezone.timedelta(minutes=5 * number)
        started = submitted + timezone.timedelta(minutes=1)
        jobs.append(
            f.JobFactory(
                queue=world.other_queue if other else world.queue,
                project=world.other_project if other else world.project,
                submitted_by=world.outsider if other else world.member,
                state=JobState.SUCCEEDED,
                gpus_per_node=8 if number % 4 == 0 else 2,
                submitted_at=submitted,
                admitted_at=started,
                started_at=started,
                finished_at=started + timezone.timedelta(minutes=40),
                max_runtime_seconds=3600,
            )
        )
    return jobs


def _form_data(world, **changes):
    data = {"days": 30, "policy": "sluice"}
    for quota in Quota.objects.all():
        data[f"quota_{quota.pk}_guaranteed"] = quota.guaranteed_gpus
        data[f"quota_{quota.pk}_borrow"] = quota.borrow_limit_gpus
    data.update(changes)
    return data


def test_platform_admin_runs_a_what_if_and_sees_both_replays(
    client, world, history, django_capture_on_commit_callbacks
):
    client.force_login(world.platform_admin)
    nlp_quota = Quota.objects.get(tenant=world.tenant)
    assert client.get(reverse("simulate")).status_code == 200

    data = _form_data(world, **{f"quota_{nlp_quota.pk}_guaranteed": 16, "class_vision": "low"})
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(reverse("simulate"), data)

    run = SimulationRun.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("simulate-run", args=[run.pk])
    assert run.state == SimulationState.DONE, run.error
    assert run.progress == 100 and run.finished_at is not None
    assert run.params["quotas"] == {str(nlp_quota.pk): {"guaranteed": 16, "borrow_limit": 8}}
    assert run.params["classes"] == {"vision": "low"}
    result = run.result
    assert result["jobs"] == 24 and result["gpus"] == 16
    nlp = next(row for row in result["comparison"] if row["tenant"] == "nlp")
    assert (nlp["guaranteed_before"], nlp["guaranteed_after"]) == (8, 16)
    assert result["baseline"]["summary"]["completed"] == 24

    page = client.get(reverse("simulate-run", args=[run.pk]))
    assert page.status_code == 200
    assert b"Per tenant" in page.content and b"nlp" in page.content
    assert b"guaranteed 8 -&gt; 16" in page.content
    status = client.get(reverse("simulate-run-status", args=[run.pk]))
    assert b"hx-trigger" not in status.content  # finished: no more polling


def test_a_running_simulation_is_polled_every_two_seconds(client, world):
    run = SimulationRun.objects.create(
        created_by=world.platform_admin,
        params={"days": 30},
        created_at=timezone.now(),
        state=SimulationState.RUNNING,
        progress=40,
    )
    client.force_login(world.platform_admin)

    response = client.get(reverse("simulate-run-status", args=[run.pk]))

    assert b'hx-trigger="every 2s"' in response.content
    assert b"40 %" in response.content


def test_a_what_if_without_history_fails_with_a_reason(
    client, world, django_capture_on_commit_callbacks
):
    client.force_login(world.platform_admin)
    with django_capture_on_commit_callbacks(execute=True):
        client.post(reverse("simulate"), _form_data(world))

    run = SimulationRun.objects.get()
    assert run.state == SimulationState.FAILED
    assert "No finished job" in run.error


@pytest.mark.parametrize("who", ["tenant_admin", "member", "viewer", "outsider"])
def test_others_are_refused(client, world, who):
    run = SimulationRun.objects.create(
        created_by=world.platform_admin, params={}, created_at=timezone.now()
    )
    client.force_login(getattr(world, who))

    assert client.get(reverse("simulate")).status_code == 403
    assert client.post(reverse("simulate"), _form_data(world)).status_code == 403
    assert client.get(reverse("simulate-run", args=[run.pk])).status_code == 404
    assert client.get(reverse("simulate-run-status", args=[run.pk])).status_code == 404
    assert SimulationRun.objects.count() == 1


def test_anonymous_users_are_sent_to_log_in(client):
    response = client.get(reverse("simulate"))

    assert response.status_code == 302 and "login" in response["Location"]


def test_only_platform_admins_may_queue_a_run(world):
    with pytest.raises(PermissionDeniedError):
        whatif.simulation_run_create(user=world.tenant_admin, params={})
    assert not SimulationRun.objects.exists()


def test_bad_parameters_are_refused(world):
    with pytest.raises(whatif.BusinessError, match="Unknown priority class"):
        whatif.clean_params({"classes": {"nlp": "urgent"}})
    with pytest.raises(whatif.BusinessError, match="No quota"):
        whatif.clean_params({"quotas": {"999": {"guaranteed": 1, "borrow_limit": 1}}})
    with pytest.raises(whatif.BusinessError, match="between 1 and"):
        whatif.clean_params({"days": 1000})


def test_the_demo_has_a_history_the_what_if_page_replays(
    client, django_capture_on_commit_callbacks
):
    import io

    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from scheduling.models import Job

    call_command("seed_demo", stdout=io.StringIO())
    call_command("seed_demo", stdout=io.StringIO())  # the history is added once
    finished = Job.objects.filter(name__startswith="demo-history-")
    assert finished.count() == 160
    assert all(job.finished_at > job.started_at >= job.submitted_at for job in finished)

    client.force_login(get_user_model().objects.get(username="admin"))
    vision = Quota.objects.get(tenant__slug="vision", pool__name="training")
    data = {"days": 30, "policy": "sluice"}
    for quota in Quota.objects.all():
        data[f"quota_{quota.pk}_guaranteed"] = quota.guaranteed_gpus
        data[f"quota_{quota.pk}_borrow"] = quota.borrow_limit_gpus
    data[f"quota_{vision.pk}_guaranteed"] = 4
    with django_capture_on_commit_callbacks(execute=True):
        client.post(reverse("simulate"), data)

    run = SimulationRun.objects.get()
    assert run.state == SimulationState.DONE, run.error
    # The history, and the demo's other jobs of the past days (failed, preempted, …) that ran.
    ran = Job.objects.filter(
        started_at__isnull=False,
        finished_at__isnull=False,
        submitted_at__gte=timezone.now() - timedelta(days=30),
    )
    assert run.result["jobs"] == ran.count() >= 160
    assert run.result["baseline"]["summary"]["completed"] == ran.count()
    page = client.get(reverse("simulate-run", args=[run.pk]))
    assert page.status_code == 200 and b"vision" in page.content
