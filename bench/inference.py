"""Inference services bench: a traffic ramp through real agents and replicas.

    .venv/bin/python bench/inference.py [--backend auto|postgres|embedded]
        [--low 5] [--high 60] [--warm 20] [--up 40] [--hold 40] [--down 40] [--tail 60]
        [--step-rate HIGH] [--step-rest DELAY] [--step-hold 30] [--step-tail 30]
        [--training-jobs 2] [--training-gpus 4] [--training-class urgent]
        [--training-guarantee 8]
        [--service-ms 100] [--concurrency 2] [--slo-ms 400] [--max-replicas 8]
        [--png bench-inference.png] [--keep]

Starts its own cluster as bench/e2e.py does (a temporary folder, its own database: gunicorn,
the dispatcher, the worker with beat, and 2 node agents × 4 simulated A100 GPUs in pool
``inference``), creates a service through ``POST /api/v1/services/`` whose replicas are
``scheduling/agent/sample_model_server.py`` (``--service-ms`` of simulated GPU time per
request, ``--concurrency`` at once, the rest wait), one GPU each, ``min_replicas`` 1,
``max_replicas``, a target of ``--target`` ongoing requests per replica (default 0.7 ×
``--concurrency``) and a p95 SLO.

Then it offers an open-loop load (requests sent on a schedule whatever the answers, so a
slow service sees its queue grow, as real users do): ``--low`` requests/s for ``--warm`` s,
a linear ramp to ``--high`` over ``--up`` s, ``--hold`` s at the peak, down to ``--low``
over ``--down`` s and ``--tail`` s there (to see the scale-down): the *ramp*. Then, after
``--step-rest`` s more at ``--low`` (default the scale-down delay, for the scale-down to
settle), a *step*: the load jumps from ``--low`` to ``--step-rate`` (default ``--high``;
negative: no step) at once, holds ``--step-hold`` s and drops back to ``--low`` for
``--step-tail`` s. Requests go round robin to the ready endpoints of
``GET /api/v1/services/{id}/endpoints`` (read every second), as a load balancer fed by
``manage.py service_upstreams`` would.

During the ramp up, ``--training-jobs`` training jobs of another tenant (``research``,
``--training-guarantee`` GPUs guaranteed in the same pool, so they are admitted within
quota, and wait for GPUs only) arrive through the API, ``--training-gpus`` GPUs on one
node each (default a whole node: none is free while replicas run on both nodes), at class
``--training-class`` (``urgent``: ``can_preempt``); the i-th of n at warm + up × i / n,
each sleeping until the end of the hold (at least 20 s); those still waiting or running
when the ramp ends are cancelled, so the step starts on a pool without training. The
replicas' class and the inference policy are preemptible in this world, so only the
engine's rule "training never preempts inference"
(DESIGN.md §6) keeps the replicas running when the training jobs find no idle GPU.

Prints, per second: offered load, answered requests, errors, replicas (live and ready),
the client's p95 latency; at the end one JSON line and one line per target (MET / NOT MET):
over the ramp's seconds, the share of seconds with p95 within the SLO after the first
scale-up and the GPU-hours used against a static deployment at ``max_replicas``, the
scale-up decision's delay after the ramp began (and after the first onset of an overload:
more offered than the ready replicas serve); flapping over the whole run (a scale-up within
the scale-down delay after a scale-down); the step's reaction: seconds from the step to the
first ScaleDecision raising the desired count (``GET /api/v1/services/{id}/decisions``)
against the panic window; and the training jobs' outcome, read from the database (the API
lists current allocations only): replica jobs stopped by preemption (a ``stop_preempted``
event, stop_reason ``preempted`` or a preemption count; must be 0), preemptions made by a
training job, and for each training job its GPUs, its wait, the pending reasons it showed and
whether a replica held one of its GPUs at the same time. ``--png`` draws the run
(matplotlib), the step and the training arrivals marked.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.e2e import API_ERRORS, Api, BenchError, Cluster, choose_backend  # noqa: E402

POOL = "inference"
NODES = 2
GPUS_PER_NODE = 4
SERVICE_NAME = "chat"
LIVE = ("PENDING", "HELD", "ADMITTED", "RUNNING")


def log(message: str) -> None:
    print(f"[inference {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class InferenceCluster(Cluster):
    """bench/e2e.py's cluster with inference nodes (and the services' tick every second)."""

    def __init__(self, backend, tmp: Path) -> None:
        super().__init__(backend, tmp)
        self.env["SLUICE_SERVICE_INTERVAL"] = "1"
        self.env["SLUICE_SERVICE_DECISION_EVERY_S"] = "5"

    def seed(self, args) -> dict:
        out = self.run(
            "seed",
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--seed-only",
                "--server",
                str(self.server_path()),
                *_service_args(args),
            ],
        )
        return json.loads(out.strip().splitlines()[-1])

    def outcome(self, info: dict) -> dict:
        out = self.run(
            "outcome",
            [sys.executable, str(Path(__file__).resolve()), "--outcome-only", json.dumps(info)],
        )
        return json.loads(out.strip().splitlines()[-1])

    def server_path(self) -> Path:
        return self.var / "agent" / "sample_model_server.py"

    def start(self) -> None:
        py = sys.executable
        self._spawn(
            "web",
            [py, "-m", "gunicorn", "portal.wsgi", "--bind", f"127.0.0.1:{self.port}",
             "--workers", "2", "--threads", "4"],
        )  # fmt: skip
        celery = [py, "-m", "celery", "-A", "portal", "worker", "--loglevel", "INFO"]
        self._spawn(
            "dispatcher",
            [*celery, "--queues", "dispatch", "--concurrency", "1", "--hostname", "dispatcher@%h"],
        )
        self._spawn(
            "worker",
            [*celery, "--queues", "reports,control", "--concurrency", "2", "--beat",
             "--schedule", str(self.var / "celerybeat-schedule"), "--hostname", "worker@%h"],
        )  # fmt: skip
        agent_dir = self.var / "agent"
        for i in range(1, NODES + 1):
            node = f"infer-{i}"
            args = [py, "-m", "scheduling.agent", "--node", node, "--pool", POOL, "--simulate",
                    f"{GPUS_PER_NODE}xA100-40GB", "--broker", self.env["CELERY_BROKER_URL"],
                    "--work-dir", str(agent_dir / node)]  # fmt: skip
            if self.backend.name == "embedded":
                args += ["--broker-dir", self.env["SLUICE_BROKER_DIR"]]
            self._spawn(f"agent-{node}", args)


def _service_args(args) -> list[str]:
    return [
        "--service-ms", str(args.service_ms), "--concurrency", str(args.concurrency),
        "--slo-ms", str(args.slo_ms), "--max-replicas", str(args.max_replicas),
        "--training-guarantee", str(args.training_guarantee),
    ]  # fmt: skip


# --- seeding (a subprocess with the cluster's environment) -----------------------------------


def seed(args) -> dict:
    """Pool ``inference`` (no workload-type restriction: it admits training too), tenant
    ``serve`` (8 GPUs guaranteed there) whose member submits the service, and tenant
    ``research`` (``--training-guarantee`` GPUs guaranteed in the same pool) whose training
    jobs arrive during the ramp at class ``urgent`` (``can_preempt``).

    The replicas' class ``normal`` and the inference workload policy are both
    *preemptible*, so the class rule alone (an urgent job may preempt lower, preemptible
    work) would let the training jobs stop a replica: only the engine's rule "training
    never preempts inference" (DESIGN.md §6) keeps them, which is what the bench checks."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    import scheduling.tasks  # noqa: F401 - registers the dispatch task the services request
    from accounts.services import api_token_create
    from scheduling.choices import WorkloadType
    from scheduling.services import config
    from tenants import services as tenants

    User = get_user_model()
    admin = User.objects.create_superuser("inf-admin", password=secrets.token_urlsafe(16))
    user = tenants.user_create(actor=admin, username="inf-user", password=secrets.token_urlsafe(16))
    pool = config.pool_save(
        actor=admin, name=POOL, purpose="inference", description="Inference bench pool"
    )
    normal = config.priority_class_save(actor=admin, name="normal", value=400, preemptible=True)
    urgent = config.priority_class_save(
        actor=admin, name="urgent", value=900, can_preempt=True, preemptible=False
    )
    config.workload_policy_save(
        actor=admin,
        workload_type=WorkloadType.INFERENCE,
        preemptible=True,
        default_runtime_seconds=3600,
        max_runtime_seconds=86400,
        stop_grace_seconds=2,
    )
    config.workload_policy_save(
        actor=admin,
        workload_type=WorkloadType.TRAINING,
        preemptible=True,
        default_runtime_seconds=600,
        max_runtime_seconds=86400,
        stop_grace_seconds=2,
    )
    world = {}
    for slug, name, gpus, classes, types in (
        ("serve", "Serving", NODES * GPUS_PER_NODE, (normal, normal), [WorkloadType.INFERENCE]),
        ("research", "Research", args.training_guarantee, (normal, urgent),
         [WorkloadType.TRAINING]),
    ):  # fmt: skip
        tenant = tenants.tenant_create(actor=admin, slug=slug, name=name)
        if os.geteuid() == 0:  # as root, jobs run as an existing unprivileged account
            tenants.tenant_update(actor=admin, tenant=tenant, unix_account="nobody")
        tenants.membership_add(actor=admin, tenant=tenant, user=user, role="member")
        config.quota_save(
            actor=admin, tenant=tenant, pool=pool, guaranteed_gpus=gpus, borrow_limit_gpus=0
        )
        queue = config.queue_save(
            actor=admin,
            tenant=tenant,
            name=slug,
            pool=pool,
            default_priority_class=classes[0],
            max_self_service_class=classes[1],
            allowed_workload_types=types,
        )
        project = tenants.project_create(
            actor=admin, tenant=tenant, slug="llm" if slug == "serve" else "train", name=name
        )
        key = "" if slug == "serve" else "training_"
        world[f"{key}queue"], world[f"{key}project"] = queue.pk, project.pk
    _, world["token"] = api_token_create(user=user, name="inference bench", expires_in_days=1)
    return world


