"""Runtime extensions: granted at once within the policy's cap, otherwise approved or
rejected by a tenant admin or platform admin, never by the requester."""

from datetime import timedelta

import pytest
from freezegun import freeze_time

from portal.errors import BusinessError, NotFoundError, PermissionDeniedError
from scheduling.choices import ExtensionState, JobState, NotificationKind
from scheduling.services.limits import (
    runtime_extension_approve,
    runtime_extension_reject,
    runtime_extension_request,
    runtime_limits_check,
)
from tests import factories as f
from tests.scheduling.limits_helpers import T0, audits, notes, placed


@pytest.fixture
def capped(world):
    """The training policy grants up to 1 h of extensions at once."""
    return f.policy("training", extension_cap_seconds=3600)


def _ask(world, job, seconds, user=None):
    return runtime_extension_request(
        user=user or world.member, job=job, seconds=seconds, reason="one more epoch"
    )


def _ext_audits(action, extension):
    return [
        a
        for a in audits(action)
        if a.target_type == "scheduling.runtimeextension" and a.target_id == str(extension.pk)
    ]


def test_within_the_cap_it_is_granted_at_once(world, capped):
    job = placed(world, max_runtime_seconds=7200)
    first = _ask(world, job, 1800)
    second = _ask(world, job, 1800)
    job.refresh_from_db()
    assert (first.state, second.state) == (ExtensionState.AUTO_GRANTED,) * 2
    assert first.decided_by is None and first.decided_at is not None
    assert job.max_runtime_seconds == 7200 + 3600
    [event, _] = job.events.filter(kind="runtime_extended").order_by("id")
    assert "2 h → 2 h 30 min" in event.message and event.actor == world.member
    [audit] = _ext_audits("runtime_extension.auto_grant", first)
    assert audit.actor == world.member and audit.after["max_runtime_seconds"] == 9000
    assert not notes(world.tenant_admin, NotificationKind.EXTENSION_REQUESTED)


def test_beyond_the_cap_it_waits_and_the_admins_are_asked(world, capped):
    job = placed(world, max_runtime_seconds=7200)
    _ask(world, job, 3000)
    extension = _ask(world, job, 1200)  # 3000 + 1200 > 3600
    job.refresh_from_db()
    assert extension.state == ExtensionState.PENDING
    assert job.max_runtime_seconds == 7200 + 3000
    [note] = notes(world.tenant_admin, NotificationKind.EXTENSION_REQUESTED)
    assert note.link == "/approvals/extensions/" and "20 min more" in note.message
    assert not notes(world.member, NotificationKind.EXTENSION_REQUESTED)
    assert len(_ext_audits("runtime_extension.request", extension)) == 1
    assert job.events.filter(kind="extension_requested").count() == 1


def test_approval_adds_the_time_and_resets_warnings_that_no_longer_apply(world):
    with freeze_time(T0) as clock:
        job = placed(world, max_runtime_seconds=1000)
        clock.move_to(T0 + timedelta(seconds=960))
        runtime_limits_check()
        job.refresh_from_db()
        assert job.runtime_warnings_sent == [0.8, 0.95]
        extension = _ask(world, job, 200)  # cap 0: needs an approval
        runtime_extension_approve(extension=extension, user=world.tenant_admin, comment="ok")
    job.refresh_from_db()
    extension.refresh_from_db()
    assert extension.state == ExtensionState.APPROVED and extension.decided_by == world.tenant_admin
    assert job.max_runtime_seconds == 1200
    assert job.runtime_warnings_sent == [0.8]  # 960 s is 80 % of 1200 s, not yet 95 %
    [note] = notes(world.member, NotificationKind.EXTENSION_APPROVED)
    assert "09:20:00" in note.message and "Comment: ok" in note.message
    assert len(_ext_audits("runtime_extension.approve", extension)) == 1
    with freeze_time(T0 + timedelta(seconds=1140)):
        runtime_limits_check()
    job.refresh_from_db()
    assert job.runtime_warnings_sent == [0.8, 0.95] and job.state == JobState.RUNNING


