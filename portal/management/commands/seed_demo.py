"""Seed a demo: users, two tenants, pools, classes, policies, queues, quotas, simulated nodes
and a week of finished jobs (the history the what-if page replays).

Idempotent: running it again changes nothing that exists and adds what is missing.

A command of the portal, the layer above every app it writes to (tenants, scheduling, the
insights' history): see tests/test_layering.py.
"""

import random
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from scheduling.choices import Environment, JobState, NodeState, PoolPurpose, WorkloadType
from scheduling.models import (
    Gpu,
    Job,
    JobEvent,
    Node,
    PriorityClass,
    Queue,
    Quota,
    ResourcePool,
    TenantRaiseCeiling,
    WorkloadPolicy,
)
from scheduling.services import jobs as job_services
from scheduling.services import raises as raise_services
from scheduling.services.runtime_history import runtime_history_rebuild
from tenants.choices import Role
from tenants.models import Membership, Project, Tenant

User = get_user_model()

DEMO_PASSWORD = "sluice-demo-2026"

PRIORITY_CLASSES = [
    # name, value, preemptible, can_preempt, requires_approval, max_grant_hours, description
    ("production-inference", 1000, False, True, True, 72, "Online inference serving customers."),
    ("release-critical", 800, False, True, True, 24, "Work blocking a release; needs approval."),
    ("high", 600, False, True, True, 24, "Important work; needs approval."),
    ("normal", 400, False, False, False, 24, "The default for most work."),
    ("low", 200, True, False, False, 24, "Preemptible; may borrow idle GPUs."),
    ("best-effort", 100, True, False, False, 24, "Runs only on otherwise idle GPUs."),
]

HOUR = 3600
POLICIES = {
    # type: (preemptible, default runtime, max runtime, grace, min runtime before preemption, idle reclaim)
    WorkloadType.TRAINING: (True, 12 * HOUR, 72 * HOUR, 60, 300, False),
    WorkloadType.FINE_TUNING: (True, 6 * HOUR, 24 * HOUR, 60, 300, False),
    WorkloadType.EVALUATION: (True, 1 * HOUR, 6 * HOUR, 30, 60, False),
    WorkloadType.INFERENCE: (False, 24 * HOUR, 30 * 24 * HOUR, 30, 0, False),
    WorkloadType.BATCH_INFERENCE: (True, 2 * HOUR, 12 * HOUR, 30, 120, False),
    WorkloadType.INTERACTIVE: (True, 4 * HOUR, 8 * HOUR, 15, 0, True),
}