# --- the load ---------------------------------------------------------------------------------


class Profile:
    """Offered requests/s at second ``t``: low, ramp up, hold, ramp down, low (the ramp,
    ``ramp_length`` s); then, with a ``--step-rate``, a step: ``step_rate`` at once from
    ``step_at`` for ``--step-hold`` s, and ``--low`` again for ``--step-tail`` s."""

    def __init__(self, args) -> None:
        self.low, self.high = args.low, args.high
        self.edges = [args.warm, args.warm + args.up, args.warm + args.up + args.hold]
        self.edges.append(self.edges[-1] + args.down)
        self.ramp_length = self.edges[-1] + args.tail
        self.step_rate = args.step_rate
        self.step_at = self.ramp_length + (args.step_rest if self.step_rate > 0 else 0)
        self.step_end = self.step_at + (args.step_hold if self.step_rate > 0 else 0)
        self.length = self.step_end + (args.step_tail if self.step_rate > 0 else 0)

    def rate(self, t: float) -> float:
        if t >= self.ramp_length:
            return self.step_rate if self.step_at <= t < self.step_end else self.low
        w, u, h, d = self.edges
        if t < w:
            return self.low
        if t < u:
            return self.low + (self.high - self.low) * (t - w) / (u - w)
        if t < h:
            return self.high
        if t < d:
            return self.high - (self.high - self.low) * (t - h) / (d - h)
        return self.low


