"""The job page's limits panel (``scheduling/_job_limits.html``) and the ``duration`` filter."""

from django import template
from django.utils import timezone

from scheduling.choices import RAISABLE_STATES
from scheduling.limits import selectors
from scheduling.limits.forms import ExtensionRequestForm, IdleExemptForm
from scheduling.models import WorkloadPolicy
from scheduling.selectors import can_manage_job
from scheduling.services.limits import EXTENDABLE_STATES, warning_fractions
from scheduling.services.waste import human_duration
from tenants.choices import Role
from tenants.selectors import has_role

register = template.Library()


@register.filter
def duration(seconds) -> str:
    """``5400`` → ``1 h 30 min``."""
    return "—" if seconds is None else human_duration(seconds)


@register.simple_tag(takes_context=True)
def job_limits(context, job) -> dict:
    """The limits that apply to the job and what the user may do about them."""
    user = context["request"].user
    policy = WorkloadPolicy.objects.filter(workload_type=job.workload_type).first()
    info = selectors.job_limits(job, policy, timezone.now())
    pending = info["pending_extension"]
    info["warning_percents"] = [round(f * 100) for f in warning_fractions()]
    info["may_extend"] = (
        job.state in EXTENDABLE_STATES
        and pending is None
        and has_role(user, job.tenant_id, Role.MEMBER)
        and can_manage_job(user, job)
    )
    info["may_exempt"] = (
        info["idle_reclaim"]
        and job.state in RAISABLE_STATES
        and has_role(user, job.tenant_id, Role.ADMIN)
    )
    info["may_decide"] = pending is not None and selectors.extension_refusal(user, pending) is None
    # Distinct element ids: both forms have a "reason" field on the same page.
    info["extension_form"] = (
        ExtensionRequestForm(auto_id="extend_%s") if info["may_extend"] else None
    )
    info["exempt_form"] = IdleExemptForm(auto_id="exempt_%s") if info["may_exempt"] else None
    return info
