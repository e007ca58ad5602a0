"""Priority raises (scheduling.services.raises): request, decide, expire, revoke, project windows."""

from datetime import UTC, datetime, timedelta

import pytest
from django.core import mail
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction
from freezegun import freeze_time

from audit.models import AuditEvent
from portal.errors import BusinessError, NotFoundError, PermissionDeniedError
from scheduling.choices import JobState, NotificationKind, RaiseState
from scheduling.models import Job, JobEvent, Notification, PriorityRaise
from scheduling.positions import positions_attach
from scheduling.services import raises
from scheduling.services.jobs import JobSpec, job_submit, job_submit_bulk
from scheduling.services.sweeps import CHECKS, control_sweep
from tests import factories as f
from tests.audit_helpers import tamper
from tests.raise_helpers import ask

T0 = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


@pytest.fixture
def job(member_job):
    return member_job


def audit_rows(action):
    return list(AuditEvent.objects.filter(action=action))


def job_kinds(job):
    return list(JobEvent.objects.filter(job=job).values_list("kind", flat=True))


# --- request ---------------------------------------------------------------------------------


def test_member_request_is_stored_audited_and_sent_to_the_tenant_admins(world, ceiling, job):
    raise_ = ask(world, job, hours=3)

    raise_.refresh_from_db()
    assert raise_.state == RaiseState.PENDING
    assert (raise_.tenant, raise_.from_class, raise_.to_class) == (
        world.tenant,
        world.normal,
        world.high,
    )
    assert raise_.requested_by == world.member
    [audit] = audit_rows("priority_raise.request")
    assert audit.actor == world.member
    assert audit.tenant == world.tenant
    assert audit.target_type == "scheduling.priorityraise"
    assert audit.target_id == str(raise_.pk)
    assert audit.before is None
    assert audit.after["state"] == "pending"
    assert audit.after["to_class"] == "high"
    assert audit.after["from_class"] == "normal"
    assert audit.reason == "release candidate for the demo"
    assert job_kinds(job) == ["raise_requested"]
    # Within the ceiling: the tenant's admins are asked, not the platform admins.
    notified = Notification.objects.filter(kind=NotificationKind.RAISE_REQUESTED)
    assert [n.user for n in notified] == [world.tenant_admin]
    assert notified[0].priority_raise == raise_
    assert notified[0].link == "/approvals/"
    job.refresh_from_db()
    assert job.priority_class == world.normal  # nothing changes before approval


def test_request_above_the_ceiling_goes_to_platform_admins(world, ceiling, urgent, job):
    ask(world, job, urgent)

    notified = Notification.objects.filter(kind=NotificationKind.RAISE_REQUESTED)
    assert [n.user for n in notified] == [world.platform_admin]


def test_without_a_ceiling_every_request_goes_to_platform_admins(world, job):
    ask(world, job)

    assert [n.user for n in Notification.objects.all()] == [world.platform_admin]


def test_request_mails_the_approvers_on_commit_when_mail_is_enabled(
    world, ceiling, job, settings, django_capture_on_commit_callbacks
):
    settings.SLUICE_MAIL_ENABLED = True
    with django_capture_on_commit_callbacks(execute=True):
        ask(world, job)

    assert [m.to for m in mail.outbox] == [[world.tenant_admin.email]]
    assert "asks for class high" in mail.outbox[0].subject


def test_no_mail_when_mail_is_disabled(
    world, ceiling, job, settings, django_capture_on_commit_callbacks
):
    settings.SLUICE_MAIL_ENABLED = False
    with django_capture_on_commit_callbacks(execute=True):
        ask(world, job)

    assert mail.outbox == []
    assert Notification.objects.count() == 1  # in-app always


