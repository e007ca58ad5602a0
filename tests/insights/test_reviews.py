"""The weekly policy review: exact figures and deltas from a hand-made fortnight, the
verdict, idempotence, one notification, the beat task, and per-tenant slices."""

from __future__ import annotations

import datetime as dt

import pytest
from freezegun import freeze_time

from audit.services import audit_record
from insights import reviews
from insights.models import PolicyReview
from insights.services import reviews as review_services
from insights.tasks import policy_review
from scheduling.choices import ExtensionState, JobState, ReclaimKind
from scheduling.models import Notification, PriorityRaise, ReclaimRecord, RuntimeExtension
from tests import factories as f

pytestmark = pytest.mark.django_db

WEEK = dt.date(2026, 11, 23)  # a Monday; the week before begins on 2026-11-16
UTC = dt.UTC


def at(day: int, hour: int = 12, minute: int = 0, month: int = 11) -> dt.datetime:
    return dt.datetime(2026, month, day, hour, minute, tzinfo=UTC)


def admitted_job(w, *, tenant="nlp", waited_s: float, admitted: dt.datetime, **fields):
    queue = w.queue if tenant == "nlp" else w.other_queue
    project = w.project if tenant == "nlp" else w.other_project
    return f.JobFactory(
        queue=queue,
        project=project,
        state=JobState.RUNNING,
        submitted_at=admitted - dt.timedelta(seconds=waited_s),
        admitted_at=admitted,
        started_at=admitted,
        **fields,
    )


def audit_at(when: dt.datetime, action: str, *, actor=None, tenant=None) -> None:
    with freeze_time(when):
        audit_record(action=action, actor=actor, tenant=tenant, target_type="test", target_id=1)


def raise_at(w, when: dt.datetime) -> None:
    job = f.JobFactory(queue=w.queue, project=w.project, submitted_at=when)
    PriorityRaise.objects.create(
        tenant=w.tenant,
        job=job,
        to_class=w.high,
        reason="deadline",
        requested_by=w.member,
        created_at=when,
    )


def extension_at(w, when: dt.datetime, state=ExtensionState.APPROVED) -> None:
    job = f.JobFactory(queue=w.queue, project=w.project, submitted_at=when)
    RuntimeExtension.objects.create(
        job=job,
        tenant=w.tenant,
        seconds=3600,
        reason="almost done",
        requested_by=w.member,
        state=state,
        decided_by=w.tenant_admin,
        decided_at=when,
        created_at=when,
    )