class Run:
    """Sends the profile's requests and records what happened each second."""

    def __init__(
        self,
        api: Api,
        service_id: int,
        profile: Profile,
        arrivals: TrainingArrivals | None = None,
    ) -> None:
        self.api, self.service_id, self.profile = api, service_id, profile
        self.arrivals = arrivals
        self.targets: list[int] = []
        self.replicas: dict[int, tuple[int, int]] = {}  # second -> (live, ready)
        self.latencies: dict[int, list[float]] = {}
        self.errors: dict[int, int] = {}
        self.offered: dict[int, int] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.t0 = 0.0

    def _watch(self) -> None:
        while not self.stop.is_set():
            second = int(time.monotonic() - self.t0)
            try:
                rows = self.api.get(f"services/{self.service_id}/endpoints")
            except API_ERRORS:
                rows = None
            if rows is not None:
                live = [e for e in rows if e["state"] in ("PENDING", "ADMITTED", "RUNNING")]
                ready = [e for e in rows if e["ready"] and e["port"]]
                self.targets = [e["port"] for e in ready]
                self.replicas[second] = (len(live), len(ready))
            time.sleep(1.0)

    def _one(self, second: int, index: int) -> None:
        import http.client

        targets = self.targets
        started = time.monotonic()
        ok = False
        if targets:
            port = targets[index % len(targets)]
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                conn.request("GET", "/infer")
                response = conn.getresponse()
                response.read()
                conn.close()
                ok = response.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
        elapsed = time.monotonic() - started
        with self.lock:
            if ok:
                self.latencies.setdefault(second, []).append(elapsed)
            else:
                self.errors[second] = self.errors.get(second, 0) + 1

    def run(self) -> None:
        self.t0 = time.monotonic()
        watcher = threading.Thread(target=self._watch, daemon=True)
        watcher.start()
        if self.arrivals is not None:
            threading.Thread(
                target=self.arrivals.run, args=(self.t0, self.stop), daemon=True
            ).start()
            threading.Thread(target=self.arrivals.watch, args=(self.stop,), daemon=True).start()
        sent = 0
        budget = 0.0
        with ThreadPoolExecutor(max_workers=256) as pool:
            tick = 0.02
            t = 0.0
            while t < self.profile.length:
                budget += self.profile.rate(t) * tick
                second = int(t)
                while budget >= 1:
                    budget -= 1
                    pool.submit(self._one, second, sent)
                    sent += 1
                    self.offered[second] = self.offered.get(second, 0) + 1
                t += tick
                delay = self.t0 + t - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            self.stop.set()
        watcher.join(timeout=5)


