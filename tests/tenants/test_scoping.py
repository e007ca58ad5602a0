"""The one tenant-scoping rule (tenants.scoping.restrict) and that every selector uses it."""

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import AnonymousUser
from django.utils import timezone

from portal.errors import NotFoundError, PermissionDeniedError
from scheduling.models import Job, JobEvent, ReclaimRecord
from tenants.choices import Role
from tenants.models import Project, Tenant
from tenants.scoping import require_role, restrict, tenant_ids_for
from tests import factories as f

ROOT = Path(__file__).resolve().parents[2]


def _visible(qs, user, **kwargs) -> set:
    return set(restrict(qs, user, **kwargs).values_list("pk", flat=True))


@pytest.fixture
def tenants(world):
    closed = f.TenantFactory(slug="closed", active=False)
    f.MembershipFactory(user=world.member, tenant=closed, role=Role.ADMIN)
    return world.tenant, world.other, closed


def test_members_see_their_active_tenants_only(world, tenants):
    nlp, vision, closed = tenants
    assert _visible(Tenant.objects.all(), world.member, tenant_field=None) == {nlp.pk}
    assert _visible(Tenant.objects.all(), world.outsider, tenant_field=None) == {vision.pk}


def test_platform_admins_see_every_tenant_active_or_not(world, tenants):
    assert _visible(Tenant.objects.all(), world.platform_admin, tenant_field=None) == {
        t.pk for t in tenants
    }


def test_anonymous_and_deactivated_users_see_nothing(world, tenants):
    world.member.is_active = False
    world.member.save()
    staff = f.UserFactory(is_staff=True, is_active=False)
    for user in (AnonymousUser(), world.member, staff, None):
        assert _visible(Tenant.objects.all(), user, tenant_field=None) == set()
        assert _visible(Project.objects.all(), user) == set()


def test_the_action_needs_its_role(world):
    own = f.JobFactory(
        tenant=world.tenant, project=world.project, queue=world.queue, submitted_by=world.member
    )
    jobs = Job.objects.all()
    expect = {
        "view": {"viewer", "member", "admin"},
        "change": {"member", "admin"},
        "admin": {"admin"},
    }
    for action, roles in expect.items():
        for role in Role.values:
            user = getattr(world, {"admin": "tenant_admin"}.get(role, role))
            seen = _visible(jobs, user, action=action)
            assert seen == ({own.pk} if role in roles else set()), (action, role)
    with pytest.raises(ValueError):
        restrict(jobs, world.member, action="delete")


def test_a_path_through_a_relation_and_rows_of_no_tenant(world):
    job = f.JobFactory(
        tenant=world.tenant, project=world.project, queue=world.queue, submitted_by=world.member
    )
    event = JobEvent.objects.create(job=job, created_at=timezone.now(), kind="note")
    events = JobEvent.objects.all()
    assert _visible(events, world.viewer, tenant_field="job__tenant") == {event.pk}
    assert _visible(events, world.outsider, tenant_field="job__tenant") == set()
    zombie = ReclaimRecord.objects.create(
        created_at=timezone.now(), kind="zombie_kill", tenant=None
    )
    records = ReclaimRecord.objects.all()
    assert _visible(records, world.tenant_admin) == set()  # no tenant: the platform's
    assert _visible(records, world.platform_admin) == {zombie.pk}


def test_cached_roles_answer_as_the_subquery(world, tenants):
    for user in (world.member, world.viewer, world.outsider, world.platform_admin):
        for action in ("view", "change", "admin"):
            qs = Project.objects.all()
            assert _visible(qs, user, action=action) == _visible(
                qs, user, action=action, cached_roles=True
            ), (user.username, action)


@pytest.mark.parametrize("mode", ["cached_roles", "tenants_named"])
def test_the_other_modes_answer_as_the_subquery(world, tenants, mode):
    for user in (world.member, world.viewer, world.outsider, world.platform_admin):
        for action in ("view", "change", "admin"):
            qs = Project.objects.all()
            assert _visible(qs, user, action=action) == _visible(
                qs, user, action=action, **{mode: True}
            ), (user.username, action)


def test_named_tenants_are_in_the_query_and_no_join(world, tenants):
    sql = str(restrict(Project.objects.order_by(), world.member, tenants_named=True).query)
    assert f"IN ({world.tenant.pk})" in sql
    assert "tenants_membership" not in sql and "JOIN" not in sql
    assert not restrict(Project.objects.all(), f.UserFactory(), tenants_named=True).exists()


def test_tenant_ids_for_ignores_platform_rights(world):
    assert list(tenant_ids_for(world.platform_admin, "view")) == []
    assert [r["tenant_id"] for r in tenant_ids_for(world.tenant_admin, "admin")] == [
        world.tenant.pk
    ]


