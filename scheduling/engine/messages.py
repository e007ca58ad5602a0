"""Human messages of pending reasons and preemptions, with the numbers behind them.

Messages do not repeat the reason code (the UI shows ``code: message``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from .quota import Account
from .snapshot import PendingJob


def duration(seconds: float) -> str:
    """A short, rounded duration: ``45 s``, ``12 min``, ``3.5 h``, ``2.0 d``."""
    if math.isinf(seconds):
        return "an unknown time"
    seconds = max(seconds, 0.0)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def shape(job: PendingJob) -> str:
    """``4 GPUs on one node`` or ``2 nodes x 8 GPUs``."""
    if job.nodes == 1:
        plural = "s" if job.gpus_per_node != 1 else ""
        return f"{job.gpus_per_node} GPU{plural} on one node"
    return f"{job.nodes} nodes x {job.gpus_per_node} GPUs"


def models(job: PendingJob) -> str:
    """The GPU models the job accepts, in words."""
    wanted = "/".join(job.gpu_models) if job.gpu_models else "any model"
    if job.min_gpu_memory_mb:
        wanted += f" with at least {job.min_gpu_memory_mb} MB"
    return wanted


def queue_closed(queue_name: str) -> str:
    return f"queue {queue_name} is closed"


def held() -> str:
    return "the job is held; release it to queue it again"


def no_matching_nodes(job: PendingJob, pool_known: bool) -> str:
    if job.gpus_per_node < 1 or job.nodes < 1:
        return f"invalid size: {job.nodes} node(s) x {job.gpus_per_node} GPU(s)"
    if not pool_known:
        return f"pool {job.pool} has no schedulable node with healthy GPUs"
    return f"pool {job.pool} has no nodes that could ever hold {shape(job)} of {models(job)}"


def exceeds_quota(job: PendingJob, account: Account) -> str:
    gpus = job.gpus
    if account.max_running == 0:
        return f"{account.tenant} may run no jobs on {account.label} in pool {job.pool}"
    if not job.preemptible and gpus <= account.limit:
        return (
            f"non-preemptible job needs {gpus} {account.label} but {account.tenant} is "
            f"guaranteed only {account.guaranteed} in pool {job.pool}; non-preemptible "
            f"work must fit within the guarantee"
        )
    return (
        f"job needs {gpus} GPUs but {account.tenant} may use at most {account.limit} "
        f"{account.label} in pool {job.pool} (guaranteed {account.guaranteed} + "
        f"borrowing {account.borrow_limit})"
    )


def quota_wait(job: PendingJob, account: Account, idle: int) -> str:
    if account.max_running is not None and account.jobs >= account.max_running:
        return (
            f"{account.tenant} runs {account.jobs}/{account.max_running} jobs allowed on "
            f"{account.label} in pool {account.pool}"
        )
    # The pool's idle GPUs are named only where they could matter, for a job that may
    # borrow: they change with every other tenant's job, and the message is stored on every
    # waiting job, so a number that cannot help this job would rewrite all of them.
    borrows = job.preemptible and account.borrow_limit > 0
    text = (
        f"{account.tenant} uses {account.used}/{account.guaranteed} guaranteed "
        f"{account.label} in pool {account.pool}; borrowing allowed "
        f"{account.borrow_limit}{f', idle {idle}' if borrows else ''}; job needs {job.gpus}"
    )
    if not job.preemptible and account.used + job.gpus > account.guaranteed:
        if 0 < job.max_preemptions <= job.preemptions:
            text += (
                f"; preempted {job.preemptions} times (limit {job.max_preemptions}), it now "
                "runs only within the guarantee, like non-preemptible work"
            )
        else:
            text += "; non-preemptible work must fit within the guarantee"
    return text


def gpus_wait(job: PendingJob, model: str, idle: int, largest: int) -> str:
    return (
        f"needs {shape(job)} of {model} in pool {job.pool}; largest idle block "
        f"{largest}, {idle} idle in pool"
    )


def topology_wait(
    job: PendingJob, model: str, most_in_block: int, left: float, preempting: bool = False
) -> str:
    """A job of several nodes that the idle GPUs (or, ``preempting``, the GPUs of the jobs
    it may stop) hold only spread over topology blocks, waiting for one block for what is
    left of its topology wait."""
    plural = "" if most_in_block == 1 else "s"
    held = "the GPUs it may preempt" if preempting else "the idle GPUs"
    return (
        f"waiting for one block to hold {shape(job)} of {model} in pool {job.pool} "
        f"(topology): {held} hold it only spread over blocks (at most "
        f"{most_in_block} node{plural} of one block free); spread over blocks in "
        f"{duration(left)} if no block is free by then"
    )


def kept_for_preemptors(job_ids: list[int]) -> str:
    """GPUs being freed by a preemption, kept for the jobs it was made for."""
    if len(job_ids) == 1:
        return f"GPUs being freed are kept for job {job_ids[0]}, which preempted for them"
    listed = ", ".join(str(job_id) for job_id in sorted(job_ids))
    return f"GPUs being freed are kept for jobs {listed}, which preempted for them"


#: What "higher priority" means in RESERVED_FOR_HIGHER_PRIORITY: ahead in the order the
#: engine considers waiting jobs in (a higher class, or the same class ordered first).
AHEAD = "ahead of this one in priority order (a higher class, or its class and ordered first)"


def reserved_gpus(job: PendingJob, owners: list[tuple[int, float]], now: float) -> str:
    if owners:
        owner, start = owners[0]
        return (
            f"the idle GPUs in pool {job.pool} are reserved for jobs {AHEAD} (e.g. job "
            f"{owner}, starting in {duration(start - now)}) and this job would hold them longer"
        )
    return f"the idle GPUs in pool {job.pool} are reserved for jobs {AHEAD}"


def reserved_quota(account: Account) -> str:
    return (
        f"{account.tenant}'s {account.label} quota in pool {account.pool} is promised to "
        f"its waiting jobs {AHEAD}"
    )


def pool_blocked(job: PendingJob, blocker: int) -> str:
    return f"pool {job.pool} does not backfill: job {blocker} must start first"


def preemption_wait(
    victim_ids: Iterable[int], start: float, now: float, quota: Account | None = None
) -> str:
    """``quota``: the account whose quota the victims free, when the job lacked it."""
    ids = ", ".join(str(victim) for victim in sorted(victim_ids))
    freed = "their GPUs"
    if quota is not None:
        freed = f"their GPUs and {quota.tenant}'s quota of {quota.label} in pool {quota.pool}"
    return f"preempting job(s) {ids}; {freed} are free within {duration(start - now)}"


def protected_borrowers(job_ids: list[int]) -> str:
    """Borrowed GPUs a reclaim may not take: their jobs are at their stop limit."""
    listed = ", ".join(str(job_id) for job_id in job_ids[:5])
    more = f" and {len(job_ids) - 5} more" if len(job_ids) > 5 else ""
    return (
        f"borrowed GPUs of job(s) {listed}{more} are not reclaimed: stopped as often as "
        "their policy allows, they run on to their end or their runtime limit"
    )


def releasing_wait(start: float, now: float) -> str:
    return f"waiting for GPUs of stopping jobs, free within {duration(start - now)}"


def stopping_quota_wait(account: Account, start: float, now: float) -> str:
    return (
        f"waiting for {account.tenant}'s quota of {account.label} in pool {account.pool}, "
        f"held by stopping jobs, free within {duration(start - now)}"
    )


def queue_head(queue_name: str, head_id: int, head_code: str) -> str:
    return f"strict-FIFO queue {queue_name}: job {head_id} ({head_code}) must start first"


def fifo_head(head_id: int, head_code: str) -> str:
    return f"global FIFO: job {head_id} ({head_code}) must start first"


def preempted_for_priority(job: PendingJob, victim_class: str) -> str:
    return f"preempted by job {job.id} of class {job.priority_class}, higher than {victim_class}"


def reclaimed(job: PendingJob, account: Account) -> str:
    return (
        f"borrowed GPUs reclaimed for job {job.id}: {account.tenant} uses "
        f"{account.used}/{account.guaranteed} guaranteed {account.label} in pool "
        f"{account.pool}"
    )


def gpu_hours(gpu_seconds: float) -> str:
    """GPU-seconds as GPU-hours, one decimal."""
    return f"{gpu_seconds / 3600:.1f}"


def stopped_for_time_sharing(job: PendingJob, attained: float) -> str:
    return (
        f"stopped for time-sharing: job {job.id} of class {job.priority_class} has used "
        f"{gpu_hours(job.attained_gpu_seconds)} GPU-hours, this job {gpu_hours(attained)} GPU-hours; "
        "it resumes from its last checkpoint"
    )
