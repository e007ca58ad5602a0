"""Idle-session reclaim on GPU utilization, exemptions, and the maximum age of sessions."""

import io
from datetime import timedelta

import pytest
from freezegun import freeze_time

from portal.errors import BusinessError, NotFoundError, PermissionDeniedError
from scheduling.choices import JobState, NotificationKind, ReclaimKind, StopReason
from scheduling.models import Allocation, ReclaimRecord
from scheduling.services.nodes import node_heartbeat
from scheduling.services.reclaim import (
    idle_reclaim_check,
    job_idle_exempt,
    session_age_check,
)
from tests import factories as f
from tests.scheduling.limits_helpers import T0, audits, notes, placed, report_exit, stops

WINDOW, LEAD = 600, 120


@pytest.fixture
def sessions(world):
    """Interactive sessions are reclaimed after 10 min below 5 %, warned 2 min before."""
    return f.policy(
        "interactive",
        idle_reclaim_enabled=True,
        idle_utilization_threshold=5.0,
        idle_window_seconds=WINDOW,
        idle_warning_lead_seconds=LEAD,
    )


def _at(seconds):
    return T0 + timedelta(seconds=seconds)


def _session(world, **fields):
    fields.setdefault("max_runtime_seconds", 4 * 3600)
    return placed(world, workload_type="interactive", gpus=2, **fields)


def _heartbeat(node, utilization, at, only=None):
    """A heartbeat of ``node`` with every GPU (or only GPU ``only``, the others at 0) at
    ``utilization`` percent."""
    node_heartbeat(
        {
            "type": "heartbeat",
            "node": node.name,
            "sent_at": at.timestamp(),
            "gpus": [
                {"index": g.index, "utilization": utilization if only in (None, g.index) else 0.0}
                for g in node.gpus.all()
            ],
            # The agent lists the jobs it runs (a job it does not list is lost).
            "jobs": [
                {"job_id": job_id, "attempt": attempt, "pid": 1, "running": True}
                for job_id, attempt in Allocation.objects.filter(
                    node=node, released_at__isnull=True
                )
                .values_list("job_id", "job__requeue_count")
                .distinct()
            ],
            "zombies": [],
        }
    )


def test_idle_session_is_warned_then_reclaimed(
    world, sessions, outbox, dispatch_requests, django_capture_on_commit_callbacks
):
    with freeze_time(T0) as clock:
        job = _session(world)
        clock.move_to(_at(WINDOW - LEAD - 1))
        assert idle_reclaim_check() == {"cleared": 0, "warn": 0, "reclaim": 0}
        clock.move_to(_at(WINDOW - LEAD))
        assert idle_reclaim_check()["warn"] == 1
        clock.move_to(_at(WINDOW - 1))
        assert idle_reclaim_check()["warn"] == 0  # once
        job.refresh_from_db()
        assert job.idle_warning_sent_at == _at(WINDOW - LEAD) and job.state == JobState.RUNNING
        clock.move_to(_at(WINDOW))
        with django_capture_on_commit_callbacks(execute=True):
            assert idle_reclaim_check()["reclaim"] == 1
        assert idle_reclaim_check()["reclaim"] == 0
    job.refresh_from_db()
    assert job.state == JobState.STOPPING and job.stop_reason == StopReason.RECLAIMED
    [warning] = job.events.filter(kind="idle_warning")
    assert "below 5 %" in warning.message and "09:10:00" in warning.message
    [warned] = notes(world.member, NotificationKind.IDLE_WARNING)
    assert warned.job == job
    [(_, stop)] = stops(outbox, job)
    assert stop["reason"] == "reclaimed"
    [audit] = audits("job.reclaim", job)
    assert audit.after["kind"] == ReclaimKind.IDLE_RECLAIM and audit.after["idle_seconds"] == 600
    [reclaimed] = notes(world.member, NotificationKind.JOB_RECLAIMED)
    assert "stayed below 5 % for 10 min" in reclaimed.message
    [record] = ReclaimRecord.objects.all()
    assert record.kind == ReclaimKind.IDLE_RECLAIM and record.workload_type == "interactive"
    assert record.gpus == 2 and record.gpu_hours_freed == pytest.approx(2 * 600 / 3600)
    report_exit(job, stop_reason="reclaimed", at=_at(WINDOW + 2))
    job.refresh_from_db()
    assert job.state == JobState.RECLAIMED


