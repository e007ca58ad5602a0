"""Platform configuration writes (pools, nodes, classes, policies, quotas, queues), all audited."""

from __future__ import annotations

from datetime import UTC, datetime

from django.core.exceptions import ValidationError
from django.db import IntegrityError, models, transaction
from django.utils import timezone

from audit.services import audit_record
from portal.errors import BusinessError, PermissionDeniedError
from tenants.choices import Role
from tenants.selectors import has_role, is_platform_admin

from ..choices import NodeState
from ..models import (
    Node,
    PriorityClass,
    Queue,
    Quota,
    QuotaChange,
    ResourcePool,
    WorkloadPolicy,
)
from .enqueue import dispatch_on_commit


def _json_value(value):
    if isinstance(value, models.Model):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def object_state(instance: models.Model) -> dict:
    """A JSON-safe dict of every concrete field, for audit before/after."""
    data = {}
    for f in instance._meta.concrete_fields:
        if f.primary_key:
            continue
        data[f.name] = _json_value(getattr(instance, f.name))
    return data


def _tenant_of(instance):
    return getattr(instance, "tenant", None)


@transaction.atomic
def config_save(
    *,
    actor,
    instance: models.Model,
    changes: dict,
    action: str,
    reason: str = "",
    m2m: dict | None = None,
) -> models.Model:
    """Apply ``changes`` to a configuration object, validate, save and audit before/after."""
    creating = instance.pk is None
    before = None if creating else object_state(instance)
    # A quota's GPUs go into its history (QuotaChange) whoever changes them: quota_save,
    # an applied recommendation.
    quota_before = quota_scope(instance) if isinstance(instance, Quota) and not creating else None
    for key, value in changes.items():
        setattr(instance, key, value)
    try:
        instance.full_clean()
        instance.save()
    except ValidationError as exc:
        raise BusinessError("Invalid input.", errors=exc.message_dict) from None
    except IntegrityError:
        raise BusinessError(
            "This conflicts with an existing object (it must be unique).", code="duplicate"
        ) from None
    after = object_state(instance)
    if isinstance(instance, Quota):
        quota_history_record(before=quota_before, after=quota_scope(instance))
    for name, values in (m2m or {}).items():
        if before is not None:
            before[name] = sorted(str(v) for v in getattr(instance, name).all())
        getattr(instance, name).set(values)
        after[name] = sorted(str(v) for v in values)
    if before == after:
        return instance  # nothing changed: nothing to audit
    audit_record(
        action=action,
        target=instance,
        actor=actor,
        tenant=_tenant_of(instance),
        before=before,
        after=after,
        reason=reason,
    )
    return instance


@transaction.atomic
def config_delete(*, actor, instance: models.Model, action: str) -> None:
    before = object_state(instance)
    audit_record(
        action=action, target=instance, actor=actor, tenant=_tenant_of(instance), before=before
    )
    if isinstance(instance, Quota):
        quota_history_record(before=quota_scope(instance), after=None)
    try:
        instance.delete()
    except models.ProtectedError:
        raise BusinessError(
            f"{instance} is still in use and cannot be deleted.", code="in_use"
        ) from None


#: Where the history of a quota with no recorded start begins (see migration 0014).
QUOTA_HISTORY_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def require_platform_admin(actor) -> None:
    if not is_platform_admin(actor):
        raise PermissionDeniedError("Only platform admins may change this.")


# --- platform objects -----------------------------------------------------------------------


def pool_save(*, actor, pool: ResourcePool | None = None, **changes) -> ResourcePool:
    require_platform_admin(actor)
    action = "pool.update" if pool else "pool.create"
    return config_save(actor=actor, instance=pool or ResourcePool(), changes=changes, action=action)


def priority_class_save(
    *, actor, priority_class: PriorityClass | None = None, **changes
) -> PriorityClass:
    require_platform_admin(actor)
    action = "priority_class.update" if priority_class else "priority_class.create"
    return config_save(
        actor=actor, instance=priority_class or PriorityClass(), changes=changes, action=action
    )


def workload_policy_save(
    *, actor, policy: WorkloadPolicy | None = None, allowed_pools=None, **changes
) -> WorkloadPolicy:
    require_platform_admin(actor)
    action = "policy.update" if policy else "policy.create"
    m2m = {"allowed_pools": allowed_pools} if allowed_pools is not None else None
    return config_save(
        actor=actor, instance=policy or WorkloadPolicy(), changes=changes, action=action, m2m=m2m
    )


def node_update(*, actor, node: Node, **changes) -> Node:
    """Platform admins drain, cordon or re-enable a node and edit its labels or pool."""
    require_platform_admin(actor)
    if changes.get("state") == NodeState.DOWN:
        from .nodes import node_mark_down

        node_mark_down(node=node, reason="marked down by a platform admin", actor=actor)
        changes.pop("state")
        node.refresh_from_db()
    if changes:
        node = config_save(actor=actor, instance=node, changes=changes, action="node.update")
    dispatch_on_commit()
    return node


NODE_RETIRED_LABEL = "sluice/retired-at"


