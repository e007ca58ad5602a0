"""``/api/v1/services/``: inference services (list, create, read, change, delete), the steps
``pause`` and ``resume``, the replicas' ``endpoints`` (for a load balancer) and the
autoscaler's ``decisions``. Another tenant's service is 404; a viewer's write is 403."""

from __future__ import annotations

from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from portal.api.filters import IdFilter, path_id
from portal.api.views import validated
from portal.errors import BusinessError, NotFoundError
from scheduling.models import PriorityClass
from scheduling.selectors import queues_visible_to
from tenants.selectors import project_get_visible

from .. import selectors, services
from ..choices import ServiceState
from ..models import Service
from . import serializers as s


class ServiceFilter(filters.FilterSet):
    tenant = filters.CharFilter(field_name="tenant__slug")
    project = IdFilter(field_name="project_id")
    queue = IdFilter(field_name="queue_id")
    state = filters.ChoiceFilter(choices=ServiceState.choices)
    near_capacity = filters.BooleanFilter()

    class Meta:
        model = Service
        fields = ["tenant", "project", "queue", "state", "near_capacity"]


def _resolve(user, data: dict) -> dict:
    """Ids and names of the input as objects the user may see (404 otherwise)."""
    if "project" in data:
        project = project_get_visible(user, data["project"])
        if project is None:
            raise NotFoundError("Project not found.")
        data["project"] = project
    if "queue" in data:
        queue = queues_visible_to(user).filter(pk=data["queue"]).first()
        if queue is None:
            raise NotFoundError("Queue not found.")
        data["queue"] = queue
    if "priority_class" in data:
        name = data["priority_class"] or ""
        priority = PriorityClass.objects.filter(name=name).first() if name else None
        if name and priority is None:
            raise BusinessError(f"Unknown priority class {name!r}.", field="priority_class")
        data["priority_class"] = priority
    return data


class ServiceViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Inference services of your tenants: replicas that follow the load."""

    serializer_class = s.ServiceSerializer
    filterset_class = ServiceFilter
    ordering_fields = ["id", "name", "created_at", "updated_at"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Service.objects.none()
        return selectors.with_replica_counts(selectors.services_visible_to(self.request.user))

    def get_object(self):
        pk = path_id(self.kwargs["pk"], "Service not found.")
        service = self.get_queryset().filter(pk=pk).first()
        if service is None:
            raise NotFoundError("Service not found.")
        return service

    def _answer(self, service: Service, code=status.HTTP_200_OK) -> Response:
        fresh = self.get_queryset().get(pk=service.pk)
        return Response(self.get_serializer(fresh).data, status=code)

    @extend_schema(request=s.ServiceInputSerializer, responses={201: s.ServiceSerializer})
    def create(self, request):
        data = _resolve(request.user, dict(validated(s.ServiceInputSerializer, request.data)))
        spec = services.ServiceSpec(**data)
        service = services.service_create(user=request.user, spec=spec)
        return self._answer(service, status.HTTP_201_CREATED)

    @extend_schema(
        request=s.ServiceChangeSerializer,
        responses=s.ServiceSerializer,
        description="Change any part; a change of the replicas' spec (command, env, GPUs, "
        "queue, class, paths) makes a new spec version: a rolling update.",
    )
    def partial_update(self, request, pk=None):
        service = self.get_object()
        data = _resolve(request.user, dict(validated(s.ServiceChangeSerializer, request.data)))
        service = services.service_update(user=request.user, service=service, changes=data)
        return self._answer(service)

    @extend_schema(request=s.ServiceChangeSerializer, responses=s.ServiceSerializer)
    def update(self, request, pk=None):
        return self.partial_update(request, pk=pk)

    @extend_schema(request=None, responses={204: None})
    def destroy(self, request, pk=None):
        service = self.get_object()
        services.service_delete(user=request.user, service=service)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=s.ServiceActionSerializer, responses=s.ServiceSerializer)
    @action(detail=True, methods=["post"])
    def pause(self, request, pk=None):
        """Cancel every replica and keep the settings."""
        service = self.get_object()
        reason = validated(s.ServiceActionSerializer, request.data)["reason"]
        return self._answer(
            services.service_pause(user=request.user, service=service, reason=reason)
        )

    @extend_schema(request=s.ServiceActionSerializer, responses=s.ServiceSerializer)
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        """Let the autoscaler bring the replicas back."""
        service = self.get_object()
        reason = validated(s.ServiceActionSerializer, request.data)["reason"]
        return self._answer(
            services.service_resume(user=request.user, service=service, reason=reason)
        )

    @extend_schema(responses=s.EndpointSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)
    def endpoints(self, request, pk=None):
        """Where the replicas answer (node host and port) and whether each is ready: what
        a load balancer needs (see ``manage.py service_upstreams``)."""
        service = self.get_object()
        return Response(s.EndpointSerializer(selectors.service_endpoints(service), many=True).data)

    @extend_schema(responses=s.ScaleDecisionSerializer(many=True))
    @action(detail=True, methods=["get"])
    def decisions(self, request, pk=None):
        """The autoscaler's decisions, newest first: desired count, reason, inputs and why
        the service is short of replicas (a pending job's reason code, or the quota)."""
        service = self.get_object()
        page = self.paginate_queryset(selectors.service_decisions(service))
        return self.get_paginated_response(s.ScaleDecisionSerializer(page, many=True).data)