class TrainingArrivals:
    """Training jobs of tenant ``research`` arriving during the ramp: ``--training-jobs``
    jobs of ``--training-gpus`` GPUs on one node each at class ``--training-class``, the
    i-th of n submitted at warm + up × i / n (the last at the peak), each sleeping until
    the end of the hold (at least 20 s). Same pool and GPU model as the replicas: past the
    idle GPUs, the only GPUs they could get are the replicas'."""

    def __init__(self, api: Api, world: dict, args, profile: Profile) -> None:
        self.api, self.world, self.args, self.profile = api, world, args, profile
        self.jobs: list[dict] = []  # {"id", "at", "seconds"}
        self.errors: list[str] = []
        self.reasons: dict[int, set[str]] = {}  # job -> pending reason codes seen
        self.cancelled: list[int] = []  # still waiting or running at the ramp's end

    def watch(self, stop: threading.Event) -> None:
        """The training jobs' pending reasons, every 2 s (what they were waiting for)."""
        while not stop.wait(2.0):
            if not self.jobs:
                continue
            try:
                rows = self.api.get(
                    "jobs/", project=self.world["training_project"], state="PENDING", page_size=500
                )["results"]
            except API_ERRORS:  # a missed sample
                continue
            for row in rows:
                if row.get("pending_reason"):
                    self.reasons.setdefault(row["id"], set()).add(row["pending_reason"]["code"])

    def times(self) -> list[float]:
        n = self.args.training_jobs
        w, u, _, _ = self.profile.edges
        return [w + (u - w) * (i + 1) / n for i in range(n)]

    def run(self, t0: float, stop: threading.Event) -> None:
        hold_end = self.profile.edges[2]
        for i, at in enumerate(self.times()):
            if stop.wait(max(0.0, t0 + at - time.monotonic())):
                return
            seconds = max(20, int(hold_end - at))
            spec = {
                "project": self.world["training_project"],
                "queue": self.world["training_queue"],
                "name": f"train-{i + 1}",
                "workload_type": "training",
                "command": ["sleep", str(seconds)],
                "gpus_per_node": self.args.training_gpus,
                "priority_class": self.args.training_class,
                "max_runtime_seconds": 600,
            }
            try:
                job = self.api.post("jobs/", spec)
            except API_ERRORS as exc:  # reported in the summary
                self.errors.append(str(exc)[:300])
                log(f"training job {i + 1} refused: {exc}")
                continue
            self.jobs.append({"id": job["id"], "at": at, "seconds": seconds})
            log(f"t={at:.0f}s training job {job['id']} submitted ({self.args.training_gpus} GPUs)")
        if stop.wait(max(0.0, t0 + self.profile.ramp_length - time.monotonic())):
            return
        for arrival in self.jobs:  # the step starts on a pool without training
            with contextlib.suppress(*API_ERRORS):
                if self.api.get(f"jobs/{arrival['id']}")["state"] in LIVE:
                    self.api.post(f"jobs/{arrival['id']}/cancel", {"reason": "ramp ended"})
                    self.cancelled.append(arrival["id"])
                    log(f"training job {arrival['id']} cancelled at the ramp's end")


