"""The planner's cheap copies of snapshot records equal what ``dataclasses.replace`` gives."""

import dataclasses

from scheduling.engine import PendingJob


def _every_field_set() -> PendingJob:
    """A pending job with no field left at its default."""
    return PendingJob(
        id=7,
        tenant="a",
        project="p",
        queue_id=3,
        pool="training",
        workload_type="fine_tuning",
        priority=100,
        priority_class="normal",
        preemptible=True,
        can_preempt=True,
        gpus_per_node=4,
        nodes=2,
        gpu_models=("H100", "A100"),
        min_gpu_memory_mb=40000,
        submitted_at=123.5,
        max_runtime_seconds=3600,
        allowed_pools=("training",),
        held=True,
        reserved_gpu_ids=(1, 2, 3, 4, 5, 6, 7, 8),
        reserved_start=456.0,
        claimed_gpu_ids=(1, 2),
        previous_position=9,
        expected_runtime_seconds=1800.0,
        max_wait_seconds=43200.0,
        preemptions=3,
        max_preemptions=3,
        time_sharing=True,
        attained_gpu_seconds=7200.0,
        queued_at=300.0,
        topology_wait_seconds=1800.0,
        topology_since=100.0,
    )


def test_the_test_job_sets_every_field():
    """A field added to PendingJob must be set here (and copied by not_preemptible)."""
    job = _every_field_set()
    defaults = PendingJob(
        **{
            f.name: getattr(job, f.name)
            for f in dataclasses.fields(PendingJob)
            if f.init
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        }
    )
    for f in dataclasses.fields(PendingJob):
        if f.init and (f.default is not dataclasses.MISSING):
            assert getattr(job, f.name) != getattr(defaults, f.name), f.name


def test_not_preemptible_is_replace():
    job = _every_field_set()
    copy = job.not_preemptible()
    expected = dataclasses.replace(job, preemptible=False)
    for f in dataclasses.fields(PendingJob):
        assert getattr(copy, f.name) == getattr(expected, f.name), f.name
    assert copy.preemptible is False and job.preemptible is True
    assert copy.gpus == 8


def test_frozen_records_pickle_and_copy_with_every_field():
    """Frozen records (compiled: rebuilt through their constructor, see snapshot.py) come
    back equal from pickle, copy and deepcopy, no field left at its default."""
    import copy
    import pickle

    from scheduling.engine.snapshot import GpuInfo, QueueInfo, QuotaInfo

    records = [
        GpuInfo(id=5, node_id=2, index=3, model="H100", memory_mb=81920),
        QuotaInfo(
            tenant="a",
            pool="p",
            gpu_model="H100",
            guaranteed=8,
            borrow_limit=4,
            max_running_jobs=3,
        ),
        QueueInfo(id=9, name="q", tenant="a", strict_fifo=True, open=False),
    ]
    for record in records:
        assert pickle.loads(pickle.dumps(record)) == record
        assert copy.copy(record) == record
        assert copy.deepcopy(record) == record