def test_heartbeats_mark_a_job_active_when_any_gpu_reaches_the_threshold(world, sessions):
    node = world.nodes[0]
    with freeze_time(T0):
        job = _session(world)
    _heartbeat(node, 4.9, _at(100))
    job.refresh_from_db()
    assert job.last_active_at is None
    _heartbeat(node, 5.0, _at(200), only=1)  # one of its two GPUs is enough
    job.refresh_from_db()
    assert job.last_active_at == _at(200)
    _heartbeat(node, 80.0, _at(150))  # handled late: the time does not go back
    job.refresh_from_db()
    assert job.last_active_at == _at(200)


def test_a_busy_job_is_not_idle_whether_it_prints_or_not(world, sessions):
    node = world.nodes[0]
    with freeze_time(T0) as clock:
        job = _session(world)
        for second in range(60, 3 * WINDOW, 60):
            _heartbeat(node, 93.0, _at(second))
            clock.move_to(_at(second))
            assert idle_reclaim_check() == {"cleared": 0, "warn": 0, "reclaim": 0}
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.idle_warning_sent_at is None


def test_warning_is_cleared_when_the_job_is_active_again(world, sessions):
    node = world.nodes[0]
    with freeze_time(T0) as clock:
        job = _session(world)
        clock.move_to(_at(WINDOW - LEAD))
        idle_reclaim_check()
        _heartbeat(node, 50.0, _at(WINDOW - 10))
        clock.move_to(_at(WINDOW))
        assert idle_reclaim_check() == {"cleared": 1, "warn": 0, "reclaim": 0}
        job.refresh_from_db()
        assert job.idle_warning_sent_at is None and job.state == JobState.RUNNING
        clock.move_to(_at(WINDOW - 10 + WINDOW - LEAD))
        assert idle_reclaim_check()["warn"] == 1  # idle again: a new warning
    assert job.events.filter(kind="idle_warning").count() == 2


def test_policies_without_idle_reclaim_are_left_alone(world, sessions):
    with freeze_time(T0) as clock:
        job = placed(world, workload_type="training", max_runtime_seconds=86400)
        clock.move_to(_at(10 * WINDOW))
        assert idle_reclaim_check() == {"cleared": 0, "warn": 0, "reclaim": 0}
    job.refresh_from_db()
    assert job.state == JobState.RUNNING


def test_an_exemption_prevents_the_reclaim_until_it_ends(world, sessions, dispatch_requests):
    with freeze_time(T0) as clock:
        job = _session(world)
        clock.move_to(_at(WINDOW - LEAD))
        idle_reclaim_check()  # warned
        job_idle_exempt(user=world.tenant_admin, job=job, until=_at(2000), reason="long data load")
        job.refresh_from_db()
        assert job.idle_exempt_until == _at(2000) and job.idle_warning_sent_at is None
        clock.move_to(_at(1999))
        assert idle_reclaim_check() == {"cleared": 0, "warn": 0, "reclaim": 0}
        # Once it ends, the idle clock starts again: warned first, then reclaimed.
        clock.move_to(_at(2000 + WINDOW - LEAD - 1))
        assert idle_reclaim_check()["warn"] == 0
        clock.move_to(_at(2000 + WINDOW - LEAD))
        assert idle_reclaim_check()["warn"] == 1
        clock.move_to(_at(2000 + WINDOW))
        assert idle_reclaim_check()["reclaim"] == 1
    [audit] = audits("job.idle_exempt", job)
    assert audit.actor == world.tenant_admin and audit.reason == "long data load"
    assert audit.after == {"idle_exempt_until": _at(2000).isoformat()}
    [note] = notes(world.member, NotificationKind.IDLE_EXEMPTED)
    assert "nlp-admin" in note.message


def test_who_may_exempt_and_for_how_long(world, sessions):
    with freeze_time(T0):
        job = _session(world)
        until = _at(3600)
        with pytest.raises(NotFoundError):
            job_idle_exempt(user=world.outsider, job=job, until=until, reason="x")
        for user in (world.viewer, world.member):
            with pytest.raises(PermissionDeniedError, match="tenant admins and platform admins"):
                job_idle_exempt(user=user, job=job, until=until, reason="x")
        with pytest.raises(BusinessError, match="future"):
            job_idle_exempt(user=world.tenant_admin, job=job, until=T0, reason="x")
        with pytest.raises(BusinessError, match="at most 7 d"):
            job_idle_exempt(user=world.tenant_admin, job=job, until=_at(8 * 86400), reason="x")
        with pytest.raises(BusinessError, match="Say why"):
            job_idle_exempt(user=world.tenant_admin, job=job, until=until, reason="")
        job_idle_exempt(user=world.platform_admin, job=job, until=until, reason="demo")
        job_idle_exempt(user=world.platform_admin, job=job, until=None, reason="done")
    job.refresh_from_db()
    assert job.idle_exempt_until is None
    assert len(audits("job.idle_exempt", job)) == 2


