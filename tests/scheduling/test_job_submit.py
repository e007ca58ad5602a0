"""Submitting one job (service and ``POST /api/v1/jobs``): every check of DESIGN §4 step 1.

Each refusal is a 400 (403/404 for rights) naming the field, and stores nothing: no Job, no
JobEvent, no AuditEvent.
"""

import re
from datetime import UTC, datetime

import pytest
from freezegun import freeze_time

from audit.models import AuditEvent
from portal.errors import BusinessError, PermissionDeniedError
from scheduling.choices import JobState, QueueState, WorkloadType
from scheduling.models import Job, JobEvent, ProjectQuota, Queue, Quota
from scheduling.services.jobs import JobSpec, job_submit
from tests import factories as f

URL = "/api/v1/jobs"


def body(world, **overrides) -> dict:
    return {
        "project": world.project.pk,
        "queue": world.queue.pk,
        "workload_type": "training",
        "command": ["python", "train.py"],
        **overrides,
    }


def spec(world, **overrides) -> JobSpec:
    values = {
        "queue": world.queue,
        "project": world.project,
        "name": "",
        "workload_type": WorkloadType.TRAINING,
        "command": ["python", "train.py"],
        **overrides,
    }
    return JobSpec(**values)


@pytest.fixture
def nothing_stored():
    """Asserts, after the test, that no job, job event or audit row was written."""
    yield
    assert Job.objects.count() == 0
    assert JobEvent.objects.count() == 0
    assert not AuditEvent.objects.filter(action__startswith="job.").exists()


def refused(api, user, payload, status=400):
    response = api(user).post(URL, payload, format="json")
    assert response.status_code == status, response.content
    data = response.json()
    assert data["detail"]
    return data


# --- success --------------------------------------------------------------------------------


