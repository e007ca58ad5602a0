"""Before the daily run has ever run the recommendations page says so (and when it will
run), not that the history argues for no change; a platform admin runs it now (audited)."""

from datetime import UTC, datetime

import pytest
from freezegun import freeze_time

from audit.models import AuditEvent
from insights import recommendations as recs
from insights.choices import RecommendationKind, RecommendationState
from insights.models import Recommendation
from insights.services import recommendations as recommendation_services
from tests.insights import recommendations_helpers as h

pytestmark = pytest.mark.django_db


def _page(client, user):
    client.force_login(user)
    response = client.get("/recommendations/")
    return response, response.content.decode()


@freeze_time("2026-03-04 10:30:00")
def test_a_fresh_instance_says_nothing_was_computed_and_when_it_will_be(client, world):
    response, body = _page(client, world.platform_admin)
    assert response.status_code == 200
    assert "No recommendation has been computed yet." in body
    # The beat schedule's crontab (05:17 UTC): the next run is tomorrow's.
    assert "The daily run is at 05:17 UTC" in body and "next: 2026-03-05 05:17" in body
    assert "argues for no change" not in body and "argued for no change" not in body
    assert 'id="recommendations-run-now"' in body


def test_a_platform_admin_runs_it_now_and_the_run_is_audited(client, world):
    h.failed_jobs(world, [3] * 5)  # a project failing the same way: a recommendation
    client.force_login(world.platform_admin)
    response = client.post("/recommendations/run")
    assert response.status_code == 302 and response["Location"] == "/recommendations/"

    rec = Recommendation.objects.get(kind=RecommendationKind.REPEATED_FAILURE)
    assert rec.state == RecommendationState.OPEN
    event = AuditEvent.objects.get(action=recs.REFRESH_ACTION)
    assert event.actor == world.platform_admin
    assert event.after["created"] == 1
    assert recs.recommendations_last_run() == event.created_at

    _, body = _page(client, world.platform_admin)
    assert "No recommendation has been computed yet." not in body
    assert "Last computed " in body and f"/recommendations/{rec.pk}/" in body


def test_after_a_run_with_nothing_to_propose_the_page_says_the_history_argued_for_none(
    client, world
):
    assert recommendation_services.recommendations_refresh() == {
        "created": 0,
        "refreshed": 0,
        "held": 0,
        "closed": 0,
    }
    assert AuditEvent.objects.get(action=recs.REFRESH_ACTION).actor is None  # the daily run
    _, body = _page(client, world.platform_admin)
    assert "at its last run the history argued for no change" in body
    assert "No recommendation has been computed yet." not in body


def test_tenant_admins_read_that_it_has_not_run_but_cannot_run_it(client, world):
    response, body = _page(client, world.tenant_admin)
    assert response.status_code == 200
    assert "No recommendation has been computed yet." in body
    assert "A platform admin can run it now." in body
    assert 'id="recommendations-run-now"' not in body
    client.force_login(world.tenant_admin)
    assert client.post("/recommendations/run").status_code == 403
    client.force_login(world.member)
    assert client.post("/recommendations/run").status_code == 403
    assert not AuditEvent.objects.filter(action=recs.REFRESH_ACTION).exists()


def test_running_it_needs_a_post(client, world):
    client.force_login(world.platform_admin)
    assert client.get("/recommendations/run").status_code == 405
    assert not AuditEvent.objects.filter(action=recs.REFRESH_ACTION).exists()


def test_the_schedule_is_read_from_the_beat_schedule(settings):
    from celery.schedules import crontab

    settings.CELERY_BEAT_SCHEDULE = {
        recs.BEAT_ENTRY: {
            "task": "insights.recommendations",
            "schedule": crontab(hour=23, minute=5),
        }
    }
    found = recs.recommendations_schedule(datetime(2026, 3, 4, 10, 30, tzinfo=UTC))
    assert found["times"] == "23:05" and found["zone"] == "UTC"
    assert found["next"] == datetime(2026, 3, 4, 23, 5, tzinfo=UTC)
    settings.CELERY_BEAT_SCHEDULE = {}
    assert recs.recommendations_schedule() is None
