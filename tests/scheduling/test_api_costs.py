"""What the job API costs: the query count of a submission and of a page of the
list is pinned, and what made them cheaper answers what the slower code answered: the
job serializer's fast representation (scheduling.api.serializers.FastRepresentationMixin)
against DRF's own, and the submission's one-statement admission read
(scheduling.services.jobs._admission_context) against the selectors it replaces.
"""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from freezegun import freeze_time
from rest_framework import serializers

from scheduling.api.serializers import FastRepresentationMixin, JobSerializer
from scheduling.choices import GpuHealth, JobState, NodeState, RaiseState
from scheduling.models import (
    Job,
    PoolEstimates,
    PriorityRaise,
    ProjectQuota,
    RuntimeHistory,
    WorkloadPolicy,
)
from scheduling.positions import positions_attach, positions_attached
from scheduling.runtime_prediction import predict_runtime
from scheduling.selectors import jobs_visible_to, names_attach, pool_gpu_shapes, quota_for
from scheduling.services.jobs import _admission_context
from scheduling.services.raises import project_grant_classes
from tests import factories as f

URL = "/api/v1/jobs"
# A submission: token and user, the user's roles with the project, queue and policy
# (scheduling.selectors.submission_targets), the admission read (with the runtime
# histories of the answer's prediction), on PostgreSQL one statement for the job, its
# event, the audit chain's lock and its last hash, and the audit row (no transaction
# around it: no BEGIN and COMMIT). SQLite inserts the job, the event and the audit row
# apart and reads the last hash on its own (it needs no lock), in a transaction (a
# savepoint and its release in a test).
SUBMIT_QUERIES = {"postgresql": 4, "sqlite": 9}
# A page: token and user, the member's tenants, count, the page's jobs (no joins), their
# names (tenants, projects, queues, pools, submitters, classes), the GPUs they hold,
# runtime histories, positions (their ranks and pools, the pools' estimates).
LIST_QUERIES = 9


def spec(world, **overrides) -> dict:
    return {
        "project": world.project.pk,
        "queue": world.queue.pk,
        "workload_type": "training",
        "command": ["python", "train.py"],
        **overrides,
    }


@pytest.fixture
def member_client(world, api_token, token_client):
    """The member, authenticated by API token as a script would be."""
    _, key = api_token(world.member)
    client = token_client(key)
    client.get(URL)  # sets the token's last use: not part of every call
    return client


def jobs_of_every_kind(world) -> list[Job]:
    """A waiting job with a rank and an estimate, a running one holding two GPUs, an ended
    one, a held one; runtime history for the predictions."""
    own = {"queue": world.queue, "project": world.project, "submitted_by": world.member}
    now = timezone.now()
    waiting = f.JobFactory(
        pending_reason_code="WAITING_FOR_GPUS",
        pending_reason_message="Waiting for 1 H100-80GB.",
        pending_rank=1.0,
        labels={"team": "nlp"},
        env={"A": "1"},
        gpu_models=["H100-80GB"],
        seed=7,
        **own,
    )
    PoolEstimates.objects.create(
        pool=world.pool, computed_at=now, starts={str(waiting.pk): now.timestamp() + 60}
    )
    gpus = list(world.nodes[0].gpus.order_by("index")[:2])
    running = f.placed_job(gpus=gpus, last_active_at=now, **own)
    ended = f.JobFactory(
        state=JobState.FAILED,
        started_at=now - timedelta(hours=1),
        finished_at=now,
        exit_code=1,
        failure_message="boom",
        stop_reason="",
        **own,
    )
    held = f.JobFactory(state=JobState.HELD, pending_reason_code="HELD", **own)
    RuntimeHistory.objects.create(
        project=world.project,
        workload_type="training",
        submitted_by=world.member,
        entries=[[now.timestamp(), 0.5]] * 5,
        updated_at=now,
    )
    return [waiting, running, ended, held]


# --- query counts ---------------------------------------------------------------------------


def test_a_submission_costs_a_fixed_number_of_queries(
    world, member_client, django_assert_max_num_queries, dispatch_requests
):
    with django_assert_max_num_queries(SUBMIT_QUERIES[connection.vendor]):
        response = member_client.post(URL, spec(world, gpus_per_node=2), format="json")
    assert response.status_code == 201, response.content
    assert Job.objects.get(pk=response.json()["id"]).state == JobState.PENDING


