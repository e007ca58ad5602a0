from django.contrib.auth.decorators import login_required
from django.shortcuts import render

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
    return render(request, "dashboard.html", context)
