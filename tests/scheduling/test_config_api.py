"""Configuration endpoints (pools, nodes, quotas, queues, priority classes, workload policies):
writes are validated, audited with before/after, and bad input never becomes a 500."""

import pytest

from audit.models import AuditEvent
from scheduling.models import Node, PriorityClass, Queue, Quota, ResourcePool, WorkloadPolicy
from tests import factories as f


def _counts():
    return (
        ResourcePool.objects.count(),
        Node.objects.count(),
        Quota.objects.count(),
        Queue.objects.count(),
        PriorityClass.objects.count(),
        WorkloadPolicy.objects.count(),
        AuditEvent.objects.count(),
    )


# --- pools ------------------------------------------------------------------------------------


def test_platform_admin_creates_a_pool(world, api):
    response = api(world.platform_admin).post(
        "/api/v1/pools",
        {"name": "serving", "purpose": "inference", "allowed_workload_types": ["inference"]},
        format="json",
    )

    assert response.status_code == 201, response.json()
    pool = ResourcePool.objects.get(name="serving")
    assert pool.allowed_workload_types == ["inference"]
    event = AuditEvent.objects.get()
    assert event.action == "pool.create"
    assert event.before is None
    assert event.after["purpose"] == "inference"


def test_pool_update_records_before_and_after(world, api):
    response = api(world.platform_admin).patch(
        "/api/v1/pools/training", {"purpose": "training"}, format="json"
    )

    assert response.status_code == 200
    world.pool.refresh_from_db()
    assert world.pool.purpose == "training"
    event = AuditEvent.objects.get()
    assert (event.before["purpose"], event.after["purpose"]) == ("general", "training")


def test_pool_in_use_cannot_be_deleted(world, api):
    response = api(world.platform_admin).delete("/api/v1/pools/training")

    assert response.status_code == 400
    assert "in use" in response.json()["detail"]
    assert ResourcePool.objects.filter(name="training").exists()
    assert not AuditEvent.objects.exists()


def test_unused_pool_is_deleted_with_an_audit_row(world, api):
    f.PoolFactory(name="spare")

    response = api(world.platform_admin).delete("/api/v1/pools/spare")

    assert response.status_code == 204
    assert not ResourcePool.objects.filter(name="spare").exists()
    event = AuditEvent.objects.get()
    assert (event.action, event.before["name"]) == ("pool.delete", "spare")


# --- bad input --------------------------------------------------------------------------------

BAD = [
    ("/api/v1/pools", {}, "name"),
    ("/api/v1/pools", {"name": "training"}, "name"),  # taken
    ("/api/v1/pools", {"name": "Bad Name"}, "name"),
    ("/api/v1/pools", {"name": "p" * 51}, "name"),
    ("/api/v1/pools", {"name": "x", "purpose": "mining"}, "purpose"),
    (
        "/api/v1/pools",
        {"name": "x", "allowed_workload_types": ["mining"]},
        "allowed_workload_types",
    ),
    (
        "/api/v1/pools",
        {"name": "x", "allowed_workload_types": "training"},
        "allowed_workload_types",
    ),
    ("/api/v1/pools", {"name": "x", "description": "d" * 2001}, "description"),
    ("/api/v1/priority-classes", {"name": "x"}, "value"),
    ("/api/v1/priority-classes", {"name": "x", "value": 400}, "value"),  # taken
    ("/api/v1/priority-classes", {"name": "normal", "value": 1}, "name"),  # taken
    ("/api/v1/priority-classes", {"name": "x", "value": "high"}, "value"),
    (
        "/api/v1/priority-classes",
        {"name": "x", "value": 1, "max_grant_hours": 0},
        "max_grant_hours",
    ),
    ("/api/v1/priority-classes", {"name": "x", "value": 1, "preemptible": "?"}, "preemptible"),
    ("/api/v1/workload-policies", {"workload_type": "training"}, "workload_type"),  # taken
    ("/api/v1/workload-policies", {"workload_type": "mining"}, "workload_type"),
    ("/api/v1/quotas", {"tenant": "nlp", "pool": "training"}, "non_field_errors"),  # taken
    ("/api/v1/quotas", {"tenant": "nope", "pool": "training"}, "tenant"),
    ("/api/v1/quotas", {"tenant": "nlp", "pool": "nope"}, "pool"),
    (
        "/api/v1/quotas",
        {"tenant": "nlp", "pool": "training", "gpu_model": "A100", "guaranteed_gpus": -1},
        "guaranteed_gpus",
    ),
    ("/api/v1/quotas", {"tenant": "nlp", "pool": "training", "gpu_model": "g" * 41}, "gpu_model"),
    ("/api/v1/queues", {"tenant": "nlp"}, "name"),
    (
        "/api/v1/queues",
        {
            "tenant": "nlp",
            "name": "train",
            "pool": "training",
            "default_priority_class": "normal",
            "max_self_service_class": "normal",
        },
        "non_field_errors",
    ),  # taken
    (
        "/api/v1/queues",
        {
            "tenant": "nlp",
            "name": "q",
            "pool": "training",
            "default_priority_class": "high",
            "max_self_service_class": "normal",
        },
        "default_priority_class",
    ),
    (
        "/api/v1/queues",
        {
            "tenant": "nlp",
            "name": "q",
            "pool": "training",
            "default_priority_class": "nope",
            "max_self_service_class": "normal",
        },
        "default_priority_class",
    ),
    (
        "/api/v1/queues",
        {
            "tenant": "nlp",
            "name": "q",
            "pool": "training",
            "default_priority_class": "normal",
            "max_self_service_class": "normal",
            "environment": "prod",
        },
        "environment",
    ),
    (
        "/api/v1/queues",
        {
            "tenant": "nlp",
            "name": "q",
            "pool": "training",
            "default_priority_class": "normal",
            "max_self_service_class": "normal",
            "state": "paused",
        },
        "state",
    ),
    (
        "/api/v1/queues",
        {
            "tenant": "nlp",
            "name": "Q Q",
            "pool": "training",
            "default_priority_class": "normal",
            "max_self_service_class": "normal",
        },
        "name",
    ),
]


