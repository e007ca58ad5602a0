"""A burst of short jobs on real processes while the Celery worker is killed (SIGKILL of its
process group: worker, pool children and beat) five times at random moments and started
again after a pause (3 s here, not the issue's 10 s, to keep the test near two minutes;
the worker is down long enough for reports, heartbeats and dispatch requests to pile up
in Redis, and a killed worker's unacknowledged messages only come back after the broker's
visibility timeout, far beyond the test).

What must hold at the end: every job ran to its end exactly once per attempt (one end
event per attempt that ran, only the last one final, requeues accounted for; every job
SUCCEEDED but for launches the agent reports failed); no job stayed RUNNING
more than two heartbeat intervals (plus a worker's start-up) after its process was gone;
no GPU was ever held by two allocations at once, nor run two jobs at once on its node;
no allocation is left active.
"""

from __future__ import annotations

import json
import random
import time
from collections import defaultdict

import pytest
from django.db.models import Count
from rest_framework.test import APIClient

from scheduling.choices import ACTIVE_STATES, FINAL_STATES, JobState, NodeState
from scheduling.models import Allocation, Gpu, Job, JobEvent, Node, Quota

pytestmark = pytest.mark.integration

JOBS = 200
KILLS = 5
PAUSE_SECONDS = 3.0
HEARTBEAT_SECONDS = 1.0  # the agents' --heartbeat in conftest
#: What the bound allows beyond two heartbeat intervals after a process ended (or after a
#: restarted worker said it is ready): the worker's latency on a busy 2-core machine.
SLACK_SECONDS = 5.0
END_STATES = {*FINAL_STATES, JobState.LOST, JobState.PREEMPTED}
NODES = ("kill-01", "kill-02")
GPUS_PER_NODE = 8


