"""The control side of the agent protocol: register, heartbeat, started, exited, log, lost nodes."""

from datetime import timedelta

from django.utils import timezone
from freezegun import freeze_time

from audit.models import AuditEvent
from scheduling.choices import GpuHealth, JobState, NodeState
from scheduling.models import Allocation, Gpu, Job, Node
from scheduling.services.dispatch import dispatch_cycle
from scheduling.services.nodes import job_log_path, nodes_sweep_lost
from scheduling.tasks import agent_report
from tests import factories as f


def _register(name="gpu-09", pool="training", gpus=2, jobs=()):
    report = {
        "type": "register",
        "node": name,
        "pool": pool,
        "hostname": "host",
        "agent_version": "0.1.0",
        "cpus": 16,
        "memory_mb": 64000,
        "backend": "simulated",
        "sent_at": timezone.now().timestamp(),
        "gpus": [
            {
                "index": i,
                "uuid": f"GPU-{name}-{i}",
                "model": "H100-80GB",
                "name": "sim",
                "memory_mb": 81559,
            }
            for i in range(gpus)
        ],
        "jobs": list(jobs),
    }
    agent_report(report)
    return Node.objects.get(name=name)


def _placed_job(world):
    job = f.JobFactory(
        queue=world.queue, project=world.project, submitted_by=world.member, gpus_per_node=2
    )
    dispatch_cycle()
    job.refresh_from_db()
    assert job.state == JobState.ADMITTED
    return job, job.allocations.first().node


def _report(kind, node, job, **fields):
    agent_report(
        {
            "type": kind,
            "node": node.name,
            "job_id": job.pk,
            "attempt": job.attempt,
            "sent_at": timezone.now().timestamp(),
            **fields,
        }
    )
    job.refresh_from_db()
    return job


def test_register_creates_node_and_gpus_and_is_idempotent(world):
    node = _register()
    assert (
        node.pool.name == "training"
        and node.state == NodeState.READY
        and node.backend == "simulated"
    )
    assert list(node.gpus.values_list("index", "model")) == [(0, "H100-80GB"), (1, "H100-80GB")]
    _register(gpus=1)
    assert Gpu.objects.filter(node=node).count() == 2
    assert Gpu.objects.get(node=node, index=1).health == GpuHealth.UNHEALTHY


def test_register_of_seeded_node_adopts_its_gpu_rows(world):
    node = world.nodes[0]
    _register(name=node.name, gpus=8)
    assert node.gpus.count() == 8
    assert node.gpus.get(index=3).uuid == f"GPU-{node.name}-3"


def test_started_then_exited_zero_succeeds_and_releases(world, outbox):
    job, node = _placed_job(world)
    job = _report("started", node, job, pid=4242, started_at=timezone.now().timestamp())
    assert job.state == JobState.RUNNING and job.started_at
    job = _report(
        "exited",
        node,
        job,
        exit_code=0,
        signal=None,
        stop_reason=None,
        message="",
        finished_at=timezone.now().timestamp(),
    )
    assert job.state == JobState.SUCCEEDED and job.exit_code == 0
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()
    # A duplicate exit report changes nothing.
    events = job.events.count()
    job = _report(
        "exited",
        node,
        job,
        exit_code=0,
        signal=None,
        stop_reason=None,
        message="",
        finished_at=timezone.now().timestamp(),
    )
    assert job.state == JobState.SUCCEEDED and job.events.count() == events


def test_non_zero_exit_fails_and_frees_gpus_at_once(world):
    job, node = _placed_job(world)
    _report("started", node, job, pid=1, started_at=timezone.now().timestamp())
    job = _report(
        "exited",
        node,
        job,
        exit_code=3,
        signal=None,
        stop_reason=None,
        message="",
        finished_at=timezone.now().timestamp(),
    )
    assert job.state == JobState.FAILED and "exit code 3" in job.failure_message
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_launch_failure_is_a_failed_job(world):
    job, node = _placed_job(world)
    job = _report(
        "exited",
        node,
        job,
        exit_code=None,
        signal=None,
        stop_reason="launch_failed",
        message="No such file: trian.py",
        finished_at=timezone.now().timestamp(),
    )
    assert job.state == JobState.FAILED and "trian.py" in job.failure_message


def test_report_of_an_old_attempt_is_ignored(world):
    job, node = _placed_job(world)
    agent_report(
        {
            "type": "exited",
            "node": node.name,
            "job_id": job.pk,
            "attempt": 7,
            "exit_code": 0,
            "signal": None,
            "stop_reason": None,
            "message": "",
            "finished_at": timezone.now().timestamp(),
        }
    )
    job.refresh_from_db()
    assert job.state == JobState.ADMITTED


