"""The scenarios of a job's life on a Slurm pool, on real daemons: an emulated cluster of two
nodes with four fake GPUs each (tools/slurm_cluster.py), the Slurm bridge in front of it, a
real Celery worker with beat (a dispatch and a control sweep every second), PostgreSQL and
Redis. The same scenarios as on agent pools: submit, wait with a reason (pool full), run,
preempt with grace, time out with warnings, idle reclaim (GPU utilisation from the
observe-only sampler beside each node, on simulated GPUs), cancel, a controller restart, a
job cancelled behind Sluice's back, and a burst of jobs while the worker is killed.

Skipped where Slurm, munge or root are missing, unless SLUICE_REQUIRE_SLURM=1 (CI).
"""

from __future__ import annotations

import itertools
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict

import pytest
from django.conf import settings
from django.db import connection
from rest_framework.test import APIClient

from scheduling.choices import FINAL_STATES, JobState, NodeState, ReclaimKind
from scheduling.executors.slurm import SlurmClient
from scheduling.models import Allocation, Gpu, Job, JobEvent, Node, Quota, WorkloadPolicy
from tests.integration.slurm_helpers import emulated_cluster, slurm_cluster

pytestmark = pytest.mark.integration

NODES = ("sc1", "sc2")
GPUS_PER_NODE = 4
PARTITION = "sluice"
#: A job that says when it got SIGTERM and then ends (the trap runs once `sleep` returns).
POLITE = "trap 'echo got-term; exit 143' TERM; echo ready; while :; do sleep 0.2; done"
IGNORES_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(600)"
)
END_STATES = {*FINAL_STATES, JobState.LOST, JobState.PREEMPTED}


#: A job that keeps its CPU (and so, on simulated GPUs, its GPU) busy for a while.
BUSY = "import time\nend = time.time() + 120\nwhile time.time() < end: pass"


@pytest.fixture(scope="module")
def slurm():
    with emulated_cluster(
        prefix="sc", nodes=len(NODES), gpus=GPUS_PER_NODE, folder_prefix="sluice-slurm-scenarios-"
    ) as layout:
        yield layout