def _submit_burst(w) -> list[int]:
    client = APIClient()
    client.force_authenticate(user=w["member"])
    spec = {
        "project": w["project"].pk,
        "queue": w["queue"].pk,
        "workload_type": "training",
        "command": ["sleep", "0.3"],
        "gpus_per_node": 1,
    }
    response = client.post("/api/v1/jobs/bulk", {"jobs": [spec] * JOBS}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["ids"]


def _records(cluster) -> list[dict]:
    """Every job attempt the agents ran, from their state files."""
    records = []
    for path in cluster.work.glob("*/jobs/*/state.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written
        record["node"] = path.parts[-4]
        records.append(record)
    return records


class Watch:
    """Polls the database and the agents' state files: a job the portal still has RUNNING
    (or ADMITTED, STOPPING) whose process ended longer ago than the bound is a failure.
    While the worker is down (killed, or not yet ready) the clock does not run."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.worker_ready_at: float | None = time.time()
        self.late: dict[tuple[int, int], float] = {}

    def worker_down(self) -> None:
        self.worker_ready_at = None

    def bound(self, finished_at: float) -> float:
        assert self.worker_ready_at is not None
        since = max(finished_at, self.worker_ready_at)
        return since + 2 * HEARTBEAT_SECONDS + SLACK_SECONDS

    def check(self) -> None:
        from django.db import connection

        connection.close()
        now = time.time()
        if self.worker_ready_at is None:
            if "ready." not in (self.cluster.tmp / "worker.log").read_text(errors="replace"):
                return
            self.worker_ready_at = now
        active = {
            (pk, attempt)
            for pk, attempt in Job.objects.filter(state__in=ACTIVE_STATES).values_list(
                "pk", "requeue_count"
            )
        }
        for record in _records(self.cluster):
            key = (record["job_id"], record["attempt"])
            if key in active and record.get("finished") and record.get("finished_at"):
                overdue = now - self.bound(record["finished_at"])
                if overdue > 0:
                    self.late[key] = max(self.late.get(key, 0.0), overdue)

    def wait(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.check()
            time.sleep(0.5)


def test_jobs_end_exactly_once_while_the_worker_is_killed(cluster, it_world):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    Quota.objects.filter(tenant=it_world["tenant"]).update(
        guaranteed_gpus=GPUS_PER_NODE * len(NODES), borrow_limit_gpus=0
    )
    for node in NODES:
        cluster.start_agent(node, simulate=f"{GPUS_PER_NODE}xH100-80GB")
    cluster.wait_for(
        lambda: (
            Node.objects.filter(name__in=NODES, state=NodeState.READY).count() == len(NODES)
            and Gpu.objects.filter(node__name__in=NODES).count() == GPUS_PER_NODE * len(NODES)
        ),
        what="agents registered",
    )
    # Restarted workers requeue a launch lost with a killed worker sooner than conftest's
    # 30 s, and do not take nodes for lost because the worker itself was away (conftest's
    # 6 s is less than a kill's pause plus a start; a killed agent is another test's case).
    cluster.env["SLUICE_STUCK_LAUNCH_SECONDS"] = "10"
    cluster.env["SLUICE_NODE_LOST_SECONDS"] = "30"
    started = time.monotonic()
    ids = _submit_burst(it_world)
    watch = Watch(cluster)
    kills = []
    for generation in range(KILLS):
        # A random moment of a worker at work (a restarted one is ready first).
        cluster.wait_for(lambda: watch.check() or watch.worker_ready_at, what="worker ready")
        watch.wait(rng.uniform(0.5, 5.0))
        kills.append(Job.objects.filter(pk__in=ids, state__in=FINAL_STATES).count())
        cluster.kill("worker")
        watch.worker_down()
        (cluster.tmp / "worker.log").rename(cluster.tmp / f"worker-{generation}.log")
        time.sleep(PAUSE_SECONDS)
        cluster.start_worker()

    def all_ended():
        watch.check()
        return not Job.objects.filter(pk__in=ids).exclude(state__in=FINAL_STATES).exists()

    try:
        cluster.wait_for(all_ended, timeout=150, what=f"all {JOBS} jobs ended (seed {seed})")
    except AssertionError:
        left = Job.objects.filter(pk__in=ids).exclude(state__in=FINAL_STATES)
        raise AssertionError(
            f"not ended: {list(left.values_list('pk', 'state', 'requeue_count')[:20])}, "
            f"late: {watch.late}, seed {seed}, ended at each kill: {kills}"
        ) from None
    context = f"seed {seed}, ended at each kill: {kills}, took {time.monotonic() - started:.0f} s"
    # A launch may fail on the node (the agent says why); nothing else may end a job but
    # its success.
    failed = Job.objects.filter(pk__in=ids).exclude(state=JobState.SUCCEEDED)
    assert all(
        state == JobState.FAILED and message.startswith("Launch failed")
        for state, message in failed.values_list("state", "failure_message")
    ), (list(failed.values_list("pk", "state", "failure_message")), context)

    # No job stayed RUNNING long after its process ended.
    assert not watch.late, f"jobs active after their process ended: {watch.late} ({context})"

    # Every attempt ended exactly once; the last one succeeded.
    jobs = {j.pk: j for j in Job.objects.filter(pk__in=ids)}
    ends = defaultdict(list)
    requeues = defaultdict(int)
    stuck = defaultdict(int)
    for job_id, kind, data in JobEvent.objects.filter(job_id__in=ids).values_list(
        "job_id", "kind", "data"
    ):
        if isinstance(data, dict) and data.get("to") in END_STATES:
            ends[job_id].append(data["to"])
        if kind == "requeued":
            requeues[job_id] += 1
            # A stuck launch is requeued without having run: that attempt has no end.
            stuck[job_id] += isinstance(data, dict) and data.get("reason") == "stuck_launch"
    for pk, job in jobs.items():
        runs = job.requeue_count + 1 - stuck[pk]
        assert len(ends[pk]) == runs, (pk, ends[pk], job.requeue_count, stuck[pk], context)
        assert ends[pk][-1] == job.state, (pk, ends[pk], context)
        assert all(end in (JobState.LOST, JobState.PREEMPTED) for end in ends[pk][:-1])
        assert requeues[pk] == job.requeue_count, (pk, requeues[pk], context)

    # What the kills cost, for whoever reads the output (-s): jobs ended from a heartbeat
    # (their reports were lost with a worker), lost and stuck attempts requeued.
    print(  # noqa: T201
        f"worker kills: {context}; ended or started from a heartbeat: "
        f"{JobEvent.objects.filter(job_id__in=ids, data__reconciled=True).count()}, "
        f"attempts lost: {sum(e.count(JobState.LOST) for e in ends.values())}, "
        f"stuck launches requeued: {sum(stuck.values())}, launch failures: {failed.count()}"
    )

    # No GPU was held twice at once, in the database...
    assert not Allocation.objects.filter(released_at__isnull=True).exists()
    assert not (
        Allocation.objects.filter(released_at__isnull=True)
        .values("gpu")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .exists()
    )
    by_gpu = defaultdict(list)
    for gpu, granted, released in Allocation.objects.values_list(
        "gpu_id", "granted_at", "released_at"
    ):
        by_gpu[gpu].append((granted, released))
    for gpu, spans in by_gpu.items():
        spans.sort()
        for (_, released), (granted, _) in zip(spans, spans[1:], strict=False):
            assert granted >= released, f"GPU {gpu} granted at {granted} before {released}"

    # ... nor on the nodes: two processes on one GPU at the same time.
    by_node_gpu = defaultdict(list)
    for record in _records(cluster):
        if record.get("started_at") and record.get("finished_at"):
            for index in record.get("gpu_indices") or []:
                by_node_gpu[(record["node"], index)].append(
                    (record["started_at"], record["finished_at"], record["job_id"])
                )
    for where, runs in by_node_gpu.items():
        runs.sort()
        for (_, finished, a), (started, _, b) in zip(runs, runs[1:], strict=False):
            assert started >= finished, f"jobs {a} and {b} overlapped on {where} ({context})"