@pytest.fixture
def fortnight(world):
    """Last week: key waits 600, 1200, 1800 s; 3 raises requested, 2 approved; 2 extensions
    approved (and 1 auto-granted); 1 exemption; 2 quota overrides by root (and a queue
    change by a tenant admin). This week: key waits 300, 600 s (nlp) and 3000 s (vision);
    1 raise requested and approved; a pool policy override; 2 preemptions; a failed job
    that held 2 GPUs for 3 h; an idle reclaim of 4.5 GPU-h, a zombie kill of 1 GPU-h and a
    preemption requeue (not a reclaim of waste); a high job still waiting at the end."""
    w = world
    # key work's waits
    admitted_job(w, waited_s=600, admitted=at(17), priority_class=w.high)
    admitted_job(w, waited_s=1200, admitted=at(18), priority_class=w.high)
    admitted_job(w, waited_s=1800, admitted=at(19), workload_type="inference")
    admitted_job(w, waited_s=99_999, admitted=at(19))  # normal training: not key work
    admitted_job(w, waited_s=300, admitted=at(24), priority_class=w.high)
    admitted_job(w, waited_s=600, admitted=at(25), workload_type="inference")
    admitted_job(w, tenant="vision", waited_s=3000, admitted=at(26), priority_class=w.high)
    f.JobFactory(queue=w.queue, project=w.project, priority_class=w.high, submitted_at=at(29))
    # contention and interventions, last week
    for day in (16, 17, 18):
        raise_at(w, at(day))
    for day in (17, 18):
        audit_at(at(day, 13), "priority_raise.approve", actor=w.tenant_admin, tenant=w.tenant)
    extension_at(w, at(20))
    extension_at(w, at(21))
    extension_at(w, at(21), state=ExtensionState.AUTO_GRANTED)
    audit_at(at(20), "job.idle_exempt", actor=w.tenant_admin, tenant=w.tenant)
    audit_at(at(21), "quota.update", actor=w.platform_admin, tenant=w.tenant)
    audit_at(at(22), "quota.update", actor=w.platform_admin, tenant=w.tenant)
    audit_at(at(22), "queue.update", actor=w.tenant_admin, tenant=w.tenant)
    # this week
    raise_at(w, at(24))
    audit_at(at(24, 14), "priority_raise.approve", actor=w.platform_admin, tenant=w.tenant)
    audit_at(at(25), "policy.update", actor=w.platform_admin)
    audit_at(at(25), "job.preempt", tenant=w.tenant)
    audit_at(at(26), "job.preempt", tenant=w.tenant)
    failed = f.JobFactory(
        queue=w.queue,
        project=w.project,
        state=JobState.FAILED,
        submitted_at=at(24, 9),
        finished_at=at(24, 13),
    )
    for gpu in w.nodes[0].gpus.all()[:2]:
        f.AllocationFactory(job=failed, gpu=gpu, granted_at=at(24, 10), released_at=at(24, 13))
    ReclaimRecord.objects.create(
        created_at=at(27),
        kind=ReclaimKind.IDLE_RECLAIM,
        tenant=w.tenant,
        gpus=1,
        gpu_hours_freed=4.5,
    )
    ReclaimRecord.objects.create(
        created_at=at(27), kind=ReclaimKind.ZOMBIE_KILL, gpus=1, gpu_hours_freed=1.0
    )
    ReclaimRecord.objects.create(
        created_at=at(28),
        kind=ReclaimKind.PREEMPTION_REQUEUE,
        tenant=w.tenant,
        gpus=2,
        gpu_hours_freed=3.0,
    )
    # outside both weeks: counts nowhere
    audit_at(at(30, 1), "quota.update", actor=w.platform_admin, tenant=w.tenant)
    raise_at(w, at(15))
    return w


def test_week_bounds_and_last_completed_week():
    assert reviews.week_bounds(WEEK) == (at(23, 0), at(30, 0))
    assert reviews.last_completed_week(at(2, 8, month=12)) == WEEK
    assert reviews.last_completed_week(at(30, 0)) == WEEK
    assert reviews.last_completed_week(at(29, 23, 59)) == dt.date(2026, 11, 16)
    assert reviews.parse_week_start("2026-11-23") == WEEK
    assert reviews.parse_week_start("2026-11-24") is None
    assert reviews.parse_week_start("soon") is None


def test_figures_of_the_cluster(fortnight):
    figures = reviews.review_compute(WEEK)
    this, last = figures["all"]["this"], figures["all"]["last"]
    # waits: last [600, 1200, 1800], this [300, 600, 3000]
    assert (last["key_wait_p50_s"], last["key_wait_p95_s"]) == (1200.0, 1740.0)
    assert (this["key_wait_p50_s"], this["key_wait_p95_s"]) == (600.0, 2760.0)
    assert (last["key_jobs_admitted"], this["key_jobs_admitted"]) == (3, 3)
    assert last["high_wait_p95_s"] == 1170.0  # [600, 1200]
    assert (last["inference_wait_p95_s"], this["inference_wait_p95_s"]) == (1800.0, 600.0)
    assert (last["key_jobs_waiting_at_end"], this["key_jobs_waiting_at_end"]) == (0, 1)
    # contention
    assert (last["preemptions"], this["preemptions"]) == (0, 2)
    assert (last["raises_requested"], this["raises_requested"]) == (3, 1)
    assert (last["raises_approved"], this["raises_approved"]) == (2, 1)
    # failures released and reclaims
    assert (this["failed_jobs"], this["failed_gpus_released"], this["failed_gpu_hours"]) == (
        1,
        2,
        6.0,
    )
    assert (this["reclaims"], this["reclaimed_gpu_hours"]) == (2, 5.5)
    assert this["reclaims_by_kind"] == {"idle_reclaim": 1, "zombie_kill": 1}
    assert this["idle_gpu_hours_reclaimed"] == 4.5
    assert last["reclaims"] == 0
    # manual interventions
    assert (last["extensions_approved"], this["extensions_approved"]) == (2, 0)
    assert (last["exemptions"], this["exemptions"]) == (1, 0)
    assert (last["admin_overrides"], this["admin_overrides"]) == (2, 1)
    assert (last["interventions"], this["interventions"]) == (7, 2)


