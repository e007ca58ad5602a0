"""Pages: the raise panel of the job page, the approvals inbox, notifications."""

import pytest
from django.test import Client

from scheduling.choices import JobState, RaiseState
from scheduling.models import Job, Notification, PriorityRaise
from scheduling.services import raises
from tests import factories as f
from tests.raise_helpers import ask


@pytest.fixture
def job(member_job):
    return member_job


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


# --- the job page ----------------------------------------------------------------------------


def test_owner_sees_the_request_form_with_only_higher_classes(world, ceiling, job):
    page = client_for(world.member).get(f"/jobs/{job.pk}/").content.decode()

    assert 'id="raise-form"' in page
    assert f'action="/jobs/{job.pk}/raise/"' in page
    form = page[page.index('id="raise-form"') :]
    assert ">high</option>" in form and ">urgent</option>" in form
    assert ">low</option>" not in form and ">normal</option>" not in form


@pytest.mark.parametrize("who", ["viewer", "colleague"])
def test_no_form_for_users_who_may_not_manage_the_job(world, ceiling, job, who):
    user = world.viewer
    if who == "colleague":
        user = f.UserFactory(username="nlp-colleague")
        f.MembershipFactory(user=user, tenant=world.tenant, role="member")

    page = client_for(user).get(f"/jobs/{job.pk}/").content.decode()

    assert 'id="raises"' in page
    assert 'id="raise-form"' not in page


def test_no_form_for_an_ended_job(world, ceiling, job):
    Job.objects.filter(pk=job.pk).update(state=JobState.FAILED)

    page = client_for(world.member).get(f"/jobs/{job.pk}/").content.decode()

    assert 'id="raise-form"' not in page


def test_requesting_from_the_page(world, ceiling, job):
    response = client_for(world.member).post(
        f"/jobs/{job.pk}/raise/", {"to_class": world.high.pk, "reason": "demo", "hours": "2"}
    )

    assert response.status_code == 302
    assert response["Location"] == f"/jobs/{job.pk}/"
    raise_ = PriorityRaise.objects.get()
    assert (raise_.to_class, raise_.hours, raise_.requested_by) == (world.high, 2.0, world.member)
    page = client_for(world.member).get(f"/jobs/{job.pk}/").content.decode()
    assert f'id="raise-{raise_.pk}"' in page
    assert "Cancel request" in page


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"reason": ""}, "This field is required."),
        ({"hours": "0"}, "hours must be more than 0."),
        ({"to_class": "low"}, "Select a valid choice."),
    ],
)
def test_errors_are_shown_on_the_form(world, ceiling, job, data, message):
    body = {"to_class": world.high.pk, "reason": "demo", **data}
    if body["to_class"] == "low":
        body["to_class"] = world.low.pk

    response = client_for(world.member).post(f"/jobs/{job.pk}/raise/", body)

    assert response.status_code == 200
    assert message in response.content.decode()
    assert not PriorityRaise.objects.exists()


def test_viewer_posting_a_request_sees_the_refusal(world, ceiling, job):
    response = client_for(world.viewer).post(
        f"/jobs/{job.pk}/raise/", {"to_class": world.high.pk, "reason": "demo"}
    )

    assert "Viewers cannot request priority raises." in response.content.decode()
    assert not PriorityRaise.objects.exists()


def test_outsider_gets_404_for_the_raise_page(world, ceiling, job):
    assert client_for(world.outsider).get(f"/jobs/{job.pk}/raise/").status_code == 404


def test_requester_cancels_from_the_job_page(world, ceiling, job):
    raise_ = ask(world, job)

    response = client_for(world.member).post(
        f"/raises/{raise_.pk}/cancel", {"next": f"/jobs/{job.pk}/"}
    )

    assert response["Location"] == f"/jobs/{job.pk}/"
    assert PriorityRaise.objects.get(pk=raise_.pk).state == RaiseState.CANCELLED


# --- the approvals inbox ---------------------------------------------------------------------


def test_inbox_lists_what_the_user_may_decide(world, ceiling, urgent, job):
    within = ask(world, job)
    other = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
    above = ask(world, other, urgent)
    own_job = f.JobFactory(
        queue=world.queue, project=world.project, submitted_by=world.tenant_admin
    )
    own = ask(world, own_job, user=world.tenant_admin)

    admin_page = client_for(world.tenant_admin).get("/approvals/").content.decode()
    root_page = client_for(world.platform_admin).get("/approvals/").content.decode()

    assert f'id="raise-{within.pk}"' in admin_page
    assert f'id="raise-{above.pk}"' not in admin_page  # above nlp's ceiling
    assert f'id="raise-{own.pk}"' not in admin_page  # nobody decides their own
    for r in (within, above, own):
        assert f'id="raise-{r.pk}"' in root_page
    assert "release candidate for the demo" in admin_page
    assert "Queue position now" in admin_page  # the engine's preview


