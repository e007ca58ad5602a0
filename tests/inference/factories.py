"""Factories and a small inference setup for the services' tests (beside tests/factories.py)."""

from __future__ import annotations

from dataclasses import dataclass

import factory
from django.utils import timezone

from inference.models import ScaleDecision, Service, ServiceReplica
from scheduling.choices import JobState, WorkloadType
from scheduling.models import Job
from tests import factories as f


class ServiceFactory(factory.django.DjangoModelFactory):
    """A service stored directly (no validation, no audit), for what happens after create."""

    class Meta:
        model = Service

    queue = factory.SubFactory(f.QueueFactory)
    tenant = factory.SelfAttribute("queue.tenant")
    project = factory.SubFactory(f.ProjectFactory, tenant=factory.SelfAttribute("..tenant"))
    created_by = factory.SubFactory(f.UserFactory)
    name = factory.Sequence(lambda n: f"svc{n}")
    command = factory.LazyFunction(lambda: ["python", "-m", "server"])
    gpus_per_node = 1
    min_replicas = 1
    max_replicas = 4
    created_at = factory.LazyFunction(timezone.now)
    updated_at = factory.LazyFunction(timezone.now)


class ScaleDecisionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ScaleDecision

    service = factory.SubFactory(ServiceFactory)
    at = factory.LazyFunction(timezone.now)
    current = 1
    desired = 1
    reason_code = "steady"
    reason = "concurrency 1.0 / target 4 per replica → 1"


def replica(
    service: Service, *, state=JobState.PENDING, ready=False, version=None, port=None, **job_fields
) -> ServiceReplica:
    """A replica job of ``service`` stored directly, in ``state``."""
    job = f.JobFactory(
        queue=service.queue,
        project=service.project,
        submitted_by=service.created_by,
        workload_type=WorkloadType.INFERENCE,
        state=state,
        serve=service.serve,
        serve_ready=ready,
        serve_port=port,
        gpus_per_node=service.gpus_per_node,
        started_at=timezone.now() if state == JobState.RUNNING else None,
        **job_fields,
    )
    return ServiceReplica.objects.create(
        service=service,
        job=job,
        spec_version=version or service.spec_version,
        created_at=timezone.now(),
    )


def set_job(job_or_replica, **fields) -> Job:
    job = getattr(job_or_replica, "job", job_or_replica)
    Job.objects.filter(pk=job.pk).update(**fields)
    job.refresh_from_db()
    return job


@dataclass
class Serving:
    """An inference pool (one node of 4 A100s), nlp's quota there (4 guaranteed, 4
    borrowable), an inference queue of nlp and one of vision."""

    pool: object
    node: object
    queue: object
    other_queue: object
    quota: object


def serving(world, *, guaranteed=4, borrow=4, gpus=4, preemptible_policy=False) -> Serving:
    pool = f.PoolFactory(name="inference", allowed_workload_types=["inference"])
    node = f.NodeFactory(name="gpu-infer-01", pool=pool, hostname="infer01.example.com")
    for i in range(gpus):
        f.GpuFactory(node=node, index=i, uuid=f"GPU-infer-{i}", model="A100-40GB", memory_mb=40960)
    quota = f.QuotaFactory(
        tenant=world.tenant, pool=pool, guaranteed_gpus=guaranteed, borrow_limit_gpus=borrow
    )
    f.QuotaFactory(tenant=world.other, pool=pool, guaranteed_gpus=guaranteed, borrow_limit_gpus=0)
    f.policy(WorkloadType.INFERENCE, preemptible=preemptible_policy, max_runtime_seconds=7 * 86400)
    queue = f.QueueFactory(
        tenant=world.tenant,
        name="serve",
        pool=pool,
        allowed_workload_types=["inference"],
        default_priority_class=world.normal,
        max_self_service_class=world.normal,
    )
    other_queue = f.QueueFactory(
        tenant=world.other,
        name="serve",
        pool=pool,
        allowed_workload_types=["inference"],
        default_priority_class=world.normal,
        max_self_service_class=world.normal,
    )
    return Serving(pool=pool, node=node, queue=queue, other_queue=other_queue, quota=quota)
