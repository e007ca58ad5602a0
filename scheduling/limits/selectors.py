"""Reads for runtime extensions, the limits a job runs under, and the recovery metrics;
always scoped to the user asking."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.db.models import Count, QuerySet, Sum

from tenants.choices import Role
from tenants.scoping import has_role, is_platform_admin, restrict

from ..choices import (
    ACTIVE_STATES,
    GRANTED_EXTENSION_STATES,
    RAISABLE_STATES,
    ExtensionState,
    JobState,
    ReclaimKind,
)
from ..models import Job, ReclaimRecord, RuntimeExtension, WorkloadPolicy
from ..services.waste import idle_since, runtime_elapsed, runtime_origin

_EXTENSION_RELATED = ("tenant", "job", "job__submitted_by", "requested_by", "decided_by")


# --- runtime extensions ---------------------------------------------------------------------


def extensions_visible_to(user) -> QuerySet[RuntimeExtension]:
    """Every extension of the user's tenants (all for platform admins); others' do not exist."""
    qs = RuntimeExtension.objects.select_related(*_EXTENSION_RELATED)
    return restrict(qs, user)


def extension_refusal(user, extension: RuntimeExtension) -> str | None:
    """Why ``user`` may not approve or reject the extension, or None if they may.

    Tenant admins of the job's tenant and platform admins decide; nobody their own request.
    """
    if extension.requested_by_id == user.pk:
        return "You cannot approve or reject your own runtime extension; another admin must."
    if is_platform_admin(user) or has_role(user, extension.tenant_id, Role.ADMIN):
        return None
    return (
        f"Only admins of {extension.tenant.slug} and platform admins may decide runtime extensions."
    )


def extensions_decidable_by(user) -> QuerySet[RuntimeExtension]:
    """Pending extensions of jobs still running or waiting that the user may decide, oldest
    first (never their own)."""
    qs = (
        extensions_visible_to(user)
        .filter(state=ExtensionState.PENDING, job__state__in=RAISABLE_STATES)
        .exclude(requested_by=user)
    )
    return restrict(qs, user, "admin").order_by("id")


def extension_approvers(extension: RuntimeExtension) -> list:
    """Who is asked: the tenant's admins, or the platform admins when the tenant has no
    other admin. Never the requester."""
    users = get_user_model().objects.filter(is_active=True).exclude(pk=extension.requested_by_id)
    admins = list(
        users.filter(memberships__tenant_id=extension.tenant_id, memberships__role=Role.ADMIN)
    )
    return admins or list(users.filter(is_staff=True))


def granted_extension_seconds(job: Job) -> int:
    """Runtime added to the job by extensions so far."""
    total = job.runtime_extensions.filter(state__in=GRANTED_EXTENSION_STATES).aggregate(
        s=Sum("seconds")
    )["s"]
    return total or 0


# --- the limits a job runs under (job page, API) ---------------------------------------------


def launch_runtime_limit(job: Job, policy: WorkloadPolicy | None) -> int:
    """How long a job may run as far as is known at launch: its runtime limit plus the
    extensions its policy grants without approval. Executors with a time limit of their own
    (Slurm, Kubernetes) set it as a backstop: an extension granted while the job runs must
    not let their limit end it before Sluice's own timeout would."""
    return job.max_runtime_seconds + (policy.extension_cap_seconds if policy else 0)


