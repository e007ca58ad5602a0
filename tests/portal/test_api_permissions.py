"""The permission matrix of DESIGN §8, endpoint by endpoint, for the five base users.

Expected statuses are given in the order of ``ROLES``. The outsider (admin of the other
tenant) gets 404 on this tenant's objects; viewers get 403 on writes; members manage their
own jobs; tenant admins manage members, projects, queues and others' jobs; platform admins
also write pools, nodes, quotas, priority classes and workload policies.
"""

import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from django.urls.resolvers import RoutePattern

from accounts import robots
from scheduling.choices import JobState
from scheduling.models import WorkloadPolicy
from tests import factories as f

ROLES = ("platform_admin", "tenant_admin", "member", "viewer", "outsider")


@dataclass
class Case:
    method: str
    url: str  # formatted with the objects of ``objects()``
    expect: tuple[int, int, int, int, int]
    body: dict[str, Any] = field(default_factory=dict)


def everyone(status: int) -> tuple[int, int, int, int, int]:
    return (status,) * 5


SEEN_BY_TENANT = (200, 200, 200, 200, 404)  # tenant objects: the outsider sees nothing
PLATFORM_WRITE = (None, 403, 403, 403, 403)  # platform objects: only platform admins write
TENANT_ADMIN_WRITE = (None, None, 403, 403, 404)  # tenant objects: tenant admins write

QUEUE_BODY = {
    "tenant": "nlp",
    "name": "eval",
    "pool": "training",
    "default_priority_class": "normal",
    "max_self_service_class": "normal",
}
JOB_BODY = {"workload_type": "training", "command": ["python", "train.py"]}
ROBOTS = "/api/v1/tenants/nlp/robots"