@pytest.fixture
def pool(cluster, it_world, slurm):
    """The bridge started for this test (the database is new); afterwards every Slurm job
    of the partition is cancelled, so that the next test starts on an idle cluster."""
    # The quota above the pool's size: what a job waits for is the pool's GPUs.
    Quota.objects.filter(tenant=it_world["tenant"]).update(
        guaranteed_gpus=2 * len(NODES) * GPUS_PER_NODE, borrow_limit_gpus=0
    )
    _fresh_job_ids()
    cluster.env["SLURM_CONF"] = slurm["slurm_conf"]
    _start_bridge(cluster, slurm)
    client = SlurmClient(partition=PARTITION, conf=slurm["slurm_conf"])
    yield {**slurm, "client": client}
    cluster.stop_all()
    subprocess.run(["scancel", "--full", f"--partition={PARTITION}"], env=client.env, check=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(j.active for j in client.jobs()):
        time.sleep(0.5)


_id_blocks = itertools.count(1)


def _fresh_job_ids() -> None:
    """Job ids this module's cluster has not seen: the database starts again for each test,
    but the controller keeps ended jobs (``MinJobAge``) and the bridge's folders stay, both
    named by job id and attempt, as they are for good on a real site."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT setval(pg_get_serial_sequence(%s, 'id'), %s)",
            [Job._meta.db_table, next(_id_blocks) * 1_000_000],
        )


def _start_bridge(cluster, slurm):
    cluster._spawn(
        "bridge",
        [
            sys.executable,
            "-m",
            "scheduling.executors.slurm",
            "--pool",
            "training",
            "--partition",
            PARTITION,
            "--work-dir",
            str(slurm["work"]),
            "--broker",
            settings.CELERY_BROKER_URL,
            "--heartbeat",
            "1",
            "--refresh",
            "0.5",
        ],
    )
    cluster.wait_for(
        lambda: (
            Gpu.objects.filter(node__name__in=NODES).count() == len(NODES) * GPUS_PER_NODE
            and Node.objects.filter(name__in=NODES, state=NodeState.READY).count() == len(NODES)
        ),
        what="the partition's nodes registered",
    )


def _client(user):
    client = APIClient()
    client.force_authenticate(user=user)
    return client


def _spec(w, command, *, gpus=1, priority="", runtime=None):
    body = {
        "project": w["project"].pk,
        "queue": w["queue"].pk,
        "workload_type": "training",
        "command": ["sh", "-c", command],
        "gpus_per_node": gpus,
        "priority_class": priority,
    }
    if runtime:
        body["max_runtime_seconds"] = runtime
    return body


def _submit(w, command, **kwargs) -> int:
    response = _client(w["member"]).post("/api/v1/jobs", _spec(w, command, **kwargs), format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def _cancel(w, job_id) -> None:
    response = _client(w["member"]).post(f"/api/v1/jobs/{job_id}/cancel", {}, format="json")
    assert response.status_code == 200, response.json()


def _job(job_id) -> Job:
    return Job.objects.get(pk=job_id)


def _state(job_id) -> str:
    return _job(job_id).state


def _released(job_id) -> bool:
    return not Allocation.objects.filter(job_id=job_id, released_at__isnull=True).exists()


def _node_of(job_id) -> str:
    return (
        Allocation.objects.filter(job_id=job_id)
        .order_by("-id")
        .values_list("node__name", flat=True)
        .first()
    )


def _output(pool, job_id, attempt) -> str:
    """What the attempt's Slurm job wrote (the bridge's output file of it)."""
    path = pool["work"] / "jobs" / f"{job_id}-{attempt}" / "output.log"
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _slurm_jobs(pool, job_id):
    """The Slurm jobs the bridge submitted for a Sluice job (any attempt)."""
    return [j for j in pool["client"].jobs() if j.sluice and j.sluice[0] == job_id]


def test_waits_with_a_reason_while_the_pool_is_full_then_runs_and_cancel_frees_gpus(
    cluster, it_world, pool
):
    fillers = [_submit(it_world, "sleep 600", gpus=GPUS_PER_NODE) for _ in NODES]
    for job_id in fillers:
        cluster.wait_for(lambda j=job_id: _state(j) == JobState.RUNNING, what="filler running")
    assert {_node_of(j) for j in fillers} == set(NODES)

    waiter = _submit(it_world, 'echo "waited on $SLURMD_NODENAME"')
    job = cluster.wait_for(
        lambda: (j := _job(waiter)).pending_reason_code and j, what="a pending reason"
    )
    assert job.state == JobState.PENDING
    assert job.pending_reason_code == "WAITING_FOR_GPUS", job.pending_reason_message
    reason = _client(it_world["member"]).get(f"/api/v1/jobs/{waiter}").json()["pending_reason"]
    assert reason["code"] == "WAITING_FOR_GPUS" and reason["message"]
    # Sluice keeps the decision: nothing is queued in Slurm while the job waits.
    time.sleep(2)
    assert _state(waiter) == JobState.PENDING and _slurm_jobs(pool, waiter) == []

    _cancel(it_world, fillers[0])
    cluster.wait_for(lambda: _state(fillers[0]) == JobState.CANCELLED, timeout=30, what="cancel")
    cancelled = _job(fillers[0])
    assert _released(fillers[0])
    assert (cancelled.finished_at - cancelled.stop_requested_at).total_seconds() < 3 + 8
    # `sleep` ends on the SIGTERM (FAILED in Slurm's words), else the cancel after the grace.
    (slurm_job,) = _slurm_jobs(pool, fillers[0])
    assert slurm_job.state in ("FAILED", "CANCELLED") and not slurm_job.active

    cluster.wait_for(lambda: _state(waiter) == JobState.SUCCEEDED, timeout=30, what="waiter ran")
    done = _job(waiter)
    assert done.exit_code == 0 and _released(waiter)
    # It ran in the space the cancel freed, where Sluice placed it.
    assert _node_of(waiter) == _node_of(fillers[0])
    assert f"waited on {_node_of(waiter)}" in _output(pool, waiter, 0)
    _cancel(it_world, fillers[1])
    cluster.wait_for(lambda: _state(fillers[1]) == JobState.CANCELLED, timeout=30, what="cancel")


def test_a_higher_class_preempts_with_grace_and_the_preempted_job_is_requeued(
    cluster, it_world, pool
):
    # Any gain justifies a preemption here (the default asks for hours of it).
    cluster.kill("worker")
    cluster.env["SLUICE_PREEMPTION_MIN_GAIN_SECONDS"] = "0"
    cluster.start_worker()
    lows = [_submit(it_world, POLITE, gpus=GPUS_PER_NODE, priority="low") for _ in NODES]
    for job_id in lows:
        cluster.wait_for(lambda j=job_id: "ready" in _output(pool, j, 0), what="low ready")
    high = _submit(it_world, "sleep 3; echo high-done", gpus=GPUS_PER_NODE, priority="high")
    cluster.wait_for(
        lambda: _state(high) in (JobState.RUNNING, JobState.SUCCEEDED), timeout=60, what="high"
    )
    preempted = [j for j in lows if _job(j).preemption_count]
    assert len(preempted) == 1, [(j, _state(j)) for j in lows]
    (victim,) = preempted
    job = _job(victim)
    assert job.requeue_count == 1 and job.events.filter(kind="stop_preempted").exists()
    assert job.events.filter(kind="requeued").exists()
    # The first attempt saw SIGTERM and ended within the grace (3 s), not killed after it.
    assert "got-term" in _output(pool, victim, 0)
    (first,) = [s for s in _slurm_jobs(pool, victim) if s.sluice == (victim, 0)]
    assert first.state in ("CANCELLED", "FAILED", "COMPLETED") and first.exit_status is not None
    ended = job.events.filter(kind="preempted").order_by("id").first()
    stop = job.events.filter(kind="stop_preempted").order_by("id").first()
    assert ended is not None and (ended.created_at - stop.created_at).total_seconds() < 3 + 2
    # The high job got the victim's node.
    assert (
        _node_of(high)
        == Allocation.objects.filter(job_id=victim)
        .order_by("id")
        .values_list("node__name", flat=True)
        .first()
    )

    cluster.wait_for(lambda: _state(high) == JobState.SUCCEEDED, timeout=60, what="high done")
    cluster.wait_for(lambda: _state(victim) == JobState.RUNNING, timeout=60, what="low again")
    cluster.wait_for(lambda: "ready" in _output(pool, victim, 1), what="second attempt ready")
    assert [s.sluice[1] for s in _slurm_jobs(pool, victim)].count(1) == 1
    for job_id in lows:
        _cancel(it_world, job_id)
    for job_id in lows:
        cluster.wait_for(lambda j=job_id: _state(j) == JobState.CANCELLED, timeout=30, what="end")


def test_runtime_limit_warns_twice_then_times_out_and_kills_after_the_grace(
    cluster, it_world, pool
):
    polite = _submit(it_world, POLITE, runtime=5)
    stubborn = _submit(it_world, f'exec python3 -c "{IGNORES_SIGTERM}"', runtime=5)
    for job_id in (polite, stubborn):
        cluster.wait_for(
            lambda j=job_id: _state(j) == JobState.TIMED_OUT, timeout=60, what="timed out"
        )
    for job_id in (polite, stubborn):
        job = _job(job_id)
        warnings = job.events.filter(kind="runtime_warning").order_by("id")
        assert [e.data["fraction"] for e in warnings] == [0.8, 0.95]
        assert job.stop_reason == "timed_out" and job.events.filter(kind="stop_timed_out").exists()
        assert _released(job_id)
        ran = (job.stop_requested_at - job.started_at).total_seconds()
        assert 5 <= ran < 5 + 3, f"stopped {ran} s after its start"
    assert "got-term" in _output(pool, polite, 0)
    job = _job(polite)
    took = (job.finished_at - job.stop_requested_at).total_seconds()
    assert took < 3, f"the polite job took {took} s to end on SIGTERM"
    job = _job(stubborn)
    took = (job.finished_at - job.stop_requested_at).total_seconds()
    # Slurm's EndTime is in whole seconds (truncated): a kill 3 s after the stop at the
    # earliest reads as more than 2 s; a kill without the grace would read 0-1 s.
    assert took > 2, f"killed {took} s after the stop, before the 3 s grace"
    (slurm_job,) = _slurm_jobs(pool, stubborn)
    assert slurm_job.state == "CANCELLED"


def test_a_controller_restart_and_a_bridge_restart_lose_nothing(cluster, it_world, pool):
    job_id = _submit(it_world, "echo start; sleep 8; echo done")
    cluster.wait_for(lambda: _state(job_id) == JobState.RUNNING, what="running")
    slurm_cluster.restart_controller(pool["directory"])
    # The bridge killed outright while the job runs: a new one adopts it from the controller.
    cluster.kill("bridge")
    _start_bridge(cluster, pool)
    after = _submit(it_world, "echo after-restart")
    for done in (job_id, after):
        cluster.wait_for(lambda j=done: _state(j) == JobState.SUCCEEDED, timeout=60, what="done")
    job = _job(job_id)
    assert job.exit_code == 0 and job.requeue_count == 0 and _released(job_id)
    logs = _client(it_world["member"]).get(f"/api/v1/jobs/{job_id}/logs").json()["text"]
    assert logs == "start\ndone\n"
    assert len(_slurm_jobs(pool, job_id)) == 1 and len(_slurm_jobs(pool, after)) == 1
    ends = [e.kind for e in job.events.all() if e.kind in ("succeeded", "failed", "lost")]
    assert ends == ["succeeded"]


def test_a_job_cancelled_behind_sluices_back_ends_with_a_reason(cluster, it_world, pool):
    job_id = _submit(it_world, "sleep 600")
    cluster.wait_for(lambda: _state(job_id) == JobState.RUNNING, what="running")
    (slurm_job,) = _slurm_jobs(pool, job_id)
    subprocess.run(["scancel", slurm_job.job_id], env=pool["client"].env, check=True)
    cluster.wait_for(lambda: _state(job_id) in FINAL_STATES, timeout=30, what="ended")
    job = _job(job_id)
    assert job.state == JobState.FAILED and "not by Sluice" in job.failure_message
    assert job.exit_signal == 15 and _released(job_id)
    # The freed GPUs are Sluice's to place again at once.
    again = _submit(it_world, "true", gpus=GPUS_PER_NODE)
    cluster.wait_for(lambda: _state(again) == JobState.SUCCEEDED, timeout=30, what="again")


def _start_samplers(cluster):
    """The observe-only sampler of each node (simulated GPUs: a GPU's utilisation is the CPU
    use of the job holding it, found through its processes' ``SLURM_JOB_GPUS``)."""
    for node in NODES:
        cluster._spawn(
            f"sampler-{node}",
            [
                sys.executable,
                "-m",
                "scheduling.agent",
                "--node",
                node,
                "--observe-only",
                "--simulate",
                f"{GPUS_PER_NODE}xH100-80GB",
                "--broker",
                settings.CELERY_BROKER_URL,
                "--work-dir",
                str(cluster.work / node),
                "--heartbeat",
                "1",
            ],
        )


IDLE_WINDOW = 12


def test_an_idle_job_is_warned_and_reclaimed_and_a_busy_one_is_not(cluster, it_world, pool):
    WorkloadPolicy.objects.filter(workload_type="training").update(
        idle_reclaim_enabled=True,
        idle_utilization_threshold=5.0,
        # Longer than on agent pools: the busy job's first sample goes through Slurm's
        # start, the sampler finding its processes and a worker that may be busy.
        idle_window_seconds=IDLE_WINDOW,
        idle_warning_lead_seconds=3,
    )
    _start_samplers(cluster)
    idle = _submit(it_world, "sleep 600")
    busy = _submit(it_world, f'exec python3 -c "{BUSY}"')
    cluster.wait_for(lambda: _state(idle) == JobState.RECLAIMED, timeout=90, what="reclaim")
    job = _job(idle)
    warning = job.events.get(kind="idle_warning")
    stop = job.events.get(kind="stop_reclaimed")
    assert warning.created_at < stop.created_at
    idle_for = (job.stop_requested_at - job.started_at).total_seconds()
    assert IDLE_WINDOW <= idle_for < IDLE_WINDOW + 8, f"reclaimed after {idle_for} s"
    assert _released(idle)
    (slurm_job,) = _slurm_jobs(pool, idle)
    assert not slurm_job.active
    from scheduling.models import ReclaimRecord

    assert ReclaimRecord.objects.filter(job_id=idle, kind=ReclaimKind.IDLE_RECLAIM).exists()
    busy_job = _job(busy)
    assert busy_job.state == JobState.RUNNING, list(busy_job.events.values_list("kind", "message"))
    assert not busy_job.events.filter(kind="idle_warning").exists()
    assert busy_job.last_active_at is not None
    _cancel(it_world, busy)
    cluster.wait_for(lambda: _state(busy) == JobState.CANCELLED, timeout=30, what="cancel")


BURST = 100
KILLS = 3
PAUSE_SECONDS = 3.0


def test_every_job_of_a_burst_ends_exactly_once_while_the_worker_is_killed(cluster, it_world, pool):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    # As in the agent pools' test: a launch lost with a killed worker is requeued sooner,
    # and the worker's own absence does not make nodes lost.
    cluster.env["SLUICE_STUCK_LAUNCH_SECONDS"] = "10"
    cluster.env["SLUICE_NODE_LOST_SECONDS"] = "30"
    cluster.kill("worker")
    cluster.start_worker()
    spec = _spec(it_world, "true")
    response = _client(it_world["member"]).post(
        "/api/v1/jobs/bulk", {"jobs": [spec] * BURST}, format="json"
    )
    assert response.status_code == 201, response.json()
    ids = response.json()["ids"]
    started = time.monotonic()
    kills = []
    for generation in range(KILLS):
        cluster.wait_for(
            lambda: "ready." in (cluster.tmp / "worker.log").read_text(errors="replace"),
            what="worker ready",
        )
        time.sleep(rng.uniform(0.5, 4.0))
        kills.append(Job.objects.filter(pk__in=ids, state__in=FINAL_STATES).count())
        cluster.kill("worker", signal.SIGKILL)
        (cluster.tmp / "worker.log").rename(cluster.tmp / f"worker-{generation}.log")
        time.sleep(PAUSE_SECONDS)
        cluster.start_worker()
    context = f"seed {seed}, ended at each kill: {kills}"
    cluster.wait_for(
        lambda: not Job.objects.filter(pk__in=ids).exclude(state__in=FINAL_STATES).exists(),
        timeout=240,
        what=f"all {BURST} jobs ended ({context})",
    )
    context += f", took {time.monotonic() - started:.0f} s"
    failed = Job.objects.filter(pk__in=ids).exclude(state=JobState.SUCCEEDED)
    assert not failed.exists(), (
        list(failed.values_list("pk", "state", "failure_message")),
        context,
    )

    # Every attempt ended exactly once in the database; the last one succeeded.
    jobs = {j.pk: j for j in Job.objects.filter(pk__in=ids)}
    ends = defaultdict(list)
    stuck = defaultdict(int)
    for job_id, kind, data in JobEvent.objects.filter(job_id__in=ids).values_list(
        "job_id", "kind", "data"
    ):
        if isinstance(data, dict) and data.get("to") in END_STATES:
            ends[job_id].append(data["to"])
        if kind == "requeued" and isinstance(data, dict) and data.get("reason") == "stuck_launch":
            stuck[job_id] += 1
    for pk, job in jobs.items():
        assert len(ends[pk]) == job.requeue_count + 1 - stuck[pk], (pk, ends[pk], context)
        assert ends[pk].count(JobState.SUCCEEDED) == 1 and ends[pk][-1] == JobState.SUCCEEDED

    # No GPU allocated twice, nor left allocated.
    assert not Allocation.objects.filter(released_at__isnull=True).exists()
    by_gpu = defaultdict(list)
    for gpu, granted, released in Allocation.objects.values_list(
        "gpu_id", "granted_at", "released_at"
    ):
        by_gpu[gpu].append((granted, released))
    for gpu, spans in by_gpu.items():
        spans.sort()
        for (_, released), (granted, _) in zip(spans, spans[1:], strict=False):
            assert granted >= released, f"GPU {gpu} granted at {granted} before {released}"

    # Nothing launched twice in Slurm: the controller's records (kept for MinJobAge) hold at
    # most one Slurm job per attempt, every attempt one of the job's, and no two Slurm jobs
    # of one Sluice job ran at the same time; each job ran to completion once.
    records = [j for j in pool["client"].jobs() if j.sluice and j.sluice[0] in jobs]
    per_attempt = defaultdict(list)
    for record in records:
        per_attempt[record.sluice].append(record)
    doubled = {k: [r.job_id for r in v] for k, v in per_attempt.items() if len(v) > 1}
    assert not doubled, (doubled, context)
    by_job = defaultdict(list)
    for (job_id, attempt), (record,) in per_attempt.items():
        assert 0 <= attempt <= jobs[job_id].requeue_count, (job_id, attempt, context)
        by_job[job_id].append(record)
    assert set(by_job) == set(jobs), (set(jobs) - set(by_job), context)
    for job_id, runs in by_job.items():
        assert sum(r.state == "COMPLETED" for r in runs) == 1, (job_id, runs, context)
        spans = sorted((r.start_time, r.end_time) for r in runs if r.start_time)
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end, (job_id, runs, context)
    print(  # noqa: T201
        f"Slurm burst with worker kills: {context}; Slurm jobs {len(records)}, "
        f"requeues {sum(j.requeue_count for j in jobs.values())}, "
        f"stuck launches {sum(stuck.values())}"
    )
