"""In a browser: a member asks for a raise, a tenant admin approves it in the inbox, the job runs
at the new class."""

import re

import pytest
from playwright.sync_api import expect

from scheduling.choices import RaiseState
from scheduling.models import Job, PriorityRaise, TenantRaiseCeiling
from tests import factories as f

pytestmark = pytest.mark.browser


def log_out(page):
    page.click("header button:has-text('Log out')")
    page.wait_for_url(re.compile(r"/login/"))


def test_member_requests_admin_approves_member_sees_the_new_class(
    world, page, log_in, dispatch_requests
):
    TenantRaiseCeiling.objects.create(tenant=world.tenant, ceiling=world.high)
    job = f.JobFactory(
        queue=world.queue, project=world.project, submitted_by=world.member, name="rc-eval"
    )

    log_in("nlp-member")
    page.goto(f"/jobs/{job.pk}/")
    page.click("#open-raise-form")  # the form is behind a button
    page.select_option("#id_to_class", label="high")
    page.fill("#id_reason", "release candidate must be evaluated before the demo")
    page.fill("#id_hours", "2")
    page.click("#request-raise")
    page.wait_for_url(re.compile(rf"/jobs/{job.pk}/$"))
    raise_ = PriorityRaise.objects.get()
    expect(page.locator(".flash")).to_contain_text(f"Raise #{raise_.pk} requested")
    expect(page.locator(f"#raise-{raise_.pk}")).to_contain_text("pending")
    expect(page.locator("nav >> text=Approvals")).to_have_count(0)  # members decide nothing
    log_out(page)

    log_in("nlp-admin")
    expect(page.locator("#nav-unread")).to_have_text("1")
    page.click("nav >> text=Approvals")
    card = page.locator(f"#raise-{raise_.pk}")
    expect(card).to_contain_text("release candidate must be evaluated")
    expect(card.locator(".impact-job")).to_have_count(1)  # the scheduler's preview
    card.locator("input[name=comment]").fill("go for it")
    card.locator("button.approve").click()
    expect(page.locator(".flash")).to_contain_text(f"Raise #{raise_.pk} approved")
    expect(page.locator(f"#grant-{raise_.pk}")).to_be_visible()
    log_out(page)

    raise_.refresh_from_db()
    assert raise_.state == RaiseState.APPROVED
    assert Job.objects.get(pk=job.pk).priority_class == world.high
    assert dispatch_requests == [1]

    log_in("nlp-member")
    expect(page.locator("#nav-unread")).to_have_text("1")
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("main")).to_contain_text("class high (raised from normal)")
    expect(page.locator(f"#raise-{raise_.pk}")).to_contain_text("approved")
    page.click("#nav-notifications")
    expect(page.locator("#notifications")).to_contain_text("approved by nlp-admin")


def test_an_admin_cannot_approve_their_own_request_in_the_inbox(world, page, log_in):
    TenantRaiseCeiling.objects.create(tenant=world.tenant, ceiling=world.high)
    job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.tenant_admin)

    log_in("nlp-admin")
    page.goto(f"/jobs/{job.pk}/")
    page.click("#open-raise-form")  # the form is behind a button
    page.select_option("#id_to_class", label="high")
    page.fill("#id_reason", "my own job")
    page.click("#request-raise")
    page.wait_for_url(re.compile(rf"/jobs/{job.pk}/$"))
    page.click("nav >> text=Approvals")

    expect(page.locator("#no-approvals")).to_be_visible()
    assert PriorityRaise.objects.get().state == RaiseState.PENDING
