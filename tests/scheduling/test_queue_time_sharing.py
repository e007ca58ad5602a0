"""A queue's time-sharing opt-in: through the API (validated, audited, refused to those
who may not change the queue) and on the queue pages."""

from audit.models import AuditEvent
from scheduling.models import Queue


def test_a_queue_does_not_time_share_by_default(world, api):
    response = api(world.member).get(f"/api/v1/queues/{world.queue.pk}")

    assert response.status_code == 200
    assert response.json()["time_sharing"] is False


def test_tenant_admin_turns_time_sharing_on_with_an_audit_row(world, api):
    response = api(world.tenant_admin).patch(
        f"/api/v1/queues/{world.queue.pk}", {"time_sharing": True}, format="json"
    )

    assert response.status_code == 200, response.content
    assert response.json()["time_sharing"] is True
    world.queue.refresh_from_db()
    assert world.queue.time_sharing
    event = AuditEvent.objects.filter(action="queue.update").latest("id")
    assert event.before["time_sharing"] is False and event.after["time_sharing"] is True


def test_bad_time_sharing_values_are_a_400(world, api):
    admin = api(world.tenant_admin)
    bad = admin.patch(f"/api/v1/queues/{world.queue.pk}", {"time_sharing": "often"}, format="json")
    assert bad.status_code == 400
    assert "time_sharing" in bad.json()["errors"]
    unknown = admin.patch(f"/api/v1/queues/{world.queue.pk}", {"timesharing": True}, format="json")
    assert unknown.status_code == 400
    assert "timesharing" in unknown.json()["errors"]
    assert not Queue.objects.get(pk=world.queue.pk).time_sharing


def test_viewer_may_not_turn_it_on_and_an_outsider_does_not_see_the_queue(world, api):
    body = {"time_sharing": True}
    viewer = api(world.viewer).patch(f"/api/v1/queues/{world.queue.pk}", body, format="json")
    assert viewer.status_code == 403
    outsider = api(world.outsider).patch(f"/api/v1/queues/{world.queue.pk}", body, format="json")
    assert outsider.status_code == 404
    assert not Queue.objects.get(pk=world.queue.pk).time_sharing


def test_the_queue_page_says_when_time_sharing_is_on(world, client):
    client.force_login(world.viewer)
    assert "Time-sharing on" not in client.get(f"/queues/{world.queue.pk}/").content.decode()

    world.queue.time_sharing = True
    world.queue.save(update_fields=["time_sharing"])
    body = client.get(f"/queues/{world.queue.pk}/").content.decode()

    assert "Time-sharing on" in body
    assert "used less GPU-time go first" in body
    assert "time-sharing" in client.get("/queues/").content.decode()
