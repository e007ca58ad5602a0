"""Unknown fields in a request body are a 400 naming them, on every write route of the API.

The routes come from the OpenAPI schema (every operation the API serves), so a route added
later is walked too. Each gets ``{"zz_unknown": 1}`` (and, where the schema shows nested
objects, the nested cases below) from a platform admin, on objects that exist. Write
operations that take no body (deletes, ``notifications/{id}/read``, ...) are walked too:
any field sent to them is unknown, and nothing happens.
"""

from datetime import timedelta

import pytest
from django.apps import apps
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from accounts.models import ApiToken
from accounts.services import api_token_create
from insights.models import Recommendation
from portal.api.strict import NO_BODY, NO_BODY_DETAIL, UNKNOWN_FIELD
from scheduling.choices import NotificationKind
from scheduling.models import Job, Notification
from scheduling.services import limits
from tests import factories as f
from tests.inference.factories import ServiceFactory
from tests.inference.factories import serving as make_serving
from tests.raise_helpers import ask

pytestmark = pytest.mark.django_db

UNKNOWN = "zz_unknown"
WRITES = ("post", "put", "patch")
WRITES_WITHOUT_BODY = ("post", "put", "patch", "delete")


def _write_operations(*, with_body: bool):
    schema = SchemaGenerator().get_schema(request=None, public=True)
    methods = WRITES if with_body else WRITES_WITHOUT_BODY
    out = []
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if method in methods and ("requestBody" in operation) == with_body:
                out.append((method, path))
    return out


OPERATIONS = _write_operations(with_body=True)
NO_BODY_OPERATIONS = _write_operations(with_body=False)
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
    notification = Notification.objects.create(
        user=world.platform_admin,
        created_at=now,
        kind=NotificationKind.RAISE_REQUESTED,
        message="a raise waits",
    )
    token, _ = api_token_create(user=world.platform_admin, name="walk")
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
        "/notifications/": notification.pk,
        "/auth/tokens/": token.pk,
        **_robot_objects(world),
        "{slug}": world.tenant.slug,
        "{tenant_slug}": world.tenant.slug,
        "{username}": world.member.username,
    }


def _robot_objects(world) -> dict:
    """A robot account of the tenant and a token of it, where the API serves robots (after
    ``/auth/tokens/`` above: ``/tokens/`` here is the robot's)."""
    if not any("/robots/" in path for _, path in OPERATIONS + NO_BODY_OPERATIONS):
        return {}
    from accounts import robots

    robot = robots.robot_create(
        actor=world.platform_admin, tenant=world.tenant, name="ci", role=robots.ROBOT_ROLES[0]
    )
    token, _ = robots.robot_token_create(actor=world.platform_admin, robot=robot, name="walk")
    return {"/robots/": robot.name, "/tokens/": token.pk}


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


def test_the_walk_sees_the_write_routes_without_a_body():
    assert ("delete", "/api/v1/auth/tokens/{id}/") in NO_BODY_OPERATIONS
    assert ("post", "/api/v1/notifications/read-all/") in NO_BODY_OPERATIONS
    assert ("post", "/api/v1/users/{id}/deactivate/") in NO_BODY_OPERATIONS
    assert len(NO_BODY_OPERATIONS) >= 10


def _rows() -> dict:
    """Every row of every table: what a refused request must leave as it was."""
    return {
        model._meta.label: list(model._base_manager.order_by("pk").values())
        for model in apps.get_models()
    }


