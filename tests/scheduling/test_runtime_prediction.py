"""Runtime prediction from finished jobs (scheduling.runtime_prediction): the statistic, the
fallbacks from the submitter to the project to none, which jobs count, and its cost; and the
history it reads (scheduling.services.runtime_history), kept as jobs end."""

import importlib
from datetime import timedelta

import pytest
from django.apps import apps
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduling.choices import JobState, WorkloadType
from scheduling.models import Job, RuntimeHistory
from scheduling.runtime_prediction import (
    predict_live_runtimes,
    predict_runtime,
    predict_runtimes,
)
from scheduling.runtime_rule import HISTORY_JOBS, percentile
from scheduling.services.nodes import job_exited
from scheduling.services.runtime_history import (
    runtime_history_rebuild,
    runtime_history_record,
)
from tests import factories as f

_clock = iter(range(1, 1_000_000))


def finished(
    world,
    runtime: float,
    limit: int = 10_000,
    *,
    state=JobState.SUCCEEDED,
    user=None,
    project=None,
    workload_type=WorkloadType.TRAINING,
):
    """A finished job that ran ``runtime`` seconds of its ``limit``, recorded as its end
    records it; each one ends later than the previous one (newest last)."""
    end = timezone.now() - timedelta(days=1) + timedelta(seconds=next(_clock))
    job = f.JobFactory(
        queue=world.queue,
        project=project or world.project,
        submitted_by=user or world.member,
        workload_type=workload_type,
        state=state,
        max_runtime_seconds=limit,
        submitted_at=end - timedelta(seconds=runtime + 60),
        admitted_at=end - timedelta(seconds=runtime),
        started_at=end - timedelta(seconds=runtime),
        finished_at=end,
    )
    runtime_history_record(job)
    return job


def pending(world, limit: int = 7200, *, user=None, project=None, **kw):
    return f.JobFactory(
        queue=world.queue,
        project=project or world.project,
        submitted_by=user or world.member,
        max_runtime_seconds=limit,
        **kw,
    )


def test_percentile_is_linear_between_the_nearest_ranks():
    assert percentile([0.5]) == 0.5
    assert percentile([0.4, 0.1, 0.3, 0.2]) == pytest.approx(0.325)
    assert percentile([0.1, 0.2, 0.3, 0.4, 0.5]) == pytest.approx(0.4)
    assert percentile([0.1, 0.2, 0.3, 0.4, 0.5], 50) == pytest.approx(0.3)


def test_prediction_from_the_submitters_own_jobs(world):
    for runtime in (1000, 2000, 3000, 4000, 5000):  # ratios 0.1 .. 0.5 of 10,000 s
        finished(world, runtime)
    job = pending(world, limit=7200)

    prediction = predict_runtime(job)

    # declared 2 h × the 75th percentile of the ratios (0.4)
    assert prediction.seconds == pytest.approx(2880)
    assert (prediction.basis, prediction.jobs, prediction.declared_seconds) == (
        "submitter",
        5,
        7200,
    )
    assert prediction.ratio == pytest.approx(0.4)
    assert prediction.message == (
        "expected ~48 min from the last 5 finished training jobs of nlp-member in project llm "
        "(declared 2 h)"
    )


def test_only_the_last_20_finished_jobs_count(world):
    for _ in range(5):
        finished(world, 10_000)  # old: ratio 1
    for _ in range(HISTORY_JOBS):
        finished(world, 2_500)  # newer: ratio 0.25

    prediction = predict_runtime(pending(world, limit=4000))

    assert prediction.jobs == HISTORY_JOBS
    assert prediction.seconds == pytest.approx(1000)


def test_failed_cancelled_and_reclaimed_jobs_do_not_count_timed_out_ones_count_as_whole(world):
    for state in (JobState.FAILED, JobState.CANCELLED, JobState.RECLAIMED, JobState.PREEMPTED):
        for _ in range(3):
            finished(world, 100, state=state)
    assert predict_runtime(pending(world)).seconds is None

    finished(world, 1000)  # ratio 0.1
    finished(world, 1000)
    finished(world, 2000, state=JobState.TIMED_OUT)  # killed at its limit: ratio 1, not 0.2

    prediction = predict_runtime(pending(world, limit=1000))

    assert prediction.jobs == 3
    assert prediction.ratio == pytest.approx(0.55)  # 75th percentile of 0.1, 0.1, 1
    assert prediction.seconds == pytest.approx(550)


