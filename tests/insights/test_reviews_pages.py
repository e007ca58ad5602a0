"""The policy review's pages: who sees which slice, the list, the report, "compute now"."""

from __future__ import annotations

import datetime as dt

import pytest
from freezegun import freeze_time

from insights import reviews
from insights.models import PolicyReview
from insights.services import reviews as review_services
from portal.errors import BusinessError
from tests.insights.test_reviews import WEEK, at, fortnight  # noqa: F401  (the fixture)

pytestmark = pytest.mark.django_db


@pytest.fixture
def review(fortnight):  # noqa: F811
    return review_services.policy_review_write(week_start=WEEK, now=at(1, 0, month=12))


def test_platform_admin_sees_the_cluster_and_each_tenant(client, review, fortnight):  # noqa: F811
    client.force_login(fortnight.platform_admin)
    listing = client.get("/reviews/")
    assert listing.status_code == 200
    html = listing.content.decode()
    assert "/reviews/2026-11-23/" in html and "Mixed: manual interventions 7 → 2" in html
    assert 'id="compute-last-week"' in html
    page = client.get("/reviews/2026-11-23/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'class="card verdict verdict-mixed"' in html
    assert 'id="review-tenants"' in html and 'id="compute-now"' in html
    assert page.context["part"]["this"]["interventions"] == 2
    by_tenant = {t["tenant"]: t for t in page.context["by_tenant"]}
    assert by_tenant["nlp"]["verdict"]["status"] == "works"
    assert by_tenant["vision"]["wait"]["this_text"] == "50 min"
    assert "trend-better" in html and "trend-worse" in html
    nlp = client.get("/reviews/2026-11-23/", {"tenant": "nlp"})
    assert nlp.context["part"]["verdict"]["status"] == "works"


def test_the_computed_time_is_shown_in_utc(client, review, fortnight, settings):  # noqa: F811
    settings.TIME_ZONE = "Asia/Tokyo"  # 09:00 there
    client.force_login(fortnight.platform_admin)
    html = client.get("/reviews/2026-11-23/").content.decode()
    assert "Computed 2026-12-01 00:00 UTC" in html


def test_tenant_admin_sees_their_tenant_only(client, review, fortnight):  # noqa: F811
    client.force_login(fortnight.tenant_admin)
    page = client.get("/reviews/2026-11-23/")
    assert page.status_code == 200
    assert page.context["tenant"] == "nlp"
    assert page.context["part"]["this"]["interventions"] == 1
    html = page.content.decode()
    assert "The policy works: manual interventions 7 → 1" in html
    assert 'id="review-tenants"' not in html and 'id="compute-now"' not in html
    assert "vision" not in html
    assert client.get("/reviews/2026-11-23/", {"tenant": "vision"}).status_code == 404
    assert client.get("/reviews/", {"tenant": "vision"}).status_code == 404
    listing = client.get("/reviews/").content.decode()
    assert "The policy works" in listing and "Mixed" not in listing


def test_vision_admin_sees_vision(client, review, fortnight):  # noqa: F811
    client.force_login(fortnight.outsider)
    page = client.get("/reviews/2026-11-23/")
    assert page.context["tenant"] == "vision"
    assert page.context["part"]["this"]["key_wait_p95_s"] == 3000.0
    assert "nlp" not in page.content.decode()


@pytest.mark.parametrize("who", ["member", "viewer"])
def test_members_and_viewers_are_refused(client, review, fortnight, who):  # noqa: F811
    client.force_login(getattr(fortnight, who))
    assert client.get("/reviews/").status_code == 403
    assert client.get("/reviews/2026-11-23/").status_code == 403


@pytest.mark.parametrize("week", ["2026-11-24", "2026-11-30", "nonsense", "2026-02-30"])
def test_unknown_weeks_are_404(client, review, fortnight, week):  # noqa: F811
    client.force_login(fortnight.platform_admin)
    assert client.get(f"/reviews/{week}/").status_code == 404


@freeze_time("2026-12-02 10:00:00")
def test_compute_now(client, fortnight):  # noqa: F811
    client.force_login(fortnight.tenant_admin)
    assert client.post("/reviews/compute/", {"week_start": "2026-11-23"}).status_code == 403
    assert not PolicyReview.objects.exists()
    client.force_login(fortnight.platform_admin)
    response = client.post("/reviews/compute/", {"week_start": "2026-11-30"})
    assert response.status_code == 302 and response["Location"] == "/reviews/2026-11-30/"
    review = PolicyReview.objects.get()
    assert not reviews.is_final(review) and review.figures["computed_by"] == "root"
    page = client.get("/reviews/2026-11-30/").content.decode()
    assert "Week still running: figures so far." in page
    for bad in ("2026-12-01", "2026-12-07", ""):
        response = client.post("/reviews/compute/", {"week_start": bad}, follow=True)
        assert response.redirect_chain[-1][0] == "/reviews/"
    assert PolicyReview.objects.count() == 1
    assert client.get("/reviews/compute/").status_code == 405


def test_weeks_at_the_ends_of_the_calendar_are_refused_not_a_500(client, fortnight):  # noqa: F811
    # The review reads the week before and ends the Monday after: both must be dates.
    client.force_login(fortnight.platform_admin)
    for bad in ("0001-01-01", "9999-12-27", "1969-12-29"):
        response = client.post("/reviews/compute/", {"week_start": bad}, follow=True)
        assert response.status_code == 200
        assert response.redirect_chain[-1][0] == "/reviews/"
        assert client.get(f"/reviews/{bad}/").status_code == 404
    assert not PolicyReview.objects.exists()
    with pytest.raises(BusinessError):
        review_services.policy_review_write(week_start=dt.date(9999, 12, 27))


def test_empty_list(client, world):
    client.force_login(world.platform_admin)
    assert "No review yet" in client.get("/reviews/").content.decode()
