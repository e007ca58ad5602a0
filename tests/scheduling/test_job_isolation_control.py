"""The control side of job isolation: what a launch tells the node about the
account, limits and log cap of a job, what the node says it enforces, and the log cap the
portal applies to what it receives."""

from django.utils import timezone

from scheduling.choices import WorkloadType
from scheduling.models import Node, WorkloadPolicy
from scheduling.services.dispatch import dispatch_cycle
from scheduling.services.nodes import job_log_path
from scheduling.tasks import agent_report
from tests import factories as f

from .test_agent_reports import _placed_job, _register, _report


def _launch(world, outbox, captured, gpus=2, submitter=None):
    f.JobFactory(
        queue=world.queue,
        project=world.project,
        submitted_by=submitter or world.member,
        gpus_per_node=gpus,
    )
    with captured(execute=True):
        dispatch_cycle()
    [message] = [m for _, m in outbox if m["type"] == "launch"]
    return message


def test_launch_names_the_tenants_account_its_limits_and_log_cap(
    world, outbox, django_capture_on_commit_callbacks
):
    WorkloadPolicy.objects.filter(workload_type=WorkloadType.TRAINING).update(
        cpu_limit_per_gpu=4, memory_limit_mb_per_gpu=32000, pids_limit=2048, log_cap_mb=5
    )

    message = _launch(world, outbox, django_capture_on_commit_callbacks, gpus=2)

    assert message["tenant"] == "nlp"
    assert message["run_as"] == "sluice-nlp"
    assert message["limits"] == {"cpus": 8, "memory_mb": 64000, "pids": 2048}
    assert message["log_cap_bytes"] == 5 * 1024 * 1024


def test_launch_without_policy_limits_asks_for_none(
    world, outbox, django_capture_on_commit_callbacks
):
    WorkloadPolicy.objects.filter(workload_type=WorkloadType.TRAINING).update(
        cpu_limit_per_gpu=None, memory_limit_mb_per_gpu=None, pids_limit=None
    )

    message = _launch(world, outbox, django_capture_on_commit_callbacks)

    assert message["limits"] == {"cpus": None, "memory_mb": None, "pids": None}


def test_launch_uses_the_submitters_account_when_the_site_maps_per_user(
    world, outbox, django_capture_on_commit_callbacks, settings
):
    settings.SLUICE_JOB_ACCOUNT = "{user}"

    message = _launch(world, outbox, django_capture_on_commit_callbacks)

    assert message["run_as"] == world.member.username


def test_register_keeps_what_the_agent_enforces_and_the_nodes_page_shows_it(world, client):
    isolation = {
        "run_as_user": True,
        "cgroup": False,
        "cgroup_controllers": [],
        "device_isolation": False,
        "notes": ["no cgroup v2 hierarchy writable: CPU, memory and pids limits not enforced"],
    }
    node = _register(name="gpu-09")
    assert node.isolation["reported"] is False  # an agent that says nothing enforces nothing known

    report = {
        "type": "register",
        "node": "gpu-09",
        "pool": "training",
        "sent_at": timezone.now().timestamp(),
        "gpus": [],
        "jobs": [],
        "isolation": isolation,
    }
    agent_report(report)
    node = Node.objects.get(name="gpu-09")
    assert node.isolation == {"reported": True, **isolation}

    client.force_login(world.platform_admin)
    page = client.get("/nodes/").content.decode()
    assert "jobs run as their tenant's account" in page
    assert "no cgroup limits" in page
    assert "not enforced" in page and "<details" in page


def test_log_beyond_the_cap_is_dropped_with_a_marker(world, settings, tmp_path):
    settings.SLUICE_LOG_DIR = tmp_path
    WorkloadPolicy.objects.filter(workload_type=WorkloadType.TRAINING).update(log_cap_mb=1)
    cap = 1024 * 1024
    job, node = _placed_job(world)

    _report("log", node, job, offset=0, data="a" * (cap - 10))
    _report("log", node, job, offset=cap - 10, data="b" * 100)
    _report("log", node, job, offset=cap + 90, data="c" * 5000)  # an agent that did not stop

    data = job_log_path(job.pk, 0).read_bytes()
    marker = f"\n[sluice: log truncated at {cap} bytes; the job goes on running]\n".encode()
    assert data == b"a" * (cap - 10) + b"b" * 10 + marker
    assert job.log_size == len(data)


def test_platform_admins_set_a_policys_limits_and_log_cap_through_the_api(world, api):
    url = "/api/v1/workload-policies/training"
    admin = api(world.platform_admin)

    bad = admin.patch(url, {"log_cap_mb": 0, "cpu_limit_per_gpu": -1}, format="json")
    ok = admin.patch(
        url,
        {"cpu_limit_per_gpu": 6, "memory_limit_mb_per_gpu": 64000, "log_cap_mb": 20},
        format="json",
    )
    member = api(world.member).patch(url, {"log_cap_mb": 1}, format="json")

    assert bad.status_code == 400
    assert {"log_cap_mb", "cpu_limit_per_gpu"} <= set(bad.json()["errors"])
    assert ok.status_code == 200, ok.content
    assert member.status_code == 403
    policy = WorkloadPolicy.objects.get(workload_type=WorkloadType.TRAINING)
    assert (policy.cpu_limit_per_gpu, policy.memory_limit_mb_per_gpu, policy.log_cap_mb) == (
        6,
        64000,
        20,
    )
