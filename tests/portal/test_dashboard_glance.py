"""The dashboard's glance for tenant and platform admins: pools now and the queues waiting
longest (their own only); nothing of it for members."""

from datetime import timedelta

from django.utils import timezone

from tests import factories as f


def _waiting(queue, project, user, minutes):
    job = f.JobFactory(queue=queue, project=project, submitted_by=user, gpus_per_node=2)
    job.submitted_at = job.queued_at = timezone.now() - timedelta(minutes=minutes)
    job.save()
    return job


def test_admins_see_pools_and_their_longest_waits(client, world):
    _waiting(world.queue, world.project, world.member, 90)
    _waiting(world.other_queue, world.other_project, world.outsider, 300)
    client.force_login(world.tenant_admin)
    page = client.get("/")
    glance = page.context["glance"]
    assert [p["name"] for p in glance["pools"]] == ["training"]
    assert glance["pools"][0]["gpus"]["total"] == 16
    # Only nlp's queue: vision's longer wait is not theirs to see.
    assert [q["id"] for q in glance["queues"]] == [world.queue.pk]
    assert glance["queues"][0]["longest_wait_seconds"] >= 90 * 60
    html = page.content.decode()
    assert 'id="glance"' in html and "vision/" not in html

    client.force_login(world.platform_admin)
    glance = client.get("/").context["glance"]
    assert [q["id"] for q in glance["queues"]] == [world.other_queue.pk, world.queue.pk]


def test_members_get_no_glance_and_the_live_part_does_not_compute_it(client, world):
    client.force_login(world.member)
    page = client.get("/")
    assert page.context["glance"] is None and 'id="glance"' not in page.content.decode()
    client.force_login(world.tenant_admin)
    live = client.get("/", HTTP_HX_REQUEST="true")
    assert "glance" not in live.context
