"""No single process to lose: two dispatchers and two workers with beat on real processes,
PostgreSQL and Redis, draining a burst of short jobs on two agents while the dispatcher
that ran the last cycle, the worker whose beat holds the beat lock, and then the other
worker are each killed with SIGKILL (their whole process group).

What must hold: after each kill the other process of its kind takes the loop over within
``TAKEOVER_SECONDS`` (from the kill to the survivor's next dispatch cycle, or to its beat's
next task sent); every job ends exactly once per attempt that ran; no GPU is held by two
allocations at once in the database, nor runs two jobs at once on its node.

The drain is ``SLUICE_TAKEOVER_JOBS`` jobs (1,000 by default).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import pytest
from django.db import connection
from django.db.models import Count
from rest_framework.test import APIClient

from scheduling.choices import FINAL_STATES, JobState, NodeState
from scheduling.models import Allocation, Gpu, Job, JobEvent, Node, Quota
from tests.integration.conftest import Cluster
from tests.integration.test_worker_kill import _records

pytestmark = pytest.mark.integration

JOBS = int(os.environ.get("SLUICE_TAKEOVER_JOBS", "1000"))
TAKEOVER_SECONDS = 5.0
NODES = ("ha-01", "ha-02")
GPUS_PER_NODE = 8
END_STATES = {*FINAL_STATES, JobState.LOST, JobState.PREEMPTED}
#: Celery's log line prefix: "[2026-12-07 13:43:28,355: INFO/...".
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): ")
_CYCLE = "Task scheduling.dispatch["
_BEAT_SENT = "Scheduler: Sending due task"
_BEAT_LOCKED = "beat: Acquired lock"


class HaCluster(Cluster):
    """Two dispatchers (queue ``dispatch``) and two workers (``reports,control`` with beat),
    each in its own log; a restarted process writes a new log."""

    def __init__(self, tmp_path: Path, work: Path) -> None:
        super().__init__(tmp_path, work)
        self.generation: dict[str, int] = defaultdict(int)

    def log_path(self, name: str) -> Path:
        return self.tmp / f"{name}.{self.generation[name]}.log"

    def _spawn(self, name, args):
        proc = super()._spawn(name, args)
        # The parent class logs to <name>.log: keep each generation apart.
        (self.tmp / f"{name}.log").rename(self.log_path(name))
        return proc

    def start_dispatcher(self, name: str) -> None:
        self._celery(name, "dispatch", "--concurrency", "1")

    def start_beat_worker(self, name: str) -> None:
        self._celery(name, "reports,control", "--concurrency", "2", "--beat")

    def _celery(self, name: str, queues: str, *extra: str) -> None:
        self._spawn(
            name,
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "portal",
                "worker",
                "--queues",
                queues,
                "--hostname",
                f"{name}@%h",
                "--loglevel",
                "INFO",
                "--schedule",
                str(self.tmp / f"{name}-beat-schedule"),
                *extra,
            ],
        )

    def restart(self, name: str) -> None:
        self.generation[name] += 1
        (self.start_dispatcher if name.startswith("dispatcher") else self.start_beat_worker)(name)

    def stamps(self, name: str, marker: str) -> list[float]:
        """Unix times of the current log's lines of ``name`` that contain ``marker``."""
        times = []
        for line in self.log_path(name).read_text(errors="replace").splitlines():
            match = _STAMP.match(line)
            if match and marker in line and (marker != _CYCLE or "'skipped': False" in line):
                stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
                times.append(stamp.timestamp())
        return times

    def logs(self) -> str:
        return "\n".join(
            f"----- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.tmp.glob("*.log"))
        )


@pytest.fixture
def ha_cluster(transactional_db, tmp_path, settings):
    if connection.vendor != "postgresql" or not settings.CELERY_BROKER_URL.startswith("redis://"):
        pytest.skip(
            "integration tests need PostgreSQL (DATABASE_URL) and Redis (CELERY_BROKER_URL); see .ci/run"
        )
    settings.SLUICE_NODE_TRANSPORT = "broker"
    settings.CELERY_TASK_ALWAYS_EAGER = False
    from portal.celery import app

    app.conf.task_always_eager = False
    work = Path(tempfile.mkdtemp(prefix="sluice-ha-", dir="/var/tmp"))
    work.chmod(0o711)
    c = HaCluster(tmp_path, work)
    # Lost launches and nodes: as in the worker-kill test, a killed worker must not make
    # the survivors take nodes for lost, and a launch lost with a dispatcher comes back.
    c.env["SLUICE_STUCK_LAUNCH_SECONDS"] = "10"
    c.env["SLUICE_NODE_LOST_SECONDS"] = "30"
    yield c
    c.stop_all()
    c.kill_jobs()
    app.conf.task_always_eager = True
    shutil.rmtree(work, ignore_errors=True)