@pytest.mark.parametrize(("url", "body", "field"), BAD)
def test_bad_config_input_is_a_400_and_stores_nothing(world, api, url, body, field):
    before = _counts()

    response = api(world.platform_admin).post(url, body, format="json")

    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert any(key.split("[")[0].split(".")[0] == field for key in errors), errors
    assert _counts() == before


def test_workload_policy_default_runtime_above_the_maximum(world, api):
    response = api(world.platform_admin).patch(
        "/api/v1/workload-policies/training", {"default_runtime_seconds": 10**6}, format="json"
    )

    assert response.status_code == 400
    assert "default_runtime_seconds" in response.json()["errors"]
    assert WorkloadPolicy.objects.get(workload_type="training").default_runtime_seconds == 3600


def test_workload_policy_allowed_pools_by_name(world, api):
    f.PoolFactory(name="serving")

    response = api(world.platform_admin).patch(
        "/api/v1/workload-policies/inference", {"allowed_pools": ["serving"]}, format="json"
    )

    assert response.status_code == 200, response.json()
    policy = WorkloadPolicy.objects.get(workload_type="inference")
    assert [p.name for p in policy.allowed_pools.all()] == ["serving"]
    assert AuditEvent.objects.get().after["allowed_pools"] == ["serving"]


def test_priority_class_in_use_cannot_be_deleted(world, api):
    response = api(world.platform_admin).delete("/api/v1/priority-classes/normal")

    assert response.status_code == 400
    assert PriorityClass.objects.filter(name="normal").exists()


# --- quotas -----------------------------------------------------------------------------------


def test_quota_change_is_audited(world, api):
    quota = world.tenant.quotas.get()

    response = api(world.platform_admin).patch(
        f"/api/v1/quotas/{quota.pk}", {"guaranteed_gpus": 12, "borrow_limit_gpus": 0}, format="json"
    )

    assert response.status_code == 200
    quota.refresh_from_db()
    assert (quota.guaranteed_gpus, quota.borrow_limit_gpus) == (12, 0)
    event = AuditEvent.objects.get()
    assert event.action == "quota.update"
    assert event.tenant == world.tenant
    assert (event.before["guaranteed_gpus"], event.after["guaranteed_gpus"]) == (8, 12)


def test_tenant_admin_cannot_raise_their_own_quota(world, api):
    quota = world.tenant.quotas.get()

    response = api(world.tenant_admin).patch(
        f"/api/v1/quotas/{quota.pk}", {"guaranteed_gpus": 16}, format="json"
    )

    assert response.status_code == 403
    quota.refresh_from_db()
    assert quota.guaranteed_gpus == 8


# --- queues -----------------------------------------------------------------------------------

QUEUE = {
    "tenant": "nlp",
    "name": "eval",
    "pool": "training",
    "default_priority_class": "low",
    "max_self_service_class": "normal",
    "allowed_workload_types": ["evaluation"],
    "environment": "staging",
}


