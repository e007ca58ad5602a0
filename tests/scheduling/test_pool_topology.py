"""A pool's topology label: set by platform admins in the API, refused when it cannot be a
label name; each node's block in the node API and on the nodes page."""

from django.forms.models import model_to_dict

from audit.models import AuditEvent
from scheduling.models import Node, ResourcePool, WorkloadPolicy

URL = "/api/v1/pools/training"
LABEL = "topology.sluice.io/block"


def test_the_pool_api_shows_and_changes_the_topology_label(world, api):
    assert api(world.member).get(URL).json()["topology_label"] == LABEL
    response = api(world.platform_admin).patch(URL, {"topology_label": "rack"}, format="json")
    assert response.status_code == 200, response.content
    assert ResourcePool.objects.get(name="training").topology_label == "rack"
    event = AuditEvent.objects.filter(action="pool.update").latest("id")
    assert event.after["topology_label"] == "rack"


def test_a_label_with_spaces_is_refused_with_a_field_error(world, api):
    response = api(world.platform_admin).patch(URL, {"topology_label": "my rack"}, format="json")
    assert response.status_code == 400
    assert "topology_label" in response.json()["errors"]
    assert ResourcePool.objects.get(name="training").topology_label == LABEL


def test_only_platform_admins_change_it(world, api):
    for user in (world.tenant_admin, world.member, world.viewer, world.outsider):
        response = api(user).patch(URL, {"topology_label": "rack"}, format="json")
        assert response.status_code == 403, user
    assert ResourcePool.objects.get(name="training").topology_label == LABEL


def test_nodes_show_their_block_in_the_api_and_on_the_page(world, api, client):
    Node.objects.filter(name="gpu-01").update(labels={LABEL: "leaf-1", "rack": "r1"})
    nodes = {n["name"]: n for n in api(world.member).get("/api/v1/nodes/").json()["results"]}
    assert nodes["gpu-01"]["block"] == "leaf-1"
    assert nodes["gpu-02"]["block"] == ""
    client.force_login(world.member)
    page = client.get("/nodes/").content.decode()
    assert "block <strong>leaf-1</strong>" in page
    assert "no block" in page  # gpu-02, in the same pool, has no label


def test_a_pool_that_ignores_the_topology_shows_no_blocks(world, api, client):
    Node.objects.filter(name="gpu-01").update(labels={LABEL: "leaf-1"})
    ResourcePool.objects.filter(name="training").update(topology_label="")
    nodes = {n["name"]: n for n in api(world.member).get("/api/v1/nodes/").json()["results"]}
    assert nodes["gpu-01"]["block"] == ""
    client.force_login(world.member)
    page = client.get("/nodes/").content.decode()
    assert "block <strong>" not in page and "no block" not in page


def test_a_workload_policy_carries_its_topology_wait(world, api):
    url = "/api/v1/workload-policies/training"
    assert api(world.member).get(url).json()["topology_wait_seconds"] == 1800
    response = api(world.platform_admin).patch(url, {"topology_wait_seconds": 0}, format="json")
    assert response.status_code == 200, response.content
    assert WorkloadPolicy.objects.get(workload_type="training").topology_wait_seconds == 0
    for value in (-1, "soon", 2**40):
        bad = api(world.platform_admin).patch(url, {"topology_wait_seconds": value}, format="json")
        assert bad.status_code == 400 and "topology_wait_seconds" in bad.json()["errors"]
    refused = api(world.member).patch(url, {"topology_wait_seconds": 60}, format="json")
    assert refused.status_code == 403


def test_the_django_admin_refuses_a_label_with_spaces(world, client):
    client.force_login(world.platform_admin)
    pool = ResourcePool.objects.get(name="training")
    data = {k: v for k, v in model_to_dict(pool).items() if v is not None}
    data.update(topology_label="my rack", _save="Save")
    data["allowed_workload_types"] = ""
    response = client.post(f"/admin/scheduling/resourcepool/{pool.pk}/change/", data)
    assert response.status_code == 200  # the form again, with the error
    assert "A label name has no spaces" in response.content.decode()
    assert ResourcePool.objects.get(name="training").topology_label == LABEL
    data["topology_label"] = "rack"
    response = client.post(f"/admin/scheduling/resourcepool/{pool.pk}/change/", data)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert ResourcePool.objects.get(name="training").topology_label == "rack"
