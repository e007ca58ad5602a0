"""The daily run: one open recommendation per key, refreshed; a dismissed one stays closed
for the cooldown unless its numbers get clearly worse; unsupported ones are closed."""

from datetime import timedelta

import pytest
from django.utils import timezone

from insights import recommendations as recs
from insights.choices import RecommendationKind, RecommendationState
from insights.models import Recommendation
from insights.services import recommendations as recommendation_services
from insights.tasks import recommendations as recommendations_task
from scheduling.models import Job, SimulationRun
from tests.insights import recommendations_helpers as h

pytestmark = pytest.mark.django_db


def _failures():
    return Recommendation.objects.filter(kind=RecommendationKind.REPEATED_FAILURE)


def test_the_daily_task_opens_one_recommendation_and_refreshes_it(world):
    h.failed_jobs(world, [3] * 5)

    assert recommendations_task() == {"created": 1, "refreshed": 0, "held": 0, "closed": 0}
    rec = _failures().get()
    assert rec.state == RecommendationState.OPEN and rec.tenant == world.tenant
    assert rec.evidence["failed_jobs"] == 5
    first_update = rec.updated_at

    h.failed_jobs(world, [3] * 2, hours_ago=1)
    assert recommendation_services.recommendations_refresh() == {
        "created": 0,
        "refreshed": 1,
        "held": 0,
        "closed": 0,
    }
    rec.refresh_from_db()
    assert _failures().count() == 1
    assert rec.evidence["failed_jobs"] == 7
    assert rec.updated_at > first_update


def test_a_refresh_with_another_change_unlinks_the_old_simulation(world):
    h.failed_jobs(world, [3] * 5)
    recommendation_services.recommendations_refresh()
    rec = _failures().get()
    run = SimulationRun.objects.create(
        created_by=world.platform_admin, params={}, created_at=timezone.now()
    )
    Recommendation.objects.filter(pk=rec.pk).update(simulation=run)

    recommendation_services.recommendations_refresh()  # same change: the run still stands for it
    rec.refresh_from_db()
    assert rec.simulation_id == run.pk

    h.failed_jobs(world, [3], hours_ago=1)  # the message (the change) says 6 now
    recommendation_services.recommendations_refresh()
    rec.refresh_from_db()
    assert rec.simulation_id is None


def test_a_dismissed_recommendation_stays_closed_unless_clearly_worse(world):
    h.failed_jobs(world, [3] * 6)
    recommendation_services.recommendations_refresh()
    rec = _failures().get()
    recommendation_services.recommendation_dismiss(
        user=world.platform_admin, recommendation=rec, reason="known"
    )

    h.failed_jobs(world, [3] * 2, hours_ago=1)  # 8 < 6 x 1.5: not clearly worse
    assert recommendation_services.recommendations_refresh()["held"] == 1
    assert not _failures().filter(state=RecommendationState.OPEN).exists()

    h.failed_jobs(world, [3] * 1, hours_ago=1)  # 9 = 6 x 1.5: clearly worse
    assert recommendation_services.recommendations_refresh()["created"] == 1
    reopened = _failures().get(state=RecommendationState.OPEN)
    assert reopened.pk != rec.pk and reopened.evidence["failed_jobs"] == 9


def test_after_the_cooldown_a_dismissed_key_opens_again(world):
    h.failed_jobs(world, [3] * 5)
    recommendation_services.recommendations_refresh()
    rec = _failures().get()
    recommendation_services.recommendation_dismiss(
        user=world.platform_admin, recommendation=rec, reason="known"
    )
    Recommendation.objects.filter(pk=rec.pk).update(decided_at=timezone.now() - timedelta(days=8))

    assert recommendation_services.recommendations_refresh()["created"] == 1


def test_an_open_recommendation_the_history_no_longer_supports_is_closed(world):
    jobs = h.failed_jobs(world, [3] * 5)
    recommendation_services.recommendations_refresh()
    Job.objects.filter(pk=jobs[0].pk).delete()  # 4 failures left: under the threshold

    assert recommendation_services.recommendations_refresh()["closed"] == 1
    rec = _failures().get()
    assert rec.state == RecommendationState.DISMISSED
    assert rec.decided_by is None and "No longer supported" in rec.dismiss_reason


def test_thresholds_can_be_set_in_settings(world, settings):
    h.failed_jobs(world, [3] * 3)
    assert not recs.recommendations_compute()
    settings.SLUICE_RECOMMEND_FAILURE_MIN_JOBS = 3
    assert [p.kind for p in recs.recommendations_compute()] == [RecommendationKind.REPEATED_FAILURE]
