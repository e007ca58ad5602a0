"""Unknown fields in a request body are a 400 naming them, on every write route of the API.

The routes come from the OpenAPI schema (every operation the API serves), so a route added
later is walked too. Each gets ``{"zz_unknown": 1}`` (and, where the schema shows nested
objects, the nested cases below) from a platform admin, on objects that exist.
"""

from datetime import timedelta

import pytest
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator

from insights.models import Recommendation
from portal.api.strict import UNKNOWN_FIELD
from scheduling.models import Job
from scheduling.services import limits
from tests import factories as f
from tests.inference.factories import ServiceFactory
from tests.inference.factories import serving as make_serving
from tests.raise_helpers import ask

pytestmark = pytest.mark.django_db

UNKNOWN = "zz_unknown"
WRITES = ("post", "put", "patch")


def _write_operations():
    schema = SchemaGenerator().get_schema(request=None, public=True)
    out = []
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if method in WRITES and "requestBody" in operation:
                out.append((method, path))
    return out


OPERATIONS = _write_operations()
# Refused whatever the body says (a 400 that names no field): nodes register themselves.
REFUSED_ANYWAY = {("post", "/api/v1/nodes/")}


def test_the_walk_sees_the_write_routes():
    paths = {path for _, path in OPERATIONS}
    assert "/api/v1/jobs/" in paths and "/api/v1/services/{id}/" in paths
    assert len(OPERATIONS) >= 40


@pytest.fixture
def objects(world):
    job = f.placed_job(
        gpus=list(world.nodes[0].gpus.order_by("index"))[:1],
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
    )
    f.policy(job.workload_type, extension_cap_seconds=0)
    extension = limits.runtime_extension_request(
        user=world.member, job=job, seconds=600, reason="one more epoch"
    )
    pending = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
    raise_ = ask(world, pending)
    serving = make_serving(world)
    service = ServiceFactory(
        queue=serving.queue, project=world.project, created_by=world.member, name="chat"
    )
    now = timezone.now()
    recommendation = Recommendation.objects.create(
        kind=Recommendation._meta.get_field("kind").choices[0][0],
        key="walk",
        title="a recommendation",
        evidence={
            "period": {
                "start": (now - timedelta(days=7)).isoformat(),
                "end": now.isoformat(),
                "days": 7,
            }
        },
        change={},
        created_at=now,
        updated_at=now,
    )
    quota = world.tenant.quotas.first()
    return {
        "/jobs/": job.pk,
        "/runtime-extensions/": extension.pk,
        "/priority-raises/": raise_.pk,
        "/services/": service.pk,
        "/recommendations/": recommendation.pk,
        "/quotas/": quota.pk,
        "/queues/": world.queue.pk,
        "/projects/": world.project.pk,
        "/users/": world.member.pk,
        "/nodes/": world.nodes[0].name,
        "/pools/": world.pool.name,
        "/priority-classes/": world.normal.name,
        "/workload-policies/": job.workload_type,
        "{slug}": world.tenant.slug,
        "{tenant_slug}": world.tenant.slug,
        "{username}": world.member.username,
    }


def _fill(path: str, objects: dict) -> str:
    for key in ("{slug}", "{tenant_slug}", "{username}"):
        path = path.replace(key, str(objects[key]))
    for prefix, value in objects.items():
        if prefix.startswith("/") and prefix in path:
            head, _, tail = path.partition(prefix)
            if tail.startswith("{"):
                tail = str(value) + tail[tail.index("}") + 1 :]
            path = head + prefix + tail
    assert "{" not in path, path
    return path


@pytest.mark.parametrize(
    ("method", "path"), OPERATIONS, ids=[f"{m.upper()} {p}" for m, p in OPERATIONS]
)
def test_an_unknown_field_is_refused_on_every_write_route(api, world, objects, method, path):
    url = _fill(path, objects)

    response = getattr(api(world.platform_admin), method)(url, {UNKNOWN: 1}, format="json")

    assert response.status_code == 400, (url, response.content)
    data = response.json()
    if (method, path) in REFUSED_ANYWAY:
        return
    assert data["errors"].get(UNKNOWN) == [UNKNOWN_FIELD], data


def test_the_issue_case_a_misspelt_gpu_model_stores_no_job(api, world):
    body = {
        "project": world.project.pk,
        "queue": world.queue.pk,
        "workload_type": "training",
        "command": ["python", "train.py"],
        "gpu_models": ["B200-192GB"],
    }

    response = api(world.member).post("/api/v1/jobs", body, format="json")

    assert response.status_code == 400
    assert response.json() == {
        "detail": "Invalid input: gpu_models: Unknown field.",
        "errors": {"gpu_models": [UNKNOWN_FIELD]},
    }
    assert not Job.objects.exists()
    del body["gpu_models"]
    assert api(world.member).post("/api/v1/jobs", body, format="json").status_code == 201


def test_unknown_fields_inside_list_items_are_named_by_position(api, world):
    item = {
        "project": world.project.pk,
        "queue": world.queue.pk,
        "workload_type": "training",
        "command": ["python", "train.py"],
    }
    body = {"jobs": [item, {**item, "gpu_models": "B200"}]}

    response = api(world.member).post("/api/v1/jobs/bulk", body, format="json")

    assert response.status_code == 400
    assert response.json()["errors"] == {"jobs[1].gpu_models": [UNKNOWN_FIELD]}
    assert not Job.objects.exists()


def test_free_form_objects_stay_free(api, world, dispatch_requests):
    body = {
        "project": world.project.pk,
        "queue": world.queue.pk,
        "workload_type": "training",
        "command": ["python", "train.py"],
        "env": {"ANY_NAME": "1"},
        "parameters": {"lr": 0.1, "nested": {"x": 1}},
        "labels": {"team": "a"},
    }

    response = api(world.member).post("/api/v1/jobs", body, format="json")

    assert response.status_code == 201, response.content


def test_unknown_fields_and_other_errors_are_reported_together(api, world):
    response = api(world.member).post("/api/v1/jobs", {"gpu_models": "x"}, format="json")

    errors = response.json()["errors"]
    assert errors["gpu_models"] == [UNKNOWN_FIELD]
    assert "project" in errors and "command" in errors


def test_a_form_body_is_strict_too_but_the_csrf_token_is_not_a_field(world, client):
    client.force_login(world.tenant_admin)

    response = client.post(
        f"/api/v1/jobs/{f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member).pk}/hold/",
        {"reason": "x", "csrfmiddlewaretoken": "t", "colour": "blue"},
    )

    assert response.status_code == 400
    assert response.json()["errors"] == {"colour": [UNKNOWN_FIELD]}


def test_query_strings_keep_their_leniency(api, world):
    job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)

    response = api(world.member).get(f"/api/v1/jobs/{job.pk}/logs/?tail=10&colour=blue")

    assert response.status_code != 400 or "colour" not in response.json()["errors"]


def test_the_schema_says_request_bodies_take_no_other_fields():
    schemas = SchemaGenerator().get_schema(request=None, public=True)["components"]["schemas"]

    assert schemas["JobSubmitRequest"]["additionalProperties"] is False
    assert schemas["PatchedServiceChangeRequest"]["additionalProperties"] is False
    # Free-form objects inside stay open.
    assert schemas["JobSubmitRequest"]["properties"]["env"]["additionalProperties"]