def test_started_on_a_node_without_the_job_is_stopped(
    world, outbox, django_capture_on_commit_callbacks
):
    job, node = _placed_job(world)
    other = world.nodes[1] if node == world.nodes[0] else world.nodes[0]
    with django_capture_on_commit_callbacks(execute=True):
        agent_report(
            {
                "type": "started",
                "node": other.name,
                "job_id": job.pk,
                "attempt": 0,
                "pid": 5,
                "started_at": timezone.now().timestamp(),
            }
        )
    assert (other.name, "stop") in [(n, m["type"]) for n, m in outbox]
    job.refresh_from_db()
    assert job.state == JobState.ADMITTED


def test_heartbeat_stores_samples_zombies_and_activity(world):
    job, node = _placed_job(world)
    _report(
        "started", node, job, pid=1, started_at=(timezone.now() - timedelta(hours=1)).timestamp()
    )
    Job.objects.filter(pk=job.pk).update(last_active_at=timezone.now() - timedelta(hours=1))
    indices = list(job.allocations.values_list("gpu__index", flat=True))
    agent_report(
        {
            "type": "heartbeat",
            "node": node.name,
            "sent_at": timezone.now().timestamp(),
            "gpus": [
                {
                    "index": i,
                    "uuid": "x",
                    "utilization": 87.0 if i == indices[0] else 0.0,
                    "memory_used_mb": 1000,
                    "temperature_c": 50.0,
                    "power_w": 300.0,
                    "processes": [],
                }
                for i in range(8)
            ],
            "jobs": [{"job_id": job.pk, "attempt": 0, "pid": 1, "running": True}],
            "zombies": [{"gpu_index": 5, "pid": 999, "memory_mb": 2048, "name": "python"}],
        }
    )
    node.refresh_from_db()
    job.refresh_from_db()
    assert node.zombies[0]["pid"] == 999
    assert node.gpus.get(index=indices[0]).utilization == 87.0
    assert (timezone.now() - job.last_active_at).total_seconds() < 60


def test_log_chunks_are_written_at_their_offset(world):
    job, node = _placed_job(world)
    for offset, data in ((0, "hello "), (6, "world\n"), (0, "hello ")):
        _report("log", node, job, offset=offset, data=data)
    assert job_log_path(job.pk, 0).read_text() == "hello world\n"
    assert job.log_size == 12


def test_silent_node_goes_down_and_its_jobs_are_requeued(world, django_capture_on_commit_callbacks):
    job, node = _placed_job(world)
    _report("started", node, job, pid=1, started_at=timezone.now().timestamp())
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now() - timedelta(minutes=10))
    with django_capture_on_commit_callbacks(execute=True):
        assert node.name in nodes_sweep_lost()
    node.refresh_from_db()
    job.refresh_from_db()
    assert node.state == NodeState.DOWN
    assert job.state in (JobState.PENDING, JobState.ADMITTED) and job.requeue_count == 1
    assert job.events.filter(kind="lost").exists()
    assert not Allocation.objects.filter(job=job, node=node, released_at__isnull=True).exists()
    assert AuditEvent.objects.filter(action="node.down", target_id=str(node.pk)).count() == 1


def test_lost_job_fails_when_policy_forbids_requeue(world):
    f.policy("training", requeue_on_lost=False)
    job, node = _placed_job(world)
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now() - timedelta(minutes=10))
    nodes_sweep_lost()
    job.refresh_from_db()
    assert job.state == JobState.LOST and job.requeue_count == 0


def test_stale_heartbeat_does_not_revive_a_down_node(world):
    node = world.nodes[0]
    old = timezone.now() - timedelta(minutes=5)
    Node.objects.filter(pk=node.pk).update(last_heartbeat=old - timedelta(minutes=10))
    nodes_sweep_lost()
    agent_report(
        {
            "type": "heartbeat",
            "node": node.name,
            "sent_at": old.timestamp(),
            "gpus": [],
            "jobs": [],
            "zombies": [],
        }
    )
    node.refresh_from_db()
    assert node.state == NodeState.DOWN
    with freeze_time(timezone.now() + timedelta(seconds=5)):
        agent_report(
            {
                "type": "heartbeat",
                "node": node.name,
                "sent_at": timezone.now().timestamp(),
                "gpus": [],
                "jobs": [],
                "zombies": [],
            }
        )
    node.refresh_from_db()
    assert node.state == NodeState.READY
