"""Fleet benchmark: the real control plane against N simulated nodes.

    .venv/bin/python bench/fleet.py [--nodes 1000] [--gpus 8] [--jobs 10000] [--shards 4]
                                    [--heartbeat 10] [--runtime-median 20] [--keep]
                                    [--heartbeats-queue heartbeats]

Starts the control plane as ``bench/e2e.py`` does (PostgreSQL + Redis, gunicorn, the
dispatcher, the worker with beat; ``DEBUG=0``), then ``--shards`` fleet processes that
play the nodes: each runs the node runtime (:mod:`scheduling.executors.runtime`) over its
share of the nodes with :class:`SimulatedExecutor`, through the real transport and
protocol: the node queues on Redis (one consumer per shard reads all its nodes' queues),
``register``, ``heartbeat`` (with per-GPU samples), ``started``, ``exited`` and ``log``
reports as Celery task messages on the ``reports`` queue, the heartbeats on the
``heartbeats`` queue that the worker drains every second (``--heartbeats-queue ""``: with
the other reports, as agents before that queue sent them). A job "runs" for the seconds
its ``sleep`` command names, without a process.

Then: an idle phase (heartbeats only: control-plane CPU per heartbeat), a workload of
``--jobs`` jobs of 1, 2, 4 and 8 GPUs (50/20/15/15 %) whose runtimes are log-normal around
``--runtime-median`` seconds (capped at 6 ×): real runtimes compressed in time, submitted in
bulk requests of 500 while the fleet drains them. Printed and appended to
``bench/results/fleet.jsonl``: CPU per node-heartbeat and per report of the worker (from
/proc; per heartbeat sent and per heartbeat handled), dispatch cycle p50/p99 (the
dispatcher's task results' ``total_ms``), placements/s, the reports queue's lag (a probe
task sent every 0.5 s through the reports queue, lag = when the worker recorded it minus
when it was sent) and the heartbeats' lag (from a heartbeat's ``sent_at`` to its drain's
commit; each heartbeat counted at the lag of its drain's oldest, so the p99 is an upper
bound), both idle and under the workload, ``/metrics`` scrape time, rollup time (the
worker's ``insights.rollup`` task runtimes), database growth per 100k jobs (extrapolated
from the run), the machine's load.

What is simplified: a shard's reports of several nodes may share a message when
``--batch-reports`` > 1 (default 1: one report a message, as many nodes with one report
each would send); the shard's consumer does not acknowledge a message after handling it
(no redelivery for a shard that dies); no serving jobs.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import heapq
import json
import math
import os
import pickle
import random
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

from kombu.exceptions import KombuError
from redis.exceptions import RedisError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


from scheduling.executors.base import (  # noqa: E402
    Capabilities,
    Executor,
    Exited,
    GpuSample,
    LogChunk,
    NodeInfo,
    Running,
    Started,
)

POOL = "fleet"
MODEL = "H100-80GB"
SIZES = ((1, 0.5), (2, 0.2), (4, 0.15), (8, 0.15))
RESULTS = ROOT / "bench" / "results" / "fleet.jsonl"
TENANTS = 4


def log(message: str) -> None:
    print(f"[fleet {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- the node side: a simulated executor and a shared consumer --------------------------------


class SimulatedExecutor(Executor):
    """Nodes whose jobs run for their ``sleep`` seconds without a process."""

    kind = "agent"

    def __init__(self, names: list[str], gpus: int) -> None:
        self.names = names
        self.gpus = gpus
        self.jobs: dict[str, dict[tuple[int, int], dict]] = {n: {} for n in names}
        self.ends: list[tuple[float, str, int, int]] = []
        self.events: list = []
        self.counts = {"started": 0, "exited": 0, "log": 0}
        self._infos = [
            NodeInfo(
                name=n,
                gpus=[
                    {
                        "index": i,
                        "uuid": f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{n}/{i}')}",
                        "model": MODEL,
                        "name": "Simulated H100 80GB",
                        "memory_mb": 81920,
                    }
                    for i in range(gpus)
                ],
            )
            for n in names
        ]

    def capabilities(self) -> Capabilities:
        return Capabilities(
            images=False, gpu_isolation="simulated", run_as="nobody", limits=(), serving=False
        )

    def nodes(self) -> list[NodeInfo]:
        return self._infos

    def launch(self, node: str, message) -> None:
        key = (message["job_id"], message["attempt"])
        command = message["command"]
        try:
            seconds = float(command[-1]) if command and command[0] == "sleep" else 0.0
        except ValueError:
            seconds = 0.0
        self.jobs[node][key] = {"gpus": list(message["gpu_indices"])}
        heapq.heappush(self.ends, (time.monotonic() + seconds, node, *key))
        self.events.append(Started(job_id=key[0], attempt=key[1], node=node))
        self.counts["started"] += 1

    def stop(self, node: str, message) -> None:
        key = (message["job_id"], message["attempt"])
        held = self.jobs[node].pop(key, None)
        self.events.append(
            Exited(
                job_id=key[0],
                attempt=key[1],
                node=node,
                exit_code=None,
                signal=15 if held else None,
                reason=message["reason"] if held else "",
                message="" if held else "not running on this node",
            )
        )
        self.counts["exited"] += 1

    def work(self) -> None:
        now = time.monotonic()
        while self.ends and self.ends[0][0] <= now:
            _, node, job_id, attempt = heapq.heappop(self.ends)
            if self.jobs[node].pop((job_id, attempt), None) is None:
                continue  # stopped meanwhile
            line = f"job {job_id} done\n".encode()
            self.events.append(
                LogChunk(job_id=job_id, attempt=attempt, node=node, offset=0, data=line)
            )
            self.events.append(
                Exited(job_id=job_id, attempt=attempt, node=node, exit_code=0, signal=None)
            )
            self.counts["log"] += 1
            self.counts["exited"] += 1

    def due_in(self) -> float:
        return max(0.0, self.ends[0][0] - time.monotonic()) if self.ends else 1.0

    def poll(self):
        events, self.events = self.events, []
        return events

    def running(self) -> list[Running]:
        return [
            Running(job_id=j, attempt=a, node=n) for n, jobs in self.jobs.items() for j, a in jobs
        ]

    def gpu_samples(self) -> list[GpuSample]:
        return []

    def job_summaries(self, node: str) -> list[dict[str, Any]]:
        return [
            {"job_id": j, "attempt": a, "pid": 0, "running": True, "stop_reason": None}
            for j, a in self.jobs[node]
        ]

    def heartbeat_fields(self, node: str):
        busy = {i for job in self.jobs[node].values() for i in job["gpus"]}
        gpus = [
            {
                "index": i,
                "utilization": 95.0 if i in busy else 0.0,
                "memory_used_mb": 60000 if i in busy else 0,
                "processes": [],
            }
            for i in range(self.gpus)
        ]
        return {"gpus": gpus, "jobs": self.job_summaries(node), "zombies": [], "kills": []}, None


class _Inbox:
    """One node's messages, filled by the shard's consumer (no descriptor: the runtime
    looks at each inbox in turn)."""

    class _Message:
        def __init__(self, payload: Any) -> None:
            self.payload = payload

        def ack(self) -> None:
            return None

    def __init__(self) -> None:
        self.items: deque = deque()

    def get(self, timeout: float):
        try:
            return self._Message(self.items.popleft())
        except IndexError:
            return None

    def close(self) -> None:
        return None


def _consume(url: str, inboxes: dict[str, _Inbox], stop: threading.Event) -> None:
    """One kombu consumer over every node queue of the shard (one BRPOP on Redis)."""
    from scheduling.agent.protocol import node_queue_name
    from scheduling.agent.transport import broker_connection, node_queue

    by_queue = {node_queue_name(n): inbox for n, inbox in inboxes.items()}

    def handle(body, message) -> None:
        inbox = by_queue.get(message.delivery_info.get("routing_key", ""))
        if inbox is not None:
            inbox.items.append(body)

    while not stop.is_set():
        try:
            with broker_connection(url) as connection:
                queues = [node_queue(n) for n in inboxes]
                with connection.Consumer(queues, callbacks=[handle], accept=["json"], no_ack=True):
                    while not stop.is_set():
                        with contextlib.suppress(TimeoutError):
                            connection.drain_events(timeout=1.0)
        except (OSError, KombuError, RedisError) as exc:  # broker gone: retry
            log(f"consumer: {exc}")
            time.sleep(1.0)


def play(args) -> int:
    """A shard: nodes ``--first`` .. ``--first + --count - 1`` until SIGTERM."""
    import signal

    from scheduling.agent.transport import CeleryReportSender
    from scheduling.executors.runtime import Runtime, RuntimeConfig, RuntimeNode

    names = [f"fleet-{i:04d}" for i in range(args.first, args.first + args.count)]
    inboxes = {n: _Inbox() for n in names}
    stop = threading.Event()
    threading.Thread(target=_consume, args=(args.broker, inboxes, stop), daemon=True).start()
    executor = SimulatedExecutor(names, args.gpus)
    sender = CeleryReportSender(args.broker, heartbeats_queue=args.heartbeats_queue)
    config = RuntimeConfig(
        heartbeat_seconds=args.heartbeat,
        max_batch_reports=args.batch_reports,
        max_messages_per_pass=1000,
        poll_seconds=0.02,
    )
    runtime = Runtime(
        executor, [RuntimeNode(n, inboxes[n], POOL) for n in names], sender, config=config
    )
    heartbeats = [0]
    original = runtime._heartbeat

    def counted(node=None):
        heartbeats[0] += len(names) if node is None else 1
        original(node)

    runtime._heartbeat = counted
    signal.signal(signal.SIGTERM, runtime.request_stop)
    runtime.start()
    # Nodes of a real fleet do not beat in step: spread the next heartbeats over an interval.
    now = time.monotonic()
    for name in names:
        runtime._next_heartbeat[name] = now + random.uniform(0, args.heartbeat)
    next_stats = 0.0
    while not runtime._stop_requested:
        runtime.tick()
        if time.monotonic() >= next_stats:
            next_stats = time.monotonic() + 2.0
            stats = {"heartbeats": heartbeats[0], **executor.counts, "outbox": len(runtime.outbox)}
            tmp = Path(f"{args.stats}.tmp")
            tmp.write_text(json.dumps(stats))
            tmp.replace(args.stats)
    stop.set()
    runtime.close()
    return 0


# --- seeding (a subprocess with the cluster's environment) ------------------------------------


def seed(nodes: int, gpus: int) -> dict:
    import secrets

    import django

    django.setup()
    from django.contrib.auth import get_user_model

    import scheduling.tasks  # noqa: F401
    from accounts.services import api_token_create
    from scheduling.choices import WorkloadType
    from scheduling.services import config
    from tenants import services as tenants

    admin = get_user_model().objects.create_superuser(
        "fleet-admin", password=secrets.token_urlsafe(16)
    )
    user = tenants.user_create(
        actor=admin, username="fleet-user", password=secrets.token_urlsafe(16)
    )
    pool = config.pool_save(actor=admin, name=POOL, description="Fleet benchmark pool")
    normal = config.priority_class_save(actor=admin, name="normal", value=400)
    config.workload_policy_save(
        actor=admin,
        workload_type=WorkloadType.TRAINING,
        preemptible=False,
        default_runtime_seconds=600,
        max_runtime_seconds=86400,
        stop_grace_seconds=5,
    )
    world: dict[str, Any] = {"queues": [], "projects": []}
    share = nodes * gpus // TENANTS
    for t in range(TENANTS):
        tenant = tenants.tenant_create(actor=admin, slug=f"fleet-{t}", name=f"fleet {t}")
        tenants.membership_add(actor=admin, tenant=tenant, user=user, role="admin")
        config.quota_save(
            actor=admin, tenant=tenant, pool=pool, guaranteed_gpus=share, borrow_limit_gpus=share
        )
        queue = config.queue_save(
            actor=admin,
            tenant=tenant,
            name="q",
            pool=pool,
            default_priority_class=normal,
            max_self_service_class=normal,
        )
        project = tenants.project_create(actor=admin, tenant=tenant, slug="p", name="p")
        world["queues"].append(queue.pk)
        world["projects"].append(project.pk)
    _, world["token"] = api_token_create(user=user, name="fleet bench", expires_in_days=1)
    return world


# --- the bench --------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


class Prober:
    """Sends ``scheduling.reports_probe(sent_at)`` through the reports queue every
    ``every`` seconds and watches the worker record it in the cache: the queue's lag."""

    def __init__(self, broker: str, every: float = 0.5) -> None:
        import redis
        from celery import Celery

        from scheduling.agent.protocol import REPORTS_QUEUE

        self.queue = REPORTS_QUEUE
        self.app = Celery("fleet-probe", broker=broker, set_as_current=False, fixups=[])
        self.app.conf.update(task_serializer="json", task_ignore_result=True, result_backend=None)
        self.redis = redis.Redis.from_url(broker)
        self.every = every
        self.sent: deque = deque()
        self.lags: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _handled(self) -> float:
        # scheduling.services.nodes.REPORTS_PROBE_KEY, under Django's cache key prefix.
        for key in self.redis.scan_iter(match="*sluice:reports:probe", count=1000):
            raw = self.redis.get(key)
            if raw is not None:
                try:
                    return float(raw)
                except ValueError:
                    return float(pickle.loads(raw))  # noqa: S301 - Django's own cache value
        return 0.0

    def _loop(self) -> None:
        next_send = 0.0
        while not self._stop.wait(0.05):
            now = time.time()
            if now >= next_send:
                self.app.send_task(
                    "scheduling.reports_probe", args=[now], queue=self.queue, ignore_result=True
                )
                self.sent.append(now)
                next_send = now + self.every
            handled = self._handled()
            while self.sent and self.sent[0] <= handled:
                self.lags.append(time.time() - self.sent.popleft())

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _database(cluster, sql: str, *params):
    import psycopg

    with psycopg.connect(cluster.backend.database_url, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def _task_times(path: Path, task: str) -> list[tuple[float, Any]]:
    """Each ``task`` success in a Celery log: its runtime in seconds and its result."""
    pattern = re.compile(rf"Task {re.escape(task)}\[[^\]]+\] succeeded in ([0-9.]+)s: (.*)$")
    out: list[tuple[float, Any]] = []
    for line in path.read_text(errors="replace").splitlines():
        match = pattern.search(line)
        if match:
            try:
                value = ast.literal_eval(match.group(2))
            except (ValueError, SyntaxError):
                value = None
            out.append((float(match.group(1)), value))
    return out


_HANDLED = re.compile(
    r"Task scheduling\.agent_reports\[[^\]]+\] succeeded in [0-9.]+s: \{'reports': (\d+)"
)


def _reports_handled(path: Path) -> int:
    """Reports the worker has handled so far: the sum of its ``scheduling.agent_reports``
    successes' counts in its log, and of the heartbeats its drains applied (a worker that
    falls behind handles fewer than were sent)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return 0
    return sum(int(m.group(1)) for m in _HANDLED.finditer(text)) + sum(n for n, _ in _drains(path))


def _drains(path: Path) -> list[tuple[int, float]]:
    """Each heartbeat drain in the worker's log so far: (heartbeats applied, the oldest
    one's lag in seconds), for drains that applied any."""
    if not path.exists():
        return []
    return [
        (value["heartbeats"], value["lag_max_s"])
        for _, value in _task_times(path, "scheduling.heartbeats_drain")
        if isinstance(value, dict)
        and value.get("heartbeats")
        and value.get("lag_max_s") is not None
    ]


def _drain_cpu_ms(path: Path) -> tuple[int, float]:
    """Heartbeats the worker's drains applied so far, and the drains' own CPU (ms) for them
    (the drain tasks' bodies: Celery's cost of running each drain task is left out)."""
    beats, cpu = 0, 0.0
    if path.exists():
        for _, value in _task_times(path, "scheduling.heartbeats_drain"):
            if isinstance(value, dict):
                beats += value.get("heartbeats") or 0
                cpu += value.get("cpu_ms") or 0.0
    return beats, cpu


def _weighted_percentile(pairs: list[tuple[int, float]], q: float) -> float | None:
    """The ``q`` percentile of values each counted ``weight`` times ((weight, value) pairs)."""
    total = sum(w for w, _ in pairs)
    if not total:
        return None
    seen = 0
    for weight, value in sorted(pairs, key=lambda p: p[1]):
        seen += weight
        if seen >= q * total:
            return value
    return pairs[-1][1]


def _shard_stats(tmp: Path) -> dict[str, int]:
    total: dict[str, int] = {}
    for path in tmp.glob("shard-*.json"):
        try:
            for key, value in json.loads(path.read_text()).items():
                total[key] = total.get(key, 0) + value
        except (OSError, ValueError):
            continue
    return total


def _metrics_scrape(url: str, token: str) -> float:
    import urllib.request

    request = urllib.request.Request(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()
    return time.perf_counter() - started


def bench(args) -> int:
    import e2e

    backend = e2e.choose_backend("postgres", args.postgres, args.redis)
    tmp = Path(tempfile.mkdtemp(prefix="sluice-fleet-"))
    cluster = e2e.Cluster(backend, tmp)
    metrics_token = uuid.uuid4().hex
    cluster.env.update({"SLUICE_METRICS_TOKEN": metrics_token, "SLUICE_NODE_LOST_SECONDS": "120"})
    result: dict[str, Any] = {
        "bench": "fleet",
        "revision": e2e._revision(),
        "nodes": args.nodes,
        "gpus_per_node": args.gpus,
        "jobs": args.jobs,
        "shards": args.shards,
        "heartbeat_seconds": args.heartbeat,
        "batch_reports": args.batch_reports,
        "heartbeats_queue": args.heartbeats_queue,
        "runtime_median_s": args.runtime_median,
        "cpus": os.cpu_count(),
    }
    vacuum = e2e.Vacuumer(backend, 60.0)
    prober = None
    try:
        cluster.prepare_database()
        out = cluster.run(
            "seed",
            [
                sys.executable,
                __file__,
                "--seed-only",
                "--nodes",
                str(args.nodes),
                "--gpus",
                str(args.gpus),
            ],
        )
        world = json.loads(out.strip().splitlines()[-1])
        e2e.NODES = 0  # the control plane only: the fleet plays the nodes
        cluster.start()
        vacuum.start()
        per_shard = math.ceil(args.nodes / args.shards)
        for shard in range(args.shards):
            first = shard * per_shard
            count = min(per_shard, args.nodes - first)
            if count <= 0:
                break
            cluster._spawn(
                f"shard-{shard}",
                [
                    "nice", "-n", "5", sys.executable, __file__, "--play",
                    "--first", str(first), "--count", str(count), "--gpus", str(args.gpus),
                    "--heartbeat", str(args.heartbeat), "--batch-reports", str(args.batch_reports),
                    "--heartbeats-queue", args.heartbeats_queue,
                    "--broker", backend.redis_url, "--stats", str(tmp / f"shard-{shard}.json"),
                ],
            )  # fmt: skip
        t0 = time.monotonic()
        while True:
            ready = _database(
                cluster, "SELECT count(*) FROM scheduling_node WHERE state = 'ready'"
            )[0][0]
            if ready >= args.nodes:
                break
            cluster.check_alive()
            if time.monotonic() - t0 > 300:
                raise e2e.BenchError(f"only {ready} of {args.nodes} nodes registered")
            time.sleep(1)
        result["register_s"] = round(time.monotonic() - t0, 1)
        log(f"{args.nodes} nodes registered in {result['register_s']} s")
        prober = Prober(backend.redis_url)
        prober.start()

        # Idle: heartbeats only, once the worker has caught up with the registrations
        # (the reports queue's lag under a second), so that no backlog is counted.
        settle = time.monotonic()
        while time.monotonic() - settle < 120 and not (
            len(prober.lags) >= 3 and max(prober.lags[-3:]) < 1.0
        ):
            time.sleep(0.5)
        time.sleep(args.heartbeat)
        idle_mark = len(prober.lags)
        result["idle_settled"] = bool(prober.lags) and max(prober.lags[-3:]) < 1.0
        result["load_avg_1m_idle"] = os.getloadavg()[0]
        worker_log = tmp / "worker.log"
        before, stats0 = cluster.cpu_seconds(), _shard_stats(tmp)
        handled0, drains0 = _reports_handled(worker_log), len(_drains(worker_log))
        drained0 = _drain_cpu_ms(worker_log)
        time.sleep(args.idle_seconds)
        after, stats1 = cluster.cpu_seconds(), _shard_stats(tmp)
        handled = _reports_handled(worker_log) - handled0
        idle_drains = _drains(worker_log)[drains0:]
        beats = stats1.get("heartbeats", 0) - stats0.get("heartbeats", 0)
        worker_idle = after["worker"] - before["worker"]
        result["idle_heartbeats"] = beats
        result["idle_heartbeats_handled"] = handled
        # Per heartbeat sent (the figure of earlier runs): too low where the worker fell
        # behind; per heartbeat handled: what one costs (the idle phase has no other reports).
        result["cpu_ms_per_heartbeat_worker"] = round(1000 * worker_idle / max(1, beats), 2)
        result["cpu_ms_per_heartbeat_handled_worker"] = (
            round(1000 * worker_idle / handled, 2) if handled else None
        )
        result["cpu_ms_per_heartbeat_postgres"] = round(
            1000 * (after.get("postgres", 0) - before.get("postgres", 0)) / max(1, beats), 2
        )
        result["idle_lag_p99_s"] = _percentile(prober.lags[idle_mark:], 0.99)
        result["idle_heartbeat_lag_p99_s"] = _weighted_percentile(idle_drains, 0.99)
        result["idle_heartbeat_drains"] = len(idle_drains)
        drained1 = _drain_cpu_ms(worker_log)
        drained = drained1[0] - drained0[0]
        result["cpu_ms_per_heartbeat_in_drains"] = (
            round((drained1[1] - drained0[1]) / drained, 3) if drained else None
        )
        log(f"idle: {beats} heartbeats, worker {result['cpu_ms_per_heartbeat_worker']} ms each")

        # The workload.
        size_before = _database(cluster, "SELECT pg_database_size(current_database())")[0][0]
        api = e2e.Api(cluster.url, world["token"])
        rng = random.Random(52)
        specs = []
        sigma = 0.8
        for i in range(args.jobs):
            gpus = rng.choices([s for s, _ in SIZES], [w for _, w in SIZES])[0]
            runtime = min(
                6 * args.runtime_median, rng.lognormvariate(math.log(args.runtime_median), sigma)
            )
            t = i % TENANTS
            specs.append(
                {
                    "project": world["projects"][t],
                    "queue": world["queues"][t],
                    "workload_type": "training",
                    "command": ["sleep", f"{runtime:.1f}"],
                    "gpus_per_node": gpus,
                }
            )
        gpu_seconds = sum(float(s["command"][1]) * s["gpus_per_node"] for s in specs)
        result["ideal_drain_s"] = round(gpu_seconds / (args.nodes * args.gpus), 1)
        lag_mark = len(prober.lags)
        result["load_avg_1m_start"] = os.getloadavg()[0]
        before, stats0 = cluster.cpu_seconds(), _shard_stats(tmp)
        handled0, drains0 = _reports_handled(worker_log), len(_drains(worker_log))
        started = time.monotonic()
        for chunk in range(0, len(specs), 500):
            api.post("jobs/bulk", {"jobs": specs[chunk : chunk + 500]})
        result["submit_s"] = round(time.monotonic() - started, 1)
        scrapes: list[float] = []
        next_scrape = 0.0
        ended = 0
        while True:
            now = time.monotonic()
            if now >= next_scrape:
                scrapes.append(_metrics_scrape(cluster.url, metrics_token))
                next_scrape = now + 15
            ended = _database(
                cluster, "SELECT count(*) FROM scheduling_job WHERE finished_at IS NOT NULL"
            )[0][0]
            if ended >= args.jobs or now - started > args.timeout:
                break
            cluster.check_alive()
            time.sleep(2)
        drain = time.monotonic() - started
        after, stats1 = cluster.cpu_seconds(), _shard_stats(tmp)
        result["complete"] = ended >= args.jobs
        result["ended"] = ended
        result["drain_s"] = round(drain, 1)
        result["ended_per_s"] = round(ended / drain, 1)
        # Placements from the first start to the last (the starts' own times).
        starts, span = _database(
            cluster,
            "SELECT count(*), extract(epoch FROM max(started_at) - min(started_at)) "
            "FROM scheduling_job WHERE started_at IS NOT NULL",
        )[0]
        result["placements_per_s"] = round(starts / max(float(span or 0), 0.001), 1)
        reports = sum(stats1.get(k, 0) - stats0.get(k, 0) for k in ("started", "exited", "log"))
        beats = stats1.get("heartbeats", 0) - stats0.get("heartbeats", 0)
        worker = after["worker"] - before["worker"]
        heartbeat_cpu = beats * result["cpu_ms_per_heartbeat_worker"] / 1000
        result["workload_reports"] = reports
        result["workload_heartbeats"] = beats
        # Heartbeats and reports together (the idle figure above includes beat's own
        # periodic tasks, so the split below is an estimate).
        result["cpu_ms_per_message_worker"] = round(1000 * worker / max(1, reports + beats), 2)
        result["cpu_ms_per_report_worker"] = round(
            1000 * max(0.0, worker - heartbeat_cpu) / max(1, reports), 2
        )
        handled = _reports_handled(worker_log) - handled0
        result["workload_messages_handled"] = handled
        result["cpu_ms_per_message_handled_worker"] = (
            round(1000 * worker / handled, 2) if handled else None
        )
        for name in ("web", "dispatcher", "worker", "postgres", "redis", "machine"):
            result[f"cpu_s_{name}"] = round(after.get(name, 0) - before.get(name, 0), 1)
        result["cpu_s_fleet"] = round(
            sum(after[k] - before.get(k, 0) for k in after if k.startswith("shard-")), 1
        )
        lags = prober.lags[lag_mark:]
        result["report_lag_p50_s"] = _percentile(lags, 0.5)
        result["report_lag_p99_s"] = _percentile(lags, 0.99)
        result["report_lag_max_s"] = max(lags) if lags else None
        drains = _drains(worker_log)[drains0:]
        result["heartbeat_drains"] = len(drains)
        result["heartbeat_lag_p50_s"] = _weighted_percentile(drains, 0.5)
        result["heartbeat_lag_p99_s"] = _weighted_percentile(drains, 0.99)
        result["heartbeat_lag_max_s"] = max((lag for _, lag in drains), default=None)
        cycles = [
            c["total_ms"]
            for _, c in _task_times(tmp / "dispatcher.log", "scheduling.dispatch")
            if isinstance(c, dict) and not c.get("skipped")
        ]
        result["dispatch_cycles"] = len(cycles)
        result["dispatch_p50_ms"] = _percentile(cycles, 0.5)
        result["dispatch_p99_ms"] = _percentile(cycles, 0.99)
        result["dispatch_max_ms"] = max(cycles) if cycles else None
        rollups = [t for t, _ in _task_times(tmp / "worker.log", "insights.rollup")]
        result["rollups"] = len(rollups)
        result["rollup_p50_s"] = _percentile(rollups, 0.5)
        result["rollup_max_s"] = max(rollups) if rollups else None
        result["metrics_scrape_p50_s"] = round(statistics.median(scrapes), 3)
        result["metrics_scrape_max_s"] = round(max(scrapes), 3)
        size_after = _database(cluster, "SELECT pg_database_size(current_database())")[0][0]
        result["db_growth_mb_per_100k_jobs_extrapolated"] = round(
            (size_after - size_before) / max(1, ended) * 100_000 / 2**20, 1
        )
        result["load_avg_1m_end"] = os.getloadavg()[0]
        errors = sum(p.read_text(errors="replace").count("Traceback") for p in tmp.glob("*.log"))
        result["tracebacks_in_logs"] = errors
        # Both the reports queue and (when heartbeats go apart) the heartbeats' own lag.
        heartbeat_lags = [result["idle_heartbeat_lag_p99_s"], result["heartbeat_lag_p99_s"]]
        result["lag_target_ok"] = (
            result["report_lag_p99_s"] is not None
            and result["report_lag_p99_s"] <= 2
            and (result["idle_lag_p99_s"] or 0) <= 2
            and all(lag is None or lag <= 2 for lag in heartbeat_lags)
            and (not args.heartbeats_queue or result["heartbeat_drains"] > 0)
        )
        result["dispatch_target_ok"] = (
            result["dispatch_p99_ms"] is not None and result["dispatch_p99_ms"] <= 1000
        )
        result["at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        print(json.dumps(result))
        for key, value in result.items():
            print(f"  {key:45} {value}", file=sys.stderr)
        if not args.no_record:
            with RESULTS.open("a") as f:
                f.write(json.dumps(result) + "\n")
        return 0
    except Exception:
        print(cluster.log_tails(), file=sys.stderr)
        raise
    finally:
        if prober is not None:
            prober.stop()
        vacuum.stop()
        cluster.stop()
        cluster.drop()
        if args.keep:
            log(f"logs kept in {tmp}")
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--heartbeat", type=float, default=10.0)
    parser.add_argument("--batch-reports", type=int, default=1)
    parser.add_argument(
        "--heartbeats-queue",
        default="heartbeats",
        help='the queue the nodes send heartbeats to ("": with the other reports)',
    )
    parser.add_argument("--runtime-median", type=float, default=20.0, help="seconds")
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--timeout", type=float, default=600.0, help="give the drain up after this")
    parser.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--no-record", action="store_true", help="do not append to fleet.jsonl")
    parser.add_argument("--seed-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--play", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--broker", default="", help=argparse.SUPPRESS)
    parser.add_argument("--stats", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.seed_only:
        print(json.dumps(seed(args.nodes, args.gpus)))
        return 0
    if args.play:
        return play(args)
    sys.path.insert(0, str(ROOT / "bench"))
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())
