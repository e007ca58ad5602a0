"""Each recommendation rule on hand-made history: one history that triggers it (with the
exact numbers in its evidence and change) and one that does not."""

from datetime import timedelta

import pytest

from insights import recommendations as recs
from insights.choices import RecommendationKind
from scheduling.choices import WorkloadType
from scheduling.models import Quota, WorkloadPolicy
from tests.insights import recommendations_helpers as h

pytestmark = pytest.mark.django_db


def _now():
    from django.utils import timezone

    return timezone.now()


def _of(kind, proposals):
    return [p for p in proposals if p.kind == kind]


# -- a guarantee unused most of the week ------------------------------------------------------


def test_a_guarantee_unused_most_of_the_week_is_lowered_to_its_p95_plus_headroom(world):
    # 100 hours: 90 at 1 GPU, 10 at 3 GPUs; p95 (the 95th of 100) is 3 -> 3 x 1.25 -> 4.
    h.usage_hours(world.pool, {world.tenant: [1.0] * 90 + [3.0] * 10, world.other: 8.0}, hours=100)
    quota = Quota.objects.get(tenant=world.tenant)

    [proposal] = _of(RecommendationKind.LOWER_GUARANTEE, recs.recommendations_compute(_now()))

    assert proposal.key == f"lower_guarantee:quota:{quota.pk}"
    assert proposal.tenant == world.tenant
    evidence = proposal.evidence
    assert evidence["hours_observed"] == 100
    assert evidence["hours_below_half"] == 100
    assert evidence["allocated_p95_gpus"] == 3.0
    assert evidence["allocated_peak_gpus"] == 3.0
    assert evidence["impact_gpu_hours"] == 90 * 7 + 10 * 5
    assert evidence["score"] == 4
    assert proposal.change["action"] == "quota_update"
    assert (proposal.change["guaranteed"], proposal.change["borrow_limit"]) == (4, 12)
    assert proposal.change["whatif"] == {
        "quotas": {str(quota.pk): {"guaranteed": 4, "borrow_limit": 12}}
    }


def test_a_guarantee_used_most_of_the_week_is_left_alone(world):
    # 60 of 100 hours at 6 GPUs (above half of 8): below half only 40 % of the time.
    h.usage_hours(world.pool, {world.tenant: [6.0] * 60 + [1.0] * 40, world.other: 8.0}, hours=100)

    assert not _of(RecommendationKind.LOWER_GUARANTEE, recs.recommendations_compute(_now()))


def test_too_short_a_history_proposes_no_lower_guarantee(world):
    h.usage_hours(world.pool, {world.tenant: 0.0, world.other: 0.0}, hours=48)

    assert not _of(RecommendationKind.LOWER_GUARANTEE, recs.recommendations_compute(_now()))


def test_a_pool_without_history_proposes_nothing_even_with_no_minimum(world, settings):
    settings.SLUICE_RECOMMEND_GUARANTEE_MIN_HOURS = 0

    assert not _of(RecommendationKind.LOWER_GUARANTEE, recs.recommendations_compute(_now()))


# -- a queue whose p95 wait exceeds its target ----------------------------------------------


@pytest.fixture
def one_hour_target(world):
    world.queue.allowed_workload_types = [WorkloadType.TRAINING]
    world.queue.save()
    WorkloadPolicy.objects.filter(workload_type=WorkloadType.TRAINING).update(max_wait_seconds=3600)


def _slow_queue(world):
    # 8 hours with 2 jobs at p95 10 min; 2 hours with 3 jobs at p95 2 h, 4 and 6 GPUs waiting.
    # Weighted p95 of 22 jobs: the 21st job (0.95 x 22 = 20.9) lies in the 2 h hours.
    h.queue_hours(world.queue, [(2, 600.0, 0.0)] * 8 + [(3, 7200.0, 4.0), (3, 7200.0, 6.0)])


