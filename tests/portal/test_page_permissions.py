"""Who may open each page and use each form or button: the page routes' permission table.

Every page route the URL resolver has (tests/page_routes.py, the walk the production-page
test uses) must have a row in ``TABLE``; a route added without one fails
``test_every_page_route_is_in_the_table``. Each row gives what a GET answers to the five base
users of CONVENTIONS.md, in the order of ``ROLES``: a platform admin, an admin, a member and
a viewer of tenant nlp, and the outsider (an admin of tenant vision), who gets 404 for nlp's
objects. Anonymous visitors are sent to the login page from every route that is not public.

Routes that change something are also POSTed with a valid form by each user, in a
transaction rolled back afterwards: ``CHANGED`` means the change was made (checked in the
database, not taken from the status), ``UNCHANGED`` that the page answered (a form error, a
refusal shown as a message) but nothing changed; 403 and 404 are refusals by status.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.contrib.messages import get_messages
from django.db import transaction
from django.test import Client
from django.urls import URLPattern, reverse
from django.urls.resolvers import RoutePattern
from django.utils import timezone

from tests import factories as f
from tests.page_routes import page_routes
from tests.raise_helpers import ask

ROLES = ("platform_admin", "tenant_admin", "member", "viewer", "outsider")

LOGIN = "login page"  # a redirect to the login page, ?next= the route
REDIRECT = "redirect"  # a redirect elsewhere (a GET that has a page of its own to go to)
CHANGED = "changed"
UNCHANGED = "unchanged"

EVERYONE = (200, 200, 200, 200, 200)
TENANT_OBJECT = (200, 200, 200, 200, 404)  # nlp's object: the outsider sees nothing
ADMINS = (200, 200, 403, 403, 200)  # tenant and platform admins (the outsider is vision's)
PLATFORM = (200, 403, 403, 403, 403)
POST_ONLY = (405, 405, 405, 405, 405)


@dataclass(frozen=True)
class Rule:
    """What each of ``ROLES`` gets from the route: ``get`` for a GET; ``post`` for a POST of
    ``body``, with ``changed`` telling whether it did its work; ``anonymous`` for a visitor
    who is not signed in (a GET, and a POST where ``post`` is given)."""

    get: tuple
    post: tuple | None = None
    body: Callable[[Any, Any], dict] = lambda w, o: {}
    changed: Callable[[Any, Any], bool] | None = None
    anonymous: Any = LOGIN
    kwargs: Callable[[Any, Any], dict] = lambda w, o: {}


# --- the objects the routes name (all of tenant nlp) ---------------------------------------------


@dataclass
class Objects:
    job: Any  # the member's, running
    waiting_job: Any  # the member's, waiting
    spare_job: Any  # the member's, running, no extension asked for
    spare_waiting_job: Any  # the member's, waiting, no raise asked for
    raise_: Any  # the member's pending request for class high
    extension: Any  # the member's pending runtime extension
    notification: Any  # the member's
    run: Any  # a simulation run of the platform admin
    service: Any  # the member's inference service
    token: Any  # the member's API token
    robot: Any
    robot_token: Any
    recommendation: Any
    review: Any
    down_node: Any


@pytest.fixture
def objects(world) -> Objects:
    from accounts import robots
    from accounts.services import api_token_create
    from insights.models import Recommendation
    from insights.reviews import last_completed_week
    from insights.services.reviews import policy_review_write
    from scheduling.choices import NodeState, NotificationKind, SimulationState
    from scheduling.models import Notification, SimulationRun, WorkloadPolicy
    from scheduling.services.limits import runtime_extension_request
    from tests.inference.factories import ServiceFactory, serving

    own = {"queue": world.queue, "project": world.project, "submitted_by": world.member}
    gpus = list(world.nodes[0].gpus.order_by("index"))
    job = f.placed_job(gpus=gpus[:2], **own)
    waiting = f.JobFactory(pending_reason_code="WAITING_FOR_GPUS", pending_rank=1.0, **own)
    # No extension granted without an approver: the member's request waits.
    WorkloadPolicy.objects.filter(workload_type=job.workload_type).update(extension_cap_seconds=0)
    now = timezone.now()
    admin = world.platform_admin
    robot = robots.robot_create(actor=admin, tenant=world.tenant, name="ci", role="member")
    return Objects(
        job=job,
        waiting_job=waiting,
        spare_job=f.placed_job(gpus=gpus[2:4], **own),
        spare_waiting_job=f.JobFactory(pending_rank=2.0, **own),
        raise_=ask(world, waiting),
        extension=runtime_extension_request(
            user=world.member, job=job, seconds=600, reason="evaluation"
        ),
        notification=Notification.objects.create(
            user=world.member,
            created_at=now,
            kind=NotificationKind.RAISE_APPROVED,
            message="granted",
        ),
        run=SimulationRun.objects.create(
            created_by=admin,
            params={"days": 7, "policy": "sluice"},
            state=SimulationState.RUNNING,
            progress=40,
            created_at=now - timedelta(minutes=1),
        ),
        service=ServiceFactory(
            queue=serving(world).queue, project=world.project, created_by=world.member, name="chat"
        ),
        token=api_token_create(user=world.member, name="laptop", expires_in_days=None)[0],
        robot=robot,
        robot_token=robots.robot_token_create(actor=admin, robot=robot, name="deploy")[0],
        recommendation=Recommendation.objects.create(
            kind="repeated_failure",
            key="page-permissions",
            tenant=world.tenant,
            title="a recommendation",
            evidence={"impact_gpu_hours": 1.0, "score": 1.0, "facts": [["Figure", "1"]]},
            change={
                "summary": "queue train: class high",
                "action": "queue_class",
                "queue": world.queue.pk,
                "priority_class": "high",
                "whatif": {"queue_classes": {str(world.queue.pk): "high"}},
            },
            created_at=now,
            updated_at=now,
        ),
        review=policy_review_write(week_start=last_completed_week(now), now=now),
        down_node=f.NodeFactory(name="gpu-down", pool=world.pool, state=NodeState.DOWN),
    )


# --- what a POST changed -------------------------------------------------------------------------


def _model(label: str):
    from django.apps import apps

    return apps.get_model(label)


def _role_of(w, user) -> str | None:
    membership = _model("tenants.Membership").objects.filter(user=user, tenant=w.tenant).first()
    return membership.role if membership else None


def _state(instance) -> str:
    return type(instance).objects.values_list("state", flat=True).get(pk=instance.pk)


def _count(label: str, **lookups) -> int:
    return _model(label).objects.filter(**lookups).count()


def _read(notification) -> bool:
    return type(notification).objects.filter(pk=notification.pk, read_at__isnull=False).exists()


def _service_form(w, o, **overrides) -> dict:
    return {
        "project": w.project.pk,
        "queue": o.service.queue_id,
        "name": "chat-2",
        "command": "python -m server --model 7b",
        "gpus_per_node": 1,
        "health_path": "/health",
        "metrics_path": "/metrics",
        "min_replicas": 1,
        "max_replicas": 2,
        "target_running_per_replica": 4,
        "stable_window_s": 60,
        "panic_window_s": 6,
        "panic_threshold": 2,
        "scale_up_max_step": 2,
        "scale_down_delay_s": 60,
        "scale_to_zero_grace_s": 300,
        **overrides,
    }


def _job_form(w, o) -> dict:
    return {
        "project": w.project.pk,
        "queue": w.queue.pk,
        "name": "from-the-form",
        "workload_type": "training",
        "gpus_per_node": 1,
        "nodes": 1,
        "command": "python train.py",
    }


# --- the table ----------------------------------------------------------------------------------

SLUG = {"slug": "nlp"}

TABLE: dict[str, Rule] = {
    # public: signing in and out, the API's documentation, Prometheus, the icon
    "login": Rule(get=(REDIRECT,) * 5, anonymous=200),
    "logout": Rule(get=POST_ONLY, anonymous=405),
    "oidc_authentication_init": Rule(get=(LOGIN,) * 5),  # no provider configured: back
    "oidc_authentication_callback": Rule(get=(LOGIN,) * 5),
    "api-docs": Rule(get=EVERYONE, anonymous=200),
    # open unless SLUICE_METRICS_TOKEN is set (tests/insights/test_metrics_access.py)
    "metrics": Rule(get=EVERYONE, anonymous=200),
    "favicon": Rule(get=(REDIRECT,) * 5, anonymous=REDIRECT),
    # Django's admin: staff only; its login page for everyone else
    "admin:index": Rule(get=(200,) + (REDIRECT,) * 4, anonymous=REDIRECT),
    "admin:login": Rule(get=(REDIRECT, 200, 200, 200, 200), anonymous=200),
    # overview pages: each user sees what their tenants hold
    "dashboard": Rule(get=EVERYONE),
    "tenant-list": Rule(get=EVERYONE),
    "project-list": Rule(get=EVERYONE),
    "job-list": Rule(get=EVERYONE),
    "queue-list": Rule(get=EVERYONE),
    "node-list": Rule(get=EVERYONE),
    "notification-list": Rule(get=EVERYONE),
    "service-list": Rule(get=EVERYONE),
    "usage": Rule(get=EVERYONE),
    "recovery": Rule(get=EVERYONE),
    "account-tokens": Rule(get=EVERYONE),
    "quota-index": Rule(get=(200,) + (REDIRECT,) * 4),  # one tenant: straight to its page
    # tenant nlp and its objects
    "tenant-detail": Rule(get=TENANT_OBJECT, kwargs=lambda w, o: SLUG),
    "quota": Rule(get=TENANT_OBJECT, kwargs=lambda w, o: SLUG),
    "project-detail": Rule(get=TENANT_OBJECT, kwargs=lambda w, o: {"pk": w.project.pk}),
    "queue-detail": Rule(get=TENANT_OBJECT, kwargs=lambda w, o: {"pk": w.queue.pk}),
    "job-detail": Rule(get=TENANT_OBJECT, kwargs=lambda w, o: {"pk": o.job.pk}),
    "job-live": Rule(get=TENANT_OBJECT, kwargs=lambda w, o: {"pk": o.job.pk}),
    "job-log": Rule(get=TENANT_OBJECT, kwargs=lambda w, o: {"pk": o.job.pk}),
    "service-detail": Rule(get=TENANT_OBJECT, kwargs=lambda w, o: {"pk": o.service.pk}),
    "member-role": Rule(
        get=POST_ONLY,
        post=(CHANGED, CHANGED, UNCHANGED, UNCHANGED, 404),
        kwargs=lambda w, o: {**SLUG, "username": w.viewer.username},
        body=lambda w, o: {"role": "member"},
        changed=lambda w, o: _role_of(w, w.viewer) == "member",
    ),
    "member-remove": Rule(
        get=POST_ONLY,
        post=(CHANGED, CHANGED, UNCHANGED, UNCHANGED, 404),
        kwargs=lambda w, o: {**SLUG, "username": w.viewer.username},
        changed=lambda w, o: _role_of(w, w.viewer) is None,
    ),
    "project-create": Rule(
        get=POST_ONLY,
        post=(CHANGED, CHANGED, UNCHANGED, UNCHANGED, 404),
        kwargs=lambda w, o: SLUG,
        body=lambda w, o: {"project-slug": "asr", "project-name": "Speech"},
        changed=lambda w, o: _count("tenants.Project", tenant=w.tenant, slug="asr") == 1,
    ),
    # jobs
    "job-submit": Rule(
        get=EVERYONE,
        post=(CHANGED, CHANGED, CHANGED, UNCHANGED, UNCHANGED),
        body=_job_form,
        changed=lambda w, o: _count("scheduling.Job", name="from-the-form") == 1,
    ),
    "job-submit-preview": Rule(get=EVERYONE, post=EVERYONE, body=_job_form),
    "job-action": Rule(
        get=POST_ONLY,
        post=(CHANGED, CHANGED, CHANGED, UNCHANGED, 404),
        kwargs=lambda w, o: {"pk": o.job.pk, "step": "cancel"},
        changed=lambda w, o: _state(o.job) != "RUNNING",
    ),
    "job-bulk": Rule(
        get=POST_ONLY,
        post=(CHANGED, CHANGED, CHANGED, UNCHANGED, UNCHANGED),
        body=lambda w, o: {"step": "hold", "job": [o.waiting_job.pk]},
        changed=lambda w, o: _state(o.waiting_job) == "HELD",
    ),
    "job-extension-request": Rule(
        get=POST_ONLY,
        post=(CHANGED, CHANGED, CHANGED, UNCHANGED, 404),
        kwargs=lambda w, o: {"pk": o.spare_job.pk},
        body=lambda w, o: {"minutes": 30, "reason": "one more epoch"},
        changed=lambda w, o: _count("scheduling.RuntimeExtension", job=o.spare_job) == 1,
    ),
    "job-idle-exempt": Rule(
        get=POST_ONLY,
        post=(CHANGED, CHANGED, UNCHANGED, UNCHANGED, 404),
        kwargs=lambda w, o: {"pk": o.job.pk},
        body=lambda w, o: {"hours": 2, "reason": "interactive debugging"},
        changed=lambda w, o: (
            _model("scheduling.Job")
            .objects.filter(pk=o.job.pk, idle_exempt_until__isnull=False)
            .exists()
        ),
    ),
    "extension-approvals": Rule(get=ADMINS),
    "extension-action": Rule(
        get=POST_ONLY,
        post=(CHANGED, CHANGED, UNCHANGED, UNCHANGED, 404),  # never one's own request
        kwargs=lambda w, o: {"pk": o.extension.pk, "step": "approve"},
        changed=lambda w, o: _state(o.extension) == "approved",
    ),
    # priority raises
    "raise-request": Rule(
        get=TENANT_OBJECT,
        post=(CHANGED, CHANGED, CHANGED, UNCHANGED, 404),
        kwargs=lambda w, o: {"pk": o.spare_waiting_job.pk},
        body=lambda w, o: {"to_class": w.high.pk, "reason": "the deadline moved"},
        changed=lambda w, o: _count("scheduling.PriorityRaise", job=o.spare_waiting_job) == 1,
    ),
    "approvals": Rule(get=ADMINS),
    "raise-action": Rule(
        get=POST_ONLY,
        post=(CHANGED, UNCHANGED, UNCHANGED, UNCHANGED, 404),  # class high: above the ceiling
        kwargs=lambda w, o: {"pk": o.raise_.pk, "step": "approve"},
        changed=lambda w, o: _state(o.raise_) == "approved",
    ),
    "notification-read": Rule(
        get=POST_ONLY,
        post=(404, 404, CHANGED, 404, 404),  # one's own notifications only
        kwargs=lambda w, o: {"pk": o.notification.pk},
        changed=lambda w, o: _read(o.notification),
    ),
    "notifications-read-all": Rule(
        get=POST_ONLY,
        post=(UNCHANGED, UNCHANGED, CHANGED, UNCHANGED, UNCHANGED),
        changed=lambda w, o: _read(o.notification),
    ),
    # nodes and the what-if simulator: platform admins
    "node-remove": Rule(
        get=POST_ONLY,
        post=(CHANGED, 403, 403, 403, 403),
        kwargs=lambda w, o: {"pk": o.down_node.pk},
        changed=lambda w, o: _count("scheduling.Node", pk=o.down_node.pk) == 0,
    ),
    "simulate": Rule(get=PLATFORM),
    "simulate-run": Rule(get=(200, 404, 404, 404, 404), kwargs=lambda w, o: {"pk": o.run.pk}),
    "simulate-run-status": Rule(
        get=(200, 404, 404, 404, 404), kwargs=lambda w, o: {"pk": o.run.pk}
    ),
    # inference services
    "service-create": Rule(
        get=EVERYONE,
        post=(CHANGED, CHANGED, CHANGED, UNCHANGED, UNCHANGED),
        body=_service_form,
        changed=lambda w, o: _count("inference.Service", name="chat-2") == 1,
    ),
    "service-edit": Rule(
        get=(200, 200, 200, 403, 404),
        post=(CHANGED, CHANGED, CHANGED, 403, 404),
        kwargs=lambda w, o: {"pk": o.service.pk},
        body=lambda w, o: _service_form(w, o, name=o.service.name, max_replicas=3),
        changed=lambda w, o: (
            _model("inference.Service").objects.filter(pk=o.service.pk, max_replicas=3).exists()
        ),
    ),
    "service-action": Rule(
        get=POST_ONLY,
        post=(CHANGED, CHANGED, CHANGED, 403, 404),
        kwargs=lambda w, o: {"pk": o.service.pk, "step": "pause"},
        changed=lambda w, o: _state(o.service) == "paused",
    ),
    # audit, insights, recommendations, reviews: admins (platform-wide work: platform admins)
    "audit-list": Rule(get=ADMINS),
    "audit-export": Rule(get=ADMINS),
    "insights": Rule(get=ADMINS),
    "recommendations": Rule(get=ADMINS),
    "recommendations-run": Rule(
        get=POST_ONLY,
        post=(REDIRECT, 403, 403, 403, 403),
    ),
    "recommendation": Rule(
        get=(200, 200, 403, 403, 404), kwargs=lambda w, o: {"pk": o.recommendation.pk}
    ),
    "recommendation-simulate": Rule(
        get=POST_ONLY,
        post=(CHANGED, 403, 403, 403, 404),
        kwargs=lambda w, o: {"pk": o.recommendation.pk},
        changed=lambda w, o: _count("scheduling.SimulationRun") == 2,
    ),
    "recommendation-apply": Rule(
        get=POST_ONLY,
        post=(CHANGED, 403, 403, 403, 404),
        kwargs=lambda w, o: {"pk": o.recommendation.pk},
        changed=lambda w, o: _state(o.recommendation) == "applied",
    ),
    "recommendation-dismiss": Rule(
        get=POST_ONLY,
        post=(CHANGED, 403, 403, 403, 404),
        kwargs=lambda w, o: {"pk": o.recommendation.pk},
        body=lambda w, o: {"reason": "not this quarter"},
        changed=lambda w, o: _state(o.recommendation) == "dismissed",
    ),
    "policy-reviews": Rule(get=ADMINS),
    "policy-review-compute": Rule(
        get=POST_ONLY,
        post=(REDIRECT, 403, 403, 403, 403),
        body=lambda w, o: {"week_start": o.review.week_start.isoformat()},
    ),
    "policy-review": Rule(
        get=ADMINS, kwargs=lambda w, o: {"week_start": o.review.week_start.isoformat()}
    ),
    # API tokens and robot accounts
    "account-token-revoke": Rule(
        get=(200, 404, 200, 404, 404),  # the owner and platform admins
        post=(CHANGED, 404, CHANGED, 404, 404),
        kwargs=lambda w, o: {"pk": o.token.pk},
        changed=lambda w, o: _count("accounts.ApiToken", pk=o.token.pk) == 0,
    ),
    "tenant-robots-page": Rule(
        get=TENANT_OBJECT,
        post=(CHANGED, CHANGED, 403, 403, 404),
        kwargs=lambda w, o: SLUG,
        body=lambda w, o: {"name": "nightly", "role": "member"},
        changed=lambda w, o: _count("accounts.RobotAccount", name="nightly") == 1,
    ),
    "tenant-robot-token-create": Rule(
        get=POST_ONLY,
        post=(CHANGED, CHANGED, 403, 403, 404),
        kwargs=lambda w, o: {**SLUG, "name": o.robot.name},
        body=lambda w, o: {"name": "release", "expires_in_days": 30},
        changed=lambda w, o: _count("accounts.ApiToken", user=o.robot.user) == 2,
    ),
    "tenant-robot-token-revoke": Rule(
        get=POST_ONLY,
        post=(CHANGED, CHANGED, 403, 403, 404),
        kwargs=lambda w, o: {**SLUG, "name": o.robot.name, "pk": o.robot_token.pk},
        changed=lambda w, o: _count("accounts.ApiToken", pk=o.robot_token.pk) == 0,
    ),
    "tenant-robot-delete": Rule(
        get=POST_ONLY,
        post=(CHANGED, CHANGED, 403, 403, 404),
        kwargs=lambda w, o: {**SLUG, "name": o.robot.name},
        changed=lambda w, o: not _model("auth.User").objects.get(pk=o.robot.user_id).is_active,
    ),
}


# --- the walk ------------------------------------------------------------------------------------


def test_every_page_route_is_in_the_table():
    names = [route.name for route in page_routes()]
    unnamed = [route.route for route in page_routes() if route.name is None]
    missing = sorted({name for name in names if name} - set(TABLE))
    stale = sorted(set(TABLE) - set(names))

    assert not unnamed, f"page routes without a URL name (name them in their urls.py): {unnamed}"
    assert not missing, (
        "page routes missing from the permission table of tests/portal/test_page_permissions.py"
        f" (say who may open them, and POST them if they change anything): {missing}"
    )
    assert not stale, f"the table names routes that no longer exist: {stale}"


def test_a_new_route_is_found_by_the_walk():
    """The walk sees a page route added to any URLconf, so the check above would name it."""
    from django.urls import get_resolver

    extra = URLPattern(RoutePattern("brand-new/"), lambda request: None, name="brand-new")
    routes = page_routes([*get_resolver().url_patterns, extra])

    assert "brand-new" in {route.name for route in routes}
    assert "brand-new" not in TABLE


def _outcome(response, changed: bool | None) -> Any:
    if response.status_code in (301, 302):
        if response["Location"].startswith(reverse(settings.LOGIN_URL)):
            return LOGIN
        if changed is None:
            return REDIRECT
    if changed is not None and response.status_code in (200, 302):
        return CHANGED if changed else UNCHANGED
    return response.status_code


def _request(world, objects, user, rule: Rule, method: str, url: str) -> Any:
    """What ``user`` gets from ``method url``, everything it did rolled back after."""
    client = Client()
    if user is not None:
        client.force_login(user)
    with transaction.atomic():
        if method == "get":
            response = client.get(url)
            changed = None
        else:
            response = client.post(url, rule.body(world, objects))
            changed = rule.changed(world, objects) if rule.changed else None
        if response.status_code == 302 and changed is None and method == "post":
            # no check of its own: a refusal shows as an error message
            errors = [m for m in get_messages(response.wsgi_request) if m.level_tag == "error"]
            changed = None if not errors else False
        transaction.set_rollback(True)
    return _outcome(response, changed)


@pytest.mark.usefixtures("dispatch_requests")
@pytest.mark.parametrize("name", TABLE)
def test_who_may_open_the_page_and_use_it(world, objects, name):
    rule = TABLE[name]
    url = reverse(name, kwargs=rule.kwargs(world, objects) or None)
    methods = ["get"] + (["post"] if rule.post is not None else [])
    problems = []
    for method in methods:
        expected = dict(zip(ROLES, getattr(rule, method), strict=True))
        expected["anonymous"] = rule.anonymous
        got = {
            role: _request(
                world,
                objects,
                None if role == "anonymous" else getattr(world, role),
                rule,
                method,
                url,
            )
            for role in expected
        }
        if got != expected:
            problems.append(f"{method.upper()} {url}: expected {expected}, got {got}")
    assert not problems, "\n".join(problems)