# --- a write on a tenant's object: 404 out of sight, 403 below the role -------------------


def test_require_role_hides_the_object_from_outsiders_and_refuses_low_roles(world):
    def outcome(user, role):
        try:
            require_role(user, world.tenant, role, not_found="gone", denied="no")
        except NotFoundError as exc:
            return 404, exc.message
        except PermissionDeniedError as exc:
            return 403, exc.message
        return 200, ""

    assert outcome(world.outsider, Role.VIEWER) == (404, "gone")
    assert outcome(AnonymousUser(), Role.VIEWER) == (404, "gone")
    assert outcome(world.viewer, Role.VIEWER) == (200, "")
    assert outcome(world.viewer, Role.MEMBER) == (403, "no")
    assert outcome(world.member, Role.MEMBER) == (200, "")
    assert outcome(world.member, Role.ADMIN) == (403, "no")
    assert outcome(world.tenant_admin, Role.ADMIN) == (200, "")
    assert outcome(world.platform_admin, Role.ADMIN) == (200, "")


#: Services that write on a tenant's object; each says 404/403 through require_role.
WRITING_SERVICES = (
    "scheduling/services/jobs.py",
    "scheduling/services/limits.py",
    "scheduling/services/raises.py",
    "scheduling/services/reclaim.py",
    "inference/services.py",
)


@pytest.mark.parametrize("path", WRITING_SERVICES)
def test_the_404_then_403_rule_is_not_written_again(path):
    """ "Not even a viewer: not found" is tenants.scoping.require_role's, not a service's."""
    source = (ROOT / path).read_text()
    assert not re.search(r"has_role\([^)]*Role\.VIEWER\)", source), path
    assert "require_role(" in source, path


#: Where the staff flag itself is read: the rule, the account edit that may not demote
#: oneself, and sign-in and directory sync (which grant and withdraw the flag).
STAFF_FLAG_READERS = {
    "tenants/scoping.py",
    "tenants/services.py",
    "identity/forms.py",
    "identity/oidc.py",
    "identity/services.py",
}
APP_DIRS = (
    "accounts",
    "audit",
    "identity",
    "inference",
    "insights",
    "portal",
    "scheduling",
    "tenants",
)


def test_who_is_a_platform_admin_is_read_from_the_rule():
    """Pages, services and the navigation ask is_platform_admin (an active staff user), not
    the staff flag."""
    found = []
    for app in APP_DIRS:
        for path in sorted((ROOT / app).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if "/migrations/" in name or name in STAFF_FLAG_READERS:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"\.is_staff\b", line):
                    found.append(f"{name}:{number}: {line.strip()}")
    assert not found, "platform admin read from the staff flag:\n" + "\n".join(found)


# --- every selector module scopes through the primitive ---------------------------------------

SELECTOR_MODULES = (
    "tenants/selectors.py",
    "scheduling/selectors.py",
    "scheduling/limits/selectors.py",
    "insights/usage.py",
    "insights/selectors.py",
    "audit/selectors.py",
    "accounts/selectors.py",
    "inference/selectors.py",
)

#: Ways of writing the rule by hand: a membership join on the user asking, a read of the
#: user's memberships, a list of the user's tenants, the active-tenant filter, or platform
#: rights read from the staff flag.
HAND_WRITTEN = (
    re.compile(r"memberships__user\b"),
    re.compile(r"Membership\.objects\.filter\(\s*user\s*="),
    re.compile(r"\buser\.memberships\b"),
    re.compile(r"\b_?member_tenant_ids\("),
    re.compile(r"tenant__active\s*=\s*True"),
    re.compile(r"\bactive\s*=\s*True\b"),
    re.compile(r"\.is_staff\b"),
)


@pytest.mark.parametrize("path", SELECTOR_MODULES)
def test_selector_module_scopes_through_the_primitive(path):
    source = (ROOT / path).read_text()
    found = [
        f"{path}:{source.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
        for pattern in HAND_WRITTEN
        for m in pattern.finditer(source)
    ]
    assert not found, "tenant scoping written by hand; use tenants.scoping:\n" + "\n".join(found)
    assert re.search(r"\b(restrict|tenant_ids_for|is_platform_admin)\b", source), path


def test_the_hand_written_patterns_are_caught():
    """The check above finds what the selectors used to write."""
    samples = (
        "qs.filter(tenant__memberships__user=user, tenant__active=True)",
        "Membership.objects.filter(user=user, role__in=roles)",
        "user.memberships.filter(role='admin')",
        "qs.filter(tenant_id__in=member_tenant_ids(user))",
        "bool(user and user.is_staff)",
    )
    for sample in samples:
        assert any(p.search(sample) for p in HAND_WRITTEN), sample
