"""The job page's priority-raise panel (filled into the ``scheduling/_job_extra.html`` hook)."""

from django import template
from django.db.models import Q

from scheduling import selectors
from scheduling.choices import RAISABLE_STATES, RaiseState
from scheduling.forms import RaiseRequestForm
from tenants.choices import Role
from tenants.selectors import has_role

register = template.Library()


def _row(user, raise_) -> dict:
    pending, approved = raise_.state == RaiseState.PENDING, raise_.state == RaiseState.APPROVED
    return {
        "raise": raise_,
        "can_cancel": pending and selectors.raise_refusal(user, raise_, "cancel") is None,
        "can_decide": pending and selectors.raise_refusal(user, raise_, "approve") is None,
        "can_revoke": approved and selectors.raise_refusal(user, raise_, "revoke") is None,
    }


@register.inclusion_tag("scheduling/_job_raises.html", takes_context=True)
def job_raise_panel(context, job):
    """The raises of the job (and grants of its project), and the request form for those who
    may manage a job that is still waiting or running."""
    request = context["request"]
    user = request.user
    raises = list(
        selectors.raises_visible_to(user)
        .filter(Q(job=job) | Q(project_id=job.project_id, state=RaiseState.APPROVED))
        .order_by("-id")[:20]
    )
    may_request = (
        job.state in RAISABLE_STATES
        and has_role(user, job.tenant_id, Role.MEMBER)
        and selectors.can_manage_job(user, job)
    )
    rows = [_row(user, r) for r in raises]
    waiting = any(r.job_id == job.pk and r.state == RaiseState.PENDING for r in raises)
    form = RaiseRequestForm(user=user, job=job) if may_request and not waiting else None
    if form is not None and not form.fields["to_class"].queryset.exists():
        form = None
    return {
        "job": job,
        "rows": rows,
        "form": form,
        "may_request": may_request,
        "waiting": waiting,
        "csrf_token": context.get("csrf_token"),
        "request": request,
    }
