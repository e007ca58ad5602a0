from django.db.models import Prefetch
from django.http import Http404
from django_filters import rest_framework as filters
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from portal.api.views import validated
from portal.errors import BusinessError, NotFoundError
from tenants.selectors import projects_visible_to

from .. import selectors
from ..models import Allocation, Job, PriorityClass
from ..services import config, jobs
from ..services.jobs import JobSpec
from . import serializers as s


class ConfigViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Read for every member; writes go through a ``save`` service that checks rights and audits."""

    delete_action = ""

    def _save(self, instance, data):
        raise NotImplementedError

    def create(self, request):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        obj = self._save(None, dict(serializer.validated_data))
        return Response(self.get_serializer(obj).data, status=status.HTTP_201_CREATED)

    def partial_update(self, request, **kwargs):
        instance = self.get_object()
        serializer = self.get_serializer(instance, data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        obj = self._save(instance, dict(serializer.validated_data))
        return Response(self.get_serializer(obj).data)

    def destroy(self, request, **kwargs):
        instance = self.get_object()
        config.require_platform_admin(request.user)
        config.config_delete(actor=request.user, instance=instance, action=self.delete_action)
        return Response(status=status.HTTP_204_NO_CONTENT)


class PoolViewSet(ConfigViewSet):
    serializer_class = s.PoolSerializer
    filterset_fields = ["purpose", "name"]
    lookup_field = "name"
    delete_action = "pool.delete"

    def get_queryset(self):
        return selectors.pools_visible_to(self.request.user)

    def _save(self, instance, data):
        return config.pool_save(actor=self.request.user, pool=instance, **data)


class PriorityClassViewSet(ConfigViewSet):
    serializer_class = s.PriorityClassSerializer
    lookup_field = "name"
    delete_action = "priority_class.delete"

    def get_queryset(self):
        return selectors.priority_classes_visible_to(self.request.user)

    def _save(self, instance, data):
        return config.priority_class_save(actor=self.request.user, priority_class=instance, **data)


class WorkloadPolicyViewSet(ConfigViewSet):
    serializer_class = s.WorkloadPolicySerializer
    lookup_field = "workload_type"
    delete_action = "policy.delete"

    def get_queryset(self):
        return selectors.workload_policies_visible_to(self.request.user)

    def _save(self, instance, data):
        return config.workload_policy_save(actor=self.request.user, policy=instance, **data)


class NodeViewSet(ConfigViewSet):
    """Nodes register themselves through their agent; platform admins change state, pool, labels."""

    serializer_class = s.NodeSerializer
    filterset_fields = ["state", "pool__name"]
    lookup_field = "name"
    delete_action = "node.delete"

    def get_queryset(self):
        return selectors.nodes_visible_to(self.request.user)

    def create(self, request):
        config.require_platform_admin(request.user)
        raise BusinessError(
            "Nodes are registered by their agent: run `manage.py agent --node NAME` on the node."
        )

    def _save(self, instance, data):
        return config.node_update(actor=self.request.user, node=instance, **data)


class GpuViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = s.GpuSerializer
    filterset_fields = ["model", "health", "node__name", "node__pool__name"]

    def get_queryset(self):
        return selectors.gpus_visible_to(self.request.user)


class QuotaViewSet(ConfigViewSet):
    serializer_class = s.QuotaSerializer
    filterset_fields = {"tenant__slug": ["exact"], "pool__name": ["exact"], "gpu_model": ["exact"]}
    delete_action = "quota.delete"

    def get_queryset(self):
        return selectors.quotas_visible_to(self.request.user)

    def _save(self, instance, data):
        return config.quota_save(actor=self.request.user, quota=instance, **data)


class QueueViewSet(ConfigViewSet):
    serializer_class = s.QueueSerializer
    filterset_fields = {
        "tenant__slug": ["exact"],
        "pool__name": ["exact"],
        "environment": ["exact"],
        "state": ["exact"],
        "project": ["exact"],
    }
    delete_action = "queue.delete"

    def get_queryset(self):
        return selectors.queues_visible_to(self.request.user)

    def _save(self, instance, data):
        if "tenant" in data:
            # A tenant the user cannot see does not exist for them.
            from tenants.selectors import tenants_visible_to

            if not tenants_visible_to(self.request.user).filter(pk=data["tenant"].pk).exists():
                raise NotFoundError("Tenant not found.")
        return config.queue_save(actor=self.request.user, queue=instance, **data)

    def destroy(self, request, **kwargs):
        queue = self.get_object()
        config.queue_check_rights(actor=request.user, queue=queue)
        config.config_delete(actor=request.user, instance=queue, action=self.delete_action)
        return Response(status=status.HTTP_204_NO_CONTENT)


class JobFilter(filters.FilterSet):
    state = filters.MultipleChoiceFilter(choices=Job._meta.get_field("state").choices)
    queue = filters.NumberFilter(field_name="queue_id")
    project = filters.NumberFilter(field_name="project_id")
    tenant = filters.CharFilter(field_name="tenant__slug")
    user = filters.CharFilter(field_name="submitted_by__username")
    workload_type = filters.CharFilter()
    array_id = filters.CharFilter()

    class Meta:
        model = Job
        fields = ["state", "queue", "project", "tenant", "user", "workload_type", "array_id"]


def spec_from_input(user, data: dict) -> JobSpec:
    """Resolve the ids and names in validated API input into a JobSpec (404 for others' objects)."""
    project = projects_visible_to(user).filter(pk=data.pop("project")).first()
    if project is None:
        raise NotFoundError("Project not found.")
    queue = selectors.queues_visible_to(user).filter(pk=data.pop("queue")).first()
    if queue is None:
        raise NotFoundError("Queue not found.")
    name = data.pop("priority_class") or None
    priority = None
    if name:
        priority = PriorityClass.objects.filter(name=name).first()
        if priority is None:
            raise BusinessError(f"Unknown priority class {name!r}.", field="priority_class")
    data["gpu_models"] = data.pop("gpu_model")
    return JobSpec(project=project, queue=queue, priority_class=priority, **data)


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Jobs: submit (one, bulk or array), list and filter, cancel, hold, release, timeline."""

    serializer_class = s.JobSerializer
    filterset_class = JobFilter
    ordering_fields = ["id", "submitted_at", "queue_position", "state"]

    def get_queryset(self):
        active = Allocation.objects.filter(released_at__isnull=True).select_related("node", "gpu")
        return selectors.jobs_visible_to(self.request.user).prefetch_related(
            Prefetch("allocations", queryset=active, to_attr="active_allocations")
        )

    def get_object(self):
        try:
            return super().get_object()
        except Http404:
            raise NotFoundError("Job not found.") from None

    @extend_schema(request=s.JobSubmitSerializer, responses={201: s.JobSerializer})
    def create(self, request):
        data = dict(validated(s.JobSubmitSerializer, request.data))
        spec = spec_from_input(request.user, data)
        if spec.array:
            created = jobs.job_submit_bulk(user=request.user, specs=[spec])
            return Response(
                {
                    "count": len(created),
                    "ids": [j.pk for j in created],
                    "array_id": created[0].array_id,
                },
                status=status.HTTP_201_CREATED,
            )
        job = jobs.job_submit(user=request.user, spec=spec)
        return Response(
            self.get_serializer(self.get_queryset().get(pk=job.pk)).data,
            status=status.HTTP_201_CREATED,
        )

    @extend_schema(request=s.JobBulkSerializer, responses={201: None})
    @action(detail=False, methods=["post"])
    def bulk(self, request):
        """Submit a list of jobs (or arrays) all-or-nothing: one bad spec and none is stored."""
        payload = request.data if isinstance(request.data, dict) else {"jobs": request.data}
        data = validated(s.JobBulkSerializer, payload)
        specs = []
        for i, item in enumerate(data["jobs"]):
            try:
                specs.append(spec_from_input(request.user, dict(item)))
            except BusinessError as exc:
                if exc.status_code == 404:
                    raise
                raise BusinessError(
                    f"jobs[{i}]: {exc.message}",
                    errors={f"jobs[{i}].{k}": v for k, v in exc.errors.items()},
                ) from None
        created = jobs.job_submit_bulk(user=request.user, specs=specs)
        return Response(
            {"count": len(created), "ids": [j.pk for j in created]}, status=status.HTTP_201_CREATED
        )

    def _step(self, request, service):
        job = self.get_object()
        reason = validated(s.JobActionSerializer, request.data)["reason"]
        service(user=request.user, job=job, reason=reason)
        return Response(self.get_serializer(self.get_queryset().get(pk=job.pk)).data)

    @extend_schema(request=s.JobActionSerializer, responses=s.JobSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        return self._step(request, jobs.job_cancel)

    @extend_schema(request=s.JobActionSerializer, responses=s.JobSerializer)
    @action(detail=True, methods=["post"])
    def hold(self, request, pk=None):
        return self._step(request, jobs.job_hold)

    @extend_schema(request=s.JobActionSerializer, responses=s.JobSerializer)
    @action(detail=True, methods=["post"])
    def release(self, request, pk=None):
        return self._step(request, jobs.job_release)

    @extend_schema(responses=s.JobEventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request, pk=None):
        job = self.get_object()
        page = self.paginate_queryset(selectors.job_events_of(job))
        return self.get_paginated_response(s.JobEventSerializer(page, many=True).data)

    @extend_schema(
        parameters=[
            OpenApiParameter("tail", int, description="Last N bytes (default 65536)."),
            OpenApiParameter("attempt", int, description="Attempt (default: current)."),
        ],
        responses={200: None},
    )
    @action(detail=True, methods=["get"])
    def logs(self, request, pk=None):
        """The job's output (stdout and stderr) as shipped by its node agent."""
        from ..services.nodes import job_log_path

        job = self.get_object()
        try:
            tail = max(1, min(int(request.query_params.get("tail", 65536)), 10 * 1024 * 1024))
            attempt = int(request.query_params.get("attempt", job.attempt))
        except ValueError:
            raise BusinessError("tail and attempt must be integers.", field="tail") from None
        path = job_log_path(job.pk, attempt)
        text, size = "", 0
        if path.exists():
            with open(path, "rb") as handle:
                size = handle.seek(0, 2)
                handle.seek(max(0, size - tail))
                text = handle.read().decode("utf-8", errors="replace")
        return Response(
            {
                "job": job.pk,
                "attempt": attempt,
                "size": size,
                "truncated": size > tail,
                "text": text,
                "running": job.state in ("ADMITTED", "RUNNING", "STOPPING"),
            }
        )
