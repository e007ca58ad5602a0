"""In a browser: submit a job in the form and find it in "my jobs"."""

import re

import pytest
from playwright.sync_api import expect

from scheduling.choices import JobState
from scheduling.models import Job

pytestmark = pytest.mark.browser


def test_member_submits_a_job_and_sees_it_in_my_jobs(world, page, log_in, dispatch_requests):
    log_in("nlp-member")
    page.click("nav >> text=Submit")

    page.select_option("#id_project", str(world.project.pk))
    page.select_option("#id_queue", str(world.queue.pk))
    page.fill("#id_name", "browser-bert")
    page.fill("#id_gpus_per_node", "2")
    page.fill("#id_command", "python train.py --epochs 1")
    expect(page.locator("#preview")).to_contain_text("Would run as guaranteed")
    page.click("#submit-form button[type=submit]")

    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job = Job.objects.get(name="browser-bert")
    assert job.state == JobState.PENDING
    assert job.command == ["python", "train.py", "--epochs", "1"]
    expect(page.locator("#job-state")).to_have_text("PENDING")

    page.click("nav >> text=Jobs")
    row = page.locator("table tr", has_text="browser-bert")
    expect(row).to_have_count(1)
    expect(row.locator(f"a[href='/jobs/{job.pk}/']")).to_be_visible()


def test_bad_input_shows_field_errors_in_the_form(world, page, log_in):
    log_in("nlp-member")
    page.goto("/jobs/new/")

    page.select_option("#id_project", str(world.project.pk))
    page.select_option("#id_queue", str(world.queue.pk))
    page.fill("#id_gpus_per_node", "9")
    page.fill("#id_command", "python train.py")
    # The field allows no more than the pool's largest node has (the browser refuses 9).
    assert page.get_attribute("#id_gpus_per_node", "max") == "8"
    page.click("#submit-form button[type=submit]")
    assert page.eval_on_selector("#id_gpus_per_node", "field => field.validity.rangeOverflow")

    # Past the browser (the form's limit removed), the server's field error says the same.
    page.eval_on_selector("#id_gpus_per_node", "field => field.removeAttribute('max')")
    page.click("#submit-form button[type=submit]")
    expect(page.locator("#field-gpus_per_node .errors")).to_contain_text("at most 8")
    assert not Job.objects.exists()
