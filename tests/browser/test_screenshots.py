"""The screenshots of docs/tour.md: the main pages of the demo (``seed_demo``) as each role sees
them, with jobs running and waiting. Every page is checked for console errors; the PNGs go
to $SLUICE_SCREENSHOTS (``make screenshots`` sets docs/screenshots), else a temporary folder.
"""

import io
import os
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone
from playwright.sync_api import expect

from scheduling.choices import JobState
from scheduling.models import Job, Project, Queue
from scheduling.services import jobs as job_services
from scheduling.services.dispatch import dispatch_cycle
from scheduling.services.nodes import job_started

pytestmark = pytest.mark.browser

DEMO_PASSWORD = "sluice-demo-2026"
VIEWPORT = {"width": 1280, "height": 800}


def _demo_cluster(settings, log_dir: Path) -> dict:
    """The demo plus work in flight: two nlp trainings running, one waiting for GPUs."""
    from django.contrib.auth import get_user_model

    settings.SLUICE_LOG_DIR = log_dir
    call_command("seed_demo", stdout=io.StringIO())
    member = get_user_model().objects.get(username="nlp-member")
    queue = Queue.objects.get(tenant__slug="nlp", name="train")
    project = Project.objects.get(tenant__slug="nlp", slug="llm-pretrain")
    jobs = {}
    for name, gpus in [("llama-7b-pretrain", 8), ("bert-large-sweep", 4), ("mixtral-ft", 8)]:
        jobs[name] = job_services.job_submit(
            user=member,
            spec=job_services.JobSpec(
                queue=queue,
                project=project,
                name=name,
                workload_type="training",
                command=["python", "train.py", "--config", f"{name}.yaml"],
                gpus_per_node=gpus,
                max_runtime_seconds=6 * 3600,
            ),
        )
    dispatch_cycle()
    for job in Job.objects.filter(state=JobState.ADMITTED):
        allocation = job.allocations.select_related("node").first()
        job_started(
            {
                "type": "started",
                "node": allocation.node.name,
                "job_id": job.pk,
                "attempt": 0,
                "pid": 4242,
                "started_at": timezone.now().timestamp(),
            }
        )
        (log_dir / str(job.pk)).mkdir(parents=True, exist_ok=True)
        lines = [f"step {s:>5}  loss {2.9 - s / 4000:.4f}  lr 3.0e-04" for s in range(0, 2000, 100)]
        (log_dir / str(job.pk) / "attempt-0.log").write_text("\n".join(lines) + "\n")
    dispatch_cycle()  # positions and estimates of what still waits
    return {name: Job.objects.get(pk=job.pk) for name, job in jobs.items()}


def test_screenshots_of_the_main_pages(browser, live_server, transactional_db, settings, tmp_path):
    jobs = _demo_cluster(settings, tmp_path / "logs")
    running = next(j for j in jobs.values() if j.state == JobState.RUNNING)
    waiting = next(j for j in jobs.values() if j.state == JobState.PENDING)
    out = Path(os.environ.get("SLUICE_SCREENSHOTS") or tmp_path / "shots")
    out.mkdir(parents=True, exist_ok=True)
    shots = [
        ("nlp-member", "/", "dashboard", "#dashboard-live"),
        ("nlp-member", "/jobs/", "jobs", "#jobs-live"),
        ("nlp-member", f"/jobs/{running.pk}/", "job-running", "#job-log"),
        ("nlp-member", f"/jobs/{waiting.pk}/", "job-waiting", "#waiting"),
        ("nlp-member", "/jobs/new/", "submit", "#preview"),
        ("nlp-admin", "/approvals/", "approvals", "#approvals-live"),
        ("admin", "/nodes/", "nodes", "main"),
        ("nlp-member", "/audit/", "error-403", "#error-403"),
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
                    errors.append(f"{page.url}: {m.text}")
                    if m.type == "error" and "403 (Forbidden)" not in m.text
                    else None
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
        if name == "submit":
            page.select_option("#id_project", str(running.project_id))
            page.select_option("#id_queue", str(running.queue_id))
            page.fill("#id_name", "llama-7b-ablation")
            page.fill("#id_gpus_per_node", "4")
            page.fill("#id_max_runtime_seconds", "2h30m")
            page.fill("#id_command", "python train.py --config ablation.yaml")
            page.locator("#id_command").blur()
            expect(page.locator("#preview-outlook")).to_be_visible()
            page.evaluate("window.scrollTo(0, 0)")
        page.wait_for_load_state("networkidle")
        page.screenshot(path=str(out / f"{name}.png"))
    for context, _ in contexts.values():
        context.close()

    assert errors == []
    assert sorted(p.stem for p in out.glob("*.png")) == sorted(s[2] for s in shots)
