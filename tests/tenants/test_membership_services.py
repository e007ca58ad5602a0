"""tenants.services memberships and the role selectors they feed."""

import pytest

from audit.models import AuditEvent
from portal.errors import BusinessError, PermissionDeniedError
from tenants import services
from tenants.choices import Role
from tenants.models import Membership
from tenants.selectors import can_submit_to_project, has_role, role_in
from tests import factories as f


def test_roles_rank_viewer_member_admin(world):
    assert has_role(world.tenant_admin, world.tenant, Role.MEMBER)
    assert has_role(world.member, world.tenant, Role.VIEWER)
    assert not has_role(world.viewer, world.tenant, Role.MEMBER)
    assert not has_role(world.outsider, world.tenant, Role.VIEWER)
    assert has_role(world.platform_admin, world.tenant, Role.ADMIN)
    assert role_in(world.outsider, world.tenant) is None


def test_add_refreshes_the_cached_roles_of_the_added_user(world):
    newcomer = f.UserFactory(username="newcomer")
    assert role_in(newcomer, world.tenant) is None  # caches "no role"

    services.membership_add(
        actor=world.tenant_admin, tenant=world.tenant, user=newcomer, role="admin"
    )

    assert role_in(newcomer, world.tenant) == Role.ADMIN


def test_each_change_writes_exactly_one_audit_event(world):
    newcomer = f.UserFactory(username="newcomer")
    admin = world.tenant_admin

    membership = services.membership_add(
        actor=admin, tenant=world.tenant, user=newcomer, role=Role.VIEWER
    )
    services.membership_change_role(actor=admin, membership=membership, role=Role.ADMIN)
    services.membership_remove(actor=admin, membership=membership)

    events = list(AuditEvent.objects.order_by("id").values_list("action", "before", "after"))
    assert events == [
        ("membership.add", None, {"user": "newcomer", "role": "viewer"}),
        (
            "membership.change_role",
            {"user": "newcomer", "role": "viewer"},
            {"user": "newcomer", "role": "admin"},
        ),
        ("membership.remove", {"user": "newcomer", "role": "admin"}, None),
    ]
    assert not Membership.objects.filter(user=newcomer).exists()


def test_unknown_role_is_refused_by_the_service(world):
    newcomer = f.UserFactory(username="newcomer")

    with pytest.raises(BusinessError) as excinfo:
        services.membership_add(
            actor=world.tenant_admin, tenant=world.tenant, user=newcomer, role="owner"
        )

    assert "role" in excinfo.value.errors
    assert not Membership.objects.filter(user=newcomer).exists()


def test_last_admin_rules_in_the_service(world):
    membership = Membership.objects.get(user=world.tenant_admin)

    with pytest.raises(BusinessError):
        services.membership_change_role(
            actor=world.platform_admin, membership=membership, role=Role.MEMBER
        )
    with pytest.raises(BusinessError):
        services.membership_remove(actor=world.platform_admin, membership=membership)

    membership.refresh_from_db()
    assert membership.role == Role.ADMIN
    assert not AuditEvent.objects.exists()


def test_members_cannot_manage_memberships(world):
    membership = Membership.objects.get(user=world.viewer)

    with pytest.raises(PermissionDeniedError):
        services.membership_change_role(actor=world.member, membership=membership, role="admin")

    membership.refresh_from_db()
    assert membership.role == Role.VIEWER


def test_submit_rights_follow_the_grant(world):
    world.project.restricted = True
    world.project.save()
    assert not can_submit_to_project(world.member, world.project)
    assert can_submit_to_project(world.tenant_admin, world.project)
    assert not can_submit_to_project(world.viewer, world.project)

    services.project_set_submitter(
        actor=world.tenant_admin, project=world.project, user=world.member, allowed=True
    )

    assert can_submit_to_project(world.member, world.project)
    services.project_set_submitter(
        actor=world.tenant_admin, project=world.project, user=world.viewer, allowed=True
    )
    assert not can_submit_to_project(world.viewer, world.project)  # a grant does not make a member
