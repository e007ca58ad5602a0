"""The weekly policy review: this week against the last, and whether the policy works.

A week runs from Monday 00:00 UTC to the next Monday. The figures, for the whole cluster and
for each tenant (from the same queries, grouped by tenant):

- **key work's waits**: p50 / p95 of the admission wait of the jobs admitted in the week
  that are *key work*: a high priority class (one that ``can_preempt``, or whose value is
  above its queue's default class; the job's base or effective class) or online inference
  (``scheduling.choices.INFERENCE_TYPES``, the type training never preempts); also how many
  key jobs were still waiting when the week ended (a wait so long the job was never admitted
  would not show in the percentiles);
- **contention**: preemptions (audit ``job.preempt``), priority raises requested and approved;
- **failures released**: jobs that failed, the GPUs their allocations released in the week and
  the GPU-hours those GPUs had been held; GPUs taken back from failed, timed-out, stuck, lost,
  zombie and idle work (``ReclaimRecord``, preemption requeues excluded: they are contention);
- **idle GPU-hours reclaimed** (idle reclaims);
- **manual interventions**: raises approved, runtime extensions approved by a person
  (auto-granted ones are the policy working), idle-reclaim exemptions (``job.idle_exempt``),
  and admin overrides: audit events by platform admins that change quotas, queues, pools,
  priority classes, workload policies or raise ceilings.

The verdict compares the two things a policy is judged by: fewer manual interventions and
shorter waits for key work mean the policy works.

Tenant admins see their tenant's slice of the stored review: per-tenant figures are stored
with the cluster's (a few hundred bytes per tenant), so a review stays what it was when it
was written even after retention deletes the week's jobs, and a tenant's page costs one row.
Cluster-wide changes (a pool, a policy, a class: no tenant) count only in the cluster figures.
A review is stored by ``insights.services.reviews`` (``policy_review_write``).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

from django.db.models import BooleanField, Count, ExpressionWrapper, F, Q, Sum
from django.utils import timezone

from audit.models import AuditEvent
from scheduling.choices import (
    INFERENCE_TYPES,
    ExtensionState,
    JobState,
    NotificationKind,
    ReclaimKind,
)
from scheduling.models import Allocation, Job, PriorityRaise, ReclaimRecord, RuntimeExtension
from scheduling.services.waste import human_duration
from scheduling.simulator.metrics import percentile
from tenants.models import Tenant

from .models import PolicyReview

WEEK = dt.timedelta(days=7)
#: The weeks a review may be of: a review reads the week before too, and both must be
#: dates Python can represent (the first Monday of 1970; nothing past 9998).
FIRST_WEEK = dt.date(1970, 1, 5)
LAST_WEEK = dt.date(9998, 12, 28)
FIGURES_VERSION = 1
#: The notification kind of a review.
NOTIFICATION_KIND = NotificationKind.POLICY_REVIEW

#: Audit actions that change the policy; by a platform admin they are an override.
OVERRIDE_PREFIXES = ("quota.", "queue.", "policy.", "priority_class.", "pool.")
OVERRIDE_ACTIONS = ("tenant.raise_ceiling",)
#: Reclaims of wasted GPUs (failed, stuck, lost, zombie, idle work, runtime limits).
RECLAIM_KINDS = (
    ReclaimKind.TIMEOUT,
    ReclaimKind.IDLE_RECLAIM,
    ReclaimKind.SESSION_AGE,
    ReclaimKind.STUCK_LAUNCH,
    ReclaimKind.LOST_REQUEUE,
    ReclaimKind.ZOMBIE_KILL,
)
ALL = "all"
VERDICT_LABELS = {
    "works": "Works",
    "attention": "Needs attention",
    "mixed": "Mixed",
    "steady": "No change",
    "no_data": "No data",
    "no_baseline": "No baseline",
}

# The table of a review: (section, key, label, unit, which way is better).
ROWS = (
    ("Key work's waits", "key_wait_p50_s", "Key jobs: p50 admission wait", "duration", "lower"),
    ("Key work's waits", "key_wait_p95_s", "Key jobs: p95 admission wait", "duration", "lower"),
    ("Key work's waits", "high_wait_p95_s", "High classes: p95 wait", "duration", "lower"),
    ("Key work's waits", "inference_wait_p95_s", "Inference: p95 wait", "duration", "lower"),
    ("Key work's waits", "key_jobs_admitted", "Key jobs admitted", "count", None),
    (
        "Key work's waits",
        "key_jobs_waiting_at_end",
        "Key jobs still waiting at the end",
        "count",
        "lower",
    ),
    ("Manual interventions", "raises_approved", "Raises approved", "count", "lower"),
    (
        "Manual interventions",
        "extensions_approved",
        "Runtime extensions approved",
        "count",
        "lower",
    ),
    ("Manual interventions", "exemptions", "Idle-reclaim exemptions", "count", "lower"),
    ("Manual interventions", "admin_overrides", "Admin overrides", "count", "lower"),
    ("Manual interventions", "interventions", "All manual interventions", "count", "lower"),
    ("Contention", "preemptions", "Preemptions", "count", "lower"),
    ("Contention", "raises_requested", "Priority raises requested", "count", "lower"),
    ("Contention", "raises_approved", "Priority raises approved", "count", "lower"),
    ("Failures released", "failed_jobs", "Jobs failed", "count", "lower"),
    ("Failures released", "failed_gpus_released", "GPUs released by failed jobs", "count", None),
    (
        "Failures released",
        "failed_gpu_hours",
        "GPU-hours held by failed jobs",
        "gpu_hours",
        "lower",
    ),
    ("Failures released", "reclaims", "Reclaims of wasted GPUs", "count", None),
    ("Failures released", "reclaimed_gpu_hours", "GPU-hours reclaimed", "gpu_hours", None),
    ("Idle GPUs", "idle_gpu_hours_reclaimed", "Idle GPU-hours reclaimed", "gpu_hours", None),
)


# --- weeks ----------------------------------------------------------------------------------


def monday_of(day: dt.date) -> dt.date:
    return day - dt.timedelta(days=day.weekday())


def week_bounds(week_start: dt.date) -> tuple[dt.datetime, dt.datetime]:
    """Monday 00:00 UTC to the next Monday 00:00 UTC."""
    start = dt.datetime.combine(week_start, dt.time.min, tzinfo=dt.UTC)
    return start, start + WEEK


def last_completed_week(now: dt.datetime | None = None) -> dt.date:
    """The Monday of the week that ended last (the one before the current week)."""
    now = now or timezone.now()
    return monday_of(now.astimezone(dt.UTC).date()) - WEEK


def parse_week_start(value: str) -> dt.date | None:
    """A Monday from ``YYYY-MM-DD``, or None."""
    try:
        day = dt.date.fromisoformat(value)
    except (TypeError, ValueError):
        return None
    return day if day.weekday() == 0 and FIRST_WEEK <= day <= LAST_WEEK else None


# --- the figures of one week ----------------------------------------------------------------


def _empty() -> dict:
    return {
        "key_wait_p50_s": None,
        "key_wait_p95_s": None,
        "high_wait_p50_s": None,
        "high_wait_p95_s": None,
        "inference_wait_p50_s": None,
        "inference_wait_p95_s": None,
        "key_jobs_admitted": 0,
        "key_jobs_waiting_at_end": 0,
        "preemptions": 0,
        "raises_requested": 0,
        "raises_approved": 0,
        "failed_jobs": 0,
        "failed_gpus_released": 0,
        "failed_gpu_hours": 0.0,
        "reclaims": 0,
        "reclaimed_gpu_hours": 0.0,
        "reclaims_by_kind": {},
        "idle_gpu_hours_reclaimed": 0.0,
        "extensions_approved": 0,
        "exemptions": 0,
        "admin_overrides": 0,
        "interventions": 0,
    }


def _key_q() -> Q:
    default = F("queue__default_priority_class__value")
    return (
        Q(priority_class__can_preempt=True)
        | Q(base_priority_class__can_preempt=True)
        | Q(priority_class__value__gt=default)
        | Q(base_priority_class__value__gt=default)
    )


def _p(values: list[float], fraction: float) -> float | None:
    return round(percentile(sorted(values), fraction), 1) if values else None


class _Figures:
    """Figures of one week for the cluster (``ALL``) and each tenant id, filled metric by
    metric, each from one query grouped by tenant."""

    def __init__(self, start: dt.datetime, end: dt.datetime) -> None:
        self.start, self.end = start, end
        self.by: dict = defaultdict(_empty)

    def add(self, tenant_id, key: str, value) -> None:
        for scope in (ALL, tenant_id) if tenant_id is not None else (ALL,):
            self.by[scope][key] += value

    def count(self, qs, key: str, tenant_field: str = "tenant_id") -> None:
        for row in qs.values(tenant_field).annotate(n=Count("pk")).order_by():
            self.add(row[tenant_field], key, row["n"])

    def compute(self) -> dict:
        self._waits()
        self._contention()
        self._failures()
        self._interventions()
        return self.by

    def _waits(self) -> None:
        start, end = self.start, self.end
        high = ExpressionWrapper(_key_q(), output_field=BooleanField())
        rows = (
            Job.objects.filter(admitted_at__gte=start, admitted_at__lt=end)
            .filter(_key_q() | Q(workload_type__in=INFERENCE_TYPES))
            .annotate(high=high)
            .values_list(
                "tenant_id", "workload_type", "high", "admitted_at", "queued_at", "submitted_at"
            )
            .order_by()
        )
        waits: dict = defaultdict(lambda: defaultdict(list))
        for tenant_id, workload_type, is_high, admitted, queued, submitted in rows.iterator(2000):
            wait = max((admitted - (queued or submitted)).total_seconds(), 0.0)
            for scope in (ALL, tenant_id):
                waits[scope]["key"].append(wait)
                if is_high:
                    waits[scope]["high"].append(wait)
                if workload_type in INFERENCE_TYPES:
                    waits[scope]["inference"].append(wait)
        for scope, groups in waits.items():
            figures = self.by[scope]
            figures["key_jobs_admitted"] = len(groups["key"])
            for group in ("key", "high", "inference"):
                figures[f"{group}_wait_p50_s"] = _p(groups[group], 0.5)
                figures[f"{group}_wait_p95_s"] = _p(groups[group], 0.95)
        waiting = (
            Job.objects.filter(_key_q() | Q(workload_type__in=INFERENCE_TYPES))
            .filter(submitted_at__lt=end)
            .filter(Q(admitted_at__isnull=True) | Q(admitted_at__gte=end))
            .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=end))
        )
        self.count(waiting, "key_jobs_waiting_at_end")

    def _audit(self, **filters):
        return AuditEvent.objects.filter(
            created_at__gte=self.start, created_at__lt=self.end, **filters
        )

    def _contention(self) -> None:
        self.count(self._audit(action="job.preempt"), "preemptions")
        self.count(
            PriorityRaise.objects.filter(created_at__gte=self.start, created_at__lt=self.end),
            "raises_requested",
        )
        self.count(self._audit(action="priority_raise.approve"), "raises_approved")

    def _failures(self) -> None:
        self.count(
            Job.objects.filter(
                state=JobState.FAILED, finished_at__gte=self.start, finished_at__lt=self.end
            ),
            "failed_jobs",
        )
        released = Allocation.objects.filter(
            job__state=JobState.FAILED, released_at__gte=self.start, released_at__lt=self.end
        ).values_list("job__tenant_id", "granted_at", "released_at")
        for tenant_id, granted, freed in released.order_by().iterator(2000):
            self.add(tenant_id, "failed_gpus_released", 1)
            self.add(
                tenant_id, "failed_gpu_hours", max((freed - granted).total_seconds(), 0) / 3600
            )
        reclaims = (
            ReclaimRecord.objects.filter(
                created_at__gte=self.start, created_at__lt=self.end, kind__in=RECLAIM_KINDS
            )
            .values("tenant_id", "kind")
            .annotate(n=Count("pk"), hours=Sum("gpu_hours_freed"))
            .order_by()
        )
        for row in reclaims:
            hours = row["hours"] or 0.0
            self.add(row["tenant_id"], "reclaims", row["n"])
            self.add(row["tenant_id"], "reclaimed_gpu_hours", hours)
            for scope in (ALL, row["tenant_id"]) if row["tenant_id"] else (ALL,):
                by_kind = self.by[scope]["reclaims_by_kind"]
                by_kind[row["kind"]] = by_kind.get(row["kind"], 0) + row["n"]
            if row["kind"] == ReclaimKind.IDLE_RECLAIM:
                self.add(row["tenant_id"], "idle_gpu_hours_reclaimed", hours)

    def _interventions(self) -> None:
        self.count(
            RuntimeExtension.objects.filter(
                state=ExtensionState.APPROVED,
                decided_at__gte=self.start,
                decided_at__lt=self.end,
            ),
            "extensions_approved",
        )
        self.count(self._audit(action="job.idle_exempt"), "exemptions")
        overrides = Q(action__in=OVERRIDE_ACTIONS)
        for prefix in OVERRIDE_PREFIXES:
            overrides |= Q(action__startswith=prefix)
        self.count(self._audit(actor__is_staff=True).filter(overrides), "admin_overrides")
        for figures in self.by.values():
            figures["interventions"] = (
                figures["raises_approved"]
                + figures["extensions_approved"]
                + figures["exemptions"]
                + figures["admin_overrides"]
            )
            for key in ("failed_gpu_hours", "reclaimed_gpu_hours", "idle_gpu_hours_reclaimed"):
                figures[key] = round(figures[key], 3)


def week_figures(week_start: dt.date) -> dict:
    """``{"all": figures, tenant id: figures}`` of one week (tenants with nothing: absent)."""
    start, end = week_bounds(week_start)
    by = _Figures(start, end).compute()
    by.setdefault(ALL, _empty())  # the cluster's figures exist even for an empty week
    return dict(by)


def review_compute(week_start: dt.date) -> dict:
    """The figures of a review: this week and the last, for the cluster and each tenant."""
    this, last = week_figures(week_start), week_figures(week_start - WEEK)
    tenants = dict(Tenant.objects.values_list("pk", "slug"))
    start, end = week_bounds(week_start)
    return {
        "version": FIGURES_VERSION,
        "week_start": week_start.isoformat(),
        "week_end": end.date().isoformat(),
        "previous_week_start": (week_start - WEEK).isoformat(),
        "all": {"this": this[ALL], "last": last[ALL]},
        "tenants": {
            slug: {"this": this.get(pk) or _empty(), "last": last.get(pk) or _empty()}
            for pk, slug in sorted(tenants.items(), key=lambda item: item[1])
        },
    }


# --- reading a review -----------------------------------------------------------------------


def _duration(seconds: float) -> str:
    """Whole minutes from ten minutes up: a review's waits need no seconds."""
    if seconds >= 600:
        seconds = round(seconds / 60) * 60
    return human_duration(seconds)


