"""Recovery of wasted GPUs: failed jobs, stuck launches, zombie processes, log retention,
and the counts behind the recovery page."""

import os
from datetime import timedelta

import pytest
from django.core.cache import cache
from freezegun import freeze_time

from scheduling.choices import JobState, NotificationKind, ReclaimKind, StopReason
from scheduling.limits.selectors import waste_recovery_summary
from scheduling.models import Allocation, ReclaimRecord, ZombieProcess
from scheduling.services import nodes
from scheduling.services.recovery import (
    RETENTION_CLEANUP_KEY,
    job_logs_retention_cleanup,
    retention_cleanup,
    stuck_launches_requeue,
    zombies_sweep,
)
from scheduling.services.stopping import job_stop
from tests import factories as f
from tests.scheduling.limits_helpers import T0, audits, notes, placed, report_exit, stops


def _at(seconds):
    return T0 + timedelta(seconds=seconds)


# --- failed jobs -----------------------------------------------------------------------------


def test_a_failed_job_releases_its_gpus_at_once(
    world, dispatch_requests, django_capture_on_commit_callbacks
):
    job = placed(world, gpus=4)
    with django_capture_on_commit_callbacks(execute=True):
        report_exit(job, exit_code=1, signal=None)
    job.refresh_from_db()
    assert job.state == JobState.FAILED and "exit code 1" in job.failure_message
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()
    assert dispatch_requests == [1]  # the next cycle places other jobs on them


# --- stuck launches --------------------------------------------------------------------------


def test_a_stuck_launch_is_requeued(
    world, settings, outbox, dispatch_requests, django_capture_on_commit_callbacks
):
    settings.SLUICE_STUCK_LAUNCH_SECONDS = 300
    with freeze_time(T0) as clock:
        job = placed(world, state=JobState.ADMITTED, gpus=2, max_runtime_seconds=3600)
        started = placed(world, node=1)  # running: not stuck, however old
        clock.move_to(_at(299))
        assert stuck_launches_requeue() == []
        clock.move_to(_at(300))
        with django_capture_on_commit_callbacks(execute=True):
            assert stuck_launches_requeue() == [job.pk]
        assert stuck_launches_requeue() == []
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.requeue_count == 1 and job.admitted_at is None
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()
    event = job.events.get(kind="requeued")
    assert "not running 5 min after its admission" in event.message and "gpu-01" in event.message
    [(node, stop)] = stops(outbox, job)
    assert (node, stop["attempt"], stop["reason"]) == ("gpu-01", 0, "lost")
    [audit] = audits("job.requeue", job)
    assert audit.after == {"state": "PENDING", "attempt": 1, "kind": "stuck_launch"}
    [record] = ReclaimRecord.objects.all()
    assert record.kind == ReclaimKind.STUCK_LAUNCH and record.gpus == 2
    assert record.gpu_hours_freed == pytest.approx(2 * (3600 - 300) / 3600)
    assert notes(world.member, NotificationKind.JOB_REQUEUED)
    assert dispatch_requests
    started.refresh_from_db()
    assert started.state == JobState.RUNNING


def test_a_launch_whose_started_report_may_wait_in_the_reports_queue_is_not_requeued(
    world, settings, outbox, dispatch_requests
):
    """Reports handled only up to the last probe that came back (workers down, a backlog):
    a job admitted less than the stuck-launch time before that may have started already."""
    settings.SLUICE_STUCK_LAUNCH_SECONDS = 10
    try:
        with freeze_time(T0) as clock:
            job = placed(world, state=JobState.ADMITTED)
            cache.set(nodes.REPORTS_PROBE_KEY, _at(5).timestamp(), timeout=None)
            clock.move_to(_at(60))  # long past the stuck time, but nothing read since T0 + 5 s
            assert stuck_launches_requeue() == []
            job.refresh_from_db()
            assert job.state == JobState.ADMITTED and stops(outbox, job) == []
            cache.set(nodes.REPORTS_PROBE_KEY, _at(10).timestamp(), timeout=None)
            assert stuck_launches_requeue() == [job.pk]
    finally:
        cache.delete(nodes.REPORTS_PROBE_KEY)


def test_the_old_attempt_starting_late_is_stopped(
    world, settings, outbox, dispatch_requests, django_capture_on_commit_callbacks
):
    settings.SLUICE_STUCK_LAUNCH_SECONDS = 60
    with freeze_time(T0) as clock:
        job = placed(world, state=JobState.ADMITTED)
        clock.move_to(_at(61))
        stuck_launches_requeue()
        with django_capture_on_commit_callbacks(execute=True):
            nodes.job_started(
                {"node": "gpu-01", "job_id": job.pk, "attempt": 0, "pid": 42, "started_at": 0}
            )
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert [m["attempt"] for _, m in stops(outbox, job)] == [0]


# --- requeues and what they freed ------------------------------------------------------------