def job_limits(job: Job, policy: WorkloadPolicy | None, now: datetime) -> dict:
    """What the job page shows about runtime, idle reclaim, session age and retention."""
    live = job.state in (JobState.ADMITTED, JobState.RUNNING)
    elapsed = runtime_elapsed(job, now)
    origin = runtime_origin(job)
    extensions = list(job.runtime_extensions.select_related("requested_by", "decided_by"))
    granted = sum(e.seconds for e in extensions if e.state in GRANTED_EXTENSION_STATES)
    cap = policy.extension_cap_seconds if policy else 0
    info = {
        "policy": policy,
        "limit_seconds": job.max_runtime_seconds,
        "origin": origin,
        "ends_at": origin + timedelta(seconds=job.max_runtime_seconds) if live else None,
        "left_seconds": max(job.max_runtime_seconds - elapsed, 0) if live else None,
        "used_percent": round(100 * elapsed / job.max_runtime_seconds)
        if live and elapsed is not None
        else None,
        "warnings_sent": [round(f * 100) for f in sorted(job.runtime_warnings_sent or [])],
        "extensions": extensions,
        "pending_extension": next(
            (e for e in extensions if e.state == ExtensionState.PENDING), None
        ),
        "granted_seconds": granted,
        "cap_seconds": cap,
        "cap_left_seconds": max(cap - granted, 0),
        "idle_reclaim": bool(policy and policy.idle_reclaim_enabled),
        "exempt_until": job.idle_exempt_until
        if job.idle_exempt_until and job.idle_exempt_until > now
        else None,
        "idle_seconds": None,
        "reclaim_at": None,
        "session_ends_at": None,
        "logs_deleted_after": None,
    }
    if info["idle_reclaim"] and job.state == JobState.RUNNING:
        since = idle_since(job, now)
        if since is not None:
            info["idle_seconds"] = max((now - since).total_seconds(), 0)
            if not info["exempt_until"]:
                info["reclaim_at"] = since + timedelta(seconds=policy.idle_window_seconds)
    if policy and policy.max_session_age_seconds and live and origin:
        info["session_ends_at"] = origin + timedelta(seconds=policy.max_session_age_seconds)
    if policy and job.finished_at and job.state not in (*ACTIVE_STATES, *RAISABLE_STATES):
        info["logs_deleted_after"] = job.finished_at + timedelta(days=policy.retention_days)
    return info


# --- recovery metrics ------------------------------------------------------------------------


def reclaim_records_visible_to(user) -> QuerySet[ReclaimRecord]:
    """Members see their tenants' records; platform admins all (also zombies of no tenant)."""
    qs = ReclaimRecord.objects.all()
    return restrict(qs, user)


def waste_recovery_summary(user, since: datetime) -> dict:
    """Timeouts, reclaims, requeues and zombie kills since ``since``, and the GPU-hours they
    freed, per tenant and workload type (one aggregate query)."""
    kinds = list(ReclaimKind)
    rows: dict[tuple[str, str], dict] = {}
    totals = {k.value: {"count": 0, "gpu_hours": 0.0} for k in kinds}
    aggregated = (
        reclaim_records_visible_to(user)
        .filter(created_at__gte=since)
        .values("tenant__slug", "workload_type", "kind")
        .annotate(n=Count("id"), hours=Sum("gpu_hours_freed"))
        .order_by()
    )
    for item in aggregated:
        key = (item["tenant__slug"] or "", item["workload_type"] or "")
        row = rows.setdefault(
            key,
            {
                "tenant": key[0],
                "workload_type": key[1],
                "cells": {k.value: {"count": 0, "gpu_hours": 0.0} for k in kinds},
                "count": 0,
                "gpu_hours": 0.0,
            },
        )
        hours = item["hours"] or 0.0
        row["cells"][item["kind"]] = {"count": item["n"], "gpu_hours": hours}
        row["count"] += item["n"]
        row["gpu_hours"] += hours
        totals[item["kind"]]["count"] += item["n"]
        totals[item["kind"]]["gpu_hours"] += hours
    ordered = [rows[k] for k in sorted(rows)]
    for row in ordered:
        row["cell_list"] = [row["cells"][k.value] for k in kinds]
    return {
        "since": since,
        "kinds": [(k.value, k.label) for k in kinds],
        "rows": ordered,
        "totals": [totals[k.value] for k in kinds],
        "count": sum(t["count"] for t in totals.values()),
        "gpu_hours": sum(t["gpu_hours"] for t in totals.values()),
    }