def test_falls_back_to_the_projects_jobs_then_to_none(world):
    colleague = f.UserFactory(username="nlp-colleague")
    finished(world, 5000)
    finished(world, 5000)  # the member's own: 2, too few
    for _ in range(2):
        finished(world, 1000, user=colleague)
    job = pending(world, limit=10_000)

    prediction = predict_runtime(job)

    assert (prediction.basis, prediction.jobs) == ("project", 4)
    assert prediction.seconds == pytest.approx(5000)  # 75th pct of 0.1, 0.1, 0.5, 0.5
    assert "in project llm, every submitter (fewer than 3 of nlp-member's own)" in (
        prediction.message
    )

    other_project = f.ProjectFactory(tenant=world.tenant, slug="vision-ish")
    lonely = predict_runtime(pending(world, project=other_project))
    assert (lonely.basis, lonely.seconds, lonely.jobs, lonely.ratio) == ("none", None, 0, None)
    assert lonely.message == (
        "no prediction: fewer than 3 finished training jobs in project vision-ish; "
        "the declared limit (2 h) is used"
    )


def test_other_workload_types_and_projects_do_not_count(world):
    other_project = f.ProjectFactory(tenant=world.tenant, slug="elsewhere")
    for _ in range(3):
        finished(world, 100, workload_type=WorkloadType.EVALUATION)
        finished(world, 100, project=other_project)

    assert predict_runtime(pending(world)).seconds is None


def test_never_above_the_declared_limit_and_never_zero(world):
    for _ in range(3):
        finished(world, 0)  # finished at once: ratio 0
    assert predict_runtime(pending(world)).seconds == 1.0  # the engine reads <= 0 as unknown

    for _ in range(HISTORY_JOBS):
        finished(world, 50_000)  # ran past its limit (an extension granted): ratio capped at 1
    assert predict_runtime(pending(world, limit=600)).seconds == 600


def test_ended_jobs_get_no_prediction(world):
    for _ in range(3):
        finished(world, 1000)
    done = finished(world, 1000)

    assert predict_runtime(done) is None
    assert predict_live_runtimes([done]) == {}


def test_many_jobs_are_predicted_in_one_query(world):
    users = [world.member, *(f.UserFactory(username=f"u{i}") for i in range(3))]
    projects = [world.project, f.ProjectFactory(tenant=world.tenant, slug="second")]
    for user in users:
        for project in projects:
            for wtype in (WorkloadType.TRAINING, WorkloadType.EVALUATION):
                for runtime in (1000, 2000, 3000):
                    finished(world, runtime, user=user, project=project, workload_type=wtype)
    for n in range(60):
        pending(
            world,
            user=users[n % 4],
            project=projects[n % 2],
            workload_type=(WorkloadType.TRAINING, WorkloadType.EVALUATION)[n % 3 % 2],
        )
    # Loaded without their submitters and projects: the messages must not fetch them.
    jobs = list(Job.objects.filter(state=JobState.PENDING))

    with CaptureQueriesContext(connection) as ctx:
        predictions = predict_runtimes(jobs)
        messages = [p.message for p in predictions.values()]

    assert len(ctx.captured_queries) == 1
    assert len(predictions) == 60 and all(p.basis == "submitter" for p in predictions.values())
    assert all("its submitter" in m for m in messages)
    with CaptureQueriesContext(connection) as ctx:
        assert predict_runtimes([]) == {}
    assert len(ctx.captured_queries) == 0