# Scheduling order and preemption churn per type: (max wait, max preemptions, protection once
# there; 0 = the rest of the run). A person waits at the screen for a notebook and an
# online service for its replica: they reach the front of their class and band soonest.
ORDER_POLICIES = {
    WorkloadType.TRAINING: (12 * HOUR, 3, 0),
    WorkloadType.FINE_TUNING: (8 * HOUR, 3, 0),
    WorkloadType.EVALUATION: (2 * HOUR, 5, 0),
    WorkloadType.INFERENCE: (HOUR // 2, 0, 0),
    WorkloadType.BATCH_INFERENCE: (6 * HOUR, 5, 0),
    WorkloadType.INTERACTIVE: (15 * 60, 1, 0),
}

POOLS = [
    (
        "training",
        PoolPurpose.TRAINING,
        [
            WorkloadType.TRAINING,
            WorkloadType.FINE_TUNING,
            WorkloadType.EVALUATION,
            WorkloadType.BATCH_INFERENCE,
        ],
        "H100 nodes for training and fine-tuning.",
    ),
    (
        "inference",
        PoolPurpose.INFERENCE,
        [WorkloadType.INFERENCE, WorkloadType.BATCH_INFERENCE, WorkloadType.EVALUATION],
        "A100 nodes serving models.",
    ),
    (
        "interactive",
        PoolPurpose.INTERACTIVE,
        [WorkloadType.INTERACTIVE, WorkloadType.EVALUATION],
        "Notebooks and development sessions.",
    ),
]

NODES = [
    # name, pool, count, model, memory MiB
    ("gpu-train-01", "training", 8, "H100-80GB", 81559),
    ("gpu-train-02", "training", 8, "H100-80GB", 81559),
    ("gpu-infer-01", "inference", 4, "A100-40GB", 40960),
    ("gpu-dev-01", "interactive", 4, "L4-24GB", 23034),
]

TENANTS = [
    ("nlp", "Language Models", ["llm-pretrain", "chat-finetune", "eval-harness"]),
    ("vision", "Computer Vision", ["detector", "segmentation"]),
]

# The demo's idle reclaim is quick, so an idle notebook is visibly warned (after 2 min) and
# reclaimed (after 3 min); a real cluster uses tens of minutes.
DEMO_IDLE_RECLAIM = {
    "idle_utilization_threshold": 5.0,
    "idle_window_seconds": 180,
    "idle_warning_lead_seconds": 60,
}

QUOTAS = {
    # pool: (guaranteed, borrow limit) per tenant
    "training": (8, 8),
    "inference": (2, 0),
    "interactive": (2, 2),
}


# A week of finished training jobs, so that the what-if page (/simulate/) has a recorded
# history to replay in a fresh demo: seeded, added once (job names start with this).
HISTORY_PREFIX = "demo-history-"
HISTORY_JOBS = 160
HISTORY_DAYS = 7

# Each tenant's admins approve raises up to this class; above it (release-critical,
# production-inference) a platform admin decides.
RAISE_CEILING = "high"

# Jobs of the last days that ended in every way a job ends, with their timelines, so the
# jobs list, job pages and recovery page have something to show on first start:
# (name, tenant, type, GPUs, state, hours ago it started, hours it ran, exit, message).
RECENT_PREFIX = "demo-"
RECENT_JOBS = [
    ("demo-bert-pretrain", "nlp", "training", 8, JobState.SUCCEEDED, 50, 6.5, 0, ""),
    (
        "demo-chat-sft-lr3e5",
        "nlp",
        "fine_tuning",
        4,
        JobState.FAILED,
        30,
        0.4,
        1,
        "exit code 1: CUDA out of memory in step 812",
    ),
    (
        "demo-eval-mmlu",
        "nlp",
        "evaluation",
        1,
        JobState.PREEMPTED,
        20,
        1.2,
        None,
        "preempted by a higher-class job; its policy allows no further requeue",
    ),
    (
        "demo-notebook-alice",
        "nlp",
        "interactive",
        1,
        JobState.RECLAIMED,
        8,
        2.0,
        None,
        "idle reclaim: GPUs below 5 % for 3 min",
    ),
    (
        "demo-detector-sweep-07",
        "vision",
        "training",
        2,
        JobState.TIMED_OUT,
        40,
        12.0,
        None,
        "stopped at its runtime limit of 12h",
    ),
    ("demo-seg-finetune", "vision", "fine_tuning", 2, JobState.SUCCEEDED, 26, 3.0, 0, ""),
    (
        "demo-detector-export",
        "vision",
        "batch_inference",
        1,
        JobState.CANCELLED,
        5,
        0.3,
        None,
        "cancelled by vision-member",
    ),
]
QUEUE_OF_TYPE = {
    "training": "train",
    "fine_tuning": "train",
    "evaluation": "train",
    "batch_inference": "train",
    "interactive": "notebooks",
}
END_EVENT = {
    JobState.SUCCEEDED: "succeeded",
    JobState.FAILED: "failed",
    JobState.PREEMPTED: "preempted",
    JobState.RECLAIMED: "reclaimed",
    JobState.TIMED_OUT: "timed_out",
    JobState.CANCELLED: "cancelled",
}


def _fit_to_capacity(jobs: list[Job], capacity: int, fixed: list[tuple]) -> None:
    """Move each past job's admission (in submit order, no job starting before one submitted
    earlier) to the first moment the pool has its GPUs free for the whole run, around the
    ``fixed`` (start, end, GPUs) of jobs already there: the history never holds more GPUs
    than the pool has, and its waits grow where the week was busy."""
    placed = list(fixed)
    last = None
    for job in sorted(jobs, key=lambda j: j.submitted_at):
        at = max(job.admitted_at, last) if last else job.admitted_at
        duration = job.finished_at - job.started_at
        while True:
            end = at + duration
            moments = [at] + [start for start, _, _ in placed if at < start < end]
            if all(
                sum(g for start, stop, g in placed if start <= m < stop) + job.gpus_per_node
                <= capacity
                for m in moments
            ):
                break
            later = [stop for _, stop, _ in placed if stop > at]
            if not later:
                break
            at = min(later)
        job.admitted_at = job.started_at = last = at
        job.finished_at = at + duration
        placed.append((at, job.finished_at, job.gpus_per_node))


class Command(BaseCommand):
    help = "Create the demo users, tenants, pools, classes, policies, queues, quotas and simulated nodes."

    def _user(self, username, *, staff=False, email=None):
        user, created = User.objects.get_or_create(
            username=username,
            defaults={
                "email": email or f"{username}@example.com",
                "is_staff": staff,
                "is_superuser": staff,
            },
        )
        if created:
            user.set_password(DEMO_PASSWORD)
            user.save()
        return user

    def _history(self, classes) -> None:
        """Finished jobs of both tenants in the training pool over the last week (a busy
        week for 16 GPUs: about 75 % of them asked), unless the history is there already."""
        if Job.objects.filter(name__startswith=HISTORY_PREFIX).exists():
            return
        rng = random.Random(2026)
        now = timezone.now()
        queues = {
            q.tenant.slug: q for q in Queue.objects.filter(name="train").select_related("tenant")
        }
        users = {slug: User.objects.get(username=f"{slug}-member") for slug in queues}
        projects = {
            slug: list(Project.objects.filter(tenant=queue.tenant).order_by("slug"))
            for slug, queue in queues.items()
        }
        start = now - timedelta(days=HISTORY_DAYS)
        capacity = Gpu.objects.filter(node__pool__name="training").count() or 16
        jobs = []
        for number in range(HISTORY_JOBS):
            slug = rng.choices(sorted(queues), weights=[2, 1])[0]
            queue = queues[slug]
            submitted = start + timedelta(seconds=rng.uniform(0, (HISTORY_DAYS - 1) * 86400))
            duration = timedelta(seconds=rng.choice([1200, 1800, 3600, 7200, 4 * 3600, 8 * 3600]))
            waited = timedelta(seconds=rng.choice([5, 30, 120]))
            klass = classes[rng.choices(["normal", "low", "best-effort"], [6, 3, 1])[0]]
            state = rng.choices([JobState.SUCCEEDED, JobState.FAILED], [9, 1])[0]
            jobs.append(
                Job(
                    tenant=queue.tenant,
                    project=rng.choice(projects[slug]),
                    queue=queue,
                    submitted_by=users[slug],
                    name=f"{HISTORY_PREFIX}{number + 1:03d}",
                    workload_type=WorkloadType.TRAINING,
                    base_priority_class=klass,
                    priority_class=klass,
                    state=state,
                    command=["python", "train.py"],
                    gpus_per_node=rng.choice([1, 2, 2, 4, 8]),
                    max_runtime_seconds=int(duration.total_seconds() * 2),
                    submitted_at=submitted,
                    admitted_at=submitted + waited,
                    started_at=submitted + waited,
                    finished_at=submitted + waited + duration,
                    exit_code=0 if state == JobState.SUCCEEDED else 1,
                )
            )
        fixed = [
            (j.admitted_at, j.finished_at, j.gpus_per_node * j.nodes)
            for j in Job.objects.filter(
                queue__pool__name="training", admitted_at__isnull=False, finished_at__isnull=False
            )
        ]
        _fit_to_capacity(jobs, capacity, fixed)
        Job.objects.bulk_create(jobs)
        # Stored without going through their end: runtime prediction learns of them here.
        runtime_history_rebuild()

    def _recent(self, classes) -> None:
        """Jobs of the last days that ended in every way (added once, with timelines)."""
        if Job.objects.filter(name=RECENT_JOBS[0][0]).exists():
            return
        now = timezone.now()
        for name, slug, wtype, gpus, state, ago, ran, exit_code, message in RECENT_JOBS:
            queue = Queue.objects.get(tenant__slug=slug, name=QUEUE_OF_TYPE[wtype])
            started = now - timedelta(hours=ago)
            submitted = started - timedelta(minutes=4)
            finished = started + timedelta(hours=ran)
            job = Job.objects.create(
                tenant=queue.tenant,
                project=Project.objects.filter(tenant=queue.tenant).order_by("slug").first(),
                queue=queue,
                submitted_by=User.objects.get(username=f"{slug}-member"),
                name=name,
                workload_type=wtype,
                base_priority_class=classes["normal"],
                priority_class=classes["normal"],
                state=state,
                command=["python", f"{wtype}.py"],
                gpus_per_node=gpus,
                # The limit it ran into, or twice what it used.
                max_runtime_seconds=int(
                    ran * HOUR if state == JobState.TIMED_OUT else max(2 * ran, 1) * HOUR
                ),
                submitted_at=submitted,
                admitted_at=started,
                started_at=started,
                finished_at=finished,
                exit_code=exit_code,
                failure_message=message,
                preemption_count=1 if state == JobState.PREEMPTED else 0,
            )
            JobEvent.objects.bulk_create(
                [
                    JobEvent(job=job, created_at=submitted, kind="submitted", message=""),
                    JobEvent(job=job, created_at=started, kind="admitted", message=""),
                    JobEvent(job=job, created_at=started, kind="started", message=""),
                    JobEvent(job=job, created_at=finished, kind=END_EVENT[state], message=message),
                ]
            )

    def _raises(self, classes) -> None:
        """Raise ceilings for both tenants, and two raises nlp-member waits on: one nlp-admin
        may approve (up to the ceiling), one above it that only a platform admin may."""
        for tenant in Tenant.objects.filter(slug__in=[t[0] for t in TENANTS]):
            TenantRaiseCeiling.objects.get_or_create(
                tenant=tenant, defaults={"ceiling": classes[RAISE_CEILING]}
            )
        member = User.objects.get(username="nlp-member")
        if Job.objects.filter(name__startswith="demo-held-").exists():
            return
        queue = Queue.objects.get(tenant__slug="nlp", name="train-prod")
        project = Project.objects.get(tenant__slug="nlp", slug="eval-harness")
        wanted = [
            ("demo-held-release-eval", "high", "The release candidate must be evaluated today."),
            ("demo-held-hotfix-train", "release-critical", "Hotfix model for the outage."),
        ]
        for name, to_class, reason in wanted:
            job = job_services.job_submit(
                user=member,
                spec=job_services.JobSpec(
                    queue=queue,
                    project=project,
                    name=name,
                    workload_type=WorkloadType.EVALUATION,
                    command=["python", "eval.py"],
                    gpus_per_node=2,
                ),
            )
            # Held, so the demo's scheduler leaves them waiting for the decision.
            job_services.job_hold(user=member, job=job, reason="waiting for the raise")
            raise_services.priority_raise_request(
                user=member, job=job, to_class=classes[to_class], reason=reason, hours=4
            )

    @transaction.atomic
    def handle(self, *args, **options):
        self._user("admin", staff=True)
        classes = {}
        for name, value, preemptible, can_preempt, approval, hours, description in PRIORITY_CLASSES:
            classes[name], _ = PriorityClass.objects.get_or_create(
                name=name,
                defaults={
                    "value": value,
                    "preemptible": preemptible,
                    "can_preempt": can_preempt,
                    "requires_approval": approval,
                    "max_grant_hours": hours,
                    "description": description,
                },
            )
        pools = {}
        for name, purpose, types, description in POOLS:
            pools[name], _ = ResourcePool.objects.get_or_create(
                name=name,
                defaults={
                    "purpose": purpose,
                    "allowed_workload_types": types,
                    "description": description,
                },
            )
        for wtype, (preemptible, default, maximum, grace, min_run, idle) in POLICIES.items():
            WorkloadPolicy.objects.get_or_create(
                workload_type=wtype,
                defaults={
                    "preemptible": preemptible,
                    "default_runtime_seconds": default,
                    "max_runtime_seconds": maximum,
                    "stop_grace_seconds": grace,
                    "min_runtime_before_preemption_seconds": min_run,
                    "idle_reclaim_enabled": idle,
                    "idle_utilization_threshold": 5.0,
                    "idle_window_seconds": 15 * 60,
                    "idle_warning_lead_seconds": 5 * 60,
                    **(DEMO_IDLE_RECLAIM if idle else {}),
                    "extension_cap_seconds": 2 * HOUR,
                    "max_session_age_seconds": 12 * HOUR
                    if wtype == WorkloadType.INTERACTIVE
                    else None,
                    "max_wait_seconds": ORDER_POLICIES[wtype][0],
                    "max_preemptions": ORDER_POLICIES[wtype][1],
                    "preemption_protection_seconds": ORDER_POLICIES[wtype][2],
                },
            )
        now = timezone.now()
        for name, pool, count, model, memory in NODES:
            node, _ = Node.objects.get_or_create(
                name=name,
                defaults={
                    "pool": pools[pool],
                    "state": NodeState.READY,
                    "backend": "simulated",
                    "cpus": 64,
                    "memory_mb": 512 * 1024,
                    "last_heartbeat": now,
                },
            )
            for index in range(count):
                Gpu.objects.get_or_create(
                    node=node,
                    index=index,
                    defaults={
                        "uuid": f"GPU-seed-{name}-{index}",
                        "model": model,
                        "memory_mb": memory,
                    },
                )
        for slug, title, projects in TENANTS:
            tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": title})
            for role in Role.values:
                user = self._user(f"{slug}-{role}")
                Membership.objects.get_or_create(user=user, tenant=tenant, defaults={"role": role})
            for project_slug in projects:
                Project.objects.get_or_create(
                    tenant=tenant,
                    slug=project_slug,
                    defaults={"name": project_slug.replace("-", " ").title()},
                )
            for pool_name, (guaranteed, borrow) in QUOTAS.items():
                Quota.objects.get_or_create(
                    tenant=tenant,
                    pool=pools[pool_name],
                    gpu_model="",
                    defaults={"guaranteed_gpus": guaranteed, "borrow_limit_gpus": borrow},
                )
            queues = [
                ("train", Environment.EXPERIMENT, "training", [], "normal", "normal"),
                ("train-prod", Environment.PRODUCTION, "training", [], "normal", "high"),
                (
                    "serve",
                    Environment.PRODUCTION,
                    "inference",
                    [WorkloadType.INFERENCE, WorkloadType.BATCH_INFERENCE],
                    "production-inference",
                    "production-inference",
                ),
                (
                    "notebooks",
                    Environment.EXPERIMENT,
                    "interactive",
                    [WorkloadType.INTERACTIVE],
                    "normal",
                    "normal",
                ),
            ]
            for qname, env, pool_name, types, default, ceiling in queues:
                Queue.objects.get_or_create(
                    tenant=tenant,
                    name=qname,
                    defaults={
                        "environment": env,
                        "pool": pools[pool_name],
                        "allowed_workload_types": types,
                        "default_priority_class": classes[default],
                        "max_self_service_class": classes[ceiling],
                    },
                )
        self._recent(classes)
        self._history(classes)  # fitted around the recent jobs' GPUs
        self._raises(classes)
        # The insights' hourly history of the demo's week (kept hours stay as they are),
        # with the GPU utilization samples of the jobs stored here (none ran on an agent).
        from insights.demo import demo_utilization_series
        from insights.services.rollups import rollups_backfill

        demo_utilization_series(
            Job.objects.filter(
                Q(name__startswith=HISTORY_PREFIX) | Q(name__in=[r[0] for r in RECENT_JOBS]),
                finished_at__isnull=False,
            )
        )
        rollups_backfill(days=HISTORY_DAYS)
        self.stdout.write(
            self.style.SUCCESS(f"Demo data ready. Logins (password for all: {DEMO_PASSWORD}):")
        )
        self.stdout.write("  admin            platform admin")
        for slug, _, _ in TENANTS:
            for role in Role.values:
                self.stdout.write(f"  {slug + '-' + role:<16} {role} of tenant {slug}")
