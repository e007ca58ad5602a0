"""In a browser: every main page, as each role, keeps to the Content-Security-Policy.

The ``page`` fixture collects what Chromium reports (its "Refused to ..." console messages and
``securitypolicyviolation`` events); here each page is visited, its live htmx parts run, and
the bars that used to take ``style=`` widths are measured.
"""

import re
from types import SimpleNamespace

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from scheduling.choices import SimulationState
from scheduling.models import Allocation, SimulationRun, TenantRaiseCeiling
from tests import factories as f
from tests.browser.conftest import csp_violations_in
from tests.raise_helpers import ask

pytestmark = pytest.mark.browser

STRICT = [
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "object-src 'none'",
    "base-uri 'self'",
    "frame-ancestors 'none'",
    "form-action 'self'",
]


@pytest.fixture
def cluster(world):
    """Something on every page: running jobs (8 guaranteed + 4 borrowed GPUs of nlp), GPU
    utilization, a waiting job with a pending raise, a what-if run at 40 %."""
    node1, node2 = (list(n.gpus.order_by("index")) for n in world.nodes)
    running = f.placed_job(
        gpus=node1, queue=world.queue, project=world.project, submitted_by=world.member
    )
    borrowing = f.placed_job(
        gpus=node2[:4], queue=world.queue, project=world.project, submitted_by=world.member
    )
    Allocation.objects.filter(job=borrowing).update(borrowed=True)
    for gpu, utilization in zip(node1, (37, 100, 0, 64), strict=False):
        gpu.utilization = utilization
        gpu.save(update_fields=["utilization"])
    waiting = f.JobFactory(
        queue=world.queue, project=world.project, submitted_by=world.member, name="rc-eval"
    )
    TenantRaiseCeiling.objects.create(tenant=world.tenant, ceiling=world.high)
    ask(world, waiting)
    run = SimulationRun.objects.create(
        created_by=world.platform_admin,
        params={"days": 7, "policy": "sluice"},
        state=SimulationState.RUNNING,
        progress=40,
        created_at=timezone.now(),
    )
    return SimpleNamespace(world=world, running=running, waiting=waiting, run=run)


def main_pages(cluster) -> list[str]:
    world = cluster.world
    return [
        "/",
        "/jobs/",
        f"/jobs/{cluster.running.pk}/",
        f"/jobs/{cluster.waiting.pk}/",
        "/jobs/new/",
        "/queues/",
        f"/queues/{world.queue.pk}/",
        "/quotas/",
        f"/quotas/{world.tenant.slug}/",
        "/nodes/",
        "/approvals/",
        "/approvals/extensions/",
        "/audit/",
        "/tenants/",
        f"/tenants/{world.tenant.slug}/",
        "/projects/",
        f"/projects/{world.project.pk}/",
        "/simulate/",
        f"/simulate/{cluster.run.pk}/",
        "/recovery/",
        "/notifications/",
    ]


def assert_no_violations(page) -> None:
    violations = csp_violations_in(page.console_messages)
    assert violations == [], "\n".join(violations)


def width_ratio(page, inner: str, outer: str) -> float:
    inner_box = page.locator(inner).first.bounding_box()
    outer_box = page.locator(outer).first.bounding_box()
    return inner_box["width"] / outer_box["width"]


@pytest.mark.parametrize("username", ["root", "nlp-admin", "nlp-member", "nlp-viewer"])
def test_every_main_page_keeps_to_the_policy(cluster, page, log_in, username):
    log_in(username)
    shown = []

    for url in main_pages(cluster):
        response = page.goto(url)
        policy = response.headers["content-security-policy"]
        assert sorted(policy.split("; ")) == sorted(STRICT), url
        if response.status in (403, 404):  # not for this role: Django's plain error page
            continue
        assert response.status == 200, url
        shown.append(url)
        expect(page.locator("main h1, main .card").first).to_be_visible()
        # The site's scripts ran: the policy lets 'self' through.
        assert page.evaluate("typeof htmx") == "object", url

    page.wait_for_timeout(2500)  # the last pages' htmx polls (every 2-5 s) have swapped once
    assert_no_violations(page)
    if username == "root":
        assert shown == main_pages(cluster)
    assert len(shown) >= 14


def test_the_live_parts_run_under_the_policy(cluster, page, log_in):
    log_in("nlp-member")
    page.goto("/jobs/new/")
    page.select_option("#id_project", str(cluster.world.project.pk))
    page.select_option("#id_queue", str(cluster.world.queue.pk))
    page.fill("#id_gpus_per_node", "2")
    page.fill("#id_command", "python train.py")
    expect(page.locator("#preview")).not_to_contain_text("Choose a project")

    page.goto("/recovery/")
    page.select_option("#days", index=1)  # sluice.js submits the form on change
    page.wait_for_url(re.compile(r"/recovery/\?days=\d+"))

    assert_no_violations(page)


def test_bars_render_from_classes_as_they_did_from_style_attributes(cluster, page, log_in):
    log_in("root")

    # nlp: 8 guaranteed + 4 borrowed GPUs used of 8 guaranteed (+8 borrowable): 50 % + 25 %,
    # the guarantee marked at 50 %.
    page.goto(f"/quotas/{cluster.world.tenant.slug}/")
    bar = ".bar.quota"
    assert width_ratio(page, f"{bar} .guaranteed", bar) == pytest.approx(0.5, abs=0.01)
    assert width_ratio(page, f"{bar} .borrowed", bar) == pytest.approx(0.25, abs=0.01)
    mark = page.locator(f"{bar} .guarantee-mark").first.bounding_box()
    outer = page.locator(bar).first.bounding_box()
    assert (mark["x"] - outer["x"]) / outer["width"] == pytest.approx(0.5, abs=0.01)
    swatch = page.locator(".legend .swatch.borrowed")
    assert swatch.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(142, 107, 214)"

    page.goto("/nodes/")
    first_gpu = "#node-gpu-01 tbody tr:first-child"
    assert width_ratio(page, f"{first_gpu} .util", f"{first_gpu} .bar") == pytest.approx(
        0.37, abs=0.01
    )
    assert page.locator(f"{first_gpu} .bar").bounding_box()["width"] >= 120

    page.goto(f"/simulate/{cluster.run.pk}/")
    status = "#simulation-status"
    assert width_ratio(page, f"{status} .util", f"{status} .bar") == pytest.approx(0.4, abs=0.01)

    assert_no_violations(page)


def test_the_api_docs_run_under_the_policy(cluster, page, log_in):
    log_in("nlp-member")

    response = page.goto("/api/docs/")
    assert sorted(response.headers["content-security-policy"].split("; ")) == sorted(STRICT)
    operation = page.locator(".swagger-ui .opblock").first
    expect(operation).to_be_visible()
    operation.locator(".opblock-summary").click()
    expect(operation.locator(".opblock-body")).to_be_visible()
    page.locator(".swagger-ui .btn.authorize").click()
    expect(page.locator(".swagger-ui .modal-ux")).to_be_visible()

    assert_no_violations(page)


def test_the_admin_keeps_to_the_policy(cluster, page, log_in):
    log_in("root")

    for url in [
        "/admin/",
        "/admin/scheduling/job/",
        f"/admin/scheduling/job/{cluster.running.pk}/change/",
    ]:
        response = page.goto(url)
        assert response.status == 200, url
    assert_no_violations(page)
