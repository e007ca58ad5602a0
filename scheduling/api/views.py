from django.db.models import F, Prefetch
from django.http import Http404
from django_filters import rest_framework as filters
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
)
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api.filters import IdFilter, path_id
from portal.api.pagination import CountCappedPagination
from portal.api.views import validated
from portal.errors import BusinessError, NotFoundError
from tenants.selectors import (
    projects_visible_to,
    tenant_get,
    tenants_visible_to,
)

from .. import jobspec, selectors
from ..choices import RaiseState
from ..models import Allocation, Job, PriorityClass, PriorityRaise
from ..services import config, idempotency, jobs, notifications, raises
from ..services.jobs import JobSpec, Lookups
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
        # A tenant or project the user cannot see does not exist for them.
        if (
            "tenant" in data
            and not tenants_visible_to(self.request.user).filter(pk=data["tenant"].pk).exists()
        ):
            raise NotFoundError("Tenant not found.")
        project = data.get("project")
        if (
            project is not None
            and not projects_visible_to(self.request.user).filter(pk=project.pk).exists()
        ):
            raise NotFoundError("Project not found.")
        return config.queue_save(actor=self.request.user, queue=instance, **data)

    def destroy(self, request, **kwargs):
        queue = self.get_object()
        config.queue_check_rights(actor=request.user, queue=queue)
        config.config_delete(actor=request.user, instance=queue, action=self.delete_action)
        return Response(status=status.HTTP_204_NO_CONTENT)


class JobFilter(filters.FilterSet):
    # A column of the job itself: no join can repeat a row, so no DISTINCT (which sorted
    # every matching job, all columns, before the page was cut).
    state = filters.MultipleChoiceFilter(
        choices=Job._meta.get_field("state").choices, distinct=False
    )
    queue = IdFilter(field_name="queue_id")
    project = IdFilter(field_name="project_id")
    tenant = filters.CharFilter(field_name="tenant__slug")
    user = filters.CharFilter(field_name="submitted_by__username")
    workload_type = filters.CharFilter()
    array_id = filters.CharFilter()

    class Meta:
        model = Job
        fields = ["state", "queue", "project", "tenant", "user", "workload_type", "array_id"]


def _one(queryset):
    """The first row of ``queryset`` or None, without ordering it (``first()`` orders by the
    model's ordering: joins and compilation for a lookup by primary key)."""
    rows = list(queryset.order_by()[:1])
    return rows[0] if rows else None


def spec_from_input(user, data: dict, lookups: Lookups | None = None) -> JobSpec:
    """Resolve the ids and names in validated API input into a JobSpec (404 for others' objects)."""
    lookups = lookups or Lookups()
    project_id, queue_id = data.pop("project"), data.pop("queue")
    workload_type = data.get("workload_type")
    project, queue, policy = lookups.get(
        ("targets", project_id, queue_id, workload_type),
        lambda: selectors.submission_targets(
            user, project_id=project_id, queue_id=queue_id, workload_type=workload_type
        ),
    )
    if project is None:
        raise NotFoundError("Project not found.")
    if queue is None:
        raise NotFoundError("Queue not found.")
    # The policy came with them: job_validate reads it from the lookups (jobs._policy).
    lookups.get(("policy", workload_type), lambda: policy)
    name = data.pop("priority_class") or None
    priority = None
    if name:
        priority = lookups.get(
            ("class", name), lambda: _one(PriorityClass.objects.filter(name=name))
        )
        if priority is None:
            raise BusinessError(f"Unknown priority class {name!r}.", field="priority_class")
    for field in jobspec.JOB_FIELDS:
        if field.attribute != field.name:
            data[field.attribute] = data.pop(field.name)
    return JobSpec(project=project, queue=queue, priority_class=priority, **data)


IDEMPOTENCY_KEY_PARAMETER = OpenApiParameter(
    name=idempotency.HEADER,
    type=str,
    location=OpenApiParameter.HEADER,
    required=False,
    description=(
        "Makes a retry safe: a second request by the same user with the same key (1 to 255 "
        "printable ASCII characters) and the same body creates nothing and answers the first "
        "answer again (same status and body) with the header `Idempotent-Replayed: true`. "
        "The same key with another body, or on the other submission endpoint, is refused "
        "(422). Keys are per user and kept 24 hours; only a successful submission is kept, "
        "so a refused one may be retried with its key."
    ),
)
IDEMPOTENCY_KEY_REUSED = OpenApiResponse(
    description="The Idempotency-Key was used for another request (another body or endpoint)."
)


