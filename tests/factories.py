"""factory_boy factories for the whole suite."""

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from scheduling.choices import Environment, JobState, NodeState, WorkloadType
from scheduling.models import (
    Allocation,
    Gpu,
    Job,
    Node,
    PriorityClass,
    Queue,
    Quota,
    ResourcePool,
    WorkloadPolicy,
)
from tenants.choices import Role
from tenants.models import Membership, Project, Tenant

PASSWORD = "correct-horse-battery-staple"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    password = factory.PostGenerationMethodCall("set_password", PASSWORD)

    @factory.post_generation
    def _save(obj, create, extracted, **kwargs):
        if create:
            obj.save()


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"tenant{n}")
    name = factory.LazyAttribute(lambda t: t.slug.title())


class ProjectFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Project

    tenant = factory.SubFactory(TenantFactory)
    slug = factory.Sequence(lambda n: f"project{n}")
    name = factory.LazyAttribute(lambda p: p.slug.title())


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    tenant = factory.SubFactory(TenantFactory)
    role = Role.MEMBER


class PoolFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ResourcePool
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"pool{n}")


class PriorityClassFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = PriorityClass
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"class{n}")
    value = factory.Sequence(lambda n: 1000 + n)


class NodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Node

    name = factory.Sequence(lambda n: f"node-{n:02d}")
    pool = factory.SubFactory(PoolFactory)
    state = NodeState.READY
    last_heartbeat = factory.LazyFunction(timezone.now)


class GpuFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Gpu

    node = factory.SubFactory(NodeFactory)
    index = factory.Sequence(lambda n: n)
    uuid = factory.Sequence(lambda n: f"GPU-test-{n}")
    model = "H100-80GB"
    memory_mb = 81559


class QuotaFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Quota

    tenant = factory.SubFactory(TenantFactory)
    pool = factory.SubFactory(PoolFactory)
    gpu_model = ""
    guaranteed_gpus = 8
    borrow_limit_gpus = 8


class QueueFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Queue

    tenant = factory.SubFactory(TenantFactory)
    name = factory.Sequence(lambda n: f"queue{n}")
    environment = Environment.EXPERIMENT
    pool = factory.SubFactory(PoolFactory)
    default_priority_class = factory.SubFactory(PriorityClassFactory)
    max_self_service_class = factory.SelfAttribute("default_priority_class")


class JobFactory(factory.django.DjangoModelFactory):
    """A job stored directly (bypassing validation), for tests of what happens after submit."""

    class Meta:
        model = Job

    queue = factory.SubFactory(QueueFactory)
    tenant = factory.SelfAttribute("queue.tenant")
    project = factory.SubFactory(ProjectFactory, tenant=factory.SelfAttribute("..tenant"))
    submitted_by = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"job{n}")
    workload_type = WorkloadType.TRAINING
    base_priority_class = factory.SelfAttribute("queue.default_priority_class")
    priority_class = factory.SelfAttribute("base_priority_class")
    state = JobState.PENDING
    command = factory.LazyFunction(lambda: ["python", "train.py"])
    max_runtime_seconds = 3600
    submitted_at = factory.LazyFunction(timezone.now)


def policy(workload_type=WorkloadType.TRAINING, **overrides) -> WorkloadPolicy:
    values = {
        "preemptible": True,
        "default_runtime_seconds": 3600,
        "max_runtime_seconds": 86400,
        "stop_grace_seconds": 5,
        "min_runtime_before_preemption_seconds": 0,
        **overrides,
    }
    obj, _ = WorkloadPolicy.objects.update_or_create(workload_type=workload_type, defaults=values)
    return obj


class AllocationFactory(factory.django.DjangoModelFactory):
    """One GPU held by a job (as the dispatch loop would write it)."""

    class Meta:
        model = Allocation

    job = factory.SubFactory(JobFactory)
    gpu = factory.SubFactory(GpuFactory)
    node = factory.SelfAttribute("gpu.node")
    granted_at = factory.LazyFunction(timezone.now)


def placed_job(*, gpus, state=JobState.RUNNING, **job_fields) -> Job:
    """A job that holds ``gpus`` (one node's worth), in an active state, allocations included."""
    now = timezone.now()
    job = JobFactory(
        state=state,
        gpus_per_node=len(gpus),
        admitted_at=now,
        started_at=now if state != JobState.ADMITTED else None,
        **job_fields,
    )
    for gpu in gpus:
        AllocationFactory(job=job, gpu=gpu, granted_at=now)
    return job
