"""Every page as production serves it: static files collected by ``manage.py collectstatic``
under the production settings (DEBUG=0, the manifest storage), then every page route of the
URL resolver (tests/page_routes.py) loaded with DEBUG=False by each role of the demo, and
the error pages.

No page may answer 5xx, and every static file a page names must be a hashed name from the
manifest that whitenoise serves. A route added later is covered by the walk; a route that
takes arguments needs an entry in ``ROUTE_ARGS`` (the test fails and says so).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
from dataclasses import dataclass
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.core.management import call_command
from django.test import Client
from django.urls import path, reverse
from django.utils import timezone

from tests import factories as f
from tests.page_routes import Route, page_routes

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
ROLES = ("admin", "nlp-admin", "nlp-member", "nlp-viewer")  # the demo's logins (seed_demo)
STATIC_REF = re.compile(r"""(?:href|src)\s*=\s*["']([^"']*/static/[^"']+)["']""")


@dataclass
class Collected:
    root: Path
    backend: str
    hashed: set[str]  # the manifest's hashed names


@pytest.fixture(scope="module")
def collected(tmp_path_factory) -> Collected:
    """``manage.py collectstatic --noinput`` as production runs it (portal.settings, DEBUG=0,
    a SECRET_KEY given), into a folder of its own; returns the folder and the storage the
    production settings name."""
    root = tmp_path_factory.mktemp("staticfiles")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "DEBUG": "0",
        "SECRET_KEY": "collectstatic-under-test-" + "x" * 40,
        "STATIC_ROOT": str(root),
        "SLUICE_VAR_DIR": str(tmp_path_factory.mktemp("var")),
    }
    script = (
        "import json, sys\n"
        "from manage import main\n"
        "sys.argv = ['manage.py', 'collectstatic', '--noinput', '-v', '0']\n"
        "main()\n"
        "from django.conf import settings\n"
        "print(json.dumps([settings.DEBUG, settings.STORAGES['staticfiles']['BACKEND']]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, f"collectstatic failed:\n{done.stdout}\n{done.stderr}"
    debug, backend = json.loads(done.stdout.strip().splitlines()[-1])
    assert debug is False
    manifest = json.loads((root / "staticfiles.json").read_text())
    return Collected(root=root, backend=backend, hashed=set(manifest["paths"].values()))


@pytest.fixture
def production(settings, collected):
    """DEBUG=False with the collected files and their manifest, HTTPS only, as in production."""
    settings.DEBUG = False
    settings.STATIC_ROOT = collected.root
    settings.STORAGES = {
        **django_settings.STORAGES,
        "staticfiles": {"BACKEND": collected.backend},
    }
    settings.SECURE_SSL_REDIRECT = True
    settings.SESSION_COOKIE_SECURE = True
    settings.CSRF_COOKIE_SECURE = True
    return collected


@dataclass
class Site:
    """The demo, seeded, with one of each object a page route names."""

    job: object
    waiting_job: object
    project: object
    queue: object
    node: object
    raise_: object
    extension: object
    notification: object
    run: object
    service: object
    token: object
    recommendation: object
    review: object
    robot: object
    robot_token: object


@pytest.fixture
def site(db) -> Site:
    from accounts import robots
    from accounts.services import api_token_create
    from inference.models import Service
    from insights.models import Recommendation
    from insights.reviews import last_completed_week
    from insights.services.recommendations import recommendations_refresh
    from insights.services.reviews import policy_review_write
    from scheduling.choices import SimulationState
    from scheduling.models import (
        Node,
        Notification,
        PriorityRaise,
        Queue,
        SimulationRun,
    )
    from scheduling.services.limits import runtime_extension_request
    from tenants.models import Project

    call_command("seed_demo", stdout=StringIO())
    call_command("seed_service_demo", stdout=StringIO())
    users = get_user_model().objects
    admin, member = users.get(username="admin"), users.get(username="nlp-member")
    # The demo's jobs run once its scheduler places them: one placed here, on a free node.
    queue = Queue.objects.get(tenant__slug="nlp", name="train")
    node = Node.objects.filter(pool=queue.pool).exclude(gpus__allocations__isnull=False).first()
    job = f.placed_job(
        gpus=list(node.gpus.order_by("index")[:2]),
        queue=queue,
        project=Project.objects.filter(tenant__slug="nlp").order_by("pk").first(),
        submitted_by=member,
    )
    now = timezone.now()
    recommendations_refresh(now=now)
    recommendation = Recommendation.objects.order_by("pk").first() or Recommendation.objects.create(
        kind="repeated_failure",
        key="production-pages",
        tenant=job.tenant,
        title="a recommendation",
        evidence={"impact_gpu_hours": 1.0, "score": 1.0, "facts": [["Figure", "1"]]},
        created_at=now,
        updated_at=now,
    )
    robot = robots.robot_create(actor=admin, tenant=job.tenant, name="ci", role="member")
    return Site(
        job=job,
        waiting_job=f.JobFactory(queue=queue, project=job.project, submitted_by=member),
        project=Project.objects.filter(tenant__slug="nlp").order_by("pk").first(),
        queue=Queue.objects.filter(tenant__slug="nlp").order_by("pk").first(),
        node=Node.objects.order_by("pk").first(),
        raise_=PriorityRaise.objects.order_by("pk").first(),
        extension=runtime_extension_request(user=member, job=job, seconds=600, reason="eval"),
        notification=Notification.objects.order_by("pk").first(),
        run=SimulationRun.objects.create(
            created_by=admin,
            params={"days": 7, "policy": "sluice"},
            state=SimulationState.RUNNING,
            progress=40,
            created_at=now - timedelta(minutes=1),
        ),
        service=Service.objects.order_by("pk").first(),
        token=api_token_create(user=member, name="production pages", expires_in_days=None)[0],
        recommendation=recommendation,
        review=policy_review_write(week_start=last_completed_week(now), now=now),
        robot=robot,
        robot_token=robots.robot_token_create(actor=admin, robot=robot, name="deploy")[0],
    )


# The arguments of each page route that takes some, by route name. A route missing here makes
# test_every_page_route_can_be_filled_in fail: add a line naming a real object of the demo
# (add it to ``Site`` if the seed has none).
ROUTE_ARGS = {
    "tenant-detail": lambda s: {"slug": "nlp"},
    "member-role": lambda s: {"slug": "nlp", "username": "nlp-member"},
    "member-remove": lambda s: {"slug": "nlp", "username": "nlp-member"},
    "project-create": lambda s: {"slug": "nlp"},
    "project-detail": lambda s: {"pk": s.project.pk},
    "job-detail": lambda s: {"pk": s.job.pk},
    "job-live": lambda s: {"pk": s.job.pk},
    "job-log": lambda s: {"pk": s.job.pk},
    "job-action": lambda s: {"pk": s.job.pk, "step": "cancel"},
    "queue-detail": lambda s: {"pk": s.queue.pk},
    "quota": lambda s: {"slug": "nlp"},
    "node-remove": lambda s: {"pk": s.node.pk},
    "raise-request": lambda s: {"pk": s.waiting_job.pk},
    "raise-action": lambda s: {"pk": s.raise_.pk, "step": "approve"},
    "notification-read": lambda s: {"pk": s.notification.pk},
    "simulate-run": lambda s: {"pk": s.run.pk},
    "simulate-run-status": lambda s: {"pk": s.run.pk},
    "job-extension-request": lambda s: {"pk": s.job.pk},
    "job-idle-exempt": lambda s: {"pk": s.job.pk},
    "extension-action": lambda s: {"pk": s.extension.pk, "step": "approve"},
    "service-detail": lambda s: {"pk": s.service.pk},
    "service-edit": lambda s: {"pk": s.service.pk},
    "service-action": lambda s: {"pk": s.service.pk, "step": "pause"},
    "account-token-revoke": lambda s: {"pk": s.token.pk},
    "tenant-robots-page": lambda s: {"slug": "nlp"},
    "tenant-robot-token-create": lambda s: {"slug": "nlp", "name": s.robot.name},
    "tenant-robot-token-revoke": lambda s: {
        "slug": "nlp",
        "name": s.robot.name,
        "pk": s.robot_token.pk,
    },
    "tenant-robot-delete": lambda s: {"slug": "nlp", "name": s.robot.name},
    "recommendation": lambda s: {"pk": s.recommendation.pk},
    "recommendation-simulate": lambda s: {"pk": s.recommendation.pk},
    "recommendation-apply": lambda s: {"pk": s.recommendation.pk},
    "recommendation-dismiss": lambda s: {"pk": s.recommendation.pk},
    "policy-review": lambda s: {"week_start": s.review.week_start.isoformat()},
}


def url_of(route: Route, site: Site) -> str:
    if not route.arguments:
        return "/" + route.route
    return reverse(route.name, kwargs=ROUTE_ARGS[route.name](site))


def static_problems(client: Client, html: str, hashed: set[str], where: str) -> list[str]:
    """Each static file the page names must be a hashed name of the manifest, served."""
    problems = []
    prefix = "/" + django_settings.STATIC_URL.lstrip("/")
    refs = set(STATIC_REF.findall(html))
    if not refs and "<html" in html:  # a whole page, not an htmx fragment
        problems.append(f"{where}: names no static file (the layout's CSS at least)")
    for ref in refs:
        name = ref.split("?", 1)[0].removeprefix(prefix)
        if name not in hashed:
            problems.append(f"{where}: {ref} is not a hashed name of the manifest")
        elif client.get(ref, secure=True).status_code != 200:
            problems.append(f"{where}: {ref} is not served")
    return problems


def test_every_page_route_can_be_filled_in():
    missing = [
        f"{route.route!r} (name {route.name!r}, arguments {', '.join(route.arguments)})"
        for route in page_routes()
        if route.arguments and route.name not in ROUTE_ARGS
    ]
    assert not missing, (
        "page routes this test cannot fill in: "
        + "; ".join(missing)
        + ". Add each to ROUTE_ARGS in tests/portal/test_production_pages.py with a real "
        "object of the demo (or exclude it in tests/page_routes.py if it is not a page)."
    )


def test_every_page_loads_for_every_role_with_debug_off(production, site):
    routes = page_routes()
    assert len(routes) > 40, [r.route for r in routes]
    problems: list[str] = []
    ok: dict[str, int] = {}
    for username in ROLES:
        client = Client()
        client.force_login(get_user_model().objects.get(username=username))
        ok[username] = 0
        for route in routes:
            url = url_of(route, site)
            where = f"{username} GET {url}"
            response = client.get(url, secure=True)
            if response.status_code >= 500:
                problems.append(f"{where}: {response.status_code}")
                continue
            if route.arguments and response.status_code == 404 and username == "admin":
                problems.append(f"{where}: 404 for the platform admin (is the object real?)")
            if response.get("Content-Type", "").startswith("text/html") and (
                response.status_code in (200, 403, 404)
            ):
                body = response.content.decode()
                problems += static_problems(client, body, production.hashed, where)
                ok[username] += response.status_code == 200
    assert not problems, "\n".join(problems)
    # Most pages rendered in full for every role (not a redirect to the login, say).
    assert ok["admin"] >= 35 and min(ok.values()) >= 20, ok


def _raise_403(request):
    raise PermissionDenied("Only platform admins may do that.")


def _raise_500(request):
    raise RuntimeError("a bug")


@pytest.fixture
def error_urls(settings):
    """The site's URLconf and error handlers, plus two routes that fail on purpose."""
    import portal.urls

    module = types.ModuleType("production_error_urls")
    module.urlpatterns = [
        path("raise-403/", _raise_403),
        path("raise-500/", _raise_500),
        *portal.urls.urlpatterns,
    ]
    for name in ("handler403", "handler404", "handler500"):
        setattr(module, name, getattr(portal.urls, name))
    settings.ROOT_URLCONF = module
    return module


def test_login_and_error_pages_with_debug_off(production, error_urls, db):
    call_command("seed_demo", stdout=StringIO())
    problems: list[str] = []
    for username in (None, *ROLES):
        client = Client(raise_request_exception=False)
        if username is not None:
            client.force_login(get_user_model().objects.get(username=username))
        expected = {"/login/": 302 if username else 200, "/no-such-page/": 404}
        expected |= {"/raise-403/": 403, "/raise-500/": 500}
        for url, status in expected.items():
            response = client.get(url, secure=True)
            where = f"{username or 'anonymous'} GET {url}"
            assert response.status_code == status, where
            if status != 302:
                body = response.content.decode()
                problems += static_problems(client, body, production.hashed, where)
        icon = client.get("/favicon.ico", secure=True)
        assert icon.status_code == 301
        assert icon["Location"].removeprefix("/static/") in production.hashed
    assert not problems, "\n".join(problems)