@pytest.mark.parametrize("basis", ["submitter", "project", "none", "other workload type"])
def test_a_submission_answers_the_prediction_of_the_job_as_stored(
    world, member_client, dispatch_requests, basis
):
    """The answer predicts from the histories the admission read: as predict_runtime
    would from the stored job, whoever's history it rests on."""
    now = timezone.now()
    ratios = {"submitter": 0.25, "project": 0.5, "other workload type": 0.75}
    if basis in ("submitter", "project"):
        RuntimeHistory.objects.create(
            project=world.project,
            workload_type="training",
            submitted_by=world.member if basis == "submitter" else None,
            entries=[[now.timestamp(), ratios[basis]]] * 4,
            updated_at=now,
        )
    if basis == "submitter":  # the submitter's own history wins over the project's
        RuntimeHistory.objects.create(
            project=world.project, workload_type="training", entries=[[0, 0.9]] * 4, updated_at=now
        )
    if basis == "other workload type":
        RuntimeHistory.objects.create(
            project=world.project,
            workload_type="evaluation",
            submitted_by=world.member,
            entries=[[0, 0.75]] * 4,
            updated_at=now,
        )
    response = member_client.post(URL, spec(world, max_runtime_seconds=3600), format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.select_related("submitted_by", "project").get(pk=response.json()["id"])
    expected = predict_runtime(job).as_dict()
    assert response.json()["expected_runtime"] == expected
    wanted = {"submitter": 900, "project": 1800}.get(basis)
    assert expected["seconds"] == wanted


def test_a_list_page_costs_a_fixed_number_of_queries(
    world, member_client, django_assert_max_num_queries
):
    jobs_of_every_kind(world)
    with django_assert_max_num_queries(LIST_QUERIES):
        response = member_client.get(URL)
    assert response.status_code == 200
    assert response.json()["count"] == 4


def test_a_page_of_ended_jobs_reads_no_gpus_positions_or_predictions(
    world, member_client, django_assert_num_queries
):
    """Token and user, the member's tenants, count, the page, the names: a history page
    reads nothing that only jobs waiting or running have (a job leaving those states gives
    its GPUs back)."""
    now = timezone.now()
    for state in (JobState.SUCCEEDED, JobState.CANCELLED):
        f.JobFactory(
            state=state,
            queue=world.queue,
            project=world.project,
            submitted_by=world.member,
            started_at=now - timedelta(minutes=5),
            finished_at=now,
        )
    with django_assert_num_queries(5):
        response = member_client.get(URL)
    assert response.status_code == 200
    assert [job["allocations"] for job in response.json()["results"]] == [[], []]


# --- the fast representation answers what DRF's does -------------------------------------------


def drf_representation(job: Job) -> dict:
    """The job as DRF's ModelSerializer makes it (every field built and bound), its
    positions attached as JobSerializer does."""
    if not positions_attached(job):
        positions_attach([job])
    serializer = JobSerializer(job)
    return serializers.ModelSerializer.to_representation(serializer, job)


def test_the_fast_representation_is_drfs(world):
    jobs_of_every_kind(world)
    for job in jobs_visible_to(world.member):
        job.refresh_from_db()
        fast = JobSerializer(job).data
        assert fast == drf_representation(job)
        assert list(fast) == list(drf_representation(job))  # and in the same order


def test_the_api_answers_what_drf_would(world, api):
    jobs = jobs_of_every_kind(world)
    client = api(world.member)
    # One clock for every answer: a wait's seconds are counted up to now (a second
    # boundary crossed between the list and the expected answers made this test flaky).
    with freeze_time(timezone.now()):
        listed = {row["id"]: row for row in client.get(URL).json()["results"]}
        for job in jobs:
            one = client.get(f"{URL}/{job.pk}").json()
            expected = drf_representation(jobs_visible_to(world.member).get(pk=job.pk))
            assert one == expected
            assert listed[job.pk] == expected
    running = listed[jobs[1].pk]
    assert [a["gpu_index"] for a in running["allocations"]] == [0, 1]
    assert listed[jobs[0].pk]["queue_position"] == 1
    assert listed[jobs[0].pk]["estimated_start"] is not None


def test_names_are_attached_once_each_and_the_rest_loads_on_demand(
    world, django_assert_num_queries
):
    jobs_of_every_kind(world)
    jobs = list(Job.objects.order_by("id"))
    with django_assert_num_queries(1):
        names_attach(jobs)
    with django_assert_num_queries(0):
        names = {
            (j.tenant.slug, j.project.slug, str(j.queue.name), j.queue.pool.name) for j in jobs
        }
        assert names == {("nlp", "llm", "train", "training")}
        assert {j.submitted_by.username for j in jobs} == {"nlp-member"}
        assert {j.priority_class.name for j in jobs} == {"normal"}
        assert jobs[0].queue is jobs[1].queue  # one object per row read
    assert jobs[0].submitted_by.email == world.member.email  # read when asked
    with django_assert_num_queries(0):
        names_attach(jobs)  # nothing left to read


def test_a_serializer_with_context_dependent_fields_keeps_drfs_way():
    """The mixin builds the fields once per class: a subclass gets its own plan."""

    class Narrow(JobSerializer):
        class Meta(JobSerializer.Meta):
            fields = ["id", "name"]
            read_only_fields = fields

    assert [name for name, *_ in Narrow._representation_plan()] == ["id", "name"]
    assert len(JobSerializer._representation_plan()) == len(JobSerializer.Meta.fields)
    assert issubclass(Narrow, FastRepresentationMixin)


# --- the admission read answers what the selectors do -----------------------------------------


@pytest.fixture
def busy_pool(world):
    """The pool with a second GPU model on a third node, an unhealthy GPU, a node down,
    the tenant's quotas for any model and for A100-40GB, its GPUs in use (guaranteed and
    borrowed, one released), the other tenant's in use, and another pool."""
    a100_node = f.NodeFactory(name="gpu-a100", pool=world.pool)
    for i in range(4):
        f.GpuFactory(node=a100_node, index=i, uuid=f"GPU-a100-{i}", model="A100-40GB")
    down = f.NodeFactory(name="gpu-down", pool=world.pool, state=NodeState.DOWN)
    f.GpuFactory(node=down, index=0, uuid="GPU-down-0")
    sick = world.nodes[1].gpus.get(index=7)
    sick.health = GpuHealth.UNHEALTHY
    sick.save()
    f.QuotaFactory(
        tenant=world.tenant,
        pool=world.pool,
        gpu_model="A100-40GB",
        guaranteed_gpus=2,
        borrow_limit_gpus=1,
        max_running_jobs=3,
    )
    own = {"queue": world.queue, "project": world.project, "submitted_by": world.member}
    h100 = list(world.nodes[0].gpus.order_by("index"))
    f.placed_job(gpus=h100[:2], **own)
    borrowed = f.placed_job(gpus=h100[2:3], **own)
    borrowed.allocations.update(borrowed=True)
    released = f.placed_job(gpus=h100[3:4], **own)
    released.allocations.update(released_at=timezone.now())
    f.placed_job(gpus=list(a100_node.gpus.all()[:1]), **own)
    other = {"queue": world.other_queue, "project": world.other_project}
    f.placed_job(gpus=h100[4:6], submitted_by=world.outsider, **other)
    elsewhere = f.PoolFactory(name="elsewhere")
    f.GpuFactory(node=f.NodeFactory(name="gpu-elsewhere", pool=elsewhere), index=0)
    f.QuotaFactory(tenant=world.tenant, pool=elsewhere, guaranteed_gpus=1)
    return world.pool


def test_the_admission_read_answers_what_the_selectors_do(world, busy_pool):
    ProjectQuota.objects.create(project=world.project, pool=busy_pool, max_gpus=6)
    context = _admission_context(
        tenant_id=world.tenant.pk, project_id=world.project.pk, pool_id=busy_pool.pk
    )
    assert context.shapes == pool_gpu_shapes(busy_pool)
    for model in ("H100-80GB", "A100-40GB", "L4-24GB"):
        assert context.quota(model) == quota_for(world.tenant, busy_pool, model), model
    assert context.project_cap == 6
    assert context.grant is None


def test_the_admission_read_without_quota_or_gpus(world):
    empty = f.PoolFactory(name="empty")
    context = _admission_context(
        tenant_id=world.tenant.pk, project_id=world.project.pk, pool_id=empty.pk
    )
    assert context.shapes == pool_gpu_shapes(empty) == {}
    assert context.quota("H100-80GB") == quota_for(world.tenant, empty, "H100-80GB")
    assert context.project_cap is None


@pytest.mark.parametrize(
    "state, window_starts_in, expires_in, granted",
    [
        (RaiseState.APPROVED, None, 2, True),
        (RaiseState.APPROVED, -1, 2, True),
        (RaiseState.APPROVED, 1, 2, False),  # its window has not begun
        (RaiseState.APPROVED, None, -1, False),  # expired
        (RaiseState.PENDING, None, 2, False),
        (RaiseState.REVOKED, None, 2, False),
    ],
)
def test_the_admission_read_finds_the_grants_raises_finds(
    world, state, window_starts_in, expires_in, granted
):
    now = timezone.now()
    for to_class in (world.high, world.low):
        PriorityRaise.objects.create(
            tenant=world.tenant,
            project=world.project,
            to_class=to_class,
            reason="release",
            created_at=now,
            requested_by=world.member,
            state=state,
            window_start=now + timedelta(hours=window_starts_in) if window_starts_in else None,
            window_end=now + timedelta(hours=expires_in),
            expires_at=now + timedelta(hours=expires_in),
        )
    context = _admission_context(
        tenant_id=world.tenant.pk, project_id=world.project.pk, pool_id=world.pool.pk
    )
    expected = project_grant_classes([world.project.pk], timezone.now()).get(world.project.pk)
    assert (expected is not None) is granted
    assert context.grant == ((expected.value, expected.pk) if expected else None)


def test_the_admission_read_knows_the_policies_pools(world):
    other = f.PoolFactory(name="other")
    f.policy("training").allowed_pools.add(other, world.pool)
    f.policy("inference").allowed_pools.add(other)
    context = _admission_context(
        tenant_id=world.tenant.pk, project_id=world.project.pk, pool_id=world.pool.pk
    )
    assert context.policy_pools == {
        policy.workload_type: {pool.pk for pool in policy.allowed_pools.all()}
        for policy in WorkloadPolicy.objects.all()
        if policy.allowed_pools.exists()
    }
    assert context.policy_pools["inference"] == {other.pk}
