from django.http import Http404
from rest_framework import mixins, viewsets
from rest_framework.permissions import BasePermission, IsAuthenticated

from portal.errors import NotFoundError

from ..filters import AuditEventFilter
from ..selectors import audit_events_visible_to, may_read_audit_log
from .serializers import AuditEventSerializer


class CanReadAuditLog(BasePermission):
    message = "Only tenant admins and platform admins may read the audit log."

    def has_permission(self, request, view):
        return may_read_audit_log(request.user)


class AuditEventViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The append-only audit log, newest first (read only).

    Platform admins see every event, tenant admins their tenants' events; members and
    viewers get 403. An event of another tenant answers 404 and is never listed.
    """

    serializer_class = AuditEventSerializer
    permission_classes = [IsAuthenticated, CanReadAuditLog]
    filterset_class = AuditEventFilter
    ordering_fields = ["id", "created_at"]

    def get_queryset(self):
        return audit_events_visible_to(self.request.user).order_by("-id")

    def get_object(self):
        try:
            return super().get_object()
        except Http404:
            raise NotFoundError("Audit event not found.") from None
