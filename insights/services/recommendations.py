"""What the recommendations write: the daily refresh (the rules of
``insights.recommendations`` brought to the open recommendations) and a platform admin's
steps on one (simulate, apply, dismiss). Apply makes its change through the same
configuration services as a manual edit (audited)."""

from __future__ import annotations

import math
from collections import Counter
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from portal.errors import BusinessError
from scheduling.choices import NodeState, NotificationKind
from scheduling.models import Node, PriorityClass, Queue, Quota, SimulationRun, WorkloadPolicy
from scheduling.services import config as config_services
from scheduling.services import whatif
from scheduling.services.notifications import notification_send

from ..choices import RecommendationState
from ..models import Recommendation
from ..recommendations import (
    PERIOD_DAYS,
    REFRESH_ACTION,
    Proposal,
    recommendations_compute,
    simulation_effect,
    threshold,
    users_with_ids,
)

# -- the daily refresh ---------------------------------------------------------------------------


@transaction.atomic
def recommendations_refresh(*, now: datetime | None = None, user=None) -> dict:
    """Run the rules and bring the open recommendations in line (see the module docstring).
    Returns counts: created, refreshed, held back (cooldown), closed. Each run is audited
    (``recommendations.refresh``, by ``user`` when an admin asked for it, else by the
    system): the record of when the recommendations were last computed."""
    now = now or timezone.now()
    counts = _refresh(now)
    audit_record(
        action=REFRESH_ACTION,
        target_type="insights.recommendation",
        target_label="recommendations",
        actor=user,
        after={**counts, "computed_at": now.isoformat()},
        reason="Run now by an admin" if user is not None else "The daily run",
    )
    return counts


def recommendations_run_now(*, user) -> dict:
    """Compute the recommendations now instead of waiting for the daily run (platform
    admins: the rules read and change every tenant's recommendations)."""
    config_services.require_platform_admin(user)
    return recommendations_refresh(user=user)


def _refresh(now: datetime) -> dict:
    counts = Counter()
    proposed_keys = set()
    for proposal in recommendations_compute(now):
        proposed_keys.add(proposal.key)
        counts[_upsert(proposal, now)] += 1
    stale = Recommendation.objects.select_for_update().filter(state=RecommendationState.OPEN)
    for rec in stale.exclude(key__in=proposed_keys):
        rec.state = RecommendationState.DISMISSED
        rec.decided_at = now
        rec.dismiss_reason = "No longer supported by the history (closed by the daily run)."
        rec.save(update_fields=["state", "decided_at", "dismiss_reason"])
        counts["closed"] += 1
    return {k: counts.get(k, 0) for k in ("created", "refreshed", "held", "closed")}


def _upsert(proposal: Proposal, now: datetime) -> str:
    open_rec = (
        Recommendation.objects.select_for_update()
        .filter(key=proposal.key, state=RecommendationState.OPEN)
        .first()
    )
    if open_rec is not None:
        if open_rec.change != proposal.change:
            open_rec.simulation = None  # it replayed another change
        open_rec.title = proposal.title[:300]
        open_rec.evidence = proposal.evidence
        open_rec.change = proposal.change
        open_rec.tenant = proposal.tenant
        open_rec.updated_at = now
        open_rec.save()
        return "refreshed"
    recent = (
        Recommendation.objects.filter(
            key=proposal.key,
            decided_at__gte=now - timedelta(days=threshold("COOLDOWN_DAYS")),
        )
        .exclude(state=RecommendationState.OPEN)
        .order_by("-decided_at")
        .first()
    )
    if recent is not None and recent.decided_by_id is not None:
        before = float(recent.evidence.get("score") or 0)
        if float(proposal.evidence.get("score") or 0) < before * threshold("WORSE_FACTOR"):
            return "held"
    Recommendation.objects.create(
        kind=proposal.kind,
        key=proposal.key,
        tenant=proposal.tenant,
        title=proposal.title[:300],
        evidence=proposal.evidence,
        change=proposal.change,
        created_at=now,
        updated_at=now,
    )
    return "created"


# -- a platform admin's steps --------------------------------------------------------------------


def _require_open(rec: Recommendation) -> Recommendation:
    rec = Recommendation.objects.select_for_update().get(pk=rec.pk)
    if rec.state != RecommendationState.OPEN:
        raise BusinessError(
            f"Recommendation {rec.pk} is {rec.get_state_display().lower()} already.",
            code="not_open",
        )
    return rec


@transaction.atomic
def recommendation_simulate(*, user, recommendation: Recommendation) -> SimulationRun:
    """Queue a what-if replay of the recorded history with the change applied (platform
    admins) and link it to the recommendation."""
    config_services.require_platform_admin(user)
    rec = _require_open(recommendation)
    params = rec.change.get("whatif")
    if not params:
        raise BusinessError(
            rec.change.get("not_simulated") or "The simulator cannot replay this change.",
            code="not_simulatable",
        )
    days = math.ceil(float(rec.evidence.get("period", {}).get("days") or PERIOD_DAYS))
    run = whatif.simulation_run_create(user=user, params={"days": days, **params})
    rec.simulation = run
    rec.save(update_fields=["simulation"])
    return run


