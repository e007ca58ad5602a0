"""In a browser: pages follow the cluster without a reload, destructive steps ask first,
refusals are pages people can act on."""

import re

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from scheduling.choices import JobState
from scheduling.models import Job
from scheduling.services.dispatch import dispatch_cycle
from scheduling.services.nodes import job_exited, job_started
from tests import factories as f

pytestmark = pytest.mark.browser


@pytest.fixture
def console_errors(page):
    """What the browser console reported as errors (a failed request, a script error)."""
    errors: list[str] = []
    page.on(
        "console", lambda m: errors.append(f"{page.url}: {m.text}") if m.type == "error" else None
    )
    page.on("pageerror", lambda exc: errors.append(f"{page.url}: {exc}"))
    return errors


def _report(job, kind, **extra):
    node = job.allocations.first().node.name
    return {"type": kind, "node": node, "job_id": job.pk, "attempt": 0, **extra}


def test_job_page_follows_pending_running_succeeded_without_reload(
    world, page, log_in, outbox, settings, tmp_path, console_errors
):
    settings.SLUICE_LOG_DIR = tmp_path
    job = f.JobFactory(
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        name="live-bert",
        gpus_per_node=2,
    )
    log_in("nlp-member")
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#job-state")).to_have_text("PENDING")
    expect(page.locator("#waiting")).to_be_visible()
    page.evaluate("window.sluiceNotReloaded = true")  # gone if the page were loaded again

    dispatch_cycle()
    expect(page.locator("#job-state")).to_have_text("ADMITTED", timeout=8000)
    expect(page.locator("#allocations tr.allocation")).to_have_count(1)  # 2 GPUs, one node
    expect(page.locator("#allocations")).to_contain_text("2 ×")
    expect(page.locator("#waiting")).to_have_count(0)

    job.refresh_from_db()
    job_started(_report(job, "started", pid=100, started_at=timezone.now().timestamp()))
    (tmp_path / str(job.pk)).mkdir()
    (tmp_path / str(job.pk) / "attempt-0.log").write_text("epoch 1 loss 0.5\n")
    expect(page.locator("#job-state")).to_have_text("RUNNING", timeout=8000)
    expect(page.locator("#job-log")).to_contain_text("epoch 1 loss 0.5", timeout=8000)

    job_exited(
        _report(job, "exited", exit_code=0, signal=None, finished_at=timezone.now().timestamp())
    )
    expect(page.locator("#job-state")).to_have_text("SUCCEEDED", timeout=8000)
    expect(page.locator("#timeline")).to_contain_text("succeeded")
    expect(page.locator("#job-exit")).to_contain_text("code 0")
    expect(page.locator("#cancel-job")).to_have_count(0)

    assert page.evaluate("window.sluiceNotReloaded") is True
    # Ended: the last answer carries no trigger, so the page stops asking.
    assert page.locator("#job-live").get_attribute("hx-trigger") is None
    assert Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED
    assert console_errors == []


def test_cancel_asks_first_and_dismissing_keeps_the_job(
    world, page, log_in, dispatch_requests, console_errors
):
    job = f.JobFactory(
        queue=world.queue, project=world.project, submitted_by=world.member, name="keep-me"
    )
    log_in("nlp-member")
    page.goto(f"/jobs/{job.pk}/")

    asked: list[str] = []

    def dismiss(dialog):
        asked.append(dialog.message)
        dialog.dismiss()

    page.once("dialog", dismiss)
    page.click("#cancel-job")
    page.wait_for_timeout(300)
    assert asked and "Cancel job" in asked[0] and "keep-me" in asked[0]
    assert Job.objects.get(pk=job.pk).state == JobState.PENDING

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#cancel-job")
    expect(page.locator(".flash")).to_contain_text(f"Job {job.pk}: cancel done.")
    expect(page.locator("#job-state")).to_have_text("CANCELLED")
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED
    assert console_errors == []


def test_jobs_list_refreshes_and_cancels_ticked_jobs_after_confirmation(
    world, page, log_in, dispatch_requests, console_errors
):
    own = {"queue": world.queue, "project": world.project, "submitted_by": world.member}
    first, second, third = (f.JobFactory(name=f"bulk-{n}", **own) for n in range(3))
    log_in("nlp-member")
    page.goto("/jobs/")
    expect(page.locator("#jobs-live tbody tr")).to_have_count(3)

    late = f.JobFactory(name="arrives-later", **own)  # shown by the next refresh
    expect(page.locator(f"#job-row-{late.pk}")).to_be_visible(timeout=8000)

    page.check(f"#job-row-{first.pk} input[name=job]")
    page.check(f"#job-row-{second.pk} input[name=job]")
    page.wait_for_timeout(3500)  # a refresh is due: ticked boxes pause it, they stay ticked
    expect(page.locator(f"#job-row-{first.pk} input[name=job]")).to_be_checked()
    asked: list[str] = []
    page.once("dialog", lambda d: (asked.append(d.message), d.accept()))
    page.click("#bulk-cancel")
    expect(page.locator(".flash").first).to_contain_text("Cancel done for 2 job(s).")

    assert asked == ["Cancel 2 selected job(s)? Running jobs get SIGTERM and their grace period."]
    states = dict(Job.objects.values_list("name", "state"))
    assert states == {
        "bulk-0": JobState.CANCELLED,
        "bulk-1": JobState.CANCELLED,
        "bulk-2": JobState.PENDING,
        "arrives-later": JobState.PENDING,
    }
    assert third.pk
    assert console_errors == []


def test_a_refused_page_says_why_inside_the_layout(world, page, log_in):
    log_in("nlp-member")
    response = page.goto("/audit/")

    assert response.status == 403
    expect(page.locator("#error-reason")).to_contain_text("audit log")
    expect(page.locator("#error-roles")).to_contain_text("Member of nlp")
    expect(page.locator("#error-roles")).to_contain_text("nlp-admin")
    expect(page.locator("nav >> text=Jobs")).to_be_visible()  # the layout, not a bare page


def test_pages_load_their_icon_and_no_missing_resources(world, page, log_in, console_errors):
    failed: list[str] = []
    page.on("response", lambda r: failed.append(r.url) if r.status >= 400 else None)
    log_in("nlp-member")
    for url in ("/", "/jobs/", "/jobs/new/", f"/queues/{world.queue.pk}/", "/nodes/"):
        page.goto(url)
        page.wait_for_load_state("networkidle")

    assert failed == []
    icon = page.locator("link[rel=icon]").get_attribute("href")
    assert re.search(r"favicon\.svg$", icon)
    assert page.request.get(icon).status == 200
    assert console_errors == []
