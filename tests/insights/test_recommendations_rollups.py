"""The rules read what the rollup writer writes: history rebuilt by ``rollups_backfill``
from recorded jobs (not hand-made rows) opens the expected recommendations."""

from datetime import timedelta

import pytest
from django.utils import timezone

from insights import recommendations as recs
from insights.choices import RecommendationKind
from insights.services.rollups import rollups_backfill
from scheduling.choices import JobState, WorkloadType
from scheduling.models import Quota, WorkloadPolicy
from tests import factories as f

pytestmark = pytest.mark.django_db


def _ran(world, *, tenant_queue, project, gpus, admitted, finished, submitted=None):
    return f.JobFactory(
        queue=tenant_queue,
        project=project,
        submitted_by=world.member,
        state=JobState.SUCCEEDED,
        gpus_per_node=gpus,
        submitted_at=submitted or admitted,
        admitted_at=admitted,
        started_at=admitted,
        finished_at=finished,
    )


def test_rollups_rebuilt_from_jobs_open_a_lower_guarantee_and_a_queue_wait(world):
    now = timezone.now().replace(minute=30, second=0, microsecond=0)
    start = now - timedelta(days=4, hours=2)
    # nlp holds 1 GPU for four days; vision 8.
    _ran(
        world, tenant_queue=world.queue, project=world.project, gpus=1, admitted=start, finished=now
    )
    _ran(
        world,
        tenant_queue=world.other_queue,
        project=world.other_project,
        gpus=8,
        admitted=start,
        finished=now,
    )
    # Six vision jobs that each waited 3 hours; the target of training is one hour.
    WorkloadPolicy.objects.filter(workload_type=WorkloadType.TRAINING).update(max_wait_seconds=3600)
    world.other_queue.allowed_workload_types = [WorkloadType.TRAINING]
    world.other_queue.save()
    for number in range(6):
        admitted = now - timedelta(hours=10 + number)
        _ran(
            world,
            tenant_queue=world.other_queue,
            project=world.other_project,
            gpus=1,
            submitted=admitted - timedelta(hours=3),
            admitted=admitted,
            finished=admitted + timedelta(minutes=20),
        )

    rollups_backfill(days=5, now=now)
    proposals = recs.recommendations_compute(now)

    [lower] = [p for p in proposals if p.kind == RecommendationKind.LOWER_GUARANTEE]
    nlp_quota = Quota.objects.get(tenant=world.tenant)
    assert lower.evidence["quota"] == nlp_quota.pk
    assert lower.evidence["allocated_p95_gpus"] == 1.0
    assert (lower.change["guaranteed"], lower.change["borrow_limit"]) == (2, 14)
    [wait] = [p for p in proposals if p.kind == RecommendationKind.QUEUE_WAIT]
    assert wait.evidence["queue"] == world.other_queue.pk
    assert wait.evidence["admitted_jobs"] == 7  # and the 8-GPU job, which did not wait
    assert wait.evidence["wait_p95_seconds"] == pytest.approx(3 * 3600, abs=1)