def test_rejection_leaves_the_limit_and_tells_the_requester(world):
    job = placed(world, max_runtime_seconds=1000)
    extension = _ask(world, job, 600)
    runtime_extension_reject(extension=extension, user=world.platform_admin, comment="no")
    job.refresh_from_db()
    extension.refresh_from_db()
    assert extension.state == ExtensionState.REJECTED and job.max_runtime_seconds == 1000
    [note] = notes(world.member, NotificationKind.EXTENSION_REJECTED)
    assert "Comment: no" in note.message
    assert len(_ext_audits("runtime_extension.reject", extension)) == 1
    with pytest.raises(BusinessError, match="only pending"):
        runtime_extension_approve(extension=extension, user=world.tenant_admin)


def test_nobody_approves_their_own_request(world):
    job = placed(world, max_runtime_seconds=1000, user=world.tenant_admin)
    extension = _ask(world, job, 600, user=world.tenant_admin)
    # The requester is the tenant's only admin: the platform admins are asked.
    assert notes(world.platform_admin, NotificationKind.EXTENSION_REQUESTED)
    with pytest.raises(PermissionDeniedError, match="your own"):
        runtime_extension_approve(extension=extension, user=world.tenant_admin)
    with pytest.raises(PermissionDeniedError, match="your own"):
        runtime_extension_reject(extension=extension, user=world.tenant_admin)
    runtime_extension_approve(extension=extension, user=world.platform_admin)
    job.refresh_from_db()
    assert job.max_runtime_seconds == 1600


def test_members_and_outsiders_do_not_decide(world):
    job = placed(world, max_runtime_seconds=1000)
    extension = _ask(world, job, 600)
    other_member = f.UserFactory(username="nlp-member-2")
    f.MembershipFactory(user=other_member, tenant=world.tenant, role="member")
    for user in (other_member, world.viewer, world.outsider):
        with pytest.raises(PermissionDeniedError):
            runtime_extension_approve(extension=extension, user=user)
    extension.refresh_from_db()
    assert extension.state == ExtensionState.PENDING


def test_who_may_ask(world):
    job = placed(world, max_runtime_seconds=1000)
    with pytest.raises(NotFoundError):
        _ask(world, job, 60, user=world.outsider)
    with pytest.raises(PermissionDeniedError, match="Viewers"):
        _ask(world, job, 60, user=world.viewer)
    other_member = f.UserFactory(username="nlp-member-2")
    f.MembershipFactory(user=other_member, tenant=world.tenant, role="member")
    with pytest.raises(PermissionDeniedError, match="owner or a tenant admin"):
        _ask(world, job, 60, user=other_member)
    assert _ask(world, job, 60, user=world.tenant_admin).state == ExtensionState.PENDING


def test_refusals(world, capped):
    with freeze_time(T0) as clock:
        job = placed(world, max_runtime_seconds=100)
        with pytest.raises(BusinessError, match="Say why"):
            runtime_extension_request(user=world.member, job=job, seconds=60, reason=" ")
        with pytest.raises(BusinessError, match="between 1 s"):
            _ask(world, job, 0)
        pending = _ask(world, job, 4000)
        with pytest.raises(BusinessError, match=f"pending extension request \\(#{pending.pk}\\)"):
            _ask(world, job, 60)
        runtime_extension_reject(extension=pending, user=world.tenant_admin)
        clock.move_to(T0 + timedelta(seconds=100))
        with pytest.raises(BusinessError, match="reached its runtime limit"):
            _ask(world, job, 60)
    ended = placed(world, state=JobState.SUCCEEDED, node=1)
    with pytest.raises(BusinessError, match="only waiting or running"):
        _ask(world, ended, 60)


def test_a_pending_request_cannot_be_approved_once_the_job_ended(world):
    job = placed(world, max_runtime_seconds=1000)
    extension = _ask(world, job, 600)
    job.state = JobState.TIMED_OUT
    job.save(update_fields=["state"])
    with pytest.raises(BusinessError, match="can no longer be extended"):
        runtime_extension_approve(extension=extension, user=world.tenant_admin)


# --- API -------------------------------------------------------------------------------------


