"""Pools say which executor runs them and what it enforces: in the pool API (read-only for
everyone but platform admins), from what the executor registered or, before that, the
static capabilities of its kind; nodes' labels and executors' capabilities come with
``register``."""

from django.utils import timezone

from audit.models import AuditEvent
from scheduling.executors.capabilities import STATIC_CAPABILITIES
from scheduling.models import Node, ResourcePool
from scheduling.tasks import agent_report

URL = "/api/v1/pools/training"


def test_a_pool_says_its_executor_and_the_static_capabilities_of_its_kind(world, api):
    answer = api(world.member).get(URL).json()
    assert answer["executor"] == "agent"
    assert answer["container_runtime"] == ""
    assert answer["capabilities"]["images"] is False
    assert answer["capabilities"] == STATIC_CAPABILITIES["agent"].as_dict() | {
        "limits": list(STATIC_CAPABILITIES["agent"].limits),
        "notes": list(STATIC_CAPABILITIES["agent"].notes),
    }


def test_a_platform_admin_sets_the_executor_and_it_is_audited(world, api):
    response = api(world.platform_admin).patch(
        URL, {"executor": "slurm", "container_runtime": "pyxis"}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["capabilities"]["images"] is True  # slurm with pyxis
    pool = ResourcePool.objects.get(name="training")
    assert (pool.executor, pool.container_runtime) == ("slurm", "pyxis")
    assert AuditEvent.objects.filter(action="pool.update").exists()


def test_others_cannot_change_the_executor(world, api):
    for user in (world.tenant_admin, world.member, world.viewer, world.outsider):
        response = api(user).patch(URL, {"executor": "kubernetes"}, format="json")
        assert response.status_code == 403, (user, response.content)
    assert ResourcePool.objects.get(name="training").executor == "agent"


def test_an_unknown_executor_is_a_400_naming_the_field(world, api):
    response = api(world.platform_admin).patch(URL, {"executor": "nomad"}, format="json")
    assert response.status_code == 400
    assert "executor" in response.json()["errors"]


def _register(node="gpu-09", **fields):
    agent_report(
        {
            "type": "register",
            "node": node,
            "pool": "training",
            "hostname": "host",
            "agent_version": "0.1.0",
            "cpus": 16,
            "memory_mb": 64000,
            "backend": "simulated",
            "sent_at": timezone.now().timestamp(),
            "gpus": [],
            "jobs": [],
            **fields,
        }
    )
    return Node.objects.get(name=node)


def test_register_keeps_the_node_labels_and_the_executors_capabilities(world, api):
    node = Node.objects.get(name="gpu-01")
    node.labels = {"set-by": "admin"}
    node.save()
    capabilities = {**STATIC_CAPABILITIES["agent"].as_dict(), "limits": ["runtime"]}
    node = _register(
        "gpu-01",
        labels={"topology": "nvlink-a", "rack": "r1"},
        executor="agent",
        capabilities=capabilities,
    )
    assert node.labels == {"set-by": "admin", "topology": "nvlink-a", "rack": "r1"}
    assert ResourcePool.objects.get(name="training").executor_capabilities["limits"] == ["runtime"]
    assert api(world.member).get(URL).json()["capabilities"]["limits"] == ["runtime"]


def test_capabilities_of_another_executor_kind_are_not_taken(world):
    _register(executor="slurm", capabilities={"images": True})
    assert ResourcePool.objects.get(name="training").executor_capabilities is None


def test_a_register_without_the_new_fields_changes_nothing(world):
    node = _register()
    assert node.labels == {}
    assert ResourcePool.objects.get(name="training").executor_capabilities is None