#: What the job answer (serializers.JobSerializer) reads of a job and its relations.
JOB_ANSWER_FIELDS = [
    *(f.name for f in Job._meta.concrete_fields),
    "tenant__slug",
    "project__slug",
    "queue__name",
    "queue__pool__name",
    "submitted_by__username",
    "priority_class__name",
    "base_priority_class__name",
]


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Jobs: submit (one, bulk or array), list and filter, cancel, hold, release, timeline."""

    serializer_class = s.JobSerializer
    filterset_class = JobFilter
    # Counted up to 10,000 jobs (``count_capped`` says when there are more).
    pagination_class = CountCappedPagination
    # ``queue_position`` orders by the scheduling order's sort key (positions are counted
    # from it; see scheduling.positions).
    ordering_fields = ["id", "submitted_at", "queue_position", "state"]
    # ``?cursor=``: keyset pages (portal.api.pagination.StandardPagination), for these.
    cursor_orderings = ("id", "submitted_at")

    def get_queryset(self):
        jobs = selectors.jobs_visible_to(self.request.user).alias(queue_position=F("pending_rank"))
        if self.action == "list":
            # The names the answers show and the GPUs the jobs hold are read for the
            # whole page at once (serializers.JobListSerializer), not joined into every row.
            return jobs.select_related(None)
        active = Allocation.objects.filter(released_at__isnull=True).select_related("node", "gpu")
        jobs = jobs.prefetch_related(
            Prefetch("allocations", queryset=active, to_attr="active_allocations")
        )
        if self.action == "retrieve":
            # Only read: of the related objects, the names the answer shows (a user row,
            # a queue, a project... each had every column loaded and converted).
            jobs = jobs.only(*JOB_ANSWER_FIELDS)
        return jobs

    def get_object(self):
        try:
            return super().get_object()
        except Http404:
            raise NotFoundError("Job not found.") from None

    def _idempotent(self, request, endpoint: str, submit) -> Response:
        """Answer a submission once per Idempotency-Key (scheduling.services.idempotency)."""
        key = idempotency.idempotency_key_parse(request.headers.get(idempotency.HEADER))
        answer = idempotency.job_submit_idempotent(
            user=request.user,
            key=key,
            endpoint=endpoint,
            data=request.data if key is not None else None,
            submit=lambda: submit(request),
        )
        response = Response(answer.body, status=answer.status_code)
        if answer.replayed:
            response[idempotency.REPLAYED_HEADER] = "true"
        return response

    @extend_schema(
        request=s.JobSubmitSerializer,
        parameters=[IDEMPOTENCY_KEY_PARAMETER],
        responses={
            201: PolymorphicProxySerializer(
                component_name="JobSubmitted",
                serializers=[s.JobSerializer, s.JobSubmitResultSerializer],
                resource_type_field_name=None,
                many=False,
            ),
            422: IDEMPOTENCY_KEY_REUSED,
        },
        description="Submit one job; with `array` set, that many jobs and the answer lists their ids.",
    )
    def create(self, request):
        return self._idempotent(request, "jobs.create", self._create)

    def _create(self, request) -> idempotency.Answer:
        data = dict(validated(s.JobSubmitSerializer, request.data))
        lookups = Lookups()
        spec = spec_from_input(request.user, data, lookups)
        if spec.array:
            created = jobs.job_submit_bulk(user=request.user, specs=[spec], lookups=lookups)
            return idempotency.Answer(
                status.HTTP_201_CREATED,
                {
                    "count": len(created),
                    "ids": [j.pk for j in created],
                    "array_id": created[0].array_id,
                },
            )
        job = jobs.job_submit(user=request.user, spec=spec, lookups=lookups)
        # The job as stored, with the objects it was made from: no second read. A job
        # just submitted holds no GPU, and its runtime is predicted from what its
        # admission read.
        job.active_allocations = []
        serializer = self.get_serializer(job)
        prediction = jobs.submitted_prediction(job, spec, lookups, request.user)
        serializer.predictions = {job.pk: prediction}
        return idempotency.Answer(status.HTTP_201_CREATED, serializer.data)

    @extend_schema(
        request=s.JobBulkSerializer,
        parameters=[IDEMPOTENCY_KEY_PARAMETER],
        responses={201: s.JobSubmitResultSerializer, 422: IDEMPOTENCY_KEY_REUSED},
    )
    @action(detail=False, methods=["post"])
    def bulk(self, request):
        """Submit a list of jobs (or arrays) all-or-nothing: one bad spec and none is stored."""
        return self._idempotent(request, "jobs.bulk", self._bulk)

    def _bulk(self, request) -> idempotency.Answer:
        payload = request.data if isinstance(request.data, dict) else {"jobs": request.data}
        data = validated(s.JobBulkSerializer, payload)
        specs = []
        lookups = Lookups()
        for i, item in enumerate(data["jobs"]):
            try:
                specs.append(spec_from_input(request.user, dict(item), lookups))
            except BusinessError as exc:
                if exc.status_code == 404:
                    raise
                raise BusinessError(
                    f"jobs[{i}]: {exc.message}",
                    errors={f"jobs[{i}].{k}": v for k, v in exc.errors.items()},
                ) from None
        created = jobs.job_submit_bulk(user=request.user, specs=specs, lookups=lookups)
        return idempotency.Answer(
            status.HTTP_201_CREATED, {"count": len(created), "ids": [j.pk for j in created]}
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

    @extend_schema(parameters=[s.JobLogsQuerySerializer], responses=s.JobLogsSerializer)
    @action(detail=True, methods=["get"])
    def logs(self, request, pk=None):
        """The job's output (stdout and stderr) as shipped by its node agent."""
        from ..services.nodes import job_log_path

        job = self.get_object()
        params = validated(s.JobLogsQuerySerializer, request.query_params)
        tail = min(params.get("tail", 65536), 10 * 1024 * 1024)
        attempt = params.get("attempt", job.attempt)
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


