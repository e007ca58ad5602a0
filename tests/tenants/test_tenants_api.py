"""/api/v1/tenants: platform admins create; tenant admins rename; everyone sees only their own."""

import pytest

from audit.models import AuditEvent
from tenants.models import Tenant


def test_platform_admin_creates_a_tenant(world, api):
    response = api(world.platform_admin).post(
        "/api/v1/tenants", {"slug": "speech", "name": "Speech"}, format="json"
    )

    assert response.status_code == 201, response.json()
    tenant = Tenant.objects.get(slug="speech")
    assert tenant.name == "Speech" and tenant.active
    event = AuditEvent.objects.get(action="tenant.create")
    assert event.tenant == tenant
    assert event.before is None
    assert event.after == {
        "slug": "speech",
        "name": "Speech",
        "description": "",
        "active": True,
        "unix_account": "",
    }


@pytest.mark.parametrize("who", ["tenant_admin", "member", "viewer", "outsider"])
def test_only_platform_admins_create_tenants(world, api, who):
    response = api(getattr(world, who)).post(
        "/api/v1/tenants", {"slug": "speech", "name": "Speech"}, format="json"
    )

    assert response.status_code == 403
    assert not Tenant.objects.filter(slug="speech").exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "No slug"}, "slug"),
        ({"slug": "speech"}, "name"),
        ({"slug": "nlp", "name": "Duplicate"}, "slug"),
        ({"slug": "Has Spaces", "name": "x"}, "slug"),
        ({"slug": "Upper_Case", "name": "x"}, "slug"),  # a DRF slug, not a Sluice slug
        ({"slug": "-dash", "name": "x"}, "slug"),
        ({"slug": "s" * 51, "name": "x"}, "slug"),
        ({"slug": "speech", "name": "n" * 121}, "name"),
        ({"slug": "speech", "name": "x", "description": "d" * 2001}, "description"),
        ({"slug": 5, "name": {"a": 1}}, "name"),
        ({"slug": "speech", "name": "x", "active": "sometimes"}, "active"),
    ],
)
def test_bad_tenant_input_is_a_400_and_stores_nothing(world, api, body, field):
    before = Tenant.objects.count()

    response = api(world.platform_admin).post("/api/v1/tenants", body, format="json")

    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()
    assert Tenant.objects.count() == before
    assert not AuditEvent.objects.exists()


def test_tenant_list_and_detail_are_scoped(world, api):
    assert [t["slug"] for t in api(world.viewer).get("/api/v1/tenants").json()["results"]] == [
        "nlp"
    ]
    slugs = [t["slug"] for t in api(world.platform_admin).get("/api/v1/tenants").json()["results"]]
    assert slugs == ["nlp", "vision"]
    assert api(world.outsider).get("/api/v1/tenants/nlp").status_code == 404
    assert api(world.viewer).get("/api/v1/tenants/nlp").json()["my_role"] == "viewer"


def test_tenant_admin_renames_their_tenant(world, api):
    response = api(world.tenant_admin).patch(
        "/api/v1/tenants/nlp", {"name": "NLP team"}, format="json"
    )

    assert response.status_code == 200
    world.tenant.refresh_from_db()
    assert world.tenant.name == "NLP team"
    event = AuditEvent.objects.get(action="tenant.update")
    assert (event.before["name"], event.after["name"]) == ("Language", "NLP team")


def test_tenant_admin_may_not_change_the_slug_or_deactivate(world, api):
    for body in ({"slug": "renamed"}, {"active": False}):
        response = api(world.tenant_admin).patch("/api/v1/tenants/nlp", body, format="json")
        assert response.status_code == 403
    world.tenant.refresh_from_db()
    assert (world.tenant.slug, world.tenant.active) == ("nlp", True)


def test_platform_admin_cannot_take_a_used_slug(world, api):
    response = api(world.platform_admin).patch(
        "/api/v1/tenants/nlp", {"slug": "vision"}, format="json"
    )

    assert response.status_code == 400
    assert "slug" in response.json()["errors"]
    world.tenant.refresh_from_db()
    assert world.tenant.slug == "nlp"


@pytest.mark.parametrize(("who", "status"), [("member", 403), ("viewer", 403), ("outsider", 404)])
def test_others_cannot_change_the_tenant(world, api, who, status):
    response = api(getattr(world, who)).patch(
        "/api/v1/tenants/nlp", {"name": "Hijacked"}, format="json"
    )

    assert response.status_code == status
    world.tenant.refresh_from_db()
    assert world.tenant.name == "Language"


def test_inactive_tenant_disappears_for_its_members(world, api):
    api(world.platform_admin).patch("/api/v1/tenants/nlp", {"active": False}, format="json")

    assert api(world.member).get("/api/v1/tenants/nlp").status_code == 404
    assert api(world.member).get("/api/v1/projects").json()["count"] == 0
    assert api(world.platform_admin).get("/api/v1/tenants/nlp").status_code == 200
