from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.templatetags.static import static

from tenants.selectors import tenants_visible_to


@login_required
def dashboard(request):
    context = {"tenants": tenants_visible_to(request.user)}
    try:
        from scheduling.selectors import dashboard_summary
    except ImportError:
        dashboard_summary = None
    if dashboard_summary is not None:
        context.update(dashboard_summary(request.user))
    # htmx polls only the live part (the counters and the recent jobs).
    template = "_dashboard_live.html" if request.htmx else "dashboard.html"
    if not request.htmx:
        from insights.selectors import dashboard_glance

        context["glance"] = dashboard_glance(request.user)
    return render(request, template, context)


# --- error pages: inside the layout, saying why and what to do ------------------------------


def _roles_and_admins(user) -> list[dict]:
    """The user's role in each of their tenants and who administers it (whom to ask)."""
    from tenants.choices import Role
    from tenants.models import Membership

    if not user or not user.is_authenticated:
        return []
    mine = list(
        Membership.objects.filter(user=user, tenant__active=True).select_related("tenant")[:10]
    )
    admins: dict[int, list[str]] = {}
    for tenant_id, username in Membership.objects.filter(
        tenant_id__in=[m.tenant_id for m in mine], role=Role.ADMIN, user__is_active=True
    ).values_list("tenant_id", "user__username")[:50]:
        admins.setdefault(tenant_id, []).append(username)
    return [
        {
            "tenant": m.tenant,
            "role": m.get_role_display(),
            "admins": [a for a in admins.get(m.tenant_id, []) if a != user.username],
        }
        for m in mine
    ]


def permission_denied(request, exception=None):
    """403: the reason the page or action was refused and who can help."""
    reason = str(exception or "").strip()
    context = {"reason": reason, "memberships": _roles_and_admins(request.user)}
    return render(request, "403.html", context, status=403)


def page_not_found(request, exception=None):
    """404: the object does not exist, or belongs to a tenant the user is not a member of."""
    return render(request, "404.html", {"request_path": request.path}, status=404)


def server_error(request):
    """500: without the request's context (it may be what failed)."""
    from django.http import HttpResponseServerError
    from django.template import loader

    return HttpResponseServerError(loader.get_template("500.html").render({}))


def favicon(request):
    """Browsers and tools that ask /favicon.ico get the icon the pages link to."""
    return redirect(static("img/favicon.svg"), permanent=True)