def test_figures_per_tenant(fortnight):
    tenants = reviews.review_compute(WEEK)["tenants"]
    nlp, vision = tenants["nlp"], tenants["vision"]
    assert (nlp["this"]["key_wait_p50_s"], nlp["this"]["key_wait_p95_s"]) == (450.0, 585.0)
    assert nlp["last"]["key_wait_p95_s"] == 1740.0
    # the policy override had no tenant: the cluster's only
    assert (nlp["last"]["interventions"], nlp["this"]["interventions"]) == (7, 1)
    assert nlp["this"]["reclaims"] == 1 and nlp["this"]["reclaimed_gpu_hours"] == 4.5
    assert vision["this"]["key_wait_p95_s"] == 3000.0
    assert vision["last"]["key_wait_p95_s"] is None
    assert vision["this"]["interventions"] == vision["last"]["interventions"] == 0
    assert vision["this"]["preemptions"] == 0 and vision["this"]["failed_jobs"] == 0


def test_rows_deltas_and_verdicts(fortnight):
    review = review_services.policy_review_write(week_start=WEEK, now=at(1, 0, month=12))
    cluster = reviews.review_slice(review)
    rows = {r["key"]: r for rows in cluster["sections"].values() for r in rows}
    assert rows["interventions"]["delta"] == -5
    assert rows["interventions"]["delta_text"] == "↓ 5"
    assert rows["interventions"]["trend"] == "better"
    assert rows["key_wait_p95_s"]["delta"] == 1020.0
    assert rows["key_wait_p95_s"]["trend"] == "worse"
    assert rows["key_wait_p95_s"]["delta_text"].startswith("↑ ")
    assert rows["preemptions"]["trend"] == "worse"
    assert rows["key_jobs_admitted"]["trend"] == "neutral"
    assert cluster["verdict"]["status"] == "mixed"
    assert cluster["verdict"]["text"].startswith("Mixed: manual interventions 7 → 2 (↓ 5); ")
    nlp = reviews.review_slice(review, "nlp")
    assert nlp["verdict"]["status"] == "works"
    assert nlp["verdict"]["text"].startswith("The policy works: manual interventions 7 → 1 (↓ 6)")
    assert reviews.review_slice(review, "vision")["verdict"]["status"] == "no_baseline"
    assert reviews.review_slice(review, "nobody") is None


def test_verdict_when_both_get_worse_or_nothing_happened():
    empty = reviews._empty()
    assert reviews.review_verdict(empty, empty)["status"] == "no_data"
    worse = {**empty, "interventions": 4, "key_wait_p95_s": 900.0}
    better = {**empty, "interventions": 1, "key_wait_p95_s": 60.0}
    assert reviews.review_verdict(worse, better)["status"] == "attention"
    assert reviews.review_verdict(better, worse)["status"] == "works"
    assert reviews.review_verdict(better, better)["status"] == "steady"
    first = reviews.review_verdict(worse, empty)
    assert first["status"] == "no_baseline" and first["text"].startswith("No baseline")


