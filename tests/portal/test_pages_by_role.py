"""Every page renders for every role; the outsider gets 404 on the other tenant's pages."""

import pytest

from scheduling.models import Job
from tests import factories as f

ROLES = ("platform_admin", "tenant_admin", "member", "viewer", "outsider")


@pytest.fixture
def pages(world):
    """The page URLs, naming objects of tenant nlp; a job with GPUs and a timeline."""
    job = f.placed_job(
        gpus=list(world.nodes[0].gpus.all()[:2]),
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
    )
    f.JobFactory(
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        pending_reason_code="WAITING_FOR_GPUS",
        pending_reason_message="2 GPUs free, 4 needed",
        pending_rank=1.0,
    )
    return {
        "dashboard": "/",
        "tenant-list": "/tenants/",
        "tenant-detail": "/tenants/nlp/",
        "project-list": "/projects/",
        "project-detail": f"/projects/{world.project.pk}/",
        "job-list": "/jobs/",
        "job-list-all": "/jobs/?mine=&state=RUNNING",
        "job-detail": f"/jobs/{job.pk}/",
        "job-log": f"/jobs/{job.pk}/log",
        "job-submit": "/jobs/new/",
        "queue-list": "/queues/",
        "queue-detail": f"/queues/{world.queue.pk}/",
        "quota-index": "/quotas/",
        "quota": "/quotas/nlp/",
        "node-list": "/nodes/",
    }


TENANT_PAGES = {"tenant-detail", "project-detail", "job-detail", "job-log", "queue-detail", "quota"}


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(
    "page",
    [
        "dashboard",
        "tenant-list",
        "tenant-detail",
        "project-list",
        "project-detail",
        "job-list",
        "job-list-all",
        "job-detail",
        "job-log",
        "job-submit",
        "queue-list",
        "queue-detail",
        "quota-index",
        "quota",
        "node-list",
    ],
)
def test_page_renders_for_each_role(world, client, pages, page, role):
    client.force_login(getattr(world, role))

    response = client.get(pages[page])

    if role == "outsider" and page in TENANT_PAGES:
        assert response.status_code == 404
    elif page == "quota-index" and role != "platform_admin":
        # one tenant: straight to its quota page
        assert response.status_code == 302
        assert client.get(response["Location"]).status_code == 200
    else:
        assert response.status_code == 200


@pytest.mark.parametrize("page", ["tenant-list", "project-list", "queue-list", "job-list-all"])
def test_outsider_lists_do_not_show_the_other_tenant(world, client, pages, page):
    client.force_login(world.outsider)

    body = client.get(pages[page]).content.decode()

    assert "/tenants/nlp/" not in body
    assert f"/projects/{world.project.pk}/" not in body
    assert f"/queues/{world.queue.pk}/" not in body
    for job in Job.objects.filter(tenant=world.tenant):
        assert f"/jobs/{job.pk}/" not in body


def test_anonymous_users_are_sent_to_login(world, client, pages):
    for url in pages.values():
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/login/")