@transaction.atomic
def recommendation_apply(*, user, recommendation: Recommendation) -> Recommendation:
    """Make the change through the configuration services (audited as a manual edit, with
    the recommendation as the reason), record ``recommendation.apply`` with the change and
    the simulated effect, and mark it applied (platform admins)."""
    config_services.require_platform_admin(user)
    rec = _require_open(recommendation)
    effect = simulation_effect(rec)
    reason = f"Recommendation #{rec.pk}: {rec.title}"
    target = _apply_change(user, rec.change, reason)
    now = timezone.now()
    rec.state = RecommendationState.APPLIED
    rec.decided_by = user
    rec.decided_at = now
    rec.updated_at = now
    rec.save(update_fields=["state", "decided_by", "decided_at", "updated_at"])
    audit_record(
        action="recommendation.apply",
        target=rec,
        actor=user,
        tenant=rec.tenant,
        before={"state": RecommendationState.OPEN},
        after={
            "state": RecommendationState.APPLIED,
            "kind": rec.kind,
            "change": rec.change.get("summary", ""),
            "changed": target,
            "simulation": effect,
        },
        reason=reason[:2000],
    )
    return rec


def _require_unchanged(change: dict, now: dict, what: str) -> None:
    """The new values of a change were computed from the values it records in ``from``
    (a lower guarantee's borrow limit is the old one plus what the guarantee gives up):
    once someone edited them since, applying would write numbers computed for another
    configuration. The daily run recomputes the recommendation from the values of then."""
    before = change.get("from")
    if not before:
        return  # recorded before changes named their starting values
    if any(now.get(name) != value for name, value in before.items()):
        raise BusinessError(
            f"{what} was changed since this recommendation was computed (it assumed "
            + ", ".join(f"{name} {value}" for name, value in before.items())
            + "); the next daily run recomputes it.",
            code="stale",
        )


def _apply_change(user, change: dict, reason: str) -> str:
    """Carry out ``change["action"]``; returns what was changed, in words."""
    action = change.get("action")
    if action == "quota_update":
        quota = Quota.objects.select_related("tenant", "pool").filter(pk=change["quota"]).first()
        if quota is None:
            raise BusinessError("The quota of this recommendation no longer exists.")
        _require_unchanged(
            change,
            {"guaranteed": quota.guaranteed_gpus, "borrow_limit": quota.borrow_limit_gpus},
            f"quota {quota}",
        )
        config_services.config_save(
            actor=user,
            instance=quota,
            changes={
                "guaranteed_gpus": change["guaranteed"],
                "borrow_limit_gpus": change["borrow_limit"],
            },
            action="quota.update",
            reason=reason,
        )
        from scheduling.services.enqueue import dispatch_on_commit

        dispatch_on_commit()
        return f"quota {quota}"
    if action == "queue_class":
        queue = (
            Queue.objects.select_related("max_self_service_class", "default_priority_class")
            .filter(pk=change["queue"])
            .first()
        )
        cls = PriorityClass.objects.filter(name=change["priority_class"]).first()
        if queue is None or cls is None:
            raise BusinessError("The queue or class of this recommendation no longer exists.")
        _require_unchanged(
            change,
            {"default_priority_class": queue.default_priority_class.name},
            f"queue {queue}",
        )
        ceiling = queue.max_self_service_class
        config_services.config_save(
            actor=user,
            instance=queue,
            changes={
                "default_priority_class": cls,
                "max_self_service_class": cls if cls.value > ceiling.value else ceiling,
            },
            action="queue.update",
            reason=reason,
        )
        return f"queue {queue}"
    if action == "node_cordon":
        names = []
        for node in Node.objects.filter(name__in=change["nodes"]).order_by("name"):
            if node.state == NodeState.READY:
                config_services.config_save(
                    actor=user,
                    instance=node,
                    changes={"state": NodeState.CORDONED},
                    action="node.update",
                    reason=reason,
                )
                names.append(node.name)
        if not names:
            raise BusinessError("None of these nodes is ready any more: nothing to cordon.")
        return "nodes " + ", ".join(names)
    if action == "policy_update":
        policy = WorkloadPolicy.objects.filter(workload_type=change["policy"]).first()
        if policy is None:
            raise BusinessError("The workload policy of this recommendation no longer exists.")
        _require_unchanged(
            change,
            {name: getattr(policy, name) for name in change.get("from") or {}},
            f"policy {policy.workload_type}",
        )
        config_services.config_save(
            actor=user,
            instance=policy,
            changes=change["fields"],
            action="policy.update",
            reason=reason,
        )
        return f"policy {policy.workload_type}"
    if action == "notify":
        users = list(users_with_ids(change.get("users") or []))
        if not users:
            raise BusinessError("Nobody to notify: the users of this recommendation are gone.")
        notification_send(
            users=users,
            kind=NotificationKind.RECOMMENDATION,
            message=change["message"],
            link=change.get("link", ""),
        )
        return "notified " + ", ".join(sorted(u.get_username() for u in users))
    raise BusinessError(f"Unknown change {action!r}: nothing to apply.")


@transaction.atomic
def recommendation_dismiss(*, user, recommendation: Recommendation, reason: str) -> Recommendation:
    """Close a recommendation without acting on it, saying why (platform admins). The daily
    run does not re-open it for COOLDOWN_DAYS unless its numbers get clearly worse."""
    config_services.require_platform_admin(user)
    reason = (reason or "").strip()
    if not reason:
        raise BusinessError("Say why the recommendation is dismissed.", field="reason")
    rec = _require_open(recommendation)
    now = timezone.now()
    rec.state = RecommendationState.DISMISSED
    rec.decided_by = user
    rec.decided_at = now
    rec.updated_at = now
    rec.dismiss_reason = reason[:2000]
    rec.save(update_fields=["state", "decided_by", "decided_at", "updated_at", "dismiss_reason"])
    audit_record(
        action="recommendation.dismiss",
        target=rec,
        actor=user,
        tenant=rec.tenant,
        before={"state": RecommendationState.OPEN},
        after={"state": RecommendationState.DISMISSED, "kind": rec.kind},
        reason=reason[:2000],
    )
    return rec
