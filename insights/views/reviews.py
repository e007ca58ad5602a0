"""The weekly policy review's pages: the list, one week's report, and "compute now".

Platform admins see the cluster's figures (and any tenant's slice with ``?tenant=``);
tenant admins see the slice of the tenants they administer. Members and viewers get a 403:
the review is about the policy (overrides, approvals), an admin matter like the audit log.

"Compute now" is not audited: it changes no quota, queue, policy or right, it only
(re)computes a derived report from the records (the audit log among them); the review row
says when and by whom it was computed.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_POST

from portal.errors import BusinessError
from tenants.selectors import administered_tenants, is_platform_admin

from .. import reviews
from ..models import PolicyReview
from ..services.reviews import policy_review_write


def _admin_tenants(user) -> list[str]:
    """Slugs of the tenants whose slice the user may read (platform admins: all)."""
    if is_platform_admin(user):
        from tenants.models import Tenant

        return list(Tenant.objects.order_by("slug").values_list("slug", flat=True))
    return list(administered_tenants(user).values_list("slug", flat=True))


def _scope(request) -> tuple[str | None, list[str]]:
    """(tenant slug or None for the cluster, the tenants the user may pick)."""
    tenants = _admin_tenants(request.user)
    asked = request.GET.get("tenant") or None
    if is_platform_admin(request.user):
        if asked is not None and asked not in tenants:
            raise Http404("No such tenant.")
        return asked, tenants
    if not tenants:
        raise PermissionDenied("Only tenant admins and platform admins read the policy review.")
    if asked is None:
        return tenants[0], tenants
    if asked not in tenants:
        raise Http404("No such tenant.")
    return asked, tenants


@login_required
def policy_reviews(request):
    tenant, tenants = _scope(request)
    items = []
    for review in PolicyReview.objects.order_by("-week_start")[:104]:
        part = reviews.review_slice(review, tenant)
        items.append(
            {
                "review": review,
                "part": part,
                "final": reviews.is_final(review),
                "computed_at": parse_datetime((review.figures or {}).get("computed_at") or ""),
            }
        )
    now = timezone.now()
    return render(
        request,
        "insights/reviews.html",
        {
            "items": items,
            "tenant": tenant,
            "tenants": tenants,
            "is_platform_admin": is_platform_admin(request.user),
            "last_week": reviews.last_completed_week(now),
            "this_week": reviews.monday_of(now.date()),
        },
    )


@login_required
def policy_review(request, week_start: str):
    tenant, tenants = _scope(request)
    day = reviews.parse_week_start(week_start)
    review = PolicyReview.objects.filter(week_start=day).first() if day else None
    if review is None:
        raise Http404("No review of that week.")
    part = reviews.review_slice(review, tenant)
    by_tenant = []
    if tenant is None:
        for slug in (review.figures or {}).get("tenants", {}):
            sliced = reviews.review_slice(review, slug)
            rows = {r["key"]: r for section in sliced["sections"].values() for r in section}
            by_tenant.append(
                {
                    "tenant": slug,
                    "interventions": rows["interventions"],
                    "wait": rows["key_wait_p95_s"],
                    "verdict": sliced["verdict"],
                }
            )
    return render(
        request,
        "insights/review.html",
        {
            "review": review,
            "figures": review.figures or {},
            "computed_at": parse_datetime((review.figures or {}).get("computed_at") or ""),
            "part": part,
            "final": reviews.is_final(review),
            "tenant": tenant,
            "tenants": tenants,
            "by_tenant": by_tenant,
            "is_platform_admin": is_platform_admin(request.user),
        },
    )


@login_required
@require_POST
def policy_review_compute(request):
    if not is_platform_admin(request.user):
        raise PermissionDenied("Only platform admins compute the policy review.")
    day = reviews.parse_week_start(request.POST.get("week_start", ""))
    if day is None:
        messages.error(request, "Pick a week: its Monday, as YYYY-MM-DD.")
        return redirect("policy-reviews")
    try:
        review = policy_review_write(week_start=day, refresh=True, user=request.user)
    except BusinessError as error:
        messages.error(request, error.message)
        return redirect("policy-reviews")
    state = "" if reviews.is_final(review) else " so far"
    messages.success(request, f"Review of the week of {day:%Y-%m-%d} computed{state}.")
    return redirect("policy-review", week_start=day.isoformat())