@pytest.mark.parametrize(
    ("change", "field", "code"),
    [
        ({"to_class": "low"}, "to_class", "not_above"),
        ({"to_class": "normal"}, "to_class", "not_above"),
        ({"reason": "   "}, "reason", "invalid"),
        ({"hours": 0}, "hours", "invalid"),
        ({"hours": -2}, "hours", "invalid"),
        ({"window_end": T0}, "window_start", "invalid"),
    ],
)
def test_bad_requests_are_refused_with_the_field_named(world, job, change, field, code):
    if "to_class" in change:
        change["to_class"] = getattr(world, change["to_class"])
    with pytest.raises(BusinessError) as exc:
        ask(world, job, **change)

    assert exc.value.status_code == 400
    assert exc.value.code == code
    assert field in exc.value.errors
    assert not PriorityRaise.objects.exists()
    assert not AuditEvent.objects.exists()


def test_an_ended_job_cannot_be_raised(world, job):
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED)
    job.refresh_from_db()

    with pytest.raises(BusinessError) as exc:
        ask(world, job)

    assert exc.value.code == "job_not_raisable"


def test_a_second_pending_request_for_the_same_job_is_refused(world, job):
    first = ask(world, job)

    with pytest.raises(BusinessError) as exc:
        ask(world, job)

    assert exc.value.code == "duplicate"
    assert f"#{first.pk}" in exc.value.message


def test_viewer_gets_403_and_outsider_404_and_other_members_job_403(world, job):
    with pytest.raises(PermissionDeniedError):
        ask(world, job, user=world.viewer)
    with pytest.raises(NotFoundError):
        ask(world, job, user=world.outsider)
    colleague = f.UserFactory(username="nlp-colleague")
    f.MembershipFactory(user=colleague, tenant=world.tenant, role="member")
    with pytest.raises(PermissionDeniedError, match="owner or a tenant admin"):
        ask(world, job, user=colleague)
    assert not PriorityRaise.objects.exists()


def test_tenant_admin_may_request_for_a_members_job(world, job):
    raise_ = ask(world, job, user=world.tenant_admin)

    assert raise_.requested_by == world.tenant_admin


# --- approve ---------------------------------------------------------------------------------


def test_tenant_admin_approves_within_the_ceiling(
    world, ceiling, job, dispatch_requests, django_capture_on_commit_callbacks
):
    with freeze_time(T0):
        raise_ = ask(world, job, hours=3)
        with django_capture_on_commit_callbacks(execute=True):
            raises.priority_raise_approve(raise_=raise_, user=world.tenant_admin, comment="ok, go")

    raise_.refresh_from_db()
    job.refresh_from_db()
    assert raise_.state == RaiseState.APPROVED
    assert raise_.decided_by == world.tenant_admin
    assert raise_.decided_at == T0
    assert raise_.expires_at == T0 + timedelta(hours=3)
    assert raise_.comment == "ok, go"
    assert job.priority_class == world.high
    assert job.base_priority_class == world.normal
    assert dispatch_requests == [1]
    [audit] = audit_rows("priority_raise.approve")
    assert audit.actor == world.tenant_admin
    assert audit.before["state"] == "pending"
    assert audit.before["expires_at"] is None
    assert audit.after["state"] == "approved"
    assert audit.after["decided_by"] == "nlp-admin"
    assert audit.after["expires_at"] == (T0 + timedelta(hours=3)).isoformat()
    assert audit.after["jobs"] == [{"job": job.pk, "from": "normal", "to": "high"}]
    assert audit.reason == "ok, go"
    event = JobEvent.objects.get(job=job, kind="raise_approved")
    assert event.data == {"raise": raise_.pk, "from": "normal", "to": "high"}
    assert event.actor == world.tenant_admin
    note = Notification.objects.get(user=world.member)
    assert note.kind == NotificationKind.RAISE_APPROVED
    assert note.link == f"/jobs/{job.pk}/"
    assert "ok, go" in note.message


def test_grant_lasts_at_most_the_class_maximum(world, ceiling, urgent, job):
    with freeze_time(T0):
        raise_ = ask(world, job, urgent, hours=100)
        raises.priority_raise_approve(raise_=raise_, user=world.platform_admin)
        no_hours = ask(
            world, f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
        )
        raises.priority_raise_approve(raise_=no_hours, user=world.tenant_admin)

    raise_.refresh_from_db()
    no_hours.refresh_from_db()
    assert raise_.expires_at == T0 + timedelta(hours=4)  # urgent.max_grant_hours
    assert no_hours.expires_at == T0 + timedelta(hours=world.high.max_grant_hours)