def _format(value, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "duration":
        return _duration(value)
    if unit == "gpu_hours":
        return f"{value:,.1f} GPU-h"
    return f"{value:,}"


def _trend(delta, better: str | None) -> str:
    if better is None:
        return "neutral"
    if delta is None:
        return "na"
    if abs(delta) < 1e-9:
        return "same"
    return "better" if (delta < 0) == (better == "lower") else "worse"


def _delta_text(delta, unit: str) -> str:
    if delta is None:
        return ""
    if abs(delta) < 1e-9:
        return "= 0"
    arrow = "↑" if delta > 0 else "↓"
    if unit == "duration":
        return f"{arrow} {_duration(abs(delta))}"
    if unit == "gpu_hours":
        return f"{arrow} {abs(delta):,.1f} GPU-h"
    return f"{arrow} {abs(delta):,}"


def review_rows(this: dict, last: dict) -> list[dict]:
    """The table of a review: each figure last week, this week, the change and its colour."""
    rows = []
    for section, key, label, unit, better in ROWS:
        now_, before = this.get(key), last.get(key)
        delta = None if now_ is None or before is None else now_ - before
        rows.append(
            {
                "section": section,
                "key": key,
                "label": label,
                "this": now_,
                "last": before,
                "this_text": _format(now_, unit),
                "last_text": _format(before, unit),
                "delta": delta,
                "delta_text": _delta_text(delta, unit),
                "trend": _trend(delta, better),
            }
        )
    return rows


def review_verdict(this: dict, last: dict) -> dict:
    """Fewer manual interventions and shorter waits for key work: the policy works."""
    rows = {r["key"]: r for r in review_rows(this, last)}
    interventions, wait = rows["interventions"], rows["key_wait_p95_s"]
    nothing = (
        not this["interventions"]
        and not last["interventions"]
        and this["key_wait_p95_s"] is None
        and last["key_wait_p95_s"] is None
    )
    parts = [
        f"manual interventions {interventions['last_text']} → {interventions['this_text']}"
        + (f" ({interventions['delta_text']})" if interventions["delta_text"] else ""),
        f"key work's p95 wait {wait['last_text']} → {wait['this_text']}"
        + (f" ({wait['delta_text']})" if wait["delta_text"] else ""),
    ]
    trends = {interventions["trend"], wait["trend"]}
    no_baseline = not last["interventions"] and last["key_wait_p95_s"] is None
    if nothing:
        status, head = (
            "no_data",
            "Nothing to compare: no manual intervention and no key work in either week",
        )
    elif no_baseline:
        status, head = (
            "no_baseline",
            "No baseline: the week before had no key work and no manual intervention",
        )
    elif "better" in trends and "worse" not in trends:
        status, head = "works", "The policy works"
    elif "worse" in trends and "better" not in trends:
        status, head = "attention", "The policy needs attention"
    elif "worse" in trends:
        status, head = "mixed", "Mixed"
    else:
        status, head = "steady", "No change"
    text = (
        f"{head}." if status in ("no_data", "no_baseline") else f"{head}: {parts[0]}; {parts[1]}."
    )
    return {"status": status, "label": VERDICT_LABELS[status], "text": text}


def review_slice(review: PolicyReview, tenant_slug: str | None = None) -> dict | None:
    """The cluster's figures (``tenant_slug`` None) or one tenant's, with their table and
    verdict; None when the review has no figures for that tenant."""
    figures = review.figures or {}
    part = (
        figures.get("all") if tenant_slug is None else figures.get("tenants", {}).get(tenant_slug)
    )
    if not part:
        return None
    this, last = {**_empty(), **part["this"]}, {**_empty(), **part["last"]}
    rows = review_rows(this, last)
    sections: dict[str, list[dict]] = {}
    for row in rows:
        sections.setdefault(row["section"], []).append(row)
    return {
        "this": this,
        "last": last,
        "sections": sections,
        "verdict": review_verdict(this, last),
        "reclaims_by_kind": _reclaims_by_kind(this, last),
    }


def _reclaims_by_kind(this: dict, last: dict) -> list[dict]:
    kinds = set(this.get("reclaims_by_kind") or {}) | set(last.get("reclaims_by_kind") or {})
    labels = dict(ReclaimKind.choices)
    return [
        {
            "kind": labels.get(kind, kind),
            "last": (last.get("reclaims_by_kind") or {}).get(kind, 0),
            "this": (this.get("reclaims_by_kind") or {}).get(kind, 0),
        }
        for kind in sorted(kinds)
    ]


def is_final(review: PolicyReview) -> bool:
    """Computed after its week ended (not a "so far" look at the current week)."""
    return bool((review.figures or {}).get("final"))