def test_a_slow_queue_gets_a_higher_guarantee_when_the_pool_has_room(world, one_hour_target):
    Quota.objects.filter(tenant=world.other).update(guaranteed_gpus=0)  # 8 GPUs unguaranteed
    _slow_queue(world)
    quota = Quota.objects.get(tenant=world.tenant)

    [proposal] = _of(RecommendationKind.QUEUE_WAIT, recs.recommendations_compute(_now()))

    assert proposal.key == f"queue_wait:queue:{world.queue.pk}"
    evidence = proposal.evidence
    assert evidence["target_seconds"] == 3600
    assert evidence["wait_p95_seconds"] == 7200.0
    assert evidence["admitted_jobs"] == 22
    assert evidence["hours_over_target"] == 2
    assert evidence["pending_gpus_over_target"] == 5
    assert evidence["unguaranteed_gpus_in_pool"] == 8
    assert evidence["score"] == 2.0
    assert proposal.change["action"] == "quota_update"
    assert proposal.change["whatif"] == {
        "quotas": {str(quota.pk): {"guaranteed": 13, "borrow_limit": 8}}
    }


def test_a_slow_queue_in_a_fully_guaranteed_pool_runs_one_class_higher(world, one_hour_target):
    _slow_queue(world)  # 16 GPUs, 8 + 8 guaranteed: no room for 5 more

    [proposal] = _of(RecommendationKind.QUEUE_WAIT, recs.recommendations_compute(_now()))

    assert proposal.change["action"] == "queue_class"
    assert proposal.change["priority_class"] == "high"
    assert proposal.change["whatif"] == {"queue_classes": {str(world.queue.pk): "high"}}


def test_a_queue_within_its_target_gets_nothing(world, one_hour_target):
    # 25 jobs, one of them in an hour at 2 h: the 24th (0.95 x 25 = 23.75) waited 10 min.
    h.queue_hours(world.queue, [(3, 600.0, 0.0)] * 8 + [(1, 7200.0, 4.0)])

    assert not _of(RecommendationKind.QUEUE_WAIT, recs.recommendations_compute(_now()))


# -- jobs failing repeatedly ------------------------------------------------------------------


def test_five_failures_with_the_same_exit_notify_the_owner(world):
    jobs = h.failed_jobs(world, [3, 3, 3, 3, 3])

    [proposal] = _of(RecommendationKind.REPEATED_FAILURE, recs.recommendations_compute(_now()))

    assert proposal.tenant == world.tenant
    evidence = proposal.evidence
    assert evidence["failed_jobs"] == 5 and evidence["exit"] == "exit 3"
    assert evidence["same_command_jobs"] == 5
    assert evidence["command"] == "python train.py --lr 3e-4"
    assert evidence["impact_gpu_hours"] == 5.0  # 5 jobs x 2 GPUs x 30 min
    assert sorted(evidence["job_ids"]) == sorted(j.pk for j in jobs)
    assert proposal.change["action"] == "notify"
    assert proposal.change["users"] == [world.member.pk]
    assert "5 of your jobs in nlp/llm failed with exit 3" in proposal.change["message"]
    assert "whatif" not in proposal.change and proposal.change["not_simulated"]


def test_failures_with_different_exits_or_too_few_notify_nobody(world):
    h.failed_jobs(world, [3, 3, 3, 1, 1])
    h.failed_jobs(world, [2, 2, 2, 2], user=world.tenant_admin)

    assert not _of(RecommendationKind.REPEATED_FAILURE, recs.recommendations_compute(_now()))


# -- GPUs idle for days -----------------------------------------------------------------------


def test_a_node_idle_for_days_is_proposed_for_cordoning(world):
    h.gpu_activity(world.nodes[0], busy_ago=timedelta(hours=1))
    h.gpu_activity(world.nodes[1], busy_ago=timedelta(days=4))

    [proposal] = _of(RecommendationKind.IDLE_GPUS, recs.recommendations_compute(_now()))

    assert proposal.key == f"idle_gpus:pool:{world.pool.pk}"
    assert proposal.tenant is None
    assert proposal.evidence["nodes"] == ["gpu-02"]
    assert proposal.evidence["idle_gpus"] == 8
    assert proposal.evidence["idle_days_min"] == pytest.approx(4.0, abs=0.01)
    assert proposal.evidence["impact_gpu_hours"] == pytest.approx(8 * 4 * 24, abs=0.5)
    assert proposal.change["whatif"] == {"cordon": ["gpu-02"]}


def test_a_pool_keeps_one_node_and_recently_busy_nodes_stay(world):
    h.gpu_activity(world.nodes[0], busy_ago=timedelta(days=2))  # under 3 days
    h.gpu_activity(world.nodes[1], busy_ago=timedelta(days=2))
    assert not _of(RecommendationKind.IDLE_GPUS, recs.recommendations_compute(_now()))

    h.gpu_activity(world.nodes[0], busy_ago=timedelta(days=5))
    h.gpu_activity(world.nodes[1], busy_ago=timedelta(days=4))
    [proposal] = _of(RecommendationKind.IDLE_GPUS, recs.recommendations_compute(_now()))
    assert proposal.evidence["nodes"] == ["gpu-01"]  # the longest idle; one node stays