def test_self_approval_is_refused_even_for_platform_admins(world, ceiling, job):
    own = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.tenant_admin)
    raise_ = ask(world, own, user=world.tenant_admin)

    with pytest.raises(PermissionDeniedError, match="your own raise request"):
        raises.priority_raise_approve(raise_=raise_, user=world.tenant_admin)
    root_job = f.JobFactory(
        queue=world.queue, project=world.project, submitted_by=world.platform_admin
    )
    root_raise = ask(world, root_job, user=world.platform_admin)
    with pytest.raises(PermissionDeniedError, match="your own raise request"):
        raises.priority_raise_approve(raise_=root_raise, user=world.platform_admin)

    raise_.refresh_from_db()
    own.refresh_from_db()
    assert raise_.state == RaiseState.PENDING
    assert own.priority_class == world.normal
    assert not audit_rows("priority_raise.approve")


def test_tenant_admin_above_the_ceiling_is_refused_and_a_platform_admin_approves(
    world, ceiling, urgent, job
):
    raise_ = ask(world, job, urgent)

    with pytest.raises(PermissionDeniedError, match="above nlp's ceiling high"):
        raises.priority_raise_approve(raise_=raise_, user=world.tenant_admin)
    assert PriorityRaise.objects.get(pk=raise_.pk).state == RaiseState.PENDING

    raises.priority_raise_approve(raise_=raise_, user=world.platform_admin)
    job.refresh_from_db()
    assert job.priority_class == urgent


def test_without_a_ceiling_tenant_admins_approve_nothing(world, job):
    raise_ = ask(world, job)

    with pytest.raises(PermissionDeniedError, match="no raise ceiling"):
        raises.priority_raise_approve(raise_=raise_, user=world.tenant_admin)


@pytest.mark.parametrize("who", ["member", "viewer", "outsider"])
def test_others_cannot_decide(world, ceiling, job, who):
    colleague = f.UserFactory(username="nlp-colleague")
    f.MembershipFactory(user=colleague, tenant=world.tenant, role="member")
    raise_ = ask(world, job)
    user = {"member": colleague, "viewer": world.viewer, "outsider": world.outsider}[who]

    with pytest.raises(PermissionDeniedError):
        raises.priority_raise_approve(raise_=raise_, user=user)
    with pytest.raises(PermissionDeniedError):
        raises.priority_raise_reject(raise_=raise_, user=user)


def test_approving_twice_is_a_400(world, ceiling, job):
    raise_ = ask(world, job)
    raises.priority_raise_approve(raise_=raise_, user=world.tenant_admin)

    with pytest.raises(BusinessError) as exc:
        raises.priority_raise_approve(raise_=raise_, user=world.platform_admin)

    assert exc.value.code == "wrong_state"
    assert len(audit_rows("priority_raise.approve")) == 1


def test_reject_keeps_the_class_and_tells_the_requester(world, ceiling, job):
    raise_ = ask(world, job)

    raises.priority_raise_reject(raise_=raise_, user=world.tenant_admin, comment="not now")

    raise_.refresh_from_db()
    job.refresh_from_db()
    assert raise_.state == RaiseState.REJECTED
    assert raise_.decided_by == world.tenant_admin
    assert job.priority_class == world.normal
    [audit] = audit_rows("priority_raise.reject")
    assert (audit.before["state"], audit.after["state"]) == ("pending", "rejected")
    assert audit.reason == "not now"
    assert job_kinds(job) == ["raise_requested", "raise_rejected"]
    note = Notification.objects.get(user=world.member)
    assert note.kind == NotificationKind.RAISE_REJECTED
    assert "not now" in note.message


def test_requester_cancels_a_pending_request_and_nobody_else_may(world, ceiling, job):
    raise_ = ask(world, job)
    with pytest.raises(PermissionDeniedError):
        raises.priority_raise_cancel(raise_=raise_, user=world.tenant_admin)

    raises.priority_raise_cancel(raise_=raise_, user=world.member)

    raise_.refresh_from_db()
    assert raise_.state == RaiseState.CANCELLED
    assert raise_.ended_by == world.member
    [audit] = audit_rows("priority_raise.cancel")
    assert (audit.before["state"], audit.after["state"]) == ("pending", "cancelled")
    assert job_kinds(job) == ["raise_requested", "raise_cancelled"]