def test_api_ask_list_and_decide(world, api, capped):
    job = placed(world, max_runtime_seconds=1000)
    url = f"/api/v1/jobs/{job.pk}/extensions"
    response = api(world.member).post(url, {"seconds": 600, "reason": "eval"}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["state"] == "auto_granted"
    response = api(world.member).post(url, {"seconds": 7200, "reason": "eval"}, format="json")
    pending = response.json()
    assert response.status_code == 201 and pending["state"] == "pending"
    listed = api(world.viewer).get(url).json()
    assert [e["id"] for e in listed["results"]] == [pending["id"], pending["id"] - 1]
    decidable = api(world.tenant_admin).get("/api/v1/runtime-extensions?decidable=true").json()
    assert [e["id"] for e in decidable["results"]] == [pending["id"]]
    assert api(world.member).get("/api/v1/runtime-extensions?decidable=true").json()["count"] == 0
    step = f"/api/v1/runtime-extensions/{pending['id']}/approve"
    assert api(world.member).post(step, {}, format="json").status_code == 403
    response = api(world.tenant_admin).post(step, {"comment": "fine"}, format="json")
    assert response.status_code == 200 and response.json()["state"] == "approved"
    assert response.json()["decided_by"] == world.tenant_admin.username
    job.refresh_from_db()
    assert job.max_runtime_seconds == 1000 + 600 + 7200


def test_api_permissions(world, api):
    job = placed(world, max_runtime_seconds=1000)
    extension = _ask(world, job, 600)
    url = f"/api/v1/jobs/{job.pk}/extensions"
    body = {"seconds": 60, "reason": "x"}
    assert api(world.outsider).get(url).status_code == 404
    assert api(world.outsider).post(url, body, format="json").status_code == 404
    assert api(world.viewer).post(url, body, format="json").status_code == 403
    assert api().get(url).status_code == 401
    step = f"/api/v1/runtime-extensions/{extension.pk}/reject"
    assert api(world.outsider).post(step, {}, format="json").status_code == 404
    assert api(world.viewer).post(step, {}, format="json").status_code == 403
    assert api(world.outsider).get(f"/api/v1/runtime-extensions/{extension.pk}").status_code == 404
    response = api(world.member).post(url, {"seconds": 0, "reason": "x"}, format="json")
    assert response.status_code == 400 and "seconds" in response.json()["errors"]


# --- pages -----------------------------------------------------------------------------------


def test_job_page_extends_and_shows_pending_extensions(world, client):
    job = placed(world, max_runtime_seconds=1000)
    client.force_login(world.member)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="extension-form"' in page and 'id="time-left"' in page
    response = client.post(
        f"/jobs/{job.pk}/extensions/", {"minutes": 30, "reason": "almost done"}, follow=True
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert "requested; the admins were told" in page
    assert "Pending" in page and 'id="extension-form"' not in page  # one pending at a time


def test_extension_approvals_page(world, client):
    job = placed(world, max_runtime_seconds=1000)
    extension = _ask(world, job, 600)
    client.force_login(world.member)
    assert client.get("/approvals/extensions/").status_code == 403
    client.force_login(world.tenant_admin)
    page = client.get("/approvals/extensions/").content.decode()
    assert f'id="extension-{extension.pk}"' in page and "one more epoch" in page
    response = client.post(
        f"/runtime-extensions/{extension.pk}/approve", {"comment": "go"}, follow=True
    )
    assert "approved" in response.content.decode()
    extension.refresh_from_db()
    assert extension.state == ExtensionState.APPROVED
    client.force_login(world.outsider)
    assert client.post(f"/runtime-extensions/{extension.pk}/reject").status_code == 404


def test_an_extension_decision_goes_back_to_a_page_of_this_site_only(world, client):
    """The approvals page's steps are the raises' (portal.steps): an unknown step is a 404,
    a ``next`` of this site is followed and one elsewhere is not."""
    job = placed(world, max_runtime_seconds=1000)
    first = _ask(world, job, 600)
    client.force_login(world.tenant_admin)
    assert client.post(f"/runtime-extensions/{first.pk}/extend-forever").status_code == 404
    response = client.post(
        f"/runtime-extensions/{first.pk}/reject", {"next": "https://evil.example/"}
    )
    assert response["Location"] == "/approvals/extensions/"
    first.refresh_from_db()
    assert first.state == ExtensionState.REJECTED
    second = _ask(world, job, 600)
    response = client.post(f"/runtime-extensions/{second.pk}/approve", {"next": f"/jobs/{job.pk}/"})
    assert response["Location"] == f"/jobs/{job.pk}/"
    second.refresh_from_db()
    assert second.state == ExtensionState.APPROVED