def outcome(info: dict) -> dict:
    """(A subprocess with the cluster's environment.) From the database, since the API
    lists a job's current allocations only: the service's replica jobs stopped by
    preemption (a ``stop_preempted`` event, stop_reason ``preempted`` or a preemption
    count), preemptions whose preemptor is a training job, and for each training job the
    GPUs it held and whether a replica held one of them at the same time."""
    import django

    django.setup()
    from django.db.models import Q
    from django.utils import timezone

    from scheduling.models import Allocation, Job, JobEvent

    now = timezone.now()
    replica_ids = list(Job.objects.filter(project_id=info["project"]).values_list("id", flat=True))
    preempted = set(
        JobEvent.objects.filter(job_id__in=replica_ids, kind="stop_preempted").values_list(
            "job_id", flat=True
        )
    )
    preempted |= set(
        Job.objects.filter(id__in=replica_ids)
        .filter(Q(stop_reason="preempted") | Q(preemption_count__gt=0))
        .values_list("id", flat=True)
    )
    training_ids = set(
        Job.objects.filter(project_id=info["training_project"]).values_list("id", flat=True)
    )
    by_training = [
        {"victim": job_id, "preemptor": data.get("preemptor")}
        for job_id, data in JobEvent.objects.filter(kind="stop_preempted").values_list(
            "job_id", "data"
        )
        if isinstance(data, dict) and data.get("preemptor") in training_ids
    ]
    replica_gpus = [
        (gpu, start, end or now)
        for gpu, start, end in Allocation.objects.filter(job_id__in=replica_ids).values_list(
            "gpu_id", "granted_at", "released_at"
        )
    ]
    jobs = []
    for job in Job.objects.filter(id__in=training_ids).order_by("id"):
        held = list(
            Allocation.objects.filter(job=job).values_list(
                "gpu_id", "node__name", "gpu__index", "granted_at", "released_at"
            )
        )
        shared = sum(
            1
            for gpu, _, _, start, end in held
            for r_gpu, r_start, r_end in replica_gpus
            if gpu == r_gpu and start < r_end and r_start < (end or now)
        )
        jobs.append(
            {
                "id": job.pk,
                "state": job.state,
                "stop_reason": job.stop_reason,
                "gpus": [f"{node}/{index}" for _, node, index, _, _ in held],
                "waited_s": (
                    round((job.started_at - job.submitted_at).total_seconds(), 1)
                    if job.started_at
                    else None
                ),
                "gpus_shared_with_replicas": shared,
            }
        )
    return {
        "replica_jobs": len(replica_ids),
        "replicas_preempted": len(preempted),
        "replicas_preempted_ids": sorted(preempted),
        "preemptions_by_training": by_training,
        "training": jobs,
    }


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def summarize(run: Run, decisions: list[dict], args, started_at: datetime) -> dict:
    """The ramp's figures (SLO share, GPU-hours, reactions) over the ramp's seconds only;
    the step's reaction and SLO share apart; flaps over the whole run."""
    seconds = range(int(run.profile.length))
    ramp = range(int(run.profile.ramp_length))
    replicas = {}
    last = (0, 0)
    for s in seconds:  # carry the last reading over seconds the watcher missed
        last = run.replicas.get(s, last)
        replicas[s] = last
    p95 = {s: _p95(run.latencies.get(s, [])) for s in seconds}
    decisions = sorted(decisions, key=lambda d: d["at"])

    def second_of(d):
        return (datetime.fromisoformat(d["at"]) - started_at).total_seconds()

    ups = [d for d in decisions if d["desired"] > d["current"]]
    downs = [d for d in decisions if d["desired"] < d["current"]]
    first_up = next((second_of(d) for d in ups if second_of(d) >= 0), None)
    ramp_start = args.warm
    # Overload onsets: seconds the offered load went above what the ready replicas can
    # serve (replicas × concurrency / service time). The reaction to one is the delay of
    # the first scale-up decided from one panic window before it on (0 when earlier).
    capacity = args.concurrency / (args.service_ms / 1000.0)

    def overloaded(s):
        return run.offered.get(s, 0) > replicas[s][1] * capacity

    onsets = [s for s in ramp if s >= 1 and overloaded(s) and not overloaded(s - 1)]
    reactions = []
    for s in onsets:
        later = [second_of(d) for d in ups if second_of(d) >= s - args.panic_window]
        reactions.append(max(0.0, min(later) - s) if later else None)
    up_after_ramp = [second_of(d) for d in ups if second_of(d) >= ramp_start]
    after_first_up = [s for s in ramp if first_up is not None and s >= first_up]
    judged = [s for s in after_first_up if p95[s] is not None]
    within = [s for s in judged if p95[s] * 1000 <= args.slo_ms]
    flaps = ramp_flaps = 0
    for d in downs:
        t = second_of(d)
        if any(0 < second_of(u) - t < args.scale_down_delay for u in ups):
            flaps += 1
            ramp_flaps += t < run.profile.ramp_length
    gpu_seconds = sum(replicas[s][0] for s in ramp)
    static = args.max_replicas * len(ramp)
    step: dict = {}
    if run.profile.step_rate > 0:
        at = run.profile.step_at
        step_ups = [d for d in ups if second_of(d) >= at]
        phase = [s for s in seconds if s >= at and p95[s] is not None]
        first = step_ups[0] if step_ups else None
        delay = round(second_of(first) - at, 1) if first else None
        step = {
            "step_at_s": at,
            "step_rate": run.profile.step_rate,
            "replicas_before_step": replicas[int(at) - 1][0] if at >= 1 else None,
            "step_scale_up_s": delay,
            "step_scale_up_decision": (
                {k: first[k] for k in ("current", "ready", "desired", "reason_code")}
                if first
                else None
            ),
            "panic_window_s": args.panic_window,
            "step_scale_up_within_panic_window": delay is not None and delay <= args.panic_window,
            "step_max_replicas": max((replicas[s][0] for s in seconds if s >= at), default=0),
            "step_p95_within_slo_share": (
                sum(1 for s in phase if p95[s] * 1000 <= args.slo_ms) / len(phase)
                if phase
                else None
            ),
        }
    return {
        "seconds": len(seconds),
        "ramp_seconds": len(ramp),
        "requests": sum(run.offered.values()),
        "answered": sum(len(v) for v in run.latencies.values()),
        "errors": sum(run.errors.values()),
        "first_scale_up_s": first_up,
        "scale_up_after_ramp_start_s": (up_after_ramp[0] - ramp_start) if up_after_ramp else None,
        "overload_onsets": len(onsets),
        "scale_up_after_overload_max_s": (
            None if None in reactions else max(reactions, default=None)
        ),
        "p95_within_slo_share": (len(within) / len(judged)) if judged else None,
        "gpu_hours": gpu_seconds / 3600,
        "gpu_hours_static_max": static / 3600,
        "gpu_hours_share_of_static": gpu_seconds / static if static else None,
        "max_replicas_seen": max((replicas[s][0] for s in ramp), default=0),
        "flaps": flaps,
        "ramp_flaps": ramp_flaps,
        "decisions": len(decisions),
        "blocked_decisions": sum(1 for d in decisions if d.get("blocked_reason_code")),
        "blocked_codes": sorted(
            {d["blocked_reason_code"] for d in decisions if d.get("blocked_reason_code")}
        ),
        **step,
    }


