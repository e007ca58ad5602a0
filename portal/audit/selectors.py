"""Reads of the audit log, scoped to the user asking.

``portal.audit`` sits below ``tenants`` (DESIGN §3), so roles are read through the ORM
relations of the audit row's tenant instead of importing ``tenants``.
"""

from __future__ import annotations

from django.db.models import QuerySet

from .models import AuditEvent

# tenants.choices.Role.ADMIN, written out: this package must not import tenants.
TENANT_ADMIN_ROLE = "admin"


def _is_platform_admin(user) -> bool:
    return bool(user and user.is_authenticated and user.is_active and user.is_staff)


def may_read_audit_log(user) -> bool:
    """Platform admins and tenant admins read the log; members and viewers do not (403)."""
    if _is_platform_admin(user):
        return True
    if not user or not user.is_authenticated or not user.is_active:
        return False
    return user.memberships.filter(role=TENANT_ADMIN_ROLE, tenant__active=True).exists()


def audit_events_visible_to(user) -> QuerySet[AuditEvent]:
    """Platform admins: every event. Tenant admins: their tenants' events. Others: none.

    Events without a tenant (pools, nodes, users, classes) are platform events.
    """
    qs = AuditEvent.objects.select_related("tenant")
    if _is_platform_admin(user):
        return qs
    if not user or not user.is_authenticated or not user.is_active:
        return qs.none()
    # One membership row per (user, tenant), so this join adds no duplicates.
    return qs.filter(
        tenant__memberships__user=user,
        tenant__memberships__role=TENANT_ADMIN_ROLE,
        tenant__active=True,
    )


def audit_tenant_slugs(user) -> list[str]:
    """The tenants whose events the user may filter by (for the page's tenant choice)."""
    from django.apps import apps

    tenant_model = apps.get_model("tenants", "Tenant")
    qs = tenant_model.objects.order_by("slug")
    if not _is_platform_admin(user):
        qs = qs.filter(memberships__user=user, memberships__role=TENANT_ADMIN_ROLE, active=True)
    return list(qs.values_list("slug", flat=True))