def test_tenant_admin_creates_a_queue_in_a_pool_with_quota(world, api):
    response = api(world.tenant_admin).post("/api/v1/queues", QUEUE, format="json")

    assert response.status_code == 201, response.json()
    queue = Queue.objects.get(tenant=world.tenant, name="eval")
    assert queue.default_priority_class == world.low
    assert queue.allowed_workload_types == ["evaluation"]
    event = AuditEvent.objects.get()
    assert (event.action, event.tenant) == ("queue.create", world.tenant)


def test_tenant_admin_cannot_bind_a_pool_without_quota(world, api):
    f.PoolFactory(name="serving")

    response = api(world.tenant_admin).post(
        "/api/v1/queues", {**QUEUE, "pool": "serving"}, format="json"
    )

    assert response.status_code == 400
    assert "pool" in response.json()["errors"]
    assert not Queue.objects.filter(name="eval").exists()


def test_queue_cannot_move_to_another_tenant(world, api):
    response = api(world.platform_admin).patch(
        f"/api/v1/queues/{world.queue.pk}", {"tenant": "vision"}, format="json"
    )

    assert response.status_code == 400
    world.queue.refresh_from_db()
    assert world.queue.tenant == world.tenant


def test_queue_project_of_a_tenant_the_user_is_not_in_does_not_exist(world, api):
    response = api(world.tenant_admin).post(
        "/api/v1/queues", {**QUEUE, "project": world.other_project.pk}, format="json"
    )

    assert response.status_code == 404


def test_queue_project_must_be_of_the_same_tenant(world, api):
    response = api(world.platform_admin).post(
        "/api/v1/queues", {**QUEUE, "project": world.other_project.pk}, format="json"
    )

    assert response.status_code == 400
    assert "project" in response.json()["errors"]


def test_tenant_admin_closes_a_queue_and_submits_are_refused(world, api):
    admin = api(world.tenant_admin)

    response = admin.patch(f"/api/v1/queues/{world.queue.pk}", {"state": "closed"}, format="json")

    assert response.status_code == 200
    world.queue.refresh_from_db()
    assert world.queue.state == "closed"
    event = AuditEvent.objects.get()
    assert (event.before["state"], event.after["state"]) == ("open", "closed")
    submit = api(world.member).post(
        "/api/v1/jobs",
        {
            "project": world.project.pk,
            "queue": world.queue.pk,
            "workload_type": "training",
            "command": ["x"],
        },
        format="json",
    )
    assert submit.status_code == 400
    assert "queue" in submit.json()["errors"]


def test_queue_with_jobs_cannot_be_deleted(world, api):
    f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)

    response = api(world.tenant_admin).delete(f"/api/v1/queues/{world.queue.pk}")

    assert response.status_code == 400
    assert Queue.objects.filter(pk=world.queue.pk).exists()


# --- nodes ------------------------------------------------------------------------------------


def test_platform_admin_cordons_a_node(world, api):
    response = api(world.platform_admin).patch(
        "/api/v1/nodes/gpu-01", {"state": "cordoned", "labels": {"rack": "a"}}, format="json"
    )

    assert response.status_code == 200, response.json()
    node = Node.objects.get(name="gpu-01")
    assert node.state == "cordoned"
    assert node.labels == {"rack": "a"}
    assert AuditEvent.objects.get().action == "node.update"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"state": "asleep"}, "state"),
        ({"pool": "nope"}, "pool"),
        ({"labels": ["a"]}, "labels"),
        ({"labels": {"rack": 5}}, "labels"),
        ({"labels": {"\x00": "a"}}, "labels"),
    ],
)
def test_bad_node_update_is_a_400(world, api, body, field):
    response = api(world.platform_admin).patch("/api/v1/nodes/gpu-01", body, format="json")

    assert response.status_code == 400, response.content
    assert any(key.split(".")[0] == field for key in response.json()["errors"])
    assert Node.objects.get(name="gpu-01").state == "ready"
    assert not AuditEvent.objects.exists()


def test_nodes_cannot_be_created_through_the_api(world, api):
    response = api(world.platform_admin).post("/api/v1/nodes", {"name": "gpu-09"}, format="json")

    assert response.status_code == 400
    assert "agent" in response.json()["detail"]
    assert not Node.objects.filter(name="gpu-09").exists()


def test_gpus_are_listed_with_their_node_and_filterable(world, api):
    response = api(world.viewer).get("/api/v1/gpus", {"node__name": "gpu-02"})

    assert response.status_code == 200
    rows = response.json()["results"]
    assert len(rows) == 8
    assert {r["node"] for r in rows} == {"gpu-02"}
    assert rows[0]["model"] == "H100-80GB"
