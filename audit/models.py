"""The append-only, hash-chained audit log."""

from django.conf import settings
from django.db import models

from . import chain


class AppendOnlyError(Exception):
    """Raised when code tries to change or delete an audit event."""


class AuditEventQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise AppendOnlyError("Audit events are append-only; they cannot be updated.")

    def delete(self):
        raise AppendOnlyError("Audit events are append-only; they cannot be deleted.")


#: An event's columns as the API and the CSV export show them, in this order.
EVENT_COLUMNS = (
    "id",
    "created_at",
    "actor",
    "action",
    "target_type",
    "target_id",
    "target_label",
    "tenant",
    "reason",
    "before",
    "after",
    "source_address",
    "request_id",
    "prev_hash",
    "hash",
)


class AuditEvent(models.Model):
    """One audited action: who did what to which object, before and after, chained by hash.

    ``hash`` covers every field and ``prev_hash``; changing any stored row breaks the chain,
    which ``manage.py audit_verify`` detects. New events are hashed with an HMAC keyed with
    the server's audit key (``hash_version`` 2, see ``chain``), so write access to the database
    alone cannot forge them; ``audit_verify`` also keeps the chain's head in an anchor file
    outside the database, so deleting the newest events is detected too. Triggers (PostgreSQL
    and SQLite) reject UPDATE and DELETE on the table.
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
    # No default: the writer says which hash it computed (rows from before version 2 are 1).
    hash_version = models.PositiveSmallIntegerField()

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
        """The exact text the hash covers (see ``chain.canonical_payload``)."""
        return chain.canonical_payload(self)

    def compute_hash(self) -> str:
        return chain.event_hash(self)