@freeze_time("2026-03-01 12:00:00")
def test_submit_stores_a_pending_job_with_its_event_and_audit_row(
    world, api, dispatch_requests, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = api(world.member).post(
            URL,
            body(
                world,
                name="bert",
                gpus_per_node=2,
                env={"EPOCHS": "3"},
                labels={"team": "nlp"},
                parameters={"lr": 0.001, "layers": [1, 2]},
                gpu_model="H100-80GB",
                seed=7,
            ),
            format="json",
        )

    assert response.status_code == 201, response.json()
    data = response.json()
    job = Job.objects.get(pk=data["id"])
    assert job.state == JobState.PENDING
    assert job.tenant == world.tenant
    assert job.submitted_by == world.member
    assert job.priority_class == job.base_priority_class == world.normal
    assert job.gpu_models == ["H100-80GB"]
    assert job.env == {"EPOCHS": "3"}
    assert job.parameters == {"lr": 0.001, "layers": [1, 2]}
    assert job.max_runtime_seconds == 3600  # the training policy's default
    assert job.submitted_at == datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    event = JobEvent.objects.get(job=job)
    assert event.kind == "submitted"
    assert event.actor == world.member
    audit = AuditEvent.objects.get(action="job.submit")
    assert audit.target_id == str(job.pk)
    assert audit.tenant == world.tenant
    assert audit.actor == world.member
    assert audit.after == {"queue": "nlp/train", "gpus": 2, "priority_class": "normal"}
    assert data["state"] == "PENDING" and data["submitted_by"] == "nlp-member"
    assert dispatch_requests == [1]  # a dispatch is requested once the job is committed


def test_submit_service_returns_the_job(world, dispatch_requests):
    job = job_submit(user=world.member, spec=spec(world, name="svc"))

    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert job.name == "svc"
    assert job.events.get().kind == "submitted"


def test_name_defaults_to_the_program(world, dispatch_requests):
    job = job_submit(user=world.member, spec=spec(world, command=["torchrun", "x.py"]))

    assert job.name == "torchrun"


def test_runtime_defaults_to_the_policy_default(world, dispatch_requests):
    f.policy(WorkloadType.EVALUATION, default_runtime_seconds=1234, max_runtime_seconds=5000)

    job = job_submit(user=world.member, spec=spec(world, workload_type=WorkloadType.EVALUATION))

    job.refresh_from_db()
    assert job.max_runtime_seconds == 1234


def test_explicit_runtime_up_to_the_maximum_is_kept(world, api, dispatch_requests):
    response = api(world.member).post(URL, body(world, max_runtime_seconds=86400), format="json")

    assert response.status_code == 201
    assert Job.objects.get().max_runtime_seconds == 86400


def test_shell_command_as_one_string(world, api, dispatch_requests):
    response = api(world.member).post(
        URL, body(world, command="python train.py | tee out.log", shell=True), format="json"
    )

    assert response.status_code == 201, response.json()
    job = Job.objects.get()
    assert job.shell is True
    assert job.command == ["python train.py | tee out.log"]


def test_preemptible_job_may_borrow_beyond_the_guarantee(world, api, dispatch_requests):
    response = api(world.member).post(
        URL, body(world, gpus_per_node=8, nodes=2, priority_class="low"), format="json"
    )

    assert response.status_code == 201, response.json()
    assert Job.objects.get().priority_class == world.low


def test_tenant_admin_may_choose_a_class_above_the_self_service_maximum(
    world, api, dispatch_requests
):
    response = api(world.tenant_admin).post(URL, body(world, priority_class="high"), format="json")

    assert response.status_code == 201
    assert Job.objects.get().priority_class == world.high


def test_cpu_only_job_needs_no_gpu(world, api, dispatch_requests):
    response = api(world.member).post(URL, body(world, gpus_per_node=0), format="json")

    assert response.status_code == 201


# --- access ---------------------------------------------------------------------------------


def test_viewer_cannot_submit(world, api, nothing_stored):
    data = refused(api, world.viewer, body(world), status=403)

    assert "Viewers" in data["detail"]


def test_viewer_cannot_submit_through_the_service(world, nothing_stored):
    with pytest.raises(PermissionDeniedError):
        job_submit(user=world.viewer, spec=spec(world))


def test_restricted_project_without_grant_is_403(world, api, nothing_stored):
    world.project.restricted = True
    world.project.save()

    data = refused(api, world.member, body(world), status=403)

    assert "submit right" in data["errors"]["project"][0]


def test_inactive_project_is_refused(world, api, nothing_stored):
    world.project.active = False
    world.project.save()

    data = refused(api, world.tenant_admin, body(world))

    assert "inactive" in data["errors"]["project"][0]


def test_queue_of_another_tenant_is_404(world, api, nothing_stored):
    refused(api, world.member, body(world, queue=world.other_queue.pk), status=404)


def test_project_of_another_tenant_is_404(world, api, nothing_stored):
    refused(api, world.member, body(world, project=world.other_project.pk), status=404)


def test_outsider_submitting_to_the_tenant_is_404(world, api, nothing_stored):
    refused(api, world.outsider, body(world), status=404)


def test_queue_and_project_of_different_tenants_are_refused_for_platform_admins(
    world, api, nothing_stored
):
    data = refused(api, world.platform_admin, body(world, queue=world.other_queue.pk))

    assert "another tenant" in data["errors"]["queue"][0]


def test_project_queue_takes_only_its_projects_jobs(world, api, nothing_stored):
    other = f.ProjectFactory(tenant=world.tenant, slug="asr")
    world.queue.project = other
    world.queue.save()

    data = refused(api, world.member, body(world))

    assert "only takes jobs of project" in data["errors"]["queue"][0]


@pytest.mark.parametrize("state", [QueueState.CLOSED, QueueState.DRAINING])
def test_queue_that_is_not_open_is_refused(world, api, nothing_stored, state):
    Queue.objects.filter(pk=world.queue.pk).update(state=state)

    data = refused(api, world.member, body(world))

    assert f"is {state}" in data["errors"]["queue"][0]


# --- workload type, pool and GPUs -------------------------------------------------------------


def test_workload_type_not_taken_by_the_queue(world, api, nothing_stored):
    Queue.objects.filter(pk=world.queue.pk).update(allowed_workload_types=["inference"])

    data = refused(api, world.member, body(world))

    assert "does not take training jobs" in data["errors"]["workload_type"][0]


def test_workload_type_not_run_by_the_pool(world, api, nothing_stored):
    world.pool.allowed_workload_types = ["inference", "batch_inference"]
    world.pool.save()

    data = refused(api, world.member, body(world))

    message = data["errors"]["workload_type"][0]
    assert "Pool training does not run training jobs" in message
    assert "inference, batch_inference" in message


def test_workload_type_whose_policy_excludes_the_pool(world, api, nothing_stored):
    other_pool = f.PoolFactory(name="serving")
    f.policy(WorkloadType.TRAINING).allowed_pools.set([other_pool])

    data = refused(api, world.member, body(world))

    assert "allows pools serving" in data["errors"]["workload_type"][0]


def test_unknown_workload_type(world, api, nothing_stored):
    data = refused(api, world.member, body(world, workload_type="mining"))

    assert "workload_type" in data["errors"]


def test_unknown_gpu_model_lists_the_pools_models(world, api, nothing_stored):
    f.GpuFactory(node=world.nodes[0], index=8, uuid="GPU-a100", model="A100-40GB")

    data = refused(api, world.member, body(world, gpu_model="B200"))

    message = data["errors"]["gpu_model"][0]
    assert "B200" in message
    assert "A100-40GB, H100-80GB" in message


def test_more_gpus_per_node_than_any_node_has(world, api, nothing_stored):
    data = refused(api, world.member, body(world, gpus_per_node=9))

    assert "at most 8" in data["errors"]["gpus_per_node"][0]


def test_gpu_memory_above_the_largest_gpu(world, api, nothing_stored):
    data = refused(api, world.member, body(world, min_gpu_memory_mb=200_000))

    assert "min_gpu_memory_mb" in data["errors"]


def test_more_gpus_than_guaranteed_plus_borrow_limit(world, api, nothing_stored):
    Quota.objects.filter(tenant=world.tenant).update(guaranteed_gpus=4, borrow_limit_gpus=4)

    data = refused(api, world.member, body(world, gpus_per_node=8, nodes=2, priority_class="low"))

    message = data["errors"]["gpus_per_node"][0]
    assert "needs 16 GPUs" in message
    assert "4 guaranteed + 4 borrowed" in message


def test_no_quota_in_the_pool_means_no_gpus(world, api, nothing_stored):
    Quota.objects.filter(tenant=world.tenant).delete()

    data = refused(api, world.member, body(world, priority_class="low"))

    assert "0 guaranteed + 0 borrowed" in data["errors"]["gpus_per_node"][0]


def test_non_preemptible_job_beyond_the_guaranteed_quota(world, api, nothing_stored):
    data = refused(api, world.member, body(world, gpus_per_node=8, nodes=2))

    message = data["errors"]["gpus_per_node"][0]
    assert "not preemptible" in message
    assert "guaranteed 8" in message


def test_non_preemptible_policy_makes_a_preemptible_class_fit_the_guarantee(
    world, api, nothing_stored
):
    f.policy(WorkloadType.TRAINING, preemptible=False)

    data = refused(api, world.member, body(world, gpus_per_node=8, nodes=2, priority_class="low"))

    assert "not preemptible" in data["errors"]["gpus_per_node"][0]


def test_project_cap_is_enforced(world, api, nothing_stored):
    ProjectQuota.objects.create(project=world.project, pool=world.pool, max_gpus=2)

    data = refused(api, world.member, body(world, gpus_per_node=4))

    assert "at most 2 GPUs" in data["errors"]["gpus_per_node"][0]


def test_multi_node_job_without_gpus_is_refused(world, api, nothing_stored):
    data = refused(api, world.member, body(world, gpus_per_node=0, nodes=2))

    assert "nodes" in data["errors"]


# --- runtime and priority -------------------------------------------------------------------


def test_runtime_above_the_policy_maximum(world, api, nothing_stored):
    data = refused(api, world.member, body(world, max_runtime_seconds=86401))

    message = data["errors"]["max_runtime_seconds"][0]
    assert "86401" in message and "86400" in message


@pytest.mark.parametrize("value", [0, -5, "soon", 1.5])
def test_runtime_must_be_a_positive_integer(world, api, nothing_stored, value):
    data = refused(api, world.member, body(world, max_runtime_seconds=value))

    assert "max_runtime_seconds" in data["errors"]


def test_priority_class_above_the_self_service_maximum(world, api, nothing_stored):
    data = refused(api, world.member, body(world, priority_class="high"))

    message = data["errors"]["priority_class"][0]
    assert "self-service" in message
    assert "priority raise" in message


def test_unknown_priority_class(world, api, nothing_stored):
    data = refused(api, world.member, body(world, priority_class="urgent"))

    assert "urgent" in data["errors"]["priority_class"][0]


def test_workload_type_without_policy(world, api, nothing_stored):
    from scheduling.models import WorkloadPolicy

    WorkloadPolicy.objects.filter(workload_type="evaluation").delete()

    data = refused(api, world.member, body(world, workload_type="evaluation"))

    assert "No policy" in data["errors"]["workload_type"][0]


# --- the shape of the spec ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "field", "fragment"),
    [
        ({"command": "python train.py"}, "command", "shell=true"),
        ({"command": []}, "command", "empty"),
        ({"command": [""]}, "command", "empty"),
        ({"command": ["python", 3]}, "command", "list of strings"),
        ({"command": [["python"]]}, "command", "list of strings"),
        ({"command": {"cmd": "python"}}, "command", "list of strings"),
        ({"command": 42}, "command", ""),
        ({"command": None}, "command", ""),
        ({"command": ["python", "a\x00b"]}, "command", "NUL"),
        ({"command": ["a", "b"], "shell": True}, "command", "one shell string"),
        ({"command": "", "shell": True}, "command", "empty"),
        ({"command": ["x" * 70000]}, "command", "longer than"),
        ({"env": {"1BAD": "x"}}, "env", "not a valid environment variable name"),
        ({"env": {"BAD-NAME": "x"}}, "env", "not a valid"),
        ({"env": {"": "x"}}, "env", ""),
        ({"env": {"SLUICE_JOB_ID": "7"}}, "env", "set by Sluice"),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0,1"}}, "env", "set by Sluice"),
        ({"env": {"NVIDIA_VISIBLE_DEVICES": "all"}}, "env", "set by Sluice"),
        ({"env": {"EPOCHS": 3}}, "env", ""),
        ({"env": {"EPOCHS": True}}, "env", ""),
        ({"env": {"EPOCHS": None}}, "env", ""),
        ({"env": {"EPOCHS": ["3"]}}, "env", ""),
        ({"env": ["EPOCHS=3"]}, "env", ""),
        ({"env": "EPOCHS=3"}, "env", ""),
        ({"labels": ["a"]}, "labels", ""),
        ({"labels": "team=nlp"}, "labels", ""),
        ({"labels": {"team": 5}}, "labels", ""),
        ({"parameters": [1, 2]}, "parameters", ""),
        ({"parameters": "lr=1"}, "parameters", ""),
        ({"parameters": {"blob": "x" * 70000}}, "parameters", "too large"),
        ({"gpu_model": 5}, "gpu_model", ""),
        ({"gpu_model": ["H100-80GB", 5]}, "gpu_model", ""),
        ({"gpu_model": ["x" * 41]}, "gpu_model", ""),
        ({"gpu_model": ["H100-80GB", "B\x00"]}, "gpu_model", ""),
        ({"parameters": {"a": ["\x00"]}}, "parameters", "NUL"),  # jsonb cannot store it
        ({"parameters": {"\x00": 1}}, "parameters", "NUL"),
        ({"labels": {"\x00k": "v"}}, "labels", "NUL"),
        ({"labels": {"k": "\x00"}}, "labels", ""),
        ({"seed": 2**63}, "seed", ""),  # beyond the column: a 400, not a database error
        ({"seed": -(2**63) - 1}, "seed", ""),
        ({"memory_mb": 2**31}, "memory_mb", ""),
        ({"min_gpu_memory_mb": 2**40}, "min_gpu_memory_mb", ""),
        ({"max_runtime_seconds": 2**40}, "max_runtime_seconds", ""),
        ({"gpus_per_node": -1}, "gpus_per_node", ""),
        ({"gpus_per_node": "two"}, "gpus_per_node", ""),
        ({"gpus_per_node": 65}, "gpus_per_node", ""),
        ({"nodes": 0}, "nodes", ""),
        ({"cpus": 0}, "cpus", ""),
        ({"name": "n" * 121}, "name", ""),
        ({"working_dir": "w" * 501}, "working_dir", ""),
        ({"checkpoint_dir": "c" * 501}, "checkpoint_dir", ""),
        ({"dataset": "d" * 201}, "dataset", ""),
        ({"array": 0}, "array", ""),
        ({"array": 10001}, "array", ""),
        ({"seed": "lucky"}, "seed", ""),
        ({"shell": "sometimes"}, "shell", ""),
        ({"project": "llm"}, "project", ""),
        ({"queue": None}, "queue", ""),
    ],
)
def test_malformed_spec_is_a_400_naming_the_field(
    world, api, nothing_stored, overrides, field, fragment
):
    data = refused(api, world.member, body(world, **overrides))

    # Messages about one entry of a dict or list field come under "field.key" or "field[i]"
    # (e.g. "env.EPOCHS", "command[1]").
    messages = [
        m for key, ms in data["errors"].items() if re.split(r"[.\[]", key)[0] == field for m in ms
    ]
    assert messages, data
    assert fragment in " ".join(messages)


@pytest.mark.parametrize("missing", ["project", "queue", "workload_type", "command"])
def test_missing_required_field(world, api, nothing_stored, missing):
    payload = body(world)
    del payload[missing]

    data = refused(api, world.member, payload)

    assert missing in data["errors"]


def test_non_object_body(world, api, nothing_stored):
    refused(api, world.member, ["python", "train.py"])


def test_service_rejects_a_malformed_spec_without_storing(world, nothing_stored):
    with pytest.raises(BusinessError) as excinfo:
        job_submit(user=world.member, spec=spec(world, env={"CUDA_VISIBLE_DEVICES": "0"}))

    assert excinfo.value.status_code == 400
    assert "env" in excinfo.value.errors


def test_service_rejects_non_string_env_values(world, nothing_stored):
    with pytest.raises(BusinessError) as excinfo:
        job_submit(user=world.member, spec=spec(world, env={"EPOCHS": 3}))

    assert "EPOCHS" in excinfo.value.errors["env"][0]