# -- interactive sessions reclaimed often -----------------------------------------------------


@pytest.fixture
def interactive_reclaim(world):
    WorkloadPolicy.objects.filter(workload_type=WorkloadType.INTERACTIVE).update(
        idle_reclaim_enabled=True, idle_window_seconds=3600, idle_warning_lead_seconds=600
    )


def test_sessions_reclaimed_often_get_a_shorter_idle_window(world, interactive_reclaim):
    h.idle_reclaims(world, 10, gpus=1)

    [proposal] = _of(RecommendationKind.SHORT_IDLE_WINDOW, recs.recommendations_compute(_now()))

    assert proposal.evidence["reclaims"] == 10
    assert proposal.evidence["gpu_hours_freed"] == 10.0
    assert proposal.evidence["idle_window_seconds"] == 3600
    assert proposal.evidence["impact_gpu_hours"] == 5.0  # 10 GPUs x 30 min sooner
    assert proposal.change["action"] == "policy_update"
    assert proposal.change["fields"] == {
        "idle_window_seconds": 1800,
        "idle_warning_lead_seconds": 600,
    }
    assert "whatif" not in proposal.change and "utilization" in proposal.change["not_simulated"]


def test_few_reclaims_or_other_workloads_change_no_window(world, interactive_reclaim):
    h.idle_reclaims(world, 9)
    h.idle_reclaims(world, 5, workload_type=WorkloadType.TRAINING)

    assert not _of(RecommendationKind.SHORT_IDLE_WINDOW, recs.recommendations_compute(_now()))


# -- frequent raises or exemptions ----------------------------------------------------------


def test_frequent_raises_make_a_queue_class_rule(world):
    h.job_raises(world, 5)

    [proposal] = _of(RecommendationKind.FREQUENT_RAISES, recs.recommendations_compute(_now()))

    assert proposal.key == f"frequent_raises:project:{world.project.pk}"
    assert proposal.evidence["raises"] == 5 and proposal.evidence["score"] == 5
    assert proposal.evidence["class_asked"] == "high"
    assert proposal.change["action"] == "queue_class"
    assert proposal.change["whatif"] == {"queue_classes": {str(world.queue.pk): "high"}}


def test_raises_and_exemptions_count_together(world):
    h.job_raises(world, 3)
    h.idle_exemptions(world, 2)

    [proposal] = _of(RecommendationKind.FREQUENT_RAISES, recs.recommendations_compute(_now()))
    assert (proposal.evidence["raises"], proposal.evidence["idle_exemptions"]) == (3, 2)


def test_a_few_raises_make_no_rule(world):
    h.job_raises(world, 4)

    assert not _of(RecommendationKind.FREQUENT_RAISES, recs.recommendations_compute(_now()))


def test_a_lower_guarantee_still_fits_the_largest_non_preemptible_job(world):
    from django.utils import timezone

    from scheduling.choices import JobState
    from tests import factories as f

    now = timezone.now()
    f.JobFactory(  # class normal is not preemptible: 6 GPUs must fit within the guarantee
        queue=world.queue,
        project=world.project,
        state=JobState.SUCCEEDED,
        gpus_per_node=6,
        submitted_at=now - timedelta(days=2),
        started_at=now - timedelta(days=2),
        finished_at=now - timedelta(days=2) + timedelta(hours=1),
    )
    h.usage_hours(world.pool, {world.tenant: [1.0] * 90 + [3.0] * 10, world.other: 8.0}, hours=100)

    [proposal] = _of(RecommendationKind.LOWER_GUARANTEE, recs.recommendations_compute(_now()))

    assert proposal.evidence["largest_non_preemptible_job_gpus"] == 6
    assert (proposal.change["guaranteed"], proposal.change["borrow_limit"]) == (6, 10)


def test_stale_gpu_activity_proves_no_idleness(world):
    from insights.models import GpuActivity

    h.gpu_activity(world.nodes[1], busy_ago=timedelta(days=4))
    GpuActivity.objects.update(sampled_at=_now() - timedelta(hours=3))

    assert not _of(RecommendationKind.IDLE_GPUS, recs.recommendations_compute(_now()))
