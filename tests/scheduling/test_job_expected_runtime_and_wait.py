"""The job page and the job API show the expected runtime with its explanation, the order a
waiting job waits in, and its total wait (re-waits included); others' jobs stay 404."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from freezegun import freeze_time

from scheduling.choices import JobState
from scheduling.services.runtime_history import runtime_history_rebuild
from tests import factories as f
from tests.scheduling.limits_helpers import T0

HOUR = 3600


def _history(world, n=5, runtime=1200, limit=3600):
    """n finished jobs of the member that used a third of their limit."""
    for i in range(n):
        end = T0 - timedelta(hours=i + 1)
        f.JobFactory(
            queue=world.queue,
            project=world.project,
            submitted_by=world.member,
            state=JobState.SUCCEEDED,
            max_runtime_seconds=limit,
            submitted_at=end - timedelta(seconds=runtime + 60),
            admitted_at=end - timedelta(seconds=runtime),
            started_at=end - timedelta(seconds=runtime),
            finished_at=end,
        )
    runtime_history_rebuild()


@pytest.fixture
def requeued(world):
    """A pending job of the member, submitted at T0 - 2 h 10 min, that waited 1 h 30 min,
    ran, was preempted and has waited 40 min since (T0 is now)."""
    _history(world)
    return f.JobFactory(
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        max_runtime_seconds=2 * HOUR,
        gpus_per_node=4,
        submitted_at=T0 - timedelta(minutes=200),
        queued_at=T0 - timedelta(minutes=40),
        waited_seconds=90 * 60,
        first_wait_seconds=90 * 60,
        requeue_count=1,
        preemption_count=1,
        pending_reason_code="WAITING_FOR_GPUS",
        pending_reason_message="16 GPUs busy.",
    )


def test_job_page_shows_the_prediction_the_order_and_the_total_wait(world, client, requeued):
    client.force_login(world.member)
    with freeze_time(T0):
        page = client.get(f"/jobs/{requeued.pk}/").content.decode()

    assert "~40 min</strong>: Expected ~40 min from the last 5 finished training jobs" in page
    assert "of nlp-member in project llm (declared 2 h)" in page
    assert "It has been waiting 2 h 10 min in all, 40 min of it after 1 preemption" in page
    assert "(first wait 1 h 30 min)" in page
    # Why it waits: the order inside the class, aging and the guaranteed start.
    assert "small and short work goes first" in page
    assert "4 GPUs for an" in page and "expected ~40 min" in page
    assert "counts half for every 6 h it has waited" in page
    assert "After waiting 2 d (the training policy)" in page
    front = (requeued.submitted_at + timedelta(hours=48)).strftime("%Y-%m-%d %H:%M:%S")
    assert f"this one from <strong>{front}</strong>" in page
    assert 'id="class-aging"' not in page  # off by default


def test_job_page_says_when_class_aging_moves_the_job_up(world, client, requeued, settings):
    settings.SLUICE_CLASS_AGING_SECONDS = 3600
    own = requeued.priority_class
    above = f.PriorityClassFactory(name="urgent", value=own.value + 1)
    client.force_login(world.member)
    with freeze_time(T0):
        page = client.get(f"/jobs/{requeued.pk}/").content.decode()
    assert f"does not move this job up: no job of a class above {own.name} waits" in page
    f.JobFactory(
        queue=world.queue, project=world.project, submitted_by=world.member, priority_class=above
    )
    with freeze_time(T0):
        page = client.get(f"/jobs/{requeued.pk}/").content.decode()
    assert f"After waiting 1 h a job of class {own.name} is ordered with the jobs of class" in page
    assert "<strong>urgent</strong>" in page
    pool = requeued.queue.pool.name
    assert f"while the guarantee of {requeued.tenant.slug} in pool {pool} has room for it" in page
    assert "This one has waited that long" in page  # it has waited 2 h 10 min
    with freeze_time(requeued.submitted_at + timedelta(minutes=20)):
        page = client.get(f"/jobs/{requeued.pk}/").content.decode()
    aged_at = (requeued.submitted_at + timedelta(hours=1)).strftime("%Y-%m-%d %H:%M:%S")
    assert f"This one from <strong>{aged_at}</strong>" in page
    # The next class up may preempt: aging does not move the job.
    above.can_preempt = True
    above.save()
    with freeze_time(T0):
        page = client.get(f"/jobs/{requeued.pk}/").content.decode()
    assert "the next class up with jobs waiting, urgent, may preempt" in page
    # A class that may preempt does not age at all.
    own.can_preempt = True
    own.save()
    with freeze_time(T0):
        page = client.get(f"/jobs/{requeued.pk}/").content.decode()
    assert 'id="class-aging"' not in page


def test_job_page_without_history_says_the_declared_limit_is_used(world, client, settings):
    settings.SLUICE_SIZE_ORDER = False
    job = f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
    client.force_login(world.viewer)

    page = client.get(f"/jobs/{job.pk}/").content.decode()

    assert "No prediction: fewer than 3 finished training jobs in project llm" in page
    assert "Among level tenants, jobs go in submit order." in page


def test_finished_job_page_shows_its_wait_but_no_prediction(world, client):
    _history(world)
    job = f.JobFactory(
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        state=JobState.SUCCEEDED,
        submitted_at=T0,
        admitted_at=T0 + timedelta(minutes=25),
        started_at=T0 + timedelta(minutes=25),
        finished_at=T0 + timedelta(hours=2),
    )
    client.force_login(world.member)

    page = client.get(f"/jobs/{job.pk}/").content.decode()

    assert 'id="expected-runtime"' not in page and "Why it waits" not in page
    assert "Waited 25 min." in page


def test_class_aging_costs_a_finished_job_page_no_query(world, client, settings):
    job = f.JobFactory(
        queue=world.queue, project=world.project, submitted_by=world.member, state=JobState.FAILED
    )
    client.force_login(world.member)
    counts = []
    for aging in (0, 3600):
        settings.SLUICE_CLASS_AGING_SECONDS = aging
        with CaptureQueriesContext(connection) as queries:
            assert client.get(f"/jobs/{job.pk}/").status_code == 200
        counts.append(len(queries.captured_queries))
    assert counts[0] == counts[1]


def test_api_returns_the_prediction_and_the_total_wait(world, api, requeued):
    with freeze_time(T0):
        body = api(world.viewer).get(f"/api/v1/jobs/{requeued.pk}").json()

    assert body["expected_runtime"] == {
        "seconds": 2400,
        "declared_seconds": 7200,
        "basis": "submitter",
        "jobs": 5,
        "ratio": pytest.approx(1 / 3, abs=1e-4),
        "message": "expected ~40 min from the last 5 finished training jobs of nlp-member "
        "in project llm (declared 2 h)",
    }
    wait = body["wait"]
    assert (wait["total_seconds"], wait["first_seconds"], wait["rewait_seconds"]) == (
        7800,
        5400,
        2400,
    )
    assert (wait["current_seconds"], wait["waiting"], wait["requeues"]) == (2400, True, 1)
    assert wait["message"] == "waiting 2 h 10 min in all, 40 min of it after 1 preemption"
    assert wait["since"].startswith((T0 - timedelta(minutes=40)).strftime("%Y-%m-%dT%H:%M:%S"))


def test_api_list_predicts_a_page_in_one_query(world, api, requeued):
    others = [
        f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
        for _ in range(5)
    ]
    client = api(world.member)

    def fetch():
        with CaptureQueriesContext(connection) as ctx:
            response = client.get("/api/v1/jobs", {"state": "PENDING"})
        return response.json()["results"], len(ctx.captured_queries)

    results, queries = fetch()
    rows = {row["id"]: row for row in results}
    assert rows[requeued.pk]["expected_runtime"]["seconds"] == 2400
    assert all(rows[j.pk]["expected_runtime"]["basis"] == "submitter" for j in others)
    for _ in range(10):
        f.JobFactory(queue=world.queue, project=world.project, submitted_by=world.member)
    assert len(fetch()[0]) == 16 and fetch()[1] == queries

    finished = client.get("/api/v1/jobs", {"state": "SUCCEEDED"}).json()["results"]
    assert finished and all(row["expected_runtime"] is None for row in finished)


def test_others_jobs_are_404_on_the_page_and_in_the_api(world, client, api, requeued):
    client.force_login(world.outsider)

    assert client.get(f"/jobs/{requeued.pk}/").status_code == 404
    assert api(world.outsider).get(f"/api/v1/jobs/{requeued.pk}").status_code == 404


def test_queue_page_shows_the_total_wait(world, client, requeued):
    client.force_login(world.member)
    with freeze_time(T0):
        page = client.get(f"/queues/{world.queue.pk}/").content.decode()

    assert "<td>2 h 10 min (40 min after 1 requeue)</td>" in page