def test_members_get_403_for_the_inbox(world, ceiling):
    assert client_for(world.member).get("/approvals/").status_code == 403
    assert client_for(world.viewer).get("/approvals/").status_code == 403


def test_approve_and_reject_from_the_inbox(world, ceiling, job, dispatch_requests):
    raise_ = ask(world, job)
    client = client_for(world.tenant_admin)

    response = client.post(f"/raises/{raise_.pk}/approve", {"comment": "fine"})

    assert response["Location"] == "/approvals/"
    raise_.refresh_from_db()
    job.refresh_from_db()
    assert (raise_.state, raise_.comment) == (RaiseState.APPROVED, "fine")
    assert job.priority_class == world.high
    page = client.get("/approvals/").content.decode()
    assert f'id="grant-{raise_.pk}"' in page  # now an active grant, revocable here
    second = ask(
        world, f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
    )
    client.post(f"/raises/{second.pk}/reject", {"comment": "no"})
    assert PriorityRaise.objects.get(pk=second.pk).state == RaiseState.REJECTED


def test_self_approval_from_the_page_is_refused_with_a_message(world, ceiling):
    own_job = f.JobFactory(
        queue=world.queue, project=world.project, submitted_by=world.tenant_admin
    )
    raise_ = ask(world, own_job, user=world.tenant_admin)
    client = client_for(world.tenant_admin)

    response = client.post(f"/raises/{raise_.pk}/approve", follow=True)

    assert "your own raise request" in response.content.decode()
    assert PriorityRaise.objects.get(pk=raise_.pk).state == RaiseState.PENDING


def test_outsider_posting_a_decision_gets_404(world, ceiling, job):
    raise_ = ask(world, job)

    assert client_for(world.outsider).post(f"/raises/{raise_.pk}/approve").status_code == 404
    assert client_for(world.tenant_admin).post(f"/raises/{raise_.pk}/explode").status_code == 404


def test_the_next_url_must_be_local(world, ceiling, job):
    raise_ = ask(world, job)

    response = client_for(world.member).post(
        f"/raises/{raise_.pk}/cancel", {"next": "https://evil.example/"}
    )

    assert response["Location"] == "/approvals/"


# --- notifications ---------------------------------------------------------------------------


def test_unread_count_in_the_top_bar_and_mark_read(world, ceiling, job):
    raise_ = ask(world, job)
    raises.priority_raise_reject(raise_=raise_, user=world.tenant_admin)
    raises.priority_raise_approve(raise_=ask(world, job), user=world.tenant_admin)
    client = client_for(world.member)

    page = client.get("/notifications/").content.decode()
    assert '<span class="badge unread" id="nav-unread">2</span>' in page
    assert "rejected by nlp-admin" in page
    first, second = Notification.objects.filter(user=world.member).order_by("id")

    response = client.post(f"/notifications/{first.pk}/read", {"open": "1"})
    assert response["Location"] == f"/jobs/{job.pk}/"
    assert '<span class="badge unread" id="nav-unread">1</span>' in client.get("/").content.decode()

    client.post("/notifications/read-all")
    assert 'id="nav-unread"' not in client.get("/").content.decode()
    second.refresh_from_db()
    assert second.read_at is not None


def test_others_notifications_are_404(world, ceiling, job):
    ask(world, job)
    note = Notification.objects.get(user=world.tenant_admin)

    assert client_for(world.member).post(f"/notifications/{note.pk}/read").status_code == 404
    note.refresh_from_db()
    assert note.read_at is None


def test_no_second_request_form_while_one_waits(world, ceiling, job):
    ask(world, job)

    for user in (world.member, world.tenant_admin):
        page = client_for(user).get(f"/jobs/{job.pk}/").content.decode()
        assert 'id="raise-form"' not in page
        assert "waits for a decision" in page


def test_ceiling_set_in_the_django_admin_is_audited_like_the_api(world, urgent):
    from audit.models import AuditEvent
    from scheduling.models import TenantRaiseCeiling

    client = client_for(world.platform_admin)
    response = client.post(
        "/admin/scheduling/tenantraiseceiling/add/",
        {"tenant": world.tenant.pk, "ceiling": world.high.pk},
    )

    assert response.status_code == 302, response.content.decode()[:2000]
    assert TenantRaiseCeiling.objects.get(tenant=world.tenant).ceiling == world.high
    audit = AuditEvent.objects.get(action="tenant.raise_ceiling")
    assert (audit.before, audit.after) == ({"ceiling": None}, {"ceiling": "high"})