def test_lost_and_preempted_requeues_are_counted(world, dispatch_requests):
    with freeze_time(T0) as clock:
        lost = placed(world, gpus=2, max_runtime_seconds=7200)
        preempted = placed(world, node=1, gpus=4, max_runtime_seconds=3600)
        clock.move_to(_at(1800))
        nodes.node_mark_down(node=world.nodes[0], reason="test")
        job_stop(job=preempted, reason=StopReason.PREEMPTED, message="by job 99")
        report_exit(preempted, stop_reason="preempted", at=_at(1800))
    kinds = {
        r.job_id: (r.kind, r.gpus, round(r.gpu_hours_freed, 3)) for r in ReclaimRecord.objects.all()
    }
    assert kinds == {
        lost.pk: (ReclaimKind.LOST_REQUEUE, 2, 3.0),
        preempted.pk: (ReclaimKind.PREEMPTION_REQUEUE, 4, 2.0),
    }


# --- zombie GPU processes ----------------------------------------------------------------------


def _zombie(node, gpu_index, pid=4242):
    node.zombies = [{"gpu_index": gpu_index, "pid": pid, "memory_mb": 1024, "name": "python"}]
    node.save(update_fields=["zombies"])


def _kills(outbox):
    return [(node, m) for node, m in outbox if m["type"] == "kill_process"]


@pytest.fixture
def killing(world):
    return f.policy("training", kill_zombies=True)


def test_a_zombie_on_a_gpu_of_a_killing_policy_is_killed_once_after_a_control_interval(
    world, killing, settings, outbox, django_capture_on_commit_callbacks
):
    settings.SLUICE_CONTROL_INTERVAL = 5
    node = world.nodes[0]
    with freeze_time(T0) as clock:
        job = placed(world, gpus=2)
        _zombie(node, gpu_index=1)
        with django_capture_on_commit_callbacks(execute=True):
            assert zombies_sweep() == {"tracked": 1, "killed": 0}  # just seen
            clock.move_to(_at(5))
            assert zombies_sweep() == {"tracked": 1, "killed": 1}
            clock.move_to(_at(10))
            assert zombies_sweep() == {"tracked": 1, "killed": 0}  # asked once
    [(name, kill)] = _kills(outbox)
    assert (name, kill["pid"], kill["gpu_index"]) == ("gpu-01", 4242, 1)
    assert f"allocated to job {job.pk}" in kill["reason"]
    [audit] = audits("node.kill_zombie")
    assert audit.target_id == str(node.pk) and audit.tenant == world.tenant
    assert audit.after["pid"] == 4242 and audit.after["gpu_allocated"] is True
    [record] = ReclaimRecord.objects.all()
    assert record.kind == ReclaimKind.ZOMBIE_KILL and record.node == node and record.gpus == 1
    assert record.gpu_hours_freed == pytest.approx(5 / 3600, abs=1e-6)


def test_a_zombie_on_a_free_gpu_follows_the_policy_of_its_last_job(
    world, killing, settings, outbox, django_capture_on_commit_callbacks
):
    settings.SLUICE_CONTROL_INTERVAL = 5
    node = world.nodes[0]
    with freeze_time(T0) as clock:
        job = placed(world, gpus=1)
        Allocation.objects.filter(job=job).update(released_at=T0)
        _zombie(node, gpu_index=0, pid=7)
        zombies_sweep()
        clock.move_to(_at(6))
        with django_capture_on_commit_callbacks(execute=True):
            assert zombies_sweep()["killed"] == 1
    [(_, kill)] = _kills(outbox)
    assert f"last used by job {job.pk}" in kill["reason"]


def test_zombies_are_only_shown_where_no_policy_kills_them(
    world, settings, outbox, django_capture_on_commit_callbacks
):
    settings.SLUICE_CONTROL_INTERVAL = 5
    f.policy("inference", kill_zombies=True)  # kills, but no job of its type is involved
    node = world.nodes[0]
    with freeze_time(T0) as clock:
        placed(world, gpus=1)  # a training job (its policy does not kill)
        node.zombies = [
            {"gpu_index": 0, "pid": 1, "memory_mb": 1, "name": "a"},  # on the job's GPU
            {"gpu_index": 5, "pid": 2, "memory_mb": 1, "name": "b"},  # on a GPU never used
        ]
        node.save(update_fields=["zombies"])
        zombies_sweep()
        clock.move_to(_at(60))
        with django_capture_on_commit_callbacks(execute=True):
            assert zombies_sweep() == {"tracked": 2, "killed": 0}
        node.zombies = []
        node.save(update_fields=["zombies"])
        assert zombies_sweep() == {"tracked": 0, "killed": 0}  # gone: forgotten
    assert _kills(outbox) == [] and not audits("node.kill_zombie")
    assert not ZombieProcess.objects.exists()


# --- retention of job logs ---------------------------------------------------------------------