CASES = {
    # users
    "users-list": Case("get", "/api/v1/users", everyone(200)),
    "users-detail": Case("get", "/api/v1/users/{member}", SEEN_BY_TENANT),
    "users-create": Case(
        "post",
        "/api/v1/users",
        (201, 403, 403, 403, 403),
        {"username": "fresh", "password": "a-long-enough-passphrase-42"},
    ),
    "users-update": Case(
        "patch", "/api/v1/users/{member}", (200, 403, 403, 403, 404), {"first_name": "X"}
    ),
    "users-deactivate": Case(
        "post", "/api/v1/users/{member}/deactivate", (200, 403, 403, 403, 404)
    ),
    # tenants and members
    "tenants-list": Case("get", "/api/v1/tenants", everyone(200)),
    "tenants-detail": Case("get", "/api/v1/tenants/nlp", SEEN_BY_TENANT),
    "tenants-create": Case(
        "post", "/api/v1/tenants", (201, 403, 403, 403, 403), {"slug": "speech", "name": "S"}
    ),
    "tenants-update": Case(
        "patch", "/api/v1/tenants/nlp", (200, 200, 403, 403, 404), {"name": "Renamed"}
    ),
    "members-list": Case("get", "/api/v1/tenants/nlp/members", SEEN_BY_TENANT),
    "members-detail": Case("get", "/api/v1/tenants/nlp/members/nlp-member", SEEN_BY_TENANT),
    "members-add": Case(
        "post",
        "/api/v1/tenants/nlp/members",
        (201, 201, 403, 403, 404),
        {"username": "newcomer", "role": "member"},
    ),
    "members-change": Case(
        "patch",
        "/api/v1/tenants/nlp/members/nlp-viewer",
        (200, 200, 403, 403, 404),
        {"role": "member"},
    ),
    "members-remove": Case(
        "delete", "/api/v1/tenants/nlp/members/nlp-viewer", (204, 204, 403, 403, 404)
    ),
    # projects
    "projects-list": Case("get", "/api/v1/projects", everyone(200)),
    "projects-detail": Case("get", "/api/v1/projects/{project}", SEEN_BY_TENANT),
    "projects-create": Case(
        "post",
        "/api/v1/projects",
        (201, 201, 403, 403, 404),
        {"tenant": "nlp", "slug": "asr", "name": "Speech"},
    ),
    "projects-update": Case(
        "patch", "/api/v1/projects/{project}", (200, 200, 403, 403, 404), {"name": "Renamed"}
    ),
    "projects-submitters": Case(
        "post",
        "/api/v1/projects/{project}/submitters",
        (204, 204, 403, 403, 404),
        {"username": "nlp-member", "allowed": True},
    ),
    # platform objects: read by everyone, written by platform admins
    "pools-list": Case("get", "/api/v1/pools", everyone(200)),
    "pools-detail": Case("get", "/api/v1/pools/training", everyone(200)),
    "pools-create": Case(
        "post",
        "/api/v1/pools",
        (201, 403, 403, 403, 403),
        {"name": "serving", "purpose": "inference"},
    ),
    "pools-update": Case(
        "patch", "/api/v1/pools/training", (200, 403, 403, 403, 403), {"description": "x"}
    ),
    "pools-delete": Case("delete", "/api/v1/pools/spare", (204, 403, 403, 403, 403)),
    "nodes-list": Case("get", "/api/v1/nodes", everyone(200)),
    "nodes-detail": Case("get", "/api/v1/nodes/gpu-01", everyone(200)),
    "nodes-create": Case("post", "/api/v1/nodes", (400, 403, 403, 403, 403), {"name": "gpu-09"}),
    "nodes-update": Case(
        "patch", "/api/v1/nodes/gpu-01", (200, 403, 403, 403, 403), {"state": "cordoned"}
    ),
    "gpus-list": Case("get", "/api/v1/gpus", everyone(200)),
    "gpus-detail": Case("get", "/api/v1/gpus/{gpu}", everyone(200)),
    "gpus-create": Case("post", "/api/v1/gpus", everyone(405), {"uuid": "x"}),
    "priority-classes-list": Case("get", "/api/v1/priority-classes", everyone(200)),
    "priority-classes-detail": Case("get", "/api/v1/priority-classes/normal", everyone(200)),
    "priority-classes-create": Case(
        "post",
        "/api/v1/priority-classes",
        (201, 403, 403, 403, 403),
        {"name": "urgent", "value": 900, "can_preempt": True},
    ),
    "priority-classes-update": Case(
        "patch", "/api/v1/priority-classes/low", (200, 403, 403, 403, 403), {"value": 100}
    ),
    "priority-classes-delete": Case(
        "delete", "/api/v1/priority-classes/spare", (204, 403, 403, 403, 403)
    ),
    "workload-policies-list": Case("get", "/api/v1/workload-policies", everyone(200)),
    "workload-policies-detail": Case("get", "/api/v1/workload-policies/training", everyone(200)),
    "workload-policies-create": Case(
        "post",
        "/api/v1/workload-policies",
        (201, 403, 403, 403, 403),
        {"workload_type": "interactive", "max_runtime_seconds": 28800},
    ),
    "workload-policies-update": Case(
        "patch",
        "/api/v1/workload-policies/training",
        (200, 403, 403, 403, 403),
        {"max_runtime_seconds": 7200},
    ),
    # quotas: tenant objects written by platform admins
    "quotas-list": Case("get", "/api/v1/quotas", everyone(200)),
    "quotas-detail": Case("get", "/api/v1/quotas/{quota}", SEEN_BY_TENANT),
    "quotas-create": Case(
        "post",
        "/api/v1/quotas",
        (201, 403, 403, 403, 403),
        {"tenant": "nlp", "pool": "training", "gpu_model": "H100-80GB", "guaranteed_gpus": 4},
    ),
    "quotas-update": Case(
        "patch", "/api/v1/quotas/{quota}", (200, 403, 403, 403, 404), {"guaranteed_gpus": 12}
    ),
    "quotas-delete": Case("delete", "/api/v1/quotas/{quota}", (204, 403, 403, 403, 404)),
    # queues: tenant admins manage their tenant's
    "queues-list": Case("get", "/api/v1/queues", everyone(200)),
    "queues-detail": Case("get", "/api/v1/queues/{queue}", SEEN_BY_TENANT),
    "queues-create": Case("post", "/api/v1/queues", (201, 201, 403, 403, 404), QUEUE_BODY),
    "queues-update": Case(
        "patch", "/api/v1/queues/{queue}", (200, 200, 403, 403, 404), {"description": "x"}
    ),
    "queues-delete": Case("delete", "/api/v1/queues/{spare_queue}", (204, 204, 403, 403, 404)),
    # jobs
    "jobs-list": Case("get", "/api/v1/jobs", everyone(200)),
    "jobs-detail": Case("get", "/api/v1/jobs/{job}", SEEN_BY_TENANT),
    "jobs-events": Case("get", "/api/v1/jobs/{job}/events", SEEN_BY_TENANT),
    "jobs-logs": Case("get", "/api/v1/jobs/{job}/logs", SEEN_BY_TENANT),
    "jobs-submit": Case("post", "/api/v1/jobs", (201, 201, 201, 403, 404), JOB_BODY),
    "jobs-bulk": Case("post", "/api/v1/jobs/bulk", (201, 201, 201, 403, 404), {"jobs": [JOB_BODY]}),
    "jobs-cancel": Case("post", "/api/v1/jobs/{job}/cancel", (200, 200, 200, 403, 404)),
    "jobs-hold": Case("post", "/api/v1/jobs/{job}/hold", (200, 200, 200, 403, 404)),
    "jobs-release": Case("post", "/api/v1/jobs/{held_job}/release", (200, 200, 200, 403, 404)),
    # robot accounts: tenant admins manage their tenant's
    "robots-list": Case("get", ROBOTS, SEEN_BY_TENANT),
    "robots-detail": Case("get", f"{ROBOTS}/ci", SEEN_BY_TENANT),
    "robots-create": Case(
        "post", ROBOTS, (201, 201, 403, 403, 404), {"name": "deploy", "role": "member"}
    ),
    "robots-update": Case("patch", f"{ROBOTS}/ci", (200, 200, 403, 403, 404), {"description": "x"}),
    "robots-delete": Case("delete", f"{ROBOTS}/ci", (204, 204, 403, 403, 404)),
    "robot-tokens-list": Case("get", f"{ROBOTS}/ci/tokens", SEEN_BY_TENANT),
    "robot-tokens-create": Case(
        "post", f"{ROBOTS}/ci/tokens", (201, 201, 403, 403, 404), {"name": "ci"}
    ),
    "robot-tokens-revoke": Case(
        "delete", f"{ROBOTS}/ci/tokens/{{robot_token}}", (204, 204, 403, 403, 404)
    ),
    # the user's own things: everyone reads (and clears) their own
    "api-tokens-list": Case("get", "/api/v1/auth/tokens", everyone(200)),
    "notifications-list": Case("get", "/api/v1/notifications", everyone(200)),
    "notifications-read-all": Case("post", "/api/v1/notifications/read-all", everyone(200)),
    # lists scoped to the user's tenants (an outsider's list is empty, see LISTS)
    "runtime-extensions-list": Case("get", "/api/v1/runtime-extensions", everyone(200)),
    "job-extensions": Case("get", "/api/v1/jobs/{job}/extensions", SEEN_BY_TENANT),
    "priority-raises-list": Case("get", "/api/v1/priority-raises", everyone(200)),
    "raise-ceiling": Case("get", "/api/v1/tenants/nlp/raise-ceiling", SEEN_BY_TENANT),
    "services-list": Case("get", "/api/v1/services", everyone(200)),
    "usage": Case("get", "/api/v1/usage", everyone(200)),
    "metrics-summary": Case("get", "/api/v1/metrics/summary", everyone(200)),
    # admins' reads: platform and tenant admins (the outsider administers its own tenant)
    "audit-events-list": Case("get", "/api/v1/audit-events", (200, 200, 403, 403, 200)),
    "recommendations-list": Case("get", "/api/v1/recommendations", (200, 200, 403, 403, 200)),
}