# --- expiry and revoke -----------------------------------------------------------------------


def test_expiry_reverts_the_job_and_is_audited(
    world, ceiling, job, dispatch_requests, django_capture_on_commit_callbacks
):
    with freeze_time(T0):
        raise_ = ask(world, job, hours=2)
        raises.priority_raise_approve(raise_=raise_, user=world.tenant_admin)
    with freeze_time(T0 + timedelta(hours=1, minutes=59)):
        assert raises.priority_raises_expire() == {"expired": 0, "activated": 0}
    job.refresh_from_db()
    assert job.priority_class == world.high

    with (
        freeze_time(T0 + timedelta(hours=2)),
        django_capture_on_commit_callbacks(execute=True),
    ):
        result = raises.priority_raises_expire()

    assert result == {"expired": 1, "activated": 0}
    raise_.refresh_from_db()
    job.refresh_from_db()
    assert raise_.state == RaiseState.EXPIRED
    assert raise_.ended_at == T0 + timedelta(hours=2)
    assert job.priority_class == world.normal
    [audit] = audit_rows("priority_raise.expire")
    assert audit.actor is None and audit.actor_label == "system"
    assert (audit.before["state"], audit.after["state"]) == ("approved", "expired")
    assert audit.after["jobs"] == [{"job": job.pk, "from": "high", "to": "normal"}]
    assert JobEvent.objects.get(job=job, kind="raise_expired").data["to"] == "normal"
    assert (
        Notification.objects.filter(user=world.member, kind=NotificationKind.RAISE_EXPIRED).count()
        == 1
    )
    assert dispatch_requests == [1]
    # Running it again changes nothing.
    with freeze_time(T0 + timedelta(hours=3)):
        assert raises.priority_raises_expire() == {"expired": 0, "activated": 0}
    assert len(audit_rows("priority_raise.expire")) == 1


def test_expiry_runs_in_the_control_sweep(world, ceiling, job):
    assert ("raise_expiry", raises.priority_raises_expire) in CHECKS
    with freeze_time(T0):
        raise_ = ask(world, job, hours=1)
        raises.priority_raise_approve(raise_=raise_, user=world.tenant_admin)
    with freeze_time(T0 + timedelta(hours=2)):
        result = control_sweep()

    assert result["raise_expiry"]["expired"] == 1
    assert PriorityRaise.objects.get(pk=raise_.pk).state == RaiseState.EXPIRED


def test_when_a_grant_ends_the_highest_other_active_grant_applies(world, ceiling, urgent, job):
    with freeze_time(T0):
        long = ask(world, job, hours=10)
        raises.priority_raise_approve(raise_=long, user=world.tenant_admin)
        short = ask(world, job, urgent, hours=1)
        raises.priority_raise_approve(raise_=short, user=world.platform_admin)
    job.refresh_from_db()
    assert job.priority_class == urgent

    with freeze_time(T0 + timedelta(hours=1)):
        raises.priority_raises_expire()

    job.refresh_from_db()
    assert job.priority_class == world.high  # the 10-hour grant still holds
    with freeze_time(T0 + timedelta(hours=10)):
        raises.priority_raises_expire()
    job.refresh_from_db()
    assert job.priority_class == world.normal


