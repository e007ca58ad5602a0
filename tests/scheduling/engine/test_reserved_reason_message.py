"""RESERVED_FOR_HIGHER_PRIORITY and its message agree: "higher priority" is the order the
engine considers waiting jobs in, so a job of the same class ordered first counts, and the
message says so (not only "its earlier waiting jobs")."""

from engine_builders import gpu_ids, job, node, quota, run_plan, running, snapshot

from scheduling.engine import reasons
from scheduling.engine.messages import AHEAD


def test_gpus_reserved_for_a_same_class_job_ahead():
    snap = snapshot(
        [node(1)],
        [quota("a", 16), quota("b", 8)],  # room in a's quota for both: the GPUs decide
        [job(1, "a", gpus=8), job(3, "a", gpus=2, runtime=7200)],
        [running(10, "b", gpu_ids(1, 0, 1, 2, 3), age=0, runtime=3600)],
        size_order=False,  # submit order: job 1, of the same class, goes first
    )
    pending = run_plan(snap).pending[3]
    assert pending.code == reasons.RESERVED_FOR_HIGHER_PRIORITY
    assert "reserved for jobs ahead of this one in priority order" in pending.message
    assert "its class and ordered first" in pending.message and "job 1" in pending.message


def test_quota_promised_to_a_same_class_job_ahead():
    snap = snapshot(
        [node(1), node(2)],
        [quota("a", 8), quota("b", 8)],
        [job(1, "a", gpus=8), job(2, "a", gpus=2, runtime=7200)],
        [
            running(10, "b", gpu_ids(1, 0), age=0, runtime=600),
            running(11, "b", gpu_ids(2, 0), age=0, runtime=7200),
        ],
        size_order=False,
    )
    pending = run_plan(snap).pending[2]
    assert pending.code == reasons.RESERVED_FOR_HIGHER_PRIORITY
    assert pending.message.endswith(f"is promised to its waiting jobs {AHEAD}")