def test_the_history_keeps_the_newest_20_in_finish_order_even_when_reported_late(world):
    jobs = [finished(world, 1000) for _ in range(HISTORY_JOBS)]
    late = f.JobFactory(
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        state=JobState.SUCCEEDED,
        max_runtime_seconds=10_000,
        admitted_at=jobs[0].finished_at - timedelta(hours=3),
        started_at=jobs[0].finished_at - timedelta(hours=3),
        finished_at=jobs[0].finished_at - timedelta(hours=2),  # older than all 20
    )
    newest = finished(world, 5000)

    runtime_history_record(late)

    row = RuntimeHistory.objects.get(submitted_by=world.member)
    assert len(row.entries) == HISTORY_JOBS
    assert row.entries[0] == [newest.finished_at.timestamp(), 0.5]
    assert [e[0] for e in row.entries] == sorted((e[0] for e in row.entries), reverse=True)
    assert late.finished_at.timestamp() not in [e[0] for e in row.entries]
    assert RuntimeHistory.objects.get(submitted_by=None).entries == row.entries


def test_a_job_ending_through_its_exit_report_is_recorded(world, dispatch_requests):
    job = f.placed_job(
        gpus=list(world.nodes[0].gpus.all()[:1]),
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
        max_runtime_seconds=1000,
    )
    failed = f.placed_job(
        gpus=list(world.nodes[1].gpus.all()[:1]),
        queue=world.queue,
        project=world.project,
        submitted_by=world.member,
    )
    for placed, code in ((job, 0), (failed, 1)):
        job_exited(
            {
                "type": "exited",
                "node": placed.allocations.first().node.name,
                "job_id": placed.pk,
                "attempt": 0,
                "exit_code": code,
                "signal": None,
                "message": "",
                "finished_at": (placed.started_at + timedelta(seconds=250)).timestamp(),
            }
        )

    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    rows = RuntimeHistory.objects.filter(project=world.project, workload_type="training")
    assert sorted((r.submitted_by_id or 0, r.entries[0][1]) for r in rows) == [
        (0, 0.25),
        (world.member.pk, 0.25),
    ]
    assert all(len(r.entries) == 1 for r in rows)  # the failed one is not there


def test_rebuild_finds_what_the_ends_recorded(world):
    colleague = f.UserFactory(username="nlp-colleague")
    for runtime in (1000, 3000, 6000):
        finished(world, runtime)
        finished(world, runtime / 2, user=colleague, state=JobState.TIMED_OUT)
    finished(world, 100, state=JobState.FAILED)
    recorded = {
        (r.submitted_by_id, r.workload_type): r.entries for r in RuntimeHistory.objects.all()
    }

    assert runtime_history_rebuild() == 3

    rebuilt = {
        (r.submitted_by_id, r.workload_type): r.entries for r in RuntimeHistory.objects.all()
    }
    assert rebuilt == recorded
    assert len(rebuilt[(None, "training")]) == 6

    # An install upgraded from before the table: its migration fills it the same way.
    RuntimeHistory.objects.all().delete()
    migration = importlib.import_module("scheduling.migrations.0007_scheduling_order_waits")
    migration.backfill_runtime_history(apps, None)
    migrated = {
        (r.submitted_by_id, r.workload_type): r.entries for r in RuntimeHistory.objects.all()
    }
    assert migrated == recorded


def test_many_keys_are_looked_up_in_one_pass_with_the_same_answers(world, monkeypatch):
    colleague = f.UserFactory(username="nlp-colleague")
    other_project = f.ProjectFactory(tenant=world.tenant, slug="second")
    for runtime in (1000, 2000, 4000):
        finished(world, runtime)
        finished(world, runtime * 2, user=colleague, project=other_project)
        finished(world, runtime, workload_type=WorkloadType.EVALUATION, project=other_project)
    jobs = [
        pending(world, user=user, project=project, workload_type=wtype)
        for user in (world.member, colleague, f.UserFactory(username="newcomer"))
        for project in (world.project, other_project)
        for wtype in (WorkloadType.TRAINING, WorkloadType.EVALUATION)
    ]
    by_index = predict_runtimes(jobs)

    monkeypatch.setattr("scheduling.runtime_prediction._MAX_KEYS_BY_INDEX", 0)
    with CaptureQueriesContext(connection) as ctx:
        in_one_pass = predict_runtimes(jobs)

    assert len(ctx.captured_queries) == 1
    assert in_one_pass == by_index
    assert {p.basis for p in by_index.values()} == {"submitter", "project", "none"}