def verdicts(summary: dict, args) -> list[str]:
    """The issue's targets that this bench measures, one line each: met / not met."""

    def mark(ok) -> str:
        return "MET" if ok else "NOT MET"

    share = summary.get("p95_within_slo_share")
    gpu = summary.get("gpu_hours_share_of_static")
    lines = [
        f"target p95 within SLO >= 95 % of ramp seconds after the first scale-up: "
        f"{'-' if share is None else f'{share:.1%}'} {mark(share is not None and share >= 0.95)}",
        f"target GPU-hours <= 60 % of static max (ramp): "
        f"{'-' if gpu is None else f'{gpu:.0%}'} {mark(gpu is not None and gpu <= 0.60)}",
        f"target no flapping: {summary['flaps']} flaps {mark(summary['flaps'] == 0)}",
    ]
    if "step_at_s" in summary:
        delay = summary["step_scale_up_s"]
        lines.append(
            f"target scale-up decision within one panic window ({args.panic_window} s) of the "
            f"load step ({args.low:g} -> {summary['step_rate']:g} req/s at "
            f"t={summary['step_at_s']:.0f}s): "
            f"{'no scale-up' if delay is None else f'{delay:.1f} s'} "
            f"{mark(summary['step_scale_up_within_panic_window'])}"
        )
    if "replicas_preempted" in summary:
        started = sum(1 for j in summary["training"] if j["gpus"])
        lines.append(
            f"target training arriving during the ramp never stops a replica: "
            f"{summary['replicas_preempted']} replicas preempted of "
            f"{summary['replica_jobs']}, {len(summary['preemptions_by_training'])} "
            f"preemptions by training; {summary['training_jobs']} training jobs "
            f"({args.training_gpus} GPUs, class {args.training_class}), {started} ran, on GPUs "
            f"the service was not using: {'yes' if summary['training_on_free_gpus'] else 'NO'} "
            f"{mark(summary['replicas_preempted'] == 0 and summary['training_on_free_gpus'])}"
        )
    return lines


