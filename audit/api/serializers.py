from rest_framework import serializers

from ..models import EVENT_COLUMNS, AuditEvent


class AuditEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_label")
    tenant = serializers.CharField(source="tenant.slug", allow_null=True, default=None)

    class Meta:
        model = AuditEvent
        fields = list(EVENT_COLUMNS)
        read_only_fields = fields
