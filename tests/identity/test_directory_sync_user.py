"""identity.services.directory_sync_user: just-in-time users, roles synced from directory
groups (added, changed, removed, audited with group and source), local memberships kept."""

import pytest

from audit.models import AuditEvent
from identity.choices import DirectorySource, GrantedRole, MappingSource
from identity.models import DirectoryGroupRole, DirectoryIdentity
from identity.services import directory_sync_user
from portal.errors import BusinessError
from tenants.choices import MembershipSource, Role
from tenants.models import Membership
from tests import factories as f

pytestmark = pytest.mark.django_db


@pytest.fixture
def tenants():
    nlp = f.TenantFactory(slug="nlp")
    vision = f.TenantFactory(slug="vision")
    DirectoryGroupRole.objects.create(
        source=MappingSource.ANY, group="nlp-admins", tenant=nlp, role=GrantedRole.ADMIN
    )
    DirectoryGroupRole.objects.create(
        source=MappingSource.OIDC, group="nlp", tenant=nlp, role=GrantedRole.MEMBER
    )
    DirectoryGroupRole.objects.create(
        source=MappingSource.OIDC, group="vision", tenant=vision, role=GrantedRole.VIEWER
    )
    DirectoryGroupRole.objects.create(
        source=MappingSource.LDAP,
        group="cn=Vision,ou=Groups,dc=example,dc=org",
        tenant=vision,
        role=GrantedRole.MEMBER,
    )
    DirectoryGroupRole.objects.create(
        source=MappingSource.OIDC, group="platform", tenant=None, role=GrantedRole.PLATFORM_ADMIN
    )
    return nlp, vision


def _sync(groups, **kw):
    kw.setdefault("username", "alice")
    kw.setdefault("email", "alice@example.org")
    kw.setdefault("source", DirectorySource.OIDC)
    kw.setdefault("subject", "sub-alice")
    return directory_sync_user(groups=groups, **kw)


def _roles(user):
    return {m.tenant.slug: (m.role, m.source) for m in Membership.objects.filter(user=user)}


def test_new_user_is_created_without_a_usable_password_with_roles_from_groups(tenants):
    user = _sync(
        ["nlp", "vision", "unmapped"], name="Alice Liddell", unix_account="alice", unix_uid=20001
    )

    assert not user.has_usable_password()
    assert (user.first_name, user.last_name) == ("Alice", "Liddell")
    assert _roles(user) == {
        "nlp": (Role.MEMBER, MembershipSource.DIRECTORY),
        "vision": (Role.VIEWER, MembershipSource.DIRECTORY),
    }
    identity = DirectoryIdentity.objects.get(user=user)
    assert (identity.source, identity.subject, identity.unix_account, identity.unix_uid) == (
        "oidc",
        "sub-alice",
        "alice",
        20001,
    )
    granted = AuditEvent.objects.filter(action="identity.role_granted").order_by("id")
    assert [
        (e.tenant.slug, e.after["role"], e.after["groups"], e.after["source"]) for e in granted
    ] == [
        ("nlp", "member", ["nlp"], "oidc"),
        ("vision", "viewer", ["vision"], "oidc"),
    ]
    assert (
        AuditEvent.objects.filter(action="identity.user_created", target_label="alice").count() == 1
    )


def test_the_highest_role_of_the_groups_wins_and_changes_are_audited(tenants):
    user = _sync(["nlp"])
    _sync(["nlp", "nlp-admins"])
    assert _roles(user)["nlp"] == (Role.ADMIN, MembershipSource.DIRECTORY)
    changed = AuditEvent.objects.get(action="identity.role_changed")
    assert changed.before["role"] == "member"
    assert (changed.after["role"], changed.after["groups"]) == ("admin", ["nlp-admins"])


def test_a_group_removed_removes_the_role_and_is_audited(tenants):
    user = _sync(["nlp", "vision"])
    _sync(["nlp"])
    assert set(_roles(user)) == {"nlp"}
    removed = AuditEvent.objects.get(action="identity.role_removed")
    assert removed.tenant.slug == "vision"
    assert removed.before == {"user": "alice", "role": "viewer"}
    assert removed.after == {"groups": ["nlp"], "source": "oidc"}


def test_local_memberships_are_never_touched(tenants):
    nlp, vision = tenants
    user = f.UserFactory(username="alice")
    f.MembershipFactory(user=user, tenant=vision, role=Role.ADMIN)  # local, by hand
    _sync(["vision", "nlp"])  # vision would grant viewer; the local admin stays
    _sync([])  # no group at all: the directory's nlp role goes, the local one stays
    assert _roles(user) == {"vision": (Role.ADMIN, MembershipSource.LOCAL)}
    assert AuditEvent.objects.filter(action="identity.user_linked").count() == 1
    assert user.has_usable_password()  # a linked local user keeps their password


def test_ldap_group_dns_match_case_insensitively_and_only_their_source(tenants):
    user = _sync(
        ["CN=vision,OU=groups,DC=example,DC=org", "nlp"],
        source=DirectorySource.LDAP,
        subject="uid=alice,ou=People,dc=example,dc=org",
    )
    # the DN grants vision member; "nlp" is mapped for OIDC only
    assert _roles(user) == {"vision": (Role.MEMBER, MembershipSource.DIRECTORY)}


def test_platform_admin_from_the_mapping_but_a_hand_given_staff_flag_stays(tenants):
    user = _sync(["platform"])
    assert user.is_staff
    user = _sync([])
    user.refresh_from_db()
    assert not user.is_staff
    assert [
        e.action
        for e in AuditEvent.objects.filter(action__startswith="identity.platform").order_by("id")
    ] == [
        "identity.platform_admin_granted",
        "identity.platform_admin_removed",
    ]
    breakglass = f.UserFactory(username="root", is_staff=True)
    _sync([], username="root", subject="sub-root")
    breakglass.refresh_from_db()
    assert breakglass.is_staff


def test_an_invalid_unix_account_from_the_directory_is_a_business_error(tenants):
    with pytest.raises(BusinessError, match="not a valid Unix account"):
        _sync(["nlp"], unix_account="Robert'); DROP")
    assert not DirectoryIdentity.objects.exists()


def test_a_directory_membership_is_not_editable_by_hand(tenants):
    from tenants.services import membership_change_role, membership_remove

    nlp, _ = tenants
    user = _sync(["nlp"])
    admin = f.UserFactory(username="root", is_staff=True, is_superuser=True)
    membership = Membership.objects.get(user=user, tenant=nlp)
    with pytest.raises(BusinessError, match="directory"):
        membership_change_role(actor=admin, membership=membership, role=Role.VIEWER)
    with pytest.raises(BusinessError, match="directory"):
        membership_remove(actor=admin, membership=membership)
    assert Membership.objects.filter(pk=membership.pk, role=Role.MEMBER).exists()
