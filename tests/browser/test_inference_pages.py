"""The inference services' pages in Chromium, as each role sees them, on the demo
(``seed_demo`` + ``seed_service_demo``) with an hour of a traffic ramp on the timeline:
nlp's ``chat`` at its max replicas (near capacity, p95 over its SLO at the peak) and
``summarize`` held at the tenant's quota. List, detail (charts, endpoints, decisions), the
create and edit forms with an error, and the insights' services near capacity. Every page
is checked for console errors; the PNGs go to $SLUICE_SCREENSHOTS, else a temporary folder
(``services``, ``service-detail`` and ``service-form`` are in docs/tour.md).
"""

import io
import math
import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone
from playwright.sync_api import expect

from inference.choices import BlockedReason
from inference.forms import ServiceForm
from inference.models import ScaleDecision, Service
from inference.services import ServiceSpec, service_create, service_reconcile
from scheduling.choices import JobState
from scheduling.models import Job
from scheduling.services.dispatch import dispatch_cycle
from scheduling.services.nodes import job_started

pytestmark = pytest.mark.browser

DEMO_PASSWORD = "sluice-demo-2026"
VIEWPORT = {"width": 1280, "height": 900}
#: The timeline: one line every 15 s over the last 50 minutes.
STEP = timedelta(seconds=15)
LINES = 200


def _ramp(i: int) -> float:
    """Ongoing requests: a morning bump, calm, then a climb to a plateau above what two
    replicas carry (where the timeline ends: the service is near capacity now)."""
    bump = 3.0 * math.exp(-(((i - LINES / 5) / (LINES / 20)) ** 2))
    climb = 7.0 / (1 + math.exp(-(i - 0.7 * LINES) / (LINES / 30)))
    return round(1.0 + bump + climb, 2)


def _timeline(service: Service, now) -> None:
    """An hour of decisions of ``chat`` (target 2 per replica, 1-2 replicas, SLO 500 ms)."""
    rows = []
    current = 1
    for i in range(LINES):
        at = now - (LINES - i) * STEP
        load = _ramp(i)
        recommended = max(1, math.ceil(load / service.target_running_per_replica))
        desired = min(recommended, service.max_replicas)
        near = recommended > service.max_replicas
        code = "max_replicas" if near else ("scale_up" if desired > current else "steady")
        reason = f"concurrency {load:.1f} / target {service.target_running_per_replica:g} per "
        reason += f"replica → {recommended}"
        if near:
            reason += f"; at max_replicas {service.max_replicas}"
        p95 = 120 + 110 * load / current
        rows.append(
            ScaleDecision(
                service=service,
                at=at,
                current=current,
                ready=current,
                desired=desired,
                reason_code=code,
                reason=reason,
                inputs={
                    "current": current,
                    "ready": current,
                    "stable_concurrency": load,
                    "request_rate": round(load * 8, 1),
                    "p95_ms": round(p95),
                    "error_rate": 0.02 if p95 > 500 else 0.001,
                    "recommended": recommended,
                    "near_capacity": near,
                },
            )
        )
        current = desired
    ScaleDecision.objects.bulk_create(rows)


def _demo_services() -> dict:
    """The demo's chat with two running replicas (one ready, one warming up) and a timeline,
    and summarize waiting at the quota."""
    call_command("seed_demo", stdout=io.StringIO())
    call_command("seed_service_demo", stdout=io.StringIO())
    now = timezone.now()
    chat = Service.objects.get(name="chat")
    Service.objects.filter(pk=chat.pk).update(desired_replicas=2)
    chat.refresh_from_db()
    service_reconcile(service=chat, now=now)
    dispatch_cycle()
    for n, job in enumerate(Job.objects.filter(state=JobState.ADMITTED).order_by("pk")):
        allocation = job.allocations.select_related("node").first()
        job_started(
            {
                "type": "started",
                "node": allocation.node.name,
                "job_id": job.pk,
                "attempt": 0,
                "pid": 5000 + n,
                "started_at": now.timestamp(),
            }
        )
        Job.objects.filter(pk=job.pk).update(serve_port=41000 + n, serve_ready=n == 0)
    _timeline(chat, now)
    Service.objects.filter(pk=chat.pk).update(
        near_capacity=True, last_reason_code="max_replicas", decided_at=now - STEP
    )
    member = chat.created_by
    summarize = service_create(
        user=member,
        spec=ServiceSpec(
            project=chat.project,
            queue=chat.queue,
            name="summarize",
            description="Long-document summaries.",
            command=["python3", "-m", "summarizer", "--port", "$PORT"],
            gpus_per_node=2,
            min_replicas=1,
            max_replicas=6,
            target_running_per_replica=1,
            latency_slo_ms=2000,
        ),
    )
    Service.objects.filter(pk=summarize.pk).update(
        desired_replicas=6,
        near_capacity=True,
        last_reason_code="scale_up",
        decided_at=now - STEP,
        blocked_reason_code=BlockedReason.AT_QUOTA,
        blocked_reason_message=(
            "At quota: nlp uses 4/4 guaranteed A100-40GB in pool inference (borrowing 0 of 0)."
            " The service wants 6 replicas of 2 GPU(s), has 2; no more can start."
        ),
    )
    return {"chat": chat, "summarize": summarize}


