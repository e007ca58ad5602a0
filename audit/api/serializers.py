from rest_framework import serializers

from ..models import AuditEvent


class AuditEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_label")
    tenant = serializers.CharField(source="tenant.slug", allow_null=True, default=None)

    class Meta:
        model = AuditEvent
        fields = [
            "id",
            "created_at",
            "actor",
            "action",
            "target_type",
            "target_id",
            "target_label",
            "tenant",
            "before",
            "after",
            "reason",
            "source_address",
            "request_id",
            "prev_hash",
            "hash",
        ]
        read_only_fields = fields
