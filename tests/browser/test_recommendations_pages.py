"""The recommendations pages in Chromium, on the demo with a hand-made week of history: the
list ranks what the rules found, the detail page simulates a change through the what-if
simulator and applies it. Screenshots go to $SLUICE_SCREENSHOTS (docs/screenshots with
``make screenshots``), else a temporary folder."""

import io
import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone
from playwright.sync_api import expect

from insights.choices import RecommendationKind
from insights.models import Recommendation
from insights.services import recommendations as recommendation_services
from scheduling.choices import JobState, RaiseState, ReclaimKind, WorkloadType
from scheduling.models import (
    Node,
    PriorityClass,
    PriorityRaise,
    Queue,
    Quota,
    ReclaimRecord,
    ResourcePool,
    WorkloadPolicy,
)
from tenants.models import Project, Tenant
from tests import factories as f
from tests.insights import recommendations_helpers as h
from tests.insights.rollups_helpers import without_backfilled_history

pytestmark = pytest.mark.browser

DEMO_PASSWORD = "sluice-demo-2026"
VIEWPORT = {"width": 1280, "height": 900}


def _screenshot_dir(tmp_path) -> Path:
    folder = Path(os.environ.get("SLUICE_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _week_of_history() -> None:
    """What the rules find in the demo: vision's training guarantee barely used, nlp's
    production queue waiting, a member's jobs failing, an idle inference node, notebooks
    reclaimed, and an nlp project raising its jobs every other day."""
    from django.contrib.auth import get_user_model

    users = get_user_model().objects
    nlp, vision = Tenant.objects.get(slug="nlp"), Tenant.objects.get(slug="vision")
    training = ResourcePool.objects.get(name="training")
    # vision was given 12 of the 16 training GPUs and used 1-3 of them (its largest job: 8).
    Quota.objects.filter(tenant=vision, pool=training).update(guaranteed_gpus=12)
    Quota.objects.filter(tenant=nlp, pool=training).update(guaranteed_gpus=4)
    pattern = [1.0] * 140 + [2.0] * 20 + [3.0] * 8
    h.usage_hours(training, {vision: pattern, nlp: 8.0}, hours=168)

    queue = Queue.objects.get(tenant=nlp, name="train-prod")
    WorkloadPolicy.objects.filter(workload_type=WorkloadType.EVALUATION).update(
        max_wait_seconds=2 * 3600
    )
    queue.allowed_workload_types = [WorkloadType.EVALUATION]
    queue.save()
    h.queue_hours(queue, [(4, 900.0, 0.0)] * 30 + [(5, 4 * 3600.0, 6.0)] * 6)

    member = users.get(username="nlp-member")
    project = Project.objects.get(tenant=nlp, slug="chat-finetune")
    train = Queue.objects.get(tenant=nlp, name="train")
    now = timezone.now()
    for number in range(7):
        finished = now - timedelta(hours=3 + 9 * number)
        f.JobFactory(
            queue=train,
            project=project,
            submitted_by=member,
            name=f"chat-sft-{number}",
            workload_type=WorkloadType.FINE_TUNING,
            state=JobState.FAILED,
            exit_code=137,
            gpus_per_node=4,
            command=["torchrun", "--nproc-per-node=4", "sft.py", "--batch", "64"],
            failure_message="exit code 137: killed (out of memory)",
            submitted_at=finished - timedelta(hours=1),
            admitted_at=finished - timedelta(minutes=50),
            started_at=finished - timedelta(minutes=50),
            finished_at=finished,
        )

    infer = Node.objects.get(name="gpu-infer-01")
    h.gpu_activity(infer, busy_ago=timedelta(days=5, hours=3))
    for node in Node.objects.exclude(pk=infer.pk):
        h.gpu_activity(node, busy_ago=timedelta(minutes=10))
    f.NodeFactory(name="gpu-infer-02", pool=infer.pool)
    spare = Node.objects.get(name="gpu-infer-02")
    for index in range(4):
        f.GpuFactory(node=spare, index=index, uuid=f"GPU-spare-{index}", model="A100-40GB")
    h.gpu_activity(spare, busy_ago=timedelta(minutes=30))

    WorkloadPolicy.objects.filter(workload_type=WorkloadType.INTERACTIVE).update(
        idle_reclaim_enabled=True, idle_window_seconds=3600, idle_warning_lead_seconds=600
    )
    notebooks = Queue.objects.get(tenant=nlp, name="notebooks")
    for number in range(14):
        job = f.JobFactory(
            queue=notebooks,
            project=Project.objects.get(tenant=nlp, slug="eval-harness"),
            submitted_by=member,
            workload_type=WorkloadType.INTERACTIVE,
            state=JobState.RECLAIMED,
            submitted_at=now - timedelta(hours=10 * number + 5),
        )
        ReclaimRecord.objects.create(
            created_at=now - timedelta(hours=10 * number + 1),
            kind=ReclaimKind.IDLE_RECLAIM,
            tenant=nlp,
            workload_type=WorkloadType.INTERACTIVE,
            job=job,
            gpus=1,
            gpu_hours_freed=1.0,
        )

    pretrain = Project.objects.get(tenant=nlp, slug="llm-pretrain")
    high = PriorityClass.objects.get(name="high")
    normal = PriorityClass.objects.get(name="normal")
    for number in range(9):
        job = f.JobFactory(queue=train, project=pretrain, submitted_by=member)
        PriorityRaise.objects.create(
            tenant=nlp,
            job=job,
            from_class=normal,
            to_class=high,
            reason="release candidate evaluation",
            requested_by=member,
            state=RaiseState.APPROVED,
            decided_by=users.get(username="nlp-admin"),
            decided_at=now,
            created_at=now - timedelta(days=2 * number + 1),
        )


def test_recommendations_pages_as_platform_admin(
    page, log_in, tmp_path, settings, django_capture_on_commit_callbacks
):
    settings.SLUICE_LOG_DIR = tmp_path / "logs"
    call_command("seed_demo", stdout=io.StringIO())
    without_backfilled_history()
    _week_of_history()
    counts = recommendation_services.recommendations_refresh()
    assert counts["created"] >= 6, [r.title for r in Recommendation.objects.all()]
    folder = _screenshot_dir(tmp_path)
    page.set_viewport_size(VIEWPORT)

    log_in("admin", DEMO_PASSWORD)
    page.goto("/recommendations/")
    expect(page.locator("#open-recommendations .rec-row")).to_have_count(counts["created"])
    page.screenshot(path=str(folder / "recommendations.png"), full_page=True)

    lower = Recommendation.objects.get(kind=RecommendationKind.LOWER_GUARANTEE)
    assert lower.change["guaranteed"] == 8  # p95 2 GPUs + 25 %, but its largest job has 8
    page.goto(f"/recommendations/{lower.pk}/")
    page.click("#rec-simulate")
    page.wait_for_url("**/simulate/*/")
    expect(page.locator("#simulation-status")).to_contain_text("Per tenant", timeout=60_000)
    # The tail next to the averages: how long the longest wait was, before and after.
    expect(page.locator("#simulation-status")).to_contain_text("longest wait")
    page.screenshot(path=str(folder / "simulation-run.png"), full_page=True)
    page.goto(f"/recommendations/{lower.pk}/")
    expect(page.locator("#rec-effect")).to_contain_text("vision: guaranteed GPUs")
    page.screenshot(path=str(folder / "recommendation-detail.png"), full_page=True)

    page.on("dialog", lambda dialog: dialog.accept())
    page.click("#rec-apply")
    expect(page.locator("#rec-state")).to_have_text("Applied")
    quota = Quota.objects.get(tenant__slug="vision", pool__name="training")
    assert (quota.guaranteed_gpus, quota.borrow_limit_gpus) == (8, 12)

    window = Recommendation.objects.get(kind=RecommendationKind.SHORT_IDLE_WINDOW)
    page.goto(f"/recommendations/{window.pk}/")
    expect(page.locator("#rec-not-simulated")).to_contain_text("does not model")
    page.click("#rec-dismiss")  # no reason: the browser refuses to send the form
    assert page.locator("#id_reason").evaluate("field => field.validity.valueMissing")
    expect(page.locator("#rec-state")).to_have_text("Open")
    page.fill("#id_reason", "Notebook users asked for an hour; revisit next quarter.")
    page.click("#rec-dismiss")
    expect(page.locator("#rec-state")).to_have_text("Dismissed")
    page.screenshot(path=str(folder / "recommendation-dismissed.png"), full_page=True)
