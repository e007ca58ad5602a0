"""The append-only, hash-chained audit log."""

import hashlib
import json

from django.conf import settings
from django.db import models


class AppendOnlyError(Exception):
    """Raised when code tries to change or delete an audit event."""


class AuditEventQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise AppendOnlyError("Audit events are append-only; they cannot be updated.")

    def delete(self):
        raise AppendOnlyError("Audit events are append-only; they cannot be deleted.")


class AuditEvent(models.Model):
    """One audited action: who did what to which object, before and after, chained by hash.

    ``hash`` covers every field and ``prev_hash``; changing any stored row breaks the chain,
    which ``manage.py audit_verify`` detects. On PostgreSQL a trigger also rejects UPDATE and
    DELETE on the table.
    """

    created_at = models.DateTimeField(db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    actor_label = models.CharField(max_length=150, blank=True)
    action = models.CharField(max_length=80, db_index=True)
    target_type = models.CharField(max_length=80, db_index=True)
    target_id = models.CharField(max_length=64, blank=True, db_index=True)
    target_label = models.CharField(max_length=255, blank=True)
    tenant = models.ForeignKey(
        "tenants.Tenant", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    reason = models.TextField(blank=True)
    source_address = models.GenericIPAddressField(null=True, blank=True)
    request_id = models.CharField(max_length=64, blank=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64, unique=True)

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["tenant", "-id"])]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_label or 'system'} {self.action} {self.target_label}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise AppendOnlyError("Audit events are append-only; they cannot be updated.")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AppendOnlyError("Audit events are append-only; they cannot be deleted.")

    def canonical_payload(self) -> str:
        """The exact text the hash covers (stable key order, ISO time, ids not objects)."""
        data = {
            "created_at": self.created_at.isoformat(timespec="microseconds"),
            "actor": self.actor_id,
            "actor_label": self.actor_label,
            "action": self.action,
            "target_type": self.target_type,
            "target_id": self.target_id,
            "target_label": self.target_label,
            "tenant": self.tenant_id,
            "before": self.before,
            "after": self.after,
            "reason": self.reason,
            "source_address": self.source_address,
            "request_id": self.request_id,
            "prev_hash": self.prev_hash,
        }
        return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)

    def compute_hash(self) -> str:
        return hashlib.sha256(self.canonical_payload().encode()).hexdigest()
