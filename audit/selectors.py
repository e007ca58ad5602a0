"""Reads of the audit log, scoped to the user asking.

``audit`` sits below ``tenants`` (DESIGN §3): it imports nothing of ``tenants`` when
loaded. The one scoping rule (``tenants.scoping``) is imported where a read runs, as the
tenant model is looked up by name, so the rule is not written a second time here.
"""

from __future__ import annotations

from django.db.models import QuerySet

from .models import AuditEvent


def _scoping():
    from tenants import scoping

    return scoping


def may_read_audit_log(user) -> bool:
    """Platform admins and tenant admins read the log; members and viewers do not (403)."""
    return _scoping().administers_any_tenant(user)


def audit_events_visible_to(user) -> QuerySet[AuditEvent]:
    """Platform admins: every event. Tenant admins: their tenants' events. Others: none.

    Events without a tenant (pools, nodes, users, classes) are platform events.
    """
    return _scoping().restrict(AuditEvent.objects.select_related("tenant"), user, "admin")


def audit_tenant_slugs(user) -> list[str]:
    """The tenants whose events the user may filter by (for the page's tenant choice)."""
    from django.apps import apps

    tenant_model = apps.get_model("tenants", "Tenant")
    qs = _scoping().restrict(tenant_model.objects.order_by("slug"), user, "admin", None)
    return list(qs.values_list("slug", flat=True))
