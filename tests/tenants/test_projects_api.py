"""/api/v1/projects: tenant admins create and change projects and grant submit rights."""

import pytest

from audit.models import AuditEvent
from scheduling.models import Job, JobEvent
from tenants.models import Project
from tenants.selectors import can_submit_to_project

URL = "/api/v1/projects"


def job_body(world, **overrides):
    return {
        "project": world.project.pk,
        "queue": world.queue.pk,
        "workload_type": "training",
        "command": ["python", "train.py"],
        **overrides,
    }


def test_tenant_admin_creates_a_project(world, api):
    response = api(world.tenant_admin).post(
        URL, {"tenant": "nlp", "slug": "asr", "name": "Speech", "restricted": True}, format="json"
    )

    assert response.status_code == 201, response.json()
    project = Project.objects.get(tenant=world.tenant, slug="asr")
    assert project.restricted is True
    assert response.json()["tenant"] == "nlp"
    event = AuditEvent.objects.get()
    assert event.action == "project.create"
    assert event.tenant == world.tenant
    assert event.after["slug"] == "asr"


@pytest.mark.parametrize(("who", "status"), [("member", 403), ("viewer", 403), ("outsider", 404)])
def test_non_admins_cannot_create_projects(world, api, who, status):
    response = api(getattr(world, who)).post(
        URL, {"tenant": "nlp", "slug": "asr", "name": "Speech"}, format="json"
    )

    assert response.status_code == status
    assert not Project.objects.filter(slug="asr").exists()


def test_same_slug_is_fine_in_another_tenant(world, api):
    response = api(world.outsider).post(
        URL, {"tenant": "vision", "slug": "llm", "name": "Vision LLM"}, format="json"
    )

    assert response.status_code == 201


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"slug": "asr", "name": "x"}, "tenant"),
        ({"tenant": "nlp", "name": "x"}, "slug"),
        ({"tenant": "nlp", "slug": "asr"}, "name"),
        ({"tenant": "nlp", "slug": "llm", "name": "Duplicate"}, "slug"),
        ({"tenant": "nlp", "slug": "Bad Slug", "name": "x"}, "slug"),
        ({"tenant": "nlp", "slug": "under_score", "name": "x"}, "slug"),
        ({"tenant": "nlp", "slug": "a" * 51, "name": "x"}, "slug"),
        ({"tenant": "nlp", "slug": "asr", "name": "n" * 121}, "name"),
        ({"tenant": "nlp", "slug": "asr", "name": "x", "description": "d" * 2001}, "description"),
        ({"tenant": "nlp", "slug": "asr", "name": "x", "restricted": "maybe"}, "restricted"),
        ({"tenant": ["nlp"], "slug": "asr", "name": "x"}, "tenant"),
    ],
)
def test_bad_project_input_is_a_400_and_stores_nothing(world, api, body, field):
    before = Project.objects.count()

    response = api(world.tenant_admin).post(URL, body, format="json")

    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()
    assert Project.objects.count() == before
    assert not AuditEvent.objects.exists()


def test_renaming_a_project_to_a_used_slug_is_a_400(world, api):
    other = Project.objects.create(tenant=world.tenant, slug="asr", name="Speech")

    response = api(world.tenant_admin).patch(f"{URL}/{other.pk}", {"slug": "llm"}, format="json")

    assert response.status_code == 400
    assert "slug" in response.json()["errors"]
    other.refresh_from_db()
    assert other.slug == "asr"


def test_tenant_admin_restricts_a_project(world, api):
    response = api(world.tenant_admin).patch(
        f"{URL}/{world.project.pk}", {"restricted": True}, format="json"
    )

    assert response.status_code == 200
    world.project.refresh_from_db()
    assert world.project.restricted is True
    event = AuditEvent.objects.get(action="project.update")
    assert (event.before["restricted"], event.after["restricted"]) == (False, True)


def test_project_list_and_detail_are_scoped(world, api):
    slugs = [p["slug"] for p in api(world.member).get(URL).json()["results"]]

    assert slugs == ["llm"]
    assert api(world.outsider).get(f"{URL}/{world.project.pk}").status_code == 404
    assert api(world.member).get(URL, {"tenant__slug": "vision"}).json()["count"] == 0


def test_restricted_project_needs_the_submit_grant(world, api):
    world.project.restricted = True
    world.project.save()
    jobs_before = Job.objects.count()

    refused = api(world.member).post("/api/v1/jobs", job_body(world), format="json")

    assert refused.status_code == 403, refused.json()
    assert "project" in refused.json()["errors"]
    assert Job.objects.count() == jobs_before
    assert not JobEvent.objects.exists()

    grant = api(world.tenant_admin).post(
        f"{URL}/{world.project.pk}/submitters",
        {"username": "nlp-member", "allowed": True},
        format="json",
    )

    assert grant.status_code == 204
    event = AuditEvent.objects.get(action="project.submitter_grant")
    assert event.after == {"user": "nlp-member"}
    accepted = api(world.member).post("/api/v1/jobs", job_body(world), format="json")
    assert accepted.status_code == 201, accepted.json()


def test_revoking_the_submit_grant(world, api):
    world.project.restricted = True
    world.project.save()
    admin = api(world.tenant_admin)
    body = {"username": "nlp-member", "allowed": True}
    admin.post(f"{URL}/{world.project.pk}/submitters", body, format="json")
    assert can_submit_to_project(world.member, world.project)

    response = admin.post(
        f"{URL}/{world.project.pk}/submitters", {**body, "allowed": False}, format="json"
    )

    assert response.status_code == 204
    assert not can_submit_to_project(world.member, world.project)
    assert AuditEvent.objects.filter(action="project.submitter_revoke").count() == 1


def test_tenant_admins_submit_to_restricted_projects_without_a_grant(world, api):
    world.project.restricted = True
    world.project.save()

    response = api(world.tenant_admin).post("/api/v1/jobs", job_body(world), format="json")

    assert response.status_code == 201


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"username": "vision-member", "allowed": True}, 400, "user"),  # not a member of nlp
        ({"username": "nobody", "allowed": True}, 404, None),
        ({"username": "nlp-member"}, 400, "allowed"),
        ({"username": "nlp-member", "allowed": "perhaps"}, 400, "allowed"),
    ],
)
def test_bad_submitter_input(world, api, body, status, field):
    response = api(world.tenant_admin).post(
        f"{URL}/{world.project.pk}/submitters", body, format="json"
    )

    assert response.status_code == status, response.json()
    if field:
        assert field in response.json()["errors"]
    assert not AuditEvent.objects.exists()


@pytest.mark.parametrize(("who", "status"), [("member", 403), ("viewer", 403), ("outsider", 404)])
def test_only_tenant_admins_grant_submit_rights(world, api, who, status):
    response = api(getattr(world, who)).post(
        f"{URL}/{world.project.pk}/submitters",
        {"username": "nlp-member", "allowed": True},
        format="json",
    )

    assert response.status_code == status
    assert not world.member.has_perm("tenants.submit_project", world.project)