def test_revoke_reverts_at_once(
    world, ceiling, job, dispatch_requests, django_capture_on_commit_callbacks
):
    raise_ = ask(world, job)
    raises.priority_raise_approve(raise_=raise_, user=world.tenant_admin)

    with django_capture_on_commit_callbacks(execute=True):
        raises.priority_raise_revoke(raise_=raise_, user=world.platform_admin, comment="abuse")

    raise_.refresh_from_db()
    job.refresh_from_db()
    assert raise_.state == RaiseState.REVOKED
    assert raise_.ended_by == world.platform_admin
    assert job.priority_class == world.normal
    [audit] = audit_rows("priority_raise.revoke")
    assert audit.actor == world.platform_admin
    assert (audit.before["state"], audit.after["state"]) == ("approved", "revoked")
    assert audit.after["ended_by"] == "root"
    assert audit.after["jobs"] == [{"job": job.pk, "from": "high", "to": "normal"}]
    assert audit.reason == "abuse"
    note = Notification.objects.get(user=world.member, kind=NotificationKind.RAISE_REVOKED)
    assert "abuse" in note.message
    assert dispatch_requests == [1]


def test_requester_may_give_a_grant_back_but_a_member_may_not_revoke_others(world, ceiling, job):
    raise_ = ask(world, job)
    raises.priority_raise_approve(raise_=raise_, user=world.tenant_admin)
    with pytest.raises(PermissionDeniedError):
        raises.priority_raise_revoke(raise_=raise_, user=world.viewer)

    raises.priority_raise_revoke(raise_=raise_, user=world.member)

    assert PriorityRaise.objects.get(pk=raise_.pk).state == RaiseState.REVOKED
    assert not Notification.objects.filter(kind=NotificationKind.RAISE_REVOKED).exists()


def test_a_pending_request_expires_when_its_job_ends(world, ceiling, job):
    raise_ = ask(world, job)
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED)

    assert raises.priority_raises_expire()["expired"] == 1

    raise_.refresh_from_db()
    assert raise_.state == RaiseState.EXPIRED
    [audit] = audit_rows("priority_raise.expire")
    assert (audit.before["state"], audit.after["state"]) == ("pending", "expired")
    assert "job ended" in audit.reason


# --- project windows (release pushes) ------------------------------------------------------


def submit(world, user=None, project=None):
    spec = JobSpec(
        queue=world.queue,
        project=project or world.project,
        name="push",
        workload_type="training",
        command=["python", "train.py"],
        gpus_per_node=1,
    )
    return job_submit(user=user or world.member, spec=spec)


def test_project_window_raise_covers_existing_and_new_jobs_until_the_window_ends(
    world, ceiling, dispatch_requests
):
    gpus = list(world.nodes[0].gpus.order_by("index")[:2])
    kw = {"queue": world.queue, "project": world.project, "submitted_by": world.member}
    pending = f.JobFactory(**kw)
    held = f.JobFactory(state=JobState.HELD, **kw)
    running = f.placed_job(gpus=gpus, **kw)
    finished = f.JobFactory(state=JobState.SUCCEEDED, **kw)
    other_project = f.ProjectFactory(tenant=world.tenant, slug="other")
    elsewhere = f.JobFactory(queue=world.queue, project=other_project, submitted_by=world.member)
    with freeze_time(T0):
        raise_ = raises.priority_raise_request(
            user=world.member,
            project=world.project,
            to_class=world.high,
            reason="release push",
            window_end=T0 + timedelta(hours=6),
        )
        assert raise_.window_start == T0
        assert raise_.from_class is None
        raises.priority_raise_approve(raise_=raise_, user=world.tenant_admin)
        new = submit(world)
        [bulk] = job_submit_bulk(
            user=world.member,
            specs=[
                JobSpec(
                    queue=world.queue,
                    project=world.project,
                    name="b",
                    workload_type="training",
                    command=["x"],
                )
            ],
        )
        outside = submit(world, project=other_project)

    raise_.refresh_from_db()
    assert raise_.expires_at == T0 + timedelta(hours=6)  # the window ends before 24 h
    classes = {j.pk: j.priority_class for j in Job.objects.all()}
    for raised in (pending, held, running, new, bulk):
        assert classes[raised.pk] == world.high, raised
    for untouched in (finished, elsewhere, outside):
        assert classes[untouched.pk] == world.normal, untouched
    assert Job.objects.get(pk=new.pk).base_priority_class == world.normal
    [audit] = audit_rows("priority_raise.approve")
    assert sorted(c["job"] for c in audit.after["jobs"]) == sorted(
        [pending.pk, held.pk, running.pk]
    )
    assert JobEvent.objects.filter(kind="raise_approved").count() == 3

    with freeze_time(T0 + timedelta(hours=6)):
        raises.priority_raises_expire()
        after = submit(world)

    classes = {j.pk: j.priority_class for j in Job.objects.all()}
    for reverted in (pending, held, running, new, bulk, after):
        assert classes[reverted.pk] == world.normal, reverted
    [audit] = audit_rows("priority_raise.expire")
    assert len(audit.after["jobs"]) == 5


