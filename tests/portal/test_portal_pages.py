"""Dashboard, login page (no CDN: air-gapped data centers), API schema and docs."""

import re

from tests import factories as f

EXTERNAL = re.compile(r"""(src|href)\s*=\s*["']?(https?:)?//""", re.IGNORECASE)


def test_login_page_renders_without_external_assets(db, client):
    response = client.get("/login/")

    body = response.content.decode()
    assert response.status_code == 200
    assert 'name="username"' in body and 'name="password"' in body
    assert not EXTERNAL.search(body), EXTERNAL.search(body)
    assert "cdn" not in body.lower()
    assert "/static/" in body  # the stylesheet and htmx come from our own static files


def test_every_page_uses_local_assets_only(world, client):
    client.force_login(world.tenant_admin)

    for url in ["/", "/jobs/new/", "/tenants/nlp/", "/nodes/"]:
        body = client.get(url).content.decode()
        assert not EXTERNAL.search(body), (url, EXTERNAL.search(body))


def test_dashboard_shows_counts_and_recent_jobs(world, client):
    own = {"queue": world.queue, "project": world.project, "submitted_by": world.member}
    f.JobFactory(name="waiting-job", **own)
    f.placed_job(gpus=list(world.nodes[0].gpus.all()[:3]), name="busy-job", **own)
    client.force_login(world.member)

    response = client.get("/")

    assert response.context["pending_count"] == 1
    assert response.context["running_count"] == 1
    assert response.context["allocated_gpus"] == 3
    assert response.context["total_gpus"] == 16
    body = response.content.decode()
    assert "waiting-job" in body and "busy-job" in body
    assert "/tenants/nlp/" in body


def test_dashboard_of_the_outsider_shows_nothing_of_the_tenant(world, client):
    f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member, name="x-job")
    client.force_login(world.outsider)

    response = client.get("/")

    assert response.context["pending_count"] == 0
    assert "/tenants/nlp/" not in response.content.decode()


def test_api_schema_loads(world, client):
    client.force_login(world.member)

    response = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")

    assert response.status_code == 200
    schema = response.json()
    paths = schema["paths"]
    for path in ["/api/v1/jobs/", "/api/v1/jobs/{id}/cancel/", "/api/v1/auth/token"]:
        assert path in paths
    assert "/api/v1/tenants/{tenant_slug}/members" in paths
    assert "post" in paths["/api/v1/jobs/bulk/"]


def test_api_docs_load_from_local_assets(world, client):
    client.force_login(world.member)

    response = client.get("/api/docs/")

    body = response.content.decode()
    assert response.status_code == 200
    assert "swagger" in body.lower()
    assert not EXTERNAL.search(body), EXTERNAL.search(body)