#: API routes (by URL name) not in CASES, each with the tests that try it for every role.
#: Routes here need objects the shared world does not hold (a raise, an extension, a
#: service, a recommendation) or are the sign-in itself; a new route belongs in CASES.
NOT_IN_MATRIX = {
    "api-token": "sign-in itself: tests/portal/test_auth_token.py, test_login_lockout.py",
    "api-token-manage-detail": "tests/portal/test_api_tokens_api.py",
    "job-exempt": "tests/scheduling/test_idle_reclaim.py (validates the body before roles)",
    "runtime-extension-detail": "tests/scheduling/test_runtime_extensions.py",
    "runtime-extension-approve": "tests/scheduling/test_runtime_extensions.py",
    "runtime-extension-reject": "tests/scheduling/test_runtime_extensions.py",
    "priority-raise-detail": "tests/scheduling/test_priority_raises_api.py",
    "priority-raise-approve": "tests/scheduling/test_priority_raises_api.py",
    "priority-raise-cancel": "tests/scheduling/test_priority_raises_api.py",
    "priority-raise-impact": "tests/scheduling/test_priority_raises_api.py",
    "priority-raise-reject": "tests/scheduling/test_priority_raises_api.py",
    "priority-raise-revoke": "tests/scheduling/test_priority_raises_api.py",
    "notification-read": "tests/scheduling/test_priority_raises_api.py",
    "service-detail": "tests/inference/test_services_api.py",
    "service-decisions": "tests/inference/test_services_api.py",
    "service-endpoints": "tests/inference/test_services_api.py",
    "service-pause": "tests/inference/test_services_api.py",
    "service-resume": "tests/inference/test_services_api.py",
    "audit-event-detail": "tests/portal/test_audit_api.py",
    "recommendation-detail": "tests/insights/test_recommendations_actions.py",
    "recommendation-apply": "tests/insights/test_recommendations_actions.py",
    "recommendation-dismiss": "tests/insights/test_recommendations_actions.py",
    "recommendation-simulate": "tests/insights/test_recommendations_actions.py",
}