def test_project_window_starting_later_is_applied_when_it_begins(world, ceiling):
    job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
    with freeze_time(T0):
        raise_ = raises.priority_raise_request(
            user=world.member,
            project=world.project,
            to_class=world.high,
            reason="launch day",
            window_start=T0 + timedelta(days=1),
            window_end=T0 + timedelta(days=1, hours=8),
        )
        raises.priority_raise_approve(raise_=raise_, user=world.tenant_admin)
        assert raises.priority_raises_expire() == {"expired": 0, "activated": 0}
    raise_.refresh_from_db()
    job.refresh_from_db()
    # Counted from the window's start, and ending with it.
    assert raise_.expires_at == T0 + timedelta(days=1, hours=8)
    assert job.priority_class == world.normal

    with freeze_time(T0 + timedelta(days=1, minutes=1)):
        assert raises.priority_raises_expire() == {"expired": 0, "activated": 1}
        assert raises.priority_raises_expire() == {"expired": 0, "activated": 0}

    job.refresh_from_db()
    assert job.priority_class == world.high
    [audit] = audit_rows("priority_raise.activate")
    assert audit.after["jobs"] == [{"job": job.pk, "from": "normal", "to": "high"}]


@pytest.mark.parametrize(
    ("window", "field"),
    [
        ({"window_end": None}, "window_end"),
        (
            {"window_start": T0 + timedelta(hours=2), "window_end": T0 + timedelta(hours=1)},
            "window_end",
        ),
        ({"window_end": T0 - timedelta(hours=1)}, "window_end"),
    ],
)
def test_bad_project_windows_are_refused(world, window, field):
    with freeze_time(T0), pytest.raises(BusinessError) as exc:
        raises.priority_raise_request(
            user=world.member, project=world.project, to_class=world.high, reason="push", **window
        )

    assert field in exc.value.errors


def test_a_viewer_cannot_request_a_project_raise_and_an_outsider_gets_404(world):
    end = T0 + timedelta(hours=1)
    with freeze_time(T0):
        with pytest.raises(PermissionDeniedError):
            raises.priority_raise_request(
                user=world.viewer,
                project=world.project,
                to_class=world.high,
                reason="x",
                window_end=end,
            )
        with pytest.raises(NotFoundError):
            raises.priority_raise_request(
                user=world.outsider,
                project=world.project,
                to_class=world.high,
                reason="x",
                window_end=end,
            )


# --- the ceiling -----------------------------------------------------------------------------


def test_only_platform_admins_set_the_ceiling_and_it_is_audited(world, urgent):
    with pytest.raises(PermissionDeniedError):
        raises.tenant_raise_ceiling_set(
            actor=world.tenant_admin, tenant=world.tenant, ceiling=urgent
        )

    raises.tenant_raise_ceiling_set(
        actor=world.platform_admin, tenant=world.tenant, ceiling=world.high
    )
    raises.tenant_raise_ceiling_set(actor=world.platform_admin, tenant=world.tenant, ceiling=urgent)
    raises.tenant_raise_ceiling_set(actor=world.platform_admin, tenant=world.tenant, ceiling=None)

    changes = [
        (a.before, a.after)
        for a in AuditEvent.objects.filter(action="tenant.raise_ceiling").order_by("id")
    ]
    assert changes == [
        ({"ceiling": None}, {"ceiling": "high"}),
        ({"ceiling": "high"}, {"ceiling": "urgent"}),
        ({"ceiling": "urgent"}, {"ceiling": None}),
    ]


# --- the audit chain over raises -------------------------------------------------------------