# --- priority raises ------------------------------------------------------------------------


class PriorityRaiseFilter(filters.FilterSet):
    state = filters.MultipleChoiceFilter(choices=RaiseState.choices)
    tenant = filters.CharFilter(field_name="tenant__slug")
    job = IdFilter(field_name="job_id")
    project = IdFilter(field_name="project_id")
    requested_by = filters.CharFilter(field_name="requested_by__username")
    to_class = filters.CharFilter(field_name="to_class__name")
    decidable = filters.BooleanFilter(
        method="filter_decidable", label="Only pending raises I may approve or reject."
    )

    class Meta:
        model = PriorityRaise
        fields = ["state", "tenant", "job", "project", "requested_by", "to_class", "decidable"]

    def filter_decidable(self, queryset, name, value):
        if value is None:
            return queryset
        mine = selectors.raises_decidable_by(self.request.user).values("pk")
        return queryset.filter(pk__in=mine) if value else queryset.exclude(pk__in=mine)


def _priority_class(name: str, field: str) -> PriorityClass:
    priority = PriorityClass.objects.filter(name=name).first()
    if priority is None:
        raise BusinessError(f"Unknown priority class {name!r}.", field=field)
    return priority


def raise_target_from_input(user, data: dict) -> dict:
    """Resolve the ids and names of a raise request (404 for other tenants' jobs and projects)."""
    target = dict(data)
    if target["job"] is not None:
        target["job"] = selectors.jobs_visible_to(user).filter(pk=target["job"]).first()
        if target["job"] is None:
            raise NotFoundError("Job not found.")
    if target["project"] is not None:
        target["project"] = projects_visible_to(user).filter(pk=target["project"]).first()
        if target["project"] is None:
            raise NotFoundError("Project not found.")
    target["to_class"] = _priority_class(target["to_class"], "to_class")
    return target


class PriorityRaiseViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Priority raises: request one (job, or project window), then approve, reject, revoke or
    cancel it. The list shows your requests and raises on your jobs (tenant admins: their
    tenants', platform admins: all); any raise of your tenants can be fetched by id."""

    serializer_class = s.PriorityRaiseSerializer
    filterset_class = PriorityRaiseFilter
    ordering_fields = ["id", "created_at", "expires_at"]

    def get_queryset(self):
        if self.action == "list":
            return selectors.raises_listed_for(self.request.user)
        return selectors.raises_visible_to(self.request.user)

    def get_object(self):
        try:
            return super().get_object()
        except Http404:
            raise NotFoundError("Priority raise not found.") from None

    def _respond(self, raise_, status_code=status.HTTP_200_OK):
        fresh = selectors.raises_visible_to(self.request.user).get(pk=raise_.pk)
        return Response(self.get_serializer(fresh).data, status=status_code)

    @extend_schema(
        request=s.PriorityRaiseCreateSerializer, responses={201: s.PriorityRaiseSerializer}
    )
    def create(self, request):
        data = validated(s.PriorityRaiseCreateSerializer, request.data)
        target = raise_target_from_input(request.user, data)
        raise_ = raises.priority_raise_request(user=request.user, **target)
        return self._respond(raise_, status.HTTP_201_CREATED)

    def _step(self, request, service):
        raise_ = self.get_object()
        comment = validated(s.RaiseStepSerializer, request.data)["comment"]
        return self._respond(service(raise_=raise_, user=request.user, comment=comment))

    @extend_schema(request=s.RaiseStepSerializer, responses=s.PriorityRaiseSerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        """Grant it (tenant admins up to their tenant's ceiling; platform admins any class)."""
        return self._step(request, raises.priority_raise_approve)

    @extend_schema(request=s.RaiseStepSerializer, responses=s.PriorityRaiseSerializer)
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        return self._step(request, raises.priority_raise_reject)

    @extend_schema(request=s.RaiseStepSerializer, responses=s.PriorityRaiseSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        """End an active grant now; its jobs go back to their base class."""
        return self._step(request, raises.priority_raise_revoke)

    @extend_schema(request=s.RaiseStepSerializer, responses=s.PriorityRaiseSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """The requester withdraws a pending request."""
        return self._step(request, raises.priority_raise_cancel)

    @extend_schema(responses=s.RaiseImpactSerializer)
    @action(detail=True, methods=["get"])
    def impact(self, request, pk=None):
        """What granting it would change now: queue positions, jobs passed, possible preemptions."""
        from ..raise_impact import RaiseImpact, raise_impacts

        raise_ = self.get_object()
        impact = raise_impacts([raise_]).get(raise_.pk) or RaiseImpact(
            note="The scheduling engine is not available."
        )
        return Response(s.RaiseImpactSerializer(impact).data)


class RaiseCeilingView(APIView):
    """The highest class a tenant's admins may approve raises to (platform admins set it)."""

    def _body(self, tenant):
        ceiling = selectors.raise_ceiling_of(tenant)
        return {"tenant": tenant.slug, "ceiling": ceiling.name if ceiling else None}

    @extend_schema(responses=s.RaiseCeilingSerializer)
    def get(self, request, tenant_slug):
        return Response(self._body(tenant_get(request.user, tenant_slug)))

    @extend_schema(request=s.RaiseCeilingSerializer, responses=s.RaiseCeilingSerializer)
    def put(self, request, tenant_slug):
        tenant = tenant_get(request.user, tenant_slug)
        name = validated(s.RaiseCeilingSerializer, request.data)["ceiling"]
        ceiling = _priority_class(name, "ceiling") if name else None
        raises.tenant_raise_ceiling_set(actor=request.user, tenant=tenant, ceiling=ceiling)
        return Response(self._body(tenant))

    patch = put


# --- notifications --------------------------------------------------------------------------


class NotificationViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Your own notifications, newest first; mark one or all read."""

    serializer_class = s.NotificationSerializer
    filterset_fields = {"read_at": ["isnull"], "kind": ["exact"]}

    def get_queryset(self):
        return selectors.notifications_of(self.request.user)

    @extend_schema(request=None, responses=s.NotificationSerializer)
    @action(detail=True, methods=["post"])
    def read(self, request, pk=None):
        notification = self.get_queryset().filter(pk=path_id(pk, "Notification not found.")).first()
        if notification is None:
            raise NotFoundError("Notification not found.")
        notifications.notification_mark_read(user=request.user, notification=notification)
        return Response(self.get_serializer(notification).data)

    @extend_schema(request=None, responses=s.MarkedReadSerializer)
    @action(detail=False, methods=["post"], url_path="read-all")
    def read_all(self, request):
        count = notifications.notifications_mark_all_read(user=request.user)
        return Response({"marked_read": count})