def test_a_class_above_the_queue_default_is_key_work(world):
    low_queue = f.QueueFactory(
        tenant=world.tenant,
        pool=world.pool,
        default_priority_class=world.low,
        max_self_service_class=world.low,
    )
    f.JobFactory(
        queue=low_queue,
        project=world.project,
        priority_class=world.normal,
        state=JobState.RUNNING,
        submitted_at=at(24, 11),
        admitted_at=at(24, 12),
    )
    f.JobFactory(
        queue=low_queue,
        project=world.project,
        priority_class=world.low,
        state=JobState.RUNNING,
        submitted_at=at(24, 10),
        admitted_at=at(24, 12),
    )
    this = reviews.review_compute(WEEK)["all"]["this"]
    assert this["key_jobs_admitted"] == 1 and this["key_wait_p95_s"] == 3600.0


def test_write_is_idempotent_and_notifies_once(
    fortnight, settings, mailoutbox, django_capture_on_commit_callbacks
):
    settings.SLUICE_MAIL_ENABLED = True
    fortnight.platform_admin.email = "root@example.org"
    fortnight.platform_admin.save()
    with django_capture_on_commit_callbacks(execute=True):
        first = review_services.policy_review_write(week_start=WEEK, now=at(1, 0, month=12))
    assert reviews.is_final(first)
    notes = list(Notification.objects.all())
    assert [(n.user.username, n.kind, n.link) for n in notes] == [
        ("root", "policy_review", "/reviews/2026-11-23/")
    ]
    assert notes[0].message.startswith("Weekly policy review, week of 2026-11-23: Mixed: ")
    assert len(mailoutbox) == 1
    assert mailoutbox[0].to == ["root@example.org"]
    assert "/reviews/2026-11-23/" in mailoutbox[0].body
    # more history arrives; the beat runs again: nothing changes, nobody is told twice
    audit_at(at(26), "quota.update", actor=fortnight.platform_admin, tenant=fortnight.tenant)
    with django_capture_on_commit_callbacks(execute=True):
        again = review_services.policy_review_write(week_start=WEEK, now=at(2, 0, month=12))
    assert again.pk == first.pk and again.figures == first.figures
    assert PolicyReview.objects.count() == 1 and Notification.objects.count() == 1
    # "compute now" recomputes (the new override counts) without a second notification
    with django_capture_on_commit_callbacks(execute=True):
        refreshed = review_services.policy_review_write(
            week_start=WEEK, refresh=True, user=fortnight.platform_admin, now=at(3, 0, month=12)
        )
    assert refreshed.figures["all"]["this"]["admin_overrides"] == 2
    assert refreshed.figures["computed_by"] == "root"
    assert Notification.objects.count() == 1 and len(mailoutbox) == 1


def test_a_running_week_is_so_far_and_final_later(fortnight):
    running = dt.date(2026, 11, 30)
    so_far = review_services.policy_review_write(week_start=running, now=at(2, 12, month=12))
    assert not reviews.is_final(so_far)
    assert Notification.objects.count() == 0
    final = review_services.policy_review_write(week_start=running, now=at(7, 0, month=12))
    assert reviews.is_final(final) and final.pk == so_far.pk
    assert Notification.objects.count() == 1


@pytest.mark.parametrize(
    ("day", "message"),
    [
        (dt.date(2026, 11, 24), "A week starts on a Monday."),
        (dt.date(2026, 12, 7), "That week has not begun yet."),
    ],
)
def test_bad_weeks_are_refused(world, day, message):
    from portal.errors import BusinessError

    with pytest.raises(BusinessError, match=message):
        review_services.policy_review_write(week_start=day, now=at(4, 12, month=12))


def test_beat_task_writes_the_week_that_ended_once(fortnight):
    with freeze_time(at(2, 3, month=12)):
        assert policy_review.delay().get() == "2026-11-23"
        policy_review.delay()
    review = PolicyReview.objects.get()
    assert review.week_start == WEEK
    assert review.figures["all"]["this"]["interventions"] == 2
    assert Notification.objects.filter(kind="policy_review").count() == 1