def objects(world) -> dict:
    """The objects the URLs name, all in tenant nlp (or platform-wide)."""
    f.UserFactory(username="newcomer")
    f.PoolFactory(name="spare")
    f.PriorityClassFactory(name="spare", value=1)
    WorkloadPolicy.objects.filter(workload_type="interactive").delete()
    spare_queue = f.QueueFactory(
        tenant=world.tenant, name="spare", pool=world.pool, default_priority_class=world.normal
    )
    own = {"queue": world.queue, "project": world.project, "submitted_by": world.member}
    robot = robots.robot_create(
        actor=world.tenant_admin, tenant=world.tenant, name="ci", role="member"
    )
    robot_token, _ = robots.robot_token_create(actor=world.tenant_admin, robot=robot, name="t")
    return {
        "member": world.member.pk,
        "project": world.project.pk,
        "gpu": world.nodes[0].gpus.first().pk,
        "quota": world.tenant.quotas.get().pk,
        "queue": world.queue.pk,
        "spare_queue": spare_queue.pk,
        "job": f.JobFactory(**own).pk,
        "held_job": f.JobFactory(state=JobState.HELD, **own).pk,
        "robot_token": robot_token.pk,
    }


def _body(case: Case, world) -> dict:
    refs = {"project": world.project.pk, "queue": world.queue.pk}
    if case.url == "/api/v1/jobs":
        return {**case.body, **refs}
    if case.url == "/api/v1/jobs/bulk":
        return {"jobs": [{**job, **refs} for job in case.body["jobs"]]}
    return case.body


@pytest.mark.parametrize("role_index", range(len(ROLES)), ids=ROLES)
@pytest.mark.parametrize("name", CASES)
def test_permission_matrix(world, api, dispatch_requests, name, role_index):
    case = CASES[name]
    url = case.url.format(**objects(world))
    user = getattr(world, ROLES[role_index])

    response = getattr(api(user), case.method)(url, _body(case, world), format="json")

    expected = case.expect[role_index]
    assert response.status_code == expected, (name, ROLES[role_index], response.content[:300])
    if expected >= 400:
        assert response.json()["detail"]