def _logs(settings, tmp_path, job_id, text="line\n"):
    folder = tmp_path / "logs" / str(job_id)
    folder.mkdir(parents=True)
    (folder / "attempt-0.log").write_text(text)
    return folder


def _ended(queue, state, finished_at):
    project = f.ProjectFactory(tenant=queue.tenant)
    return f.JobFactory(queue=queue, project=project, state=state, finished_at=finished_at)


def test_retention_cleanup_deletes_only_what_is_past_its_time(world, settings, tmp_path):
    settings.SLUICE_LOG_DIR = tmp_path / "logs"
    f.policy("training", retention_days=14)
    now = T0 + timedelta(days=30)
    old = _ended(world.queue, JobState.SUCCEEDED, now - timedelta(days=15))
    recent = _ended(world.queue, JobState.FAILED, now - timedelta(days=13))
    vision = _ended(world.other_queue, JobState.CANCELLED, now - timedelta(days=20))
    running = placed(world, gpus=1)
    folders = {
        job.pk: _logs(settings, tmp_path, job.pk, "x" * 10)
        for job in (old, recent, running, vision)
    }
    orphan = _logs(settings, tmp_path, 99999)
    os.utime(orphan, (0, 0))
    (tmp_path / "logs" / "not-a-job").mkdir()

    assert job_logs_retention_cleanup(now=now) == {"deleted": 3}
    assert not folders[old.pk].exists() and not folders[vision.pk].exists()
    assert not orphan.exists()
    assert folders[recent.pk].exists() and folders[running.pk].exists()
    assert (tmp_path / "logs" / "not-a-job").exists()
    by_tenant = {a.tenant.slug if a.tenant else None: a.after for a in audits("retention.cleanup")}
    assert by_tenant == {
        "nlp": {"jobs": [old.pk], "files": 1, "bytes": 10},
        "vision": {"jobs": [vision.pk], "files": 1, "bytes": 10},
        None: {"jobs": [99999], "files": 1, "bytes": 5},
    }
    assert job_logs_retention_cleanup(now=now) == {"deleted": 0}  # nothing left to do


def test_the_sweep_runs_the_retention_cleanup_once_per_period(world, settings, tmp_path):
    settings.SLUICE_LOG_DIR = tmp_path / "logs"
    cache.delete(RETENTION_CLEANUP_KEY)
    assert retention_cleanup() == {"deleted": 0}
    assert retention_cleanup() == "not due"
    cache.delete(RETENTION_CLEANUP_KEY)


# --- the counts and the recovery page --------------------------------------------------------


def _record(kind, tenant, workload_type, hours, at):
    return ReclaimRecord.objects.create(
        created_at=at,
        kind=kind,
        tenant=tenant,
        workload_type=workload_type,
        gpus=1,
        gpu_hours_freed=hours,
    )


def test_waste_recovery_summary_is_scoped_and_aggregated(world):
    _record(ReclaimKind.TIMEOUT, world.tenant, "training", 0.0, T0)
    _record(ReclaimKind.IDLE_RECLAIM, world.tenant, "interactive", 1.5, T0)
    _record(ReclaimKind.IDLE_RECLAIM, world.tenant, "interactive", 0.5, T0)
    _record(ReclaimKind.STUCK_LAUNCH, world.other, "training", 4.0, T0)
    _record(ReclaimKind.ZOMBIE_KILL, None, "", 0.1, T0)
    _record(ReclaimKind.TIMEOUT, world.tenant, "training", 0.0, T0 - timedelta(days=9))

    mine = waste_recovery_summary(world.member, T0 - timedelta(days=7))
    assert [(r["tenant"], r["workload_type"]) for r in mine["rows"]] == [
        ("nlp", "interactive"),
        ("nlp", "training"),
    ]
    interactive = mine["rows"][0]
    assert interactive["cells"][ReclaimKind.IDLE_RECLAIM] == {"count": 2, "gpu_hours": 2.0}
    assert (mine["count"], mine["gpu_hours"]) == (3, 2.0)
    everything = waste_recovery_summary(world.platform_admin, T0 - timedelta(days=30))
    assert everything["count"] == 6 and everything["gpu_hours"] == pytest.approx(6.1)
    assert (
        waste_recovery_summary(world.outsider, T0 - timedelta(days=30))["rows"][0]["tenant"]
        == "vision"
    )


def test_recovery_page_and_dashboard_link(world, client):
    with freeze_time(T0):
        _record(ReclaimKind.IDLE_RECLAIM, world.tenant, "interactive", 1.5, T0)
        _record(ReclaimKind.STUCK_LAUNCH, world.other, "training", 4.0, T0)
        client.force_login(world.member)
        assert 'href="/recovery/"' in client.get("/").content.decode()
        page = client.get("/recovery/?days=30").content.decode()
    assert 'data-tenant="nlp"' in page and 'data-tenant="vision"' not in page
    assert '<strong id="recovery-gpu-hours">1.5</strong>' in page
    client.logout()
    assert client.get("/recovery/").status_code == 302
