"""Queue view (ordered pending list), quota page (usage bars) and nodes page."""

from scheduling.choices import JobState
from tests import factories as f


def test_queue_page_lists_waiting_jobs_in_scheduling_order(world, client):
    own = {"queue": world.queue, "project": world.project, "submitted_by": world.member}
    f.JobFactory(name="second-in-line", pending_rank=2048.0, **own)
    f.JobFactory(name="first-in-line", pending_rank=-5.0, **own)
    f.JobFactory(name="held-one", state=JobState.HELD, pending_rank=4096.0, **own)
    f.JobFactory(name="finished-one", state=JobState.SUCCEEDED, **own)
    running = f.placed_job(gpus=[world.nodes[0].gpus.get(index=0)], name="running-one", **own)
    client.force_login(world.viewer)

    body = client.get(f"/queues/{world.queue.pk}/").content.decode()

    assert body.index("first-in-line") < body.index("second-in-line") < body.index("held-one")
    assert "finished-one" not in body
    assert f"/jobs/{running.pk}/" in body


def test_queue_list_shows_the_tenants_queues(world, client):
    client.force_login(world.member)

    body = client.get("/queues/").content.decode()

    assert f"/queues/{world.queue.pk}/" in body
    assert f"/queues/{world.other_queue.pk}/" not in body


def test_quota_page_shows_guaranteed_and_borrowed_usage(world, client):
    own = {"queue": world.queue, "project": world.project, "submitted_by": world.member}
    gpus = list(world.nodes[0].gpus.order_by("index"))
    f.placed_job(gpus=gpus[:6], **own)
    borrowed = f.placed_job(gpus=[world.nodes[1].gpus.get(index=0)], **own)
    borrowed.allocations.update(borrowed=True)
    client.force_login(world.viewer)

    response = client.get("/quotas/nlp/")

    row = response.context["rows"][0]
    assert (row["guaranteed"], row["borrow_limit"]) == (8, 8)
    assert (row["guaranteed_used"], row["borrowed_used"], row["free"]) == (6, 1, 2)
    assert row["running"] == 2
    assert "6 / 8" in response.content.decode()


def test_quota_page_of_a_tenant_without_quota(world, client):
    world.tenant.quotas.all().delete()
    client.force_login(world.member)

    assert "No quota yet" in client.get("/quotas/nlp/").content.decode()


def test_quota_index_for_a_platform_admin_lists_tenants(world, client):
    client.force_login(world.platform_admin)

    body = client.get("/quotas/").content.decode()

    assert "/quotas/nlp/" in body and "/quotas/vision/" in body


def test_nodes_page_shows_gpus_and_their_jobs(world, client):
    job = f.placed_job(
        gpus=[world.nodes[1].gpus.get(index=3)],
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        name="on-gpu-3",
    )
    client.force_login(world.member)

    response = client.get("/nodes/")

    body = response.content.decode()
    assert 'id="node-gpu-01"' in body and 'id="node-gpu-02"' in body
    assert f"/jobs/{job.pk}/" in body
    assert body.count(">free<") == 15


def test_nodes_fragment_for_htmx(world, client):
    client.force_login(world.member)

    response = client.get("/nodes/", HTTP_HX_REQUEST="true")

    body = response.content.decode()
    assert 'id="node-gpu-01"' in body
    assert "<html" not in body


def test_nodes_page_hides_other_tenants_jobs(world, client):
    job = f.placed_job(
        gpus=[world.nodes[0].gpus.get(index=5)],
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        name="secret-nlp-run",
    )
    client.force_login(world.outsider)

    body = client.get("/nodes/").content.decode()

    assert "secret-nlp-run" not in body
    assert f"/jobs/{job.pk}/" not in body
    assert body.count(">in use<") == 1
    assert body.count(">free<") == 15