def test_service_pages_by_role(browser, live_server, transactional_db, settings, tmp_path):
    services = _demo_services()
    chat = services["chat"]
    out = Path(os.environ.get("SLUICE_SCREENSHOTS") or tmp_path / "shots")
    out.mkdir(parents=True, exist_ok=True)
    detail = f"/services/{chat.pk}/"
    shots = [
        ("admin", "/services/", "services-admin", "#service-table"),
        ("admin", detail, "service-detail-admin", "#chart-replicas-canvas"),
        ("nlp-admin", "/insights/", "insights-services-near-capacity", "#q-inference"),
        ("nlp-admin", "/services/", "services-nlp-admin", "#service-table"),
        ("nlp-member", "/services/", "services", "#service-table"),
        ("nlp-member", detail, "service-detail", "#chart-latency-canvas"),
        ("nlp-member", "/services/new/", "service-form", "#service-form"),
        ("nlp-member", f"/services/{chat.pk}/edit/", "service-edit-error", "#service-form"),
        ("nlp-viewer", "/services/", "services-viewer", "#service-table"),
        ("nlp-viewer", detail, "service-detail-viewer", "#service-decisions"),
        ("vision-member", "/services/", "services-outsider", "#service-table"),
    ]
    errors: list[str] = []
    contexts = {}
    for user, url, name, ready in shots:
        if user not in contexts:
            context = browser.new_context(base_url=live_server.url, viewport=VIEWPORT)
            page = context.new_page()
            page.on(
                "console",
                lambda m, page=page: (
                    errors.append(f"{page.url}: {m.text}") if m.type == "error" else None
                ),
            )
            page.on("pageerror", lambda exc, page=page: errors.append(f"{page.url}: {exc}"))
            page.goto("/login/")
            page.fill("#id_username", user)
            page.fill("#id_password", DEMO_PASSWORD)
            page.click("button[type=submit]:has-text('Log in')")
            page.wait_for_url(lambda u: "/login/" not in u)
            contexts[user] = (context, page)
        _, page = contexts[user]
        page.goto(url)
        expect(page.locator(ready).first).to_be_visible()
        if name == "service-form":
            page.select_option("#id_project", str(chat.project_id))
            page.select_option("#id_queue", str(chat.queue_id))
            page.fill("#id_name", "chat-7b")
            page.fill("#id_command", "sh -c 'exec python -m vllm.entrypoints.openai.api_server'")
            page.fill("#id_min_replicas", "5")
            page.fill("#id_max_replicas", "2")
            page.click("#service-save")
            expect(page.locator("#field-min_replicas .errors")).to_be_visible()
            expect(page.locator("#field-command")).to_contain_text('--port "$PORT"')
        if name == "service-edit-error":
            page.fill("#id_env", "HF_HOME")
            page.click("#service-save")
            expect(page.locator("#field-env .errors")).to_be_visible()
        page.wait_for_load_state("networkidle")
        page.screenshot(path=str(out / f"{name}.png"), full_page=True)
        if name == "service-form":
            for field in ServiceForm.base_fields:  # every field has its place in the form
                assert page.locator(f"#field-{field} #id_{field}").count() == 1, field
        if name == "service-detail-viewer":
            assert page.locator("#service-edit").count() == 0
        if name == "services-outsider":
            expect(page.locator("#service-table")).not_to_contain_text("chat")
    for context, _ in contexts.values():
        context.close()

    assert errors == []
    assert all((out / f"{s[2]}.png").stat().st_size > 0 for s in shots)