def _submit(w) -> list[int]:
    client = APIClient()
    client.force_authenticate(user=w["member"])
    spec = {
        "project": w["project"].pk,
        "queue": w["queue"].pk,
        "workload_type": "training",
        "command": ["true"],
        "gpus_per_node": 1,
    }
    ids: list[int] = []
    for start in range(0, JOBS, 250):
        count = min(250, JOBS - start)
        response = client.post("/api/v1/jobs/bulk", {"jobs": [spec] * count}, format="json")
        assert response.status_code == 201, response.json()
        ids += response.json()["ids"]
    return ids


def _ended(ids) -> int:
    connection.close()
    return Job.objects.filter(pk__in=ids, state__in=FINAL_STATES).count()


def _takeover(cluster: HaCluster, survivor: str, marker: str, killed_at: float) -> float:
    """Seconds from ``killed_at`` to the survivor's first ``marker`` line after it."""

    def next_one():
        return next((t for t in cluster.stamps(survivor, marker) if t > killed_at), None)

    return cluster.wait_for(next_one, timeout=30, what=f"{survivor}: {marker}") - killed_at


def test_one_leader_per_loop_survives_kills(ha_cluster, it_world):
    cluster = ha_cluster
    Quota.objects.filter(tenant=it_world["tenant"]).update(
        guaranteed_gpus=GPUS_PER_NODE * len(NODES), borrow_limit_gpus=0
    )
    for name in ("dispatcher-a", "dispatcher-b"):
        cluster.start_dispatcher(name)
    for name in ("worker-a", "worker-b"):
        cluster.start_beat_worker(name)
    for node in NODES:
        cluster.start_agent(node, simulate=f"{GPUS_PER_NODE}xH100-80GB")
    cluster.wait_for(
        lambda: (
            Node.objects.filter(name__in=NODES, state=NodeState.READY).count() == len(NODES)
            and Gpu.objects.filter(node__name__in=NODES).count() == GPUS_PER_NODE * len(NODES)
        ),
        what="agents registered",
    )
    # One beat holds the lock; the other waits for it.
    holder = cluster.wait_for(
        lambda: [w for w in ("worker-a", "worker-b") if cluster.stamps(w, _BEAT_LOCKED)],
        what="a beat holding the lock",
    )
    assert len(holder) == 1, cluster.logs()
    started = time.monotonic()
    ids = _submit(it_world)
    takeovers: dict[str, float] = {}

    # 1. The dispatcher that ran the latest cycle.
    cluster.wait_for(lambda: _ended(ids) >= JOBS // 10, timeout=120, what="a tenth ended")
    last = {
        d: max(cluster.stamps(d, _CYCLE), default=0.0) for d in ("dispatcher-a", "dispatcher-b")
    }
    leader = max(last, key=last.get)
    other = "dispatcher-b" if leader == "dispatcher-a" else "dispatcher-a"
    killed_at = time.time()
    cluster.kill(leader)
    takeovers["dispatch"] = _takeover(cluster, other, _CYCLE, killed_at)
    cluster.restart(leader)

    # 2. The worker whose beat holds the lock (its beat dies with it): the other's beat
    # acquires the lock and sends the next due task.
    cluster.wait_for(lambda: _ended(ids) >= JOBS // 4, timeout=120, what="a quarter ended")
    beat_holder = holder[0]
    standby = "worker-b" if beat_holder == "worker-a" else "worker-a"
    killed_at = time.time()
    cluster.kill(beat_holder)
    takeovers["beat"] = _takeover(cluster, standby, _BEAT_SENT, killed_at)
    # Once it holds the lock, the standby's beat alone sends tasks.
    assert cluster.stamps(standby, _BEAT_LOCKED), cluster.logs()
    cluster.restart(beat_holder)

    # 3. The other worker, now the beat holder: the restarted one takes over beat, and
    # the reports its victim held unacknowledged come back from the nodes' heartbeats.
    cluster.wait_for(lambda: _ended(ids) >= JOBS // 2, timeout=120, what="half ended")
    killed_at = time.time()
    cluster.kill(standby)
    takeovers["beat again"] = _takeover(cluster, beat_holder, _BEAT_SENT, killed_at)
    cluster.restart(standby)

    cluster.wait_for(lambda: _ended(ids) == len(ids), timeout=300, what=f"all {JOBS} jobs ended")
    context = f"took {time.monotonic() - started:.0f} s, takeovers {takeovers}"
    print(f"takeover: {context}")  # noqa: T201
    assert all(t <= TAKEOVER_SECONDS for t in takeovers.values()), context

    # Only successes, but launches the node reports failed.
    failed = Job.objects.filter(pk__in=ids).exclude(state=JobState.SUCCEEDED)
    assert all(
        state == JobState.FAILED and message.startswith("Launch failed")
        for state, message in failed.values_list("state", "failure_message")
    ), (list(failed.values_list("pk", "state", "failure_message")[:20]), context)

    # Every attempt that ran ended exactly once; the last end is the job's state.
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
        runs = job.requeue_count + 1 - stuck[pk]
        assert len(ends[pk]) == runs, (pk, ends[pk], job.requeue_count, stuck[pk], context)
        assert ends[pk][-1] == job.state, (pk, ends[pk], context)

    # No GPU held twice, in the database...
    assert not Allocation.objects.filter(released_at__isnull=True).exists()
    assert not (
        Allocation.objects.values("job_id", "gpu_id", "granted_at")
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
    # ... nor on the nodes.
    by_node_gpu = defaultdict(list)
    for record in _records(cluster):
        if record.get("started_at") and record.get("finished_at"):
            for index in record.get("gpu_indices") or []:
                by_node_gpu[(record["node"], index)].append(
                    (record["started_at"], record["finished_at"], record["job_id"])
                )
    for where, runs in by_node_gpu.items():
        runs.sort()
        for (_, finished, a), (begun, _, b) in zip(runs, runs[1:], strict=False):
            assert begun >= finished, f"jobs {a} and {b} overlapped on {where} ({context})"
    # Each job ran once per attempt on the nodes (none started twice by two dispatchers).
    starts = defaultdict(int)
    for record in _records(cluster):
        starts[(record["job_id"], record["attempt"])] += 1
    assert all(n == 1 for n in starts.values()), context


def test_a_beat_that_lost_its_lock_stands_by_until_it_holds_it_again(settings):
    """A holder that could not renew in time (another beat took the lock meanwhile) does
    not die: its tick waits for the lock, then it goes on as the holder."""
    if not settings.CELERY_BROKER_URL.startswith("redis://"):
        pytest.skip("needs Redis (CELERY_BROKER_URL); see .ci/run")
    from redbeat.schedulers import acquire_distributed_beat_lock, get_redis

    from portal.beat import BeatScheduler
    from portal.celery import app

    app.conf.redbeat_redis_url = settings.CELERY_BROKER_URL
    app.conf.redbeat_key_prefix = f"sluice:beat-test-{os.getpid()}:"
    app.conf.redbeat_lock_timeout = 3
    app.conf.redbeat_redis_options = {}
    app.conf.beat_max_loop_interval = 0.2
    try:
        scheduler = BeatScheduler(app=app, lazy=True)
        scheduler.lock_key = app.redbeat_conf.lock_key
        acquire_distributed_beat_lock(sender=type("S", (), {"scheduler": scheduler}))
        redis = get_redis(app)
        # The lock expired during a stall and another beat holds it for a second.
        redis.set(scheduler.lock_key, "another-beat", px=1000)
        began = time.monotonic()
        assert scheduler.tick() == 0.0
        assert time.monotonic() - began >= 0.5
        assert scheduler.lock.owned()
        assert redis.get(scheduler.lock_key) != b"another-beat"
        scheduler.lock.release()
    finally:
        for key in (
            "redbeat_redis_url",
            "redbeat_key_prefix",
            "redbeat_lock_timeout",
            "redbeat_redis_options",
        ):
            app.conf.pop(key, None)
        app.conf.beat_max_loop_interval = settings.CELERY_BEAT_MAX_LOOP_INTERVAL