def draw(path: Path, run: Run, args, summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seconds = list(range(int(run.profile.length)))
    last = (0, 0)
    live, ready = [], []
    for s in seconds:
        last = run.replicas.get(s, last)
        live.append(last[0])
        ready.append(last[1])
    p95 = [(_p95(run.latencies.get(s, [])) or float("nan")) * 1000 for s in seconds]
    fig, (a, b, c) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    a.plot(seconds, [run.offered.get(s, 0) for s in seconds], label="offered req/s")
    a.plot(seconds, [len(run.latencies.get(s, [])) for s in seconds], label="answered req/s")
    a.set_ylabel("requests/s")
    a.legend(loc="upper right")
    b.step(seconds, live, where="post", label="replicas")
    b.step(seconds, ready, where="post", label="ready")
    b.axhline(args.max_replicas, linestyle=":", color="grey", label="max replicas")
    b.set_ylabel("replicas")
    b.legend(loc="upper right")
    if run.profile.step_rate > 0:
        for axis in (a, b, c):
            axis.axvline(run.profile.step_at, linestyle="--", color="purple", alpha=0.5)
        a.annotate("step", (run.profile.step_at, run.profile.step_rate), color="purple")
    if run.arrivals is not None:
        for job in run.arrivals.jobs:
            b.axvline(job["at"], linestyle=":", color="brown", alpha=0.7)
        if run.arrivals.jobs:
            b.annotate(
                f"training jobs ({args.training_gpus} GPUs)",
                (run.arrivals.jobs[0]["at"], args.max_replicas - 1),
                color="brown",
            )
    c.plot(seconds, p95, label="p95 latency (ms)")
    c.axhline(args.slo_ms, linestyle="--", color="red", label="SLO")
    c.set_ylabel("ms")
    c.set_xlabel("seconds")
    c.legend(loc="upper right")
    share = summary.get("p95_within_slo_share")
    fig.suptitle(
        f"Sluice inference bench: p95 within SLO {share:.0%} of seconds, "
        f"GPU-hours {summary['gpu_hours_share_of_static']:.0%} of static max"
        if share is not None and summary.get("gpu_hours_share_of_static") is not None
        else "Sluice inference bench"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", choices=("auto", "postgres", "embedded"), default="auto")
    parser.add_argument("--low", type=float, default=5.0)
    parser.add_argument("--high", type=float, default=60.0)
    parser.add_argument("--warm", type=float, default=20.0)
    parser.add_argument("--up", type=float, default=40.0)
    parser.add_argument("--hold", type=float, default=40.0)
    parser.add_argument("--down", type=float, default=40.0)
    parser.add_argument("--tail", type=float, default=60.0)
    parser.add_argument("--service-ms", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--slo-ms", type=int, default=400)
    parser.add_argument("--max-replicas", type=int, default=8)
    parser.add_argument("--scale-down-delay", type=int, default=30)
    parser.add_argument("--panic-window", type=int, default=6)
    parser.add_argument(
        "--target",
        type=float,
        default=0.0,
        help="ongoing requests per replica the service aims at (default 0.7 × --concurrency: "
        "headroom, as Knative's 70 %% target utilization)",
    )
    parser.add_argument(
        "--step-rate",
        type=float,
        default=0.0,
        help="after the ramp, the load jumps from --low to this at once (default --high; "
        "a negative value: no step)",
    )
    parser.add_argument(
        "--step-rest",
        type=float,
        default=-1.0,
        help="seconds at --low between the ramp and the step, for the scale-down to settle "
        "(default the scale-down delay: the step's scale-up is then no flap)",
    )
    parser.add_argument("--step-hold", type=float, default=30.0, help="seconds at the step")
    parser.add_argument(
        "--step-tail", type=float, default=30.0, help="seconds at --low after the step"
    )
    parser.add_argument(
        "--training-jobs",
        type=int,
        default=2,
        help="training jobs of another tenant arriving during the ramp up (0: none)",
    )
    parser.add_argument(
        "--training-gpus",
        type=int,
        default=GPUS_PER_NODE,
        help="GPUs of each, on one node (default a whole node: the second finds none whole "
        "while replicas run on both)",
    )
    parser.add_argument(
        "--training-class",
        default="urgent",
        help="their priority class: urgent (can_preempt, 900) or normal (the replicas', 400)",
    )
    parser.add_argument(
        "--training-guarantee",
        type=int,
        default=NODES * GPUS_PER_NODE,
        help="GPUs guaranteed to the training tenant in the same pool (the service's tenant "
        "has all 8 too): its jobs are admitted within quota and wait for GPUs only",
    )
    parser.add_argument("--png", default="", help="write a chart of the run here")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (logs)")
    parser.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--seed-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--outcome-only", default="", help=argparse.SUPPRESS)
    parser.add_argument("--server", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.seed_only:
        print(json.dumps(seed(args)))
        return 0
    if args.outcome_only:
        print(json.dumps(outcome(json.loads(args.outcome_only))))
        return 0
    if args.step_rate == 0:
        args.step_rate = args.high
    if args.step_rest < 0:
        args.step_rest = float(args.scale_down_delay)

    def interrupted(signum, frame):
        raise KeyboardInterrupt

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, interrupted)
    backend = choose_backend(args.backend, args.postgres.rstrip("/"), args.redis.rstrip("/"))
    tmp = Path(tempfile.mkdtemp(prefix="sluice-inference-", dir="/var/tmp"))
    tmp.chmod(0o711)
    cluster = InferenceCluster(backend, tmp)
    status = 1
    try:
        log(f"backend {backend.name}; temp folder {tmp}")
        cluster.prepare_database()
        agent_dir = cluster.var / "agent"
        agent_dir.mkdir(mode=0o711, exist_ok=True)
        agent_dir.chmod(0o711)
        from scheduling.agent import sample_model_server

        shutil.copy(sample_model_server.__file__, cluster.server_path())
        cluster.server_path().chmod(0o644)
        world = cluster.seed(args)
        cluster.start()
        api = Api(cluster.url, world["token"])
        deadline = time.monotonic() + 120
        while True:  # the web answers and the agents have registered their GPUs
            try:
                gpus = api.get("gpus/", page_size=1)["count"]
            except API_ERRORS:  # the web server is still starting
                gpus = 0
            if gpus >= NODES * GPUS_PER_NODE:
                break
            cluster.check_alive()
            if time.monotonic() > deadline:
                raise BenchError("the nodes did not register within 120 s")
            time.sleep(0.5)
        service = api.post(
            "services/",
            {
                "project": world["project"],
                "queue": world["queue"],
                "name": SERVICE_NAME,
                "command": ["python3", str(cluster.server_path()), "--service-ms",
                            str(args.service_ms), "--concurrency", str(args.concurrency),
                            "--warmup", "2"],
                "min_replicas": 1,
                "max_replicas": args.max_replicas,
                "target_running_per_replica": args.target or round(0.7 * args.concurrency, 2),
                "latency_slo_ms": args.slo_ms,
                "stable_window_s": 30,
                "panic_window_s": args.panic_window,
                "scale_up_max_step": 4,
                "scale_down_delay_s": args.scale_down_delay,
            },
        )  # fmt: skip
        log(f"service {service['id']} created; waiting for its first replica")
        deadline = time.monotonic() + 180
        while not any(e["ready"] for e in api.get(f"services/{service['id']}/endpoints")):
            cluster.check_alive()
            if time.monotonic() > deadline:
                raise BenchError("no replica ready after 180 s")
            time.sleep(1)
        profile = Profile(args)
        arrivals = TrainingArrivals(api, world, args, profile) if args.training_jobs > 0 else None
        run = Run(api, service["id"], profile, arrivals)
        started_at = datetime.now().astimezone()
        log(
            f"load: {args.low} → {args.high} → {args.low} requests/s over "
            f"{profile.ramp_length:.0f} s"
            + (
                f", then a step to {profile.step_rate} at t={profile.step_at:.0f}s for "
                f"{args.step_hold:.0f} s"
                if profile.step_rate > 0
                else ""
            )
        )
        printer_stop = threading.Event()

        def printer():
            shown = 0
            live, ready = 0, 0
            while not printer_stop.is_set():
                now = int(time.monotonic() - run.t0) if run.t0 else 0
                while shown < now - 1:
                    s = shown
                    p = _p95(run.latencies.get(s, []))
                    live, ready = run.replicas.get(s, (live, ready))  # the watcher may miss one
                    print(
                        f"t={s:4d}s offered={run.offered.get(s, 0):4d} "
                        f"answered={len(run.latencies.get(s, [])):4d} "
                        f"errors={run.errors.get(s, 0):3d} replicas={live} ready={ready} "
                        f"p95={'-' if p is None else f'{p * 1000:.0f}ms'}",
                        flush=True,
                    )
                    shown += 1
                time.sleep(0.5)

        printing = threading.Thread(target=printer, daemon=True)
        printing.start()
        run.run()
        time.sleep(2)
        printer_stop.set()
        decisions = []
        page = api.get(f"services/{service['id']}/decisions", page_size=500)
        decisions.extend(page["results"])
        summary = summarize(run, decisions, args, started_at)
        if arrivals is not None:
            found = cluster.outcome(
                {"project": world["project"], "training_project": world["training_project"]}
            )
            submitted = {j["id"]: j for j in arrivals.jobs}
            for job in found["training"]:
                job["submitted_s"] = round(submitted.get(job["id"], {}).get("at", -1))
                job["pending_reasons_seen"] = sorted(arrivals.reasons.get(job["id"], ()))
            summary.update(
                {
                    "training_jobs": len(arrivals.jobs),
                    "training_refused": arrivals.errors,
                    "training_cancelled_at_ramp_end": arrivals.cancelled,
                    "training_class": args.training_class,
                    "training_gpus_each": args.training_gpus,
                    **found,
                    "training_on_free_gpus": all(
                        j["gpus_shared_with_replicas"] == 0 for j in found["training"]
                    ),
                }
            )
        summary.update(
            {
                "backend": backend.name,
                "service_ms": args.service_ms,
                "concurrency": args.concurrency,
                "slo_ms": args.slo_ms,
                "max_replicas": args.max_replicas,
                "profile": [args.low, args.high, args.warm, args.up, args.hold, args.down,
                            args.tail],
            }
        )  # fmt: skip
        print(json.dumps(summary), flush=True)
        for line in verdicts(summary, args):
            print(line, flush=True)
        if args.png:
            draw(Path(args.png), run, args, summary)
            log(f"chart: {args.png}")
        status = 0
    except KeyboardInterrupt:
        log("interrupted")
    except BenchError as exc:
        log(f"failed: {exc}\n{cluster.log_tails()}")
    finally:
        cluster.stop()
        cluster.drop()
        if args.keep or status != 0:
            log(f"logs kept in {tmp}")
        else:
            with contextlib.suppress(OSError):
                shutil.rmtree(tmp)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