# --- every API route is in the matrix ---------------------------------------------------------


def _api_routes(patterns=None, prefix=""):
    """(route, URL name) of every endpoint under /api/v1/, walking the URL resolver."""
    for pattern in get_resolver().url_patterns if patterns is None else patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _api_routes(pattern.url_patterns, route)
        elif route.startswith("api/v1/"):
            yield route, pattern.name


def _case_route_names() -> set[str]:
    """The URL name each case's URL resolves to (placeholders filled with an id)."""
    names = set()
    for case in CASES.values():
        path = case.url.replace("{{", "{").replace("}}", "}")
        path = re.sub(r"\{\w+\}", "1", path)
        names.add(resolve(path).url_name)
    return names


def test_every_api_route_is_in_the_matrix():
    covered = _case_route_names() | set(NOT_IN_MATRIX)
    routes = list(_api_routes())
    missing = sorted(
        {f"{name}  ({route})" for route, name in routes if name and name not in covered}
    )
    # An unnamed route cannot be listed: name it in its urls.py.
    unnamed = sorted(
        route for route, name in routes if name is None and not _same_as_named(route, routes)
    )
    assert not missing, "API routes missing from the permission matrix:\n" + "\n".join(missing)
    assert not unnamed, f"API routes without a URL name: {unnamed}"
    stale = sorted(set(NOT_IN_MATRIX) - {name for _, name in routes})
    assert not stale, f"NOT_IN_MATRIX names routes that no longer exist: {stale}"


def _same_as_named(route: str, routes) -> bool:
    """A trailing-slash twin of a named route (``usage/`` beside ``usage``)."""
    return any(name and other == route.rstrip("/") for other, name in routes)


def test_a_route_outside_the_matrix_is_named(monkeypatch):
    """The walk sees a route added to the API: the check above would fail naming it."""
    extra = URLPattern(RoutePattern("api/v1/brand-new"), lambda request: None, name="brand-new")
    real = get_resolver().url_patterns
    monkeypatch.setattr(
        "tests.portal.test_api_permissions.get_resolver",
        lambda: type("R", (), {"url_patterns": [*real, extra]})(),
    )
    names = {name for _, name in _api_routes()}
    assert "brand-new" in names
    assert "brand-new" not in _case_route_names() | set(NOT_IN_MATRIX)


# --- the outsider's lists never show this tenant's objects ----------------------------------

LISTS = {
    "/api/v1/users": lambda w, o: ("username", w.member.username),
    "/api/v1/tenants": lambda w, o: ("slug", "nlp"),
    "/api/v1/projects": lambda w, o: ("id", w.project.pk),
    "/api/v1/quotas": lambda w, o: ("id", o["quota"]),
    "/api/v1/queues": lambda w, o: ("id", w.queue.pk),
    "/api/v1/jobs": lambda w, o: ("id", o["job"]),
}


@pytest.mark.parametrize("url", LISTS)
def test_other_tenants_objects_are_absent_from_lists(world, api, url):
    refs = objects(world)
    key, value = LISTS[url](world, refs)

    def listed(user):
        return {row[key] for row in api(user).get(url, {"page_size": 500}).json()["results"]}

    assert value in listed(world.member)
    assert value in listed(world.platform_admin)
    assert value not in listed(world.outsider)


def test_outsider_filtering_by_the_other_tenant_gets_nothing(world, api):
    objects(world)
    client = api(world.outsider)

    assert client.get("/api/v1/jobs", {"tenant": "nlp"}).json()["count"] == 0
    assert client.get("/api/v1/queues", {"tenant__slug": "nlp"}).json()["count"] == 0
    assert client.get("/api/v1/quotas", {"tenant__slug": "nlp"}).json()["count"] == 0
    assert client.get("/api/v1/projects", {"tenant__slug": "nlp"}).json()["count"] == 0