@transaction.atomic
def node_remove(*, actor, node: Node) -> bool:
    """A platform admin removes a down node. Deleted when it never held a GPU for a job;
    otherwise kept for its allocations' history and marked retired (the label
    ``sluice/retired-at``), which hides it from the nodes page until its agent registers
    again. Returns True when the node was deleted."""
    require_platform_admin(actor)
    node = Node.objects.select_for_update().get(pk=node.pk)
    if node.state != NodeState.DOWN:
        raise BusinessError(
            f"Node {node.name} is {node.state}: only a down node can be removed "
            "(drain it and stop its agent first).",
            code="node_not_down",
        )
    if node.allocations.filter(released_at__isnull=True).exists():
        raise BusinessError(
            f"Node {node.name} still holds GPUs of jobs; they are released when the jobs end.",
            code="node_in_use",
        )
    if not node.allocations.exists():
        config_delete(actor=actor, instance=node, action="node.delete")
        return True
    labels = {**node.labels, NODE_RETIRED_LABEL: timezone.now().isoformat(timespec="seconds")}
    config_save(actor=actor, instance=node, changes={"labels": labels}, action="node.retire")
    return False


def quota_save(*, actor, quota: Quota | None = None, **changes) -> Quota:
    """Create or change a quota (platform admins), audited; ``config_save`` records the
    guarantee and borrow limit in force from now on in the quota history."""
    require_platform_admin(actor)
    action = "quota.update" if quota else "quota.create"
    quota = config_save(actor=actor, instance=quota or Quota(), changes=changes, action=action)
    dispatch_on_commit()
    return quota


def quota_scope(quota: Quota) -> dict:
    return {
        "tenant_id": quota.tenant_id,
        "pool_id": quota.pool_id,
        "gpu_model": quota.gpu_model,
        "guaranteed_gpus": quota.guaranteed_gpus,
        "borrow_limit_gpus": quota.borrow_limit_gpus,
    }


_SCOPE = ("tenant_id", "pool_id", "gpu_model")
_GPUS = ("guaranteed_gpus", "borrow_limit_gpus")


def quota_history_record(*, before: dict | None, after: dict | None, now=None) -> int:
    """Write the quota history of a change from ``before`` to ``after`` (a quota's scope
    and GPUs; ``None``: no quota there), in force from ``now``: the new values for the
    scope of ``after``, 0 GPUs for the scope of ``before`` when the quota left it (deleted,
    or moved to another tenant, pool or model). A scope without any history yet (a quota
    written before the history existed, or directly) first gets its previous values as in
    force since the epoch, so that the days before this change keep them. Returns the
    rows written (0 when the GPUs did not change)."""
    now = now or timezone.now()
    rows: list[QuotaChange] = []

    def change(scope: dict, gpus: dict, previous: dict | None) -> None:
        key = {k: scope[k] for k in _SCOPE}
        history = QuotaChange.objects.filter(**key)
        last = history.order_by("-effective_from", "-id").values(*_GPUS).first()
        if last is None and previous is not None:
            rows.append(QuotaChange(**key, **previous, effective_from=QUOTA_HISTORY_EPOCH))
            last = previous
        if last is None and not any(gpus.values()):
            return  # never held a quota: nothing to end
        if last == gpus:
            return
        rows.append(QuotaChange(**key, **gpus, effective_from=now))

    none = dict.fromkeys(_GPUS, 0)
    same_scope = (
        before is not None and after is not None and all(before[k] == after[k] for k in _SCOPE)
    )
    if before is not None and not same_scope:
        change(before, none, {k: before[k] for k in _GPUS})
    if after is not None:
        previous = {k: before[k] for k in _GPUS} if same_scope else None
        change(after, {k: after[k] for k in _GPUS}, previous)
    QuotaChange.objects.bulk_create(rows)
    return len(rows)


# --- queues: tenant admins manage their own; pools they may bind are those with a quota ---------


def _check_queue_rights(actor, tenant, pool) -> None:
    if not has_role(actor, tenant, Role.ADMIN):
        raise PermissionDeniedError(
            f"Only admins of {tenant.slug} or platform admins may manage its queues."
        )
    if (
        not is_platform_admin(actor)
        and pool is not None
        and not Quota.objects.filter(tenant=tenant, pool=pool).exists()
    ):
        raise BusinessError(
            f"{tenant.slug} has no quota in pool {pool}; a platform admin must bind it.",
            field="pool",
        )


def queue_check_rights(*, actor, queue: Queue) -> None:
    _check_queue_rights(actor, queue.tenant, None)


def queue_save(*, actor, queue: Queue | None = None, **changes) -> Queue:
    tenant = changes.get("tenant") or queue.tenant
    if queue is not None and "tenant" in changes and changes["tenant"] != queue.tenant:
        raise BusinessError("A queue cannot move to another tenant.", field="tenant")
    pool_changed = queue is None or ("pool" in changes and changes["pool"] != queue.pool)
    _check_queue_rights(actor, tenant, changes.get("pool") if pool_changed else None)
    project = changes.get("project", queue.project if queue else None)
    if project is not None and project.tenant_id != tenant.pk:
        raise BusinessError("The project belongs to another tenant.", field="project")
    default = changes.get("default_priority_class") or (
        queue.default_priority_class if queue else None
    )
    ceiling = changes.get("max_self_service_class") or (
        queue.max_self_service_class if queue else None
    )
    if default and ceiling and default.value > ceiling.value:
        raise BusinessError(
            "The default priority class cannot be above the self-service maximum.",
            field="default_priority_class",
        )
    action = "queue.update" if queue else "queue.create"
    return config_save(actor=actor, instance=queue or Queue(), changes=changes, action=action)