def test_exempt_api(world, sessions, api):
    job = _session(world)
    url = f"/api/v1/jobs/{job.pk}/exempt"
    until = (job.started_at + timedelta(hours=2)).isoformat()
    body = {"until": until, "reason": "training a tokenizer on CPU first"}
    assert api(world.outsider).post(url, body, format="json").status_code == 404
    assert api(world.viewer).post(url, body, format="json").status_code == 403
    assert api(world.member).post(url, body, format="json").status_code == 403
    response = api(world.tenant_admin).post(url, body, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["id"] == job.pk
    job.refresh_from_db()
    assert job.idle_exempt_until.isoformat() == until
    bad = api(world.tenant_admin).post(url, {"until": "soon", "reason": "x"}, format="json")
    assert bad.status_code == 400 and "until" in bad.json()["errors"]


def test_sessions_end_at_their_maximum_age_even_when_busy(
    world, sessions, outbox, dispatch_requests, django_capture_on_commit_callbacks
):
    f.policy("interactive", max_session_age_seconds=3600)
    with freeze_time(T0) as clock:
        job = _session(world, max_runtime_seconds=4 * 3600)
        clock.move_to(_at(3599))
        _heartbeat(world.nodes[0], 90.0, _at(3599))
        assert session_age_check() == {"reclaimed": 0}
        clock.move_to(_at(3600))
        with django_capture_on_commit_callbacks(execute=True):
            assert session_age_check() == {"reclaimed": 1}
        assert session_age_check() == {"reclaimed": 0}
    job.refresh_from_db()
    assert job.state == JobState.STOPPING and job.stop_reason == StopReason.RECLAIMED
    event = job.events.get(kind="stop_reclaimed")
    assert "maximum session age of 1 h" in event.message
    assert stops(outbox, job, "reclaimed")
    [audit] = audits("job.reclaim", job)
    assert audit.after["kind"] == ReclaimKind.SESSION_AGE
    [record] = ReclaimRecord.objects.all()
    assert record.kind == ReclaimKind.SESSION_AGE
    assert record.gpu_hours_freed == pytest.approx(2 * 3)  # 2 GPUs × 3 h left of its 4 h limit


def test_job_page_shows_idle_time_warnings_and_exemption(world, sessions, client):
    with freeze_time(T0) as clock:
        job = _session(world)
        clock.move_to(_at(WINDOW - LEAD))
        idle_reclaim_check()
        clock.move_to(_at(500))
        client.force_login(world.member)
        page = client.get(f"/jobs/{job.pk}/").content.decode()
        assert 'Idle for <strong id="idle-time">8 min 20 s</strong>' in page
        assert "09:10:00 if it stays idle" in page and "Warned at" in page
        assert 'id="exempt-form"' not in page  # members do not exempt
        client.force_login(world.tenant_admin)
        response = client.post(
            f"/jobs/{job.pk}/idle-exemption/", {"hours": 2, "reason": "demo"}, follow=True
        )
        page = response.content.decode()
    assert "Exemption saved." in page and "Exempt from idle reclaim until" in page
    assert 'id="exempt-form"' in page


def test_the_demo_reclaims_idle_notebooks_within_minutes(db):
    from django.core.management import call_command

    from scheduling.models import WorkloadPolicy

    call_command("seed_demo", stdout=io.StringIO())
    call_command("seed_demo", stdout=io.StringIO())  # idempotent
    notebooks = WorkloadPolicy.objects.get(workload_type="interactive")
    assert notebooks.idle_reclaim_enabled
    assert (
        notebooks.idle_window_seconds,
        notebooks.idle_warning_lead_seconds,
        notebooks.idle_utilization_threshold,
    ) == (180, 60, 5.0)
    assert not WorkloadPolicy.objects.get(workload_type="training").idle_reclaim_enabled