@pytest.fixture
def spare(world, objects):
    """``objects`` where nothing else uses them, so each operation without a body succeeds:
    the walk checks that a body stops what would otherwise happen."""
    queue = f.QueueFactory(
        tenant=world.tenant, name="spare", pool=world.pool, default_priority_class=world.normal
    )
    now = timezone.now()
    recommendation = Recommendation.objects.create(
        kind=Recommendation._meta.get_field("kind").choices[0][0],
        key="walk-apply",
        title="tell the member",
        evidence={"period": {"start": now.isoformat(), "end": now.isoformat(), "days": 7}},
        change={
            "action": "notify",
            "users": [world.member.pk],
            "message": "hello",
            "whatif": {"days": 7},
        },
        created_at=now,
        updated_at=now,
    )
    return {
        **objects,
        "/recommendations/": recommendation.pk,
        "/queues/": queue.pk,
        "/nodes/": f.NodeFactory(name="spare-01", pool=world.pool).name,
        "/pools/": f.PoolFactory(name="spare").name,
        "/priority-classes/": f.PriorityClassFactory(name="spare").name,
    }


@pytest.mark.parametrize(
    ("method", "path"),
    NO_BODY_OPERATIONS,
    ids=[f"{m.upper()} {p}" for m, p in NO_BODY_OPERATIONS],
)
def test_a_field_is_refused_where_no_body_is_taken_and_nothing_happens(world, spare, method, path):
    url = _fill(path, spare)
    _, key = api_token_create(user=world.platform_admin, name="the walk's credentials")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    client.get("/api/v1/auth/tokens/")  # the token's last use is now: no later request moves it
    before = _rows()

    response = getattr(client, method)(url, {UNKNOWN: 1, "reason": "x"}, format="json")

    assert response.status_code == 400, (url, response.content)
    assert response.json() == {
        "detail": NO_BODY_DETAIL,
        "code": "no_body",
        "errors": {UNKNOWN: [UNKNOWN_FIELD], "reason": [UNKNOWN_FIELD]},
    }
    assert _rows() == before
    # Without the body the same request does what it does.
    answer = getattr(client, method)(url)
    assert answer.status_code < 300, (url, answer.content)
    assert _rows() != before


@pytest.mark.parametrize(
    "body",
    [None, {}, {"csrfmiddlewaretoken": "t"}],
    ids=["nothing", "empty object", "only the form's CSRF token"],
)
def test_no_body_is_still_fine(api, world, objects, body):
    url = _fill("/api/v1/users/{id}/deactivate/", objects)
    client = api(world.platform_admin)

    if body is None:
        response = client.post(url)
    elif "csrfmiddlewaretoken" in body:
        response = client.post(url, body)  # a form body
    else:
        response = client.post(url, body, format="json")

    assert response.status_code == 200, response.content
    world.member.refresh_from_db()
    assert not world.member.is_active


def test_a_form_field_is_refused_where_no_body_is_taken(api, world, objects):
    url = _fill("/api/v1/users/{id}/deactivate/", objects)

    response = api(world.platform_admin).post(url, {"csrfmiddlewaretoken": "t", "why": "x"})

    assert response.status_code == 400
    assert response.json()["errors"] == {"why": [UNKNOWN_FIELD]}
    world.member.refresh_from_db()
    assert world.member.is_active


@pytest.mark.parametrize("body", [[1], "yes", 0], ids=["list", "string", "number"])
def test_a_body_that_is_no_object_is_refused_where_no_body_is_taken(api, world, body):
    response = api(world.platform_admin).delete(
        f"/api/v1/queues/{world.queue.pk}/", body, format="json"
    )

    assert response.status_code == 400
    assert response.json()["errors"] == {"non_field_errors": [NO_BODY]}
    assert type(world.queue).objects.filter(pk=world.queue.pk).exists()


def test_logout_with_a_body_keeps_the_token(world):
    token, key = api_token_create(user=world.member, name="laptop")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")

    response = client.delete("/api/v1/auth/token", {"all": True}, format="json")

    assert response.status_code == 400
    assert response.json()["errors"] == {"all": [UNKNOWN_FIELD]}
    assert ApiToken.objects.filter(pk=token.pk).exists()
    assert client.delete("/api/v1/auth/token").status_code == 204
    assert not ApiToken.objects.filter(pk=token.pk).exists()


def test_credentials_come_before_the_body(api, world):
    response = api().post("/api/v1/notifications/read-all/", {UNKNOWN: 1}, format="json")

    assert response.status_code in (401, 403)


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
