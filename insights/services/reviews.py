"""What the weekly policy review writes: a week's review stored (the figures of
``insights.reviews``), and the platform admins notified once, when its final review is first
stored."""

from __future__ import annotations

import datetime as dt

from django.contrib.auth import get_user_model
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from portal.errors import BusinessError
from scheduling.services.notifications import notification_send

from ..models import PolicyReview
from ..reviews import (
    FIRST_WEEK,
    LAST_WEEK,
    NOTIFICATION_KIND,
    is_final,
    review_compute,
    review_slice,
    week_bounds,
)


@transaction.atomic
def policy_review_write(
    *, week_start: dt.date, refresh: bool = False, user=None, now: dt.datetime | None = None
) -> PolicyReview:
    """Store the review of the week that begins on ``week_start`` (a Monday).

    Idempotent: once a review was computed after its week ended it is kept as it is
    (``refresh`` recomputes it: the "compute now" button). A week still running may be
    computed "so far"; the first computation after its end replaces those figures. Platform
    admins are notified once, when the week's final review is first stored.
    """
    now = now or timezone.now()
    if week_start.weekday() != 0:
        raise BusinessError("A week starts on a Monday.", field="week_start")
    if not FIRST_WEEK <= week_start <= LAST_WEEK:
        raise BusinessError(
            f"Pick a week from {FIRST_WEEK:%Y-%m-%d} to {LAST_WEEK:%Y-%m-%d}.", field="week_start"
        )
    start, end = week_bounds(week_start)
    if start > now:
        raise BusinessError("That week has not begun yet.", field="week_start")
    review, _ = PolicyReview.objects.get_or_create(
        week_start=week_start, defaults={"created_at": now, "figures": {}}
    )
    review = PolicyReview.objects.select_for_update().get(pk=review.pk)
    if is_final(review) and not refresh:
        return review
    notified_at = (review.figures or {}).get("notified_at")
    figures = review_compute(week_start)
    figures.update(
        computed_at=now.isoformat(),
        computed_by=user.get_username() if user is not None else "",
        final=now >= end,
        notified_at=notified_at,
    )
    if figures["final"] and not notified_at:
        review.figures = figures
        _notify(review)
        figures["notified_at"] = now.isoformat()
    review.figures = figures
    review.save(update_fields=["figures"])
    return review


def _notify(review: PolicyReview) -> None:
    verdict = review_slice(review)["verdict"]
    admins = get_user_model().objects.filter(is_staff=True, is_active=True)
    notification_send(
        users=admins,
        kind=NOTIFICATION_KIND,
        message=f"Weekly policy review, week of {review.week_start:%Y-%m-%d}: {verdict['text']}",
        link=reverse("policy-review", args=[review.week_start.isoformat()]),
    )