def test_tampering_with_a_raise_audit_row_is_found_by_audit_verify(
    world, ceiling, job, settings, tmp_path
):
    settings.SLUICE_AUDIT_ANCHOR = tmp_path / "audit-anchor.json"
    raise_ = ask(world, job)
    raises.priority_raise_approve(raise_=raise_, user=world.tenant_admin)
    # A log with events and no anchor yet is accepted only with a reason.
    call_command("audit_verify", reset_anchor="first verification of this log")
    approval = AuditEvent.objects.get(action="priority_raise.approve")

    # Someone with write access to the database, past its append-only trigger.
    tamper(
        "UPDATE audit_auditevent SET actor_label = %s WHERE id = %s", ["nlp-member", approval.pk]
    )

    with pytest.raises(CommandError, match=f"broken at event {approval.pk}"):
        call_command("audit_verify")


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE audit_auditevent SET reason = 'changed' WHERE id = %s",
        "DELETE FROM audit_auditevent WHERE id = %s",
    ],
)
def test_the_database_rejects_raw_update_and_delete_of_raise_events(world, ceiling, job, sql):
    ask(world, job)
    row = AuditEvent.objects.get(action="priority_raise.request")

    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql, [row.pk])

    assert AuditEvent.objects.get(pk=row.pk).reason == row.reason


# --- with the engine: positions and preemptions ----------------------------------------------


@pytest.fixture
def full_cluster(world):
    """Both nodes busy (nlp and vision hold 8 GPUs each); three 8-GPU nlp jobs wait, oldest first."""
    from scheduling.models import Quota

    Quota.objects.filter(tenant=world.tenant).update(guaranteed_gpus=16)
    node1, node2 = (list(n.gpus.order_by("index")) for n in world.nodes)
    f.placed_job(gpus=node1, queue=world.queue, project=world.project, submitted_by=world.member)
    vision = f.placed_job(
        gpus=node2,
        queue=world.other_queue,
        project=world.other_project,
        submitted_by=world.outsider,
        base_priority_class=world.low,
        priority_class=world.low,
    )
    waiting = [
        f.JobFactory(
            queue=world.queue,
            project=world.project,
            submitted_by=world.member,
            gpus_per_node=8,
            submitted_at=T0 + timedelta(minutes=i),
        )
        for i in range(3)
    ]
    return waiting, vision


def positions(jobs):
    loaded = positions_attach([Job.objects.get(pk=j.pk) for j in jobs])
    return [job.queue_position for job in loaded]


def test_approved_raise_moves_the_job_to_the_head_of_its_queue(
    world, ceiling, full_cluster, dispatch_requests
):
    from scheduling.services.dispatch import dispatch_cycle

    waiting, _ = full_cluster
    dispatch_cycle()
    assert positions(waiting) == [1, 2, 3]

    raise_ = ask(world, waiting[2])
    raises.priority_raise_approve(raise_=raise_, user=world.tenant_admin)
    dispatch_cycle()

    assert positions(waiting) == [2, 3, 1]


def test_impact_shows_the_positions_the_jobs_passed_and_the_possible_preemptions(
    world, ceiling, full_cluster, settings
):
    settings.SLUICE_PREEMPTION_MIN_GAIN_SECONDS = 0  # any gain: these jobs run an hour
    from scheduling.raise_impact import raise_impacts
    from scheduling.services.dispatch import dispatch_cycle

    waiting, vision = full_cluster
    dispatch_cycle()
    modest = ask(world, waiting[1], user=world.tenant_admin)  # to high: may preempt
    impacts = raise_impacts([modest])

    [moved] = impacts[modest.pk].jobs
    assert moved.job_id == waiting[1].pk
    assert (moved.queue_position_now, moved.queue_position_after) == (2, 1)
    assert (moved.starts_now, moved.starts_after) == (False, False)
    assert moved.passes == 1
    assert moved.moves_ahead
    assert [v.pk for v in impacts[modest.pk].preempts] == [vision.pk]
    # Nothing was written: positions and classes are as the last cycle left them.
    assert positions(waiting) == [1, 2, 3]
    assert Job.objects.get(pk=waiting[1].pk).priority_class == world.normal
