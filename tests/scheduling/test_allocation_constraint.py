"""The database forbids two active allocations of one GPU (DESIGN §4, step 2).

Runs on whichever database is configured (SQLite here, PostgreSQL in CI): the rule is a
partial unique index, not Python code.
"""

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from scheduling.choices import JobState
from scheduling.models import Allocation
from tests import factories as f


@pytest.fixture
def gpu(world):
    return world.nodes[0].gpus.get(index=0)


def _job(world, state=JobState.RUNNING):
    return f.JobFactory(
        queue=world.queue, project=world.project, submitted_by=world.member, state=state
    )


def test_two_active_allocations_of_one_gpu_are_refused(world, gpu):
    f.AllocationFactory(job=_job(world), gpu=gpu)

    with pytest.raises(IntegrityError), transaction.atomic():
        f.AllocationFactory(job=_job(world), gpu=gpu)

    assert Allocation.objects.filter(gpu=gpu).count() == 1


def test_bulk_create_of_a_double_allocation_is_refused_whole(world, gpu):
    now = timezone.now()
    job_a, job_b = _job(world), _job(world)
    other_gpu = world.nodes[0].gpus.get(index=1)
    rows = [
        Allocation(job=job_a, gpu=other_gpu, node=gpu.node, granted_at=now),
        Allocation(job=job_a, gpu=gpu, node=gpu.node, granted_at=now),
        Allocation(job=job_b, gpu=gpu, node=gpu.node, granted_at=now),
    ]

    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.bulk_create(rows)

    assert not Allocation.objects.exists()


def test_a_released_allocation_and_an_active_one_may_share_a_gpu(world, gpu):
    f.AllocationFactory(job=_job(world, JobState.SUCCEEDED), gpu=gpu, released_at=timezone.now())
    f.AllocationFactory(job=_job(world, JobState.FAILED), gpu=gpu, released_at=timezone.now())

    active = f.AllocationFactory(job=_job(world), gpu=gpu)

    assert Allocation.objects.filter(gpu=gpu).count() == 3
    assert Allocation.objects.get(gpu=gpu, released_at__isnull=True) == active


def test_releasing_frees_the_gpu_for_the_next_job(world, gpu):
    first = f.AllocationFactory(job=_job(world), gpu=gpu)
    Allocation.objects.filter(pk=first.pk).update(released_at=timezone.now())

    f.AllocationFactory(job=_job(world), gpu=gpu)

    assert Allocation.objects.filter(gpu=gpu, released_at__isnull=True).count() == 1


def test_reactivating_a_released_allocation_is_refused_while_another_is_active(world, gpu):
    old = f.AllocationFactory(job=_job(world), gpu=gpu, released_at=timezone.now())
    f.AllocationFactory(job=_job(world), gpu=gpu)

    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.filter(pk=old.pk).update(released_at=None)

    old.refresh_from_db()
    assert old.released_at is not None
