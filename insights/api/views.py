"""Views of the insights' API.

- ``GET /api/v1/metrics/summary``: the cluster now, in numbers, for dashboards and scripts.
  Pools' totals are the same for everybody (capacity is no tenant's secret); queues and the
  inference services near capacity are those the user may see (a platform admin: all;
  others: their tenants').
- ``GET /api/v1/usage``: GPU-hours allocated and used, grouped and filtered, against the
  guarantees (chargeback). JSON (paginated rows and a totals row) or CSV (``?format=csv`` or
  ``Accept: text/csv``), streamed so that a long range needs no more memory than a short one.
- ``GET /api/v1/recommendations`` (filters ``kind``, ``state``, ``tenant``; open ones ranked
  by impact first), ``GET .../{id}``, and the steps ``POST .../{id}/simulate`` (202, the
  what-if run queued), ``.../apply`` and ``.../dismiss`` (``reason`` required). Platform
  admins act; tenant admins read their tenants' (403 on the steps); members and viewers get
  403; another tenant's recommendation is 404.
"""

from __future__ import annotations

from django.db.models import Case, F, FloatField, Value, When
from django.db.models.functions import Cast
from django.http import StreamingHttpResponse
from django.urls import reverse
from django.utils import timezone
from django_filters import rest_framework as filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import mixins, renderers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api.filters import path_id
from portal.api.pagination import StandardPagination
from portal.api.renderers import JSONRenderer
from portal.api.views import validated
from portal.csvexport import line_writer, spreadsheet_safe
from scheduling.selectors import queues_visible_to
from tenants.selectors import is_platform_admin

from .. import usage
from ..choices import RecommendationKind, RecommendationState
from ..metrics import metrics_summary
from ..models import Recommendation
from ..selectors import (
    recommendation_get,
    recommendations_check_access,
    recommendations_visible_to,
    services_near_capacity_for,
)
from ..services.recommendations import (
    recommendation_apply,
    recommendation_dismiss,
    recommendation_simulate,
)
from .serializers import (
    DismissSerializer,
    MetricsSummarySerializer,
    RecommendationSerializer,
    SimulationQueued,
    UsageQuerySerializer,
    UsageReportSerializer,
)

# -- the metrics summary ---------------------------------------------------------------------


class MetricsSummaryView(APIView):
    """The cluster now: per pool its GPUs (total, allocated, used, idle, free) and jobs;
    per queue you can see, its depth and longest current wait."""

    @extend_schema(
        responses=MetricsSummarySerializer,
        summary="Cluster summary now",
        description="Per pool: GPUs total / allocated / used / idle / free / unavailable (also "
        "per GPU model) and pending / held / running jobs, for every signed-in user. Per "
        "queue (platform admins: all; others: their tenants' queues): depth, held jobs, GPUs "
        "asked for, running jobs, the longest current wait and the pending jobs by reason. "
        "The inference services near capacity now (of the same tenants).",
    )
    def get(self, request):
        user = request.user
        queue_ids = (
            None
            if is_platform_admin(user)
            else set(queues_visible_to(user).values_list("id", flat=True))
        )
        summary = metrics_summary(queue_ids=queue_ids)
        summary["services_near_capacity"] = services_near_capacity_for(user)
        return Response(MetricsSummarySerializer(summary).data)


# -- the usage report ---------------------------------------------------------------------------


def csv_cell(value) -> str | float | int:
    """A cell for CSV: numbers as they are, text defused when a spreadsheet would run it."""
    if value is None:
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return spreadsheet_safe(str(value))


class UsageCSVRenderer(renderers.BaseRenderer):
    """``text/csv``: the header, the rows, then the totals row (first column ``total``)."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        # Only reached for a non-streamed answer (the view streams reports itself).
        return b""


def csv_lines(report_columns, rows, totals):
    """The CSV text of a report, line by line."""
    writer = line_writer()
    header = [*report_columns, *usage.FIGURE_COLUMNS]
    yield writer.writerow(header)
    for row in rows:
        yield writer.writerow([csv_cell(row.get(c)) for c in header])
    first = report_columns[0] if report_columns else None
    total = [csv_cell(totals.get(c)) for c in usage.FIGURE_COLUMNS]
    group_cells = ["total" if c == first else "" for c in report_columns]
    if not report_columns:  # no group columns: the single row is the total already
        return
    yield writer.writerow([*group_cells, *total])


def _list_parameter(name: str, type_, description: str) -> OpenApiParameter:
    return OpenApiParameter(name, type_, many=True, explode=True, description=description)


class UsageView(APIView):
    """GPU-hours allocated and used per tenant, project, user, workload type, pool, GPU
    model and/or day, against the tenants' guarantees (chargeback)."""

    renderer_classes = [JSONRenderer, renderers.BrowsableAPIRenderer, UsageCSVRenderer]
    pagination_class = StandardPagination

    @extend_schema(
        operation_id="usage_report",
        parameters=[
            OpenApiParameter(
                "start",
                OpenApiTypes.DATE,
                description="First day (UTC); default: 29 days before the end.",
            ),
            OpenApiParameter(
                "end", OpenApiTypes.DATE, description="Last day (UTC), included; default: today."
            ),
            _list_parameter(
                "group_by",
                OpenApiTypes.STR,
                "Any of " + ", ".join(usage.GROUP_BY_CHOICES) + "; default tenant.",
            ),
            _list_parameter("tenant", OpenApiTypes.STR, "Tenant slug(s)."),
            _list_parameter("project", OpenApiTypes.INT, "Project id(s)."),
            _list_parameter("pool", OpenApiTypes.STR, "Pool name(s)."),
            _list_parameter("user", OpenApiTypes.STR, "User name(s)."),
            OpenApiParameter(
                "format",
                OpenApiTypes.STR,
                enum=["json", "csv"],
                description="csv: the whole report as CSV (also with Accept: text/csv).",
            ),
            OpenApiParameter("page", OpenApiTypes.INT),
            OpenApiParameter("page_size", OpenApiTypes.INT),
        ],
        responses={
            (200, "application/json"): UsageReportSerializer,
            (200, "text/csv"): OpenApiResponse(
                OpenApiTypes.STR, description="The report as CSV, totals last."
            ),
        },
    )
    def get(self, request):
        serializer = UsageQuerySerializer(data=request.query_params)
        serializer.is_valid(raise_exception=True)
        query = serializer.validated_data
        if getattr(request.accepted_renderer, "format", "") == "csv":
            return _csv_response(request.user, query)
        report = usage.usage_report(request.user, query)
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(report.rows, request, view=self)
        return Response(
            {
                "start": query.start.isoformat(),
                "end": query.end.isoformat(),
                "hours": report.hours,
                "group_by": list(report.columns),
                "count": paginator.page.paginator.count,
                "next": paginator.get_next_link(),
                "previous": paginator.get_previous_link(),
                "results": page,
                "totals": report.totals,
            }
        )

    def finalize_response(self, request, response, *args, **kwargs):
        # Errors are JSON, even when CSV was asked for: a 400 says which field is wrong.
        if (
            isinstance(response, Response)
            and response.status_code >= 400
            and getattr(request, "accepted_renderer", None) is not None
            and request.accepted_renderer.format == "csv"
        ):
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)


def _csv_response(user, query: usage.UsageQuery) -> StreamingHttpResponse:
    now = timezone.now()
    columns = usage.canonical_group_by(query.group_by)
    guarantees = usage.guarantees_for(user, query)
    totals = usage.usage_totals(user, query, guarantees=guarantees, now=now)
    rows = usage.usage_rows_iter(user, query, guarantees=guarantees, now=now)
    response = StreamingHttpResponse(
        csv_lines(columns, rows, totals), content_type="text/csv; charset=utf-8"
    )
    response["Content-Disposition"] = (
        f'attachment; filename="sluice-usage-{query.start:%Y%m%d}-{query.end:%Y%m%d}.csv"'
    )
    return response


@extend_schema_view(get=extend_schema(exclude=True))
class UsageSlashView(UsageView):
    """``/api/v1/usage/``: the same answer; documented once, without the slash."""


# -- the recommendations -------------------------------------------------------------------------


class RecommendationFilter(filters.FilterSet):
    kind = filters.ChoiceFilter(choices=RecommendationKind.choices)
    state = filters.ChoiceFilter(choices=RecommendationState.choices)
    tenant = filters.CharFilter(field_name="tenant__slug")

    class Meta:
        model = Recommendation
        fields = ["kind", "state", "tenant"]


class RecommendationViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Recommendations computed daily from the recorded history, with their evidence and change."""

    serializer_class = RecommendationSerializer
    filterset_class = RecommendationFilter
    ordering_fields = ["updated_at", "created_at", "decided_at", "id"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Recommendation.objects.none()
        recommendations_check_access(self.request.user)
        # Open ones first, largest impact first; then the decided ones, newest first.
        impact = Cast(F("evidence__impact_gpu_hours"), FloatField())
        return recommendations_visible_to(self.request.user).order_by(
            Case(When(state=RecommendationState.OPEN, then=Value(0)), default=Value(1)),
            Case(When(state=RecommendationState.OPEN, then=impact), default=Value(0.0)).desc(),
            F("decided_at").desc(nulls_last=True),
            "-id",
        )

    def get_object(self):
        pk = path_id(self.kwargs["pk"], "Recommendation not found.")
        return recommendation_get(self.request.user, pk)

    @extend_schema(request=None, responses={202: SimulationQueued})
    @action(detail=True, methods=["post"])
    def simulate(self, request, pk=None):
        """Queue a what-if replay of the recorded history with the change (platform admins);
        400 with code ``not_simulatable`` for changes the simulator cannot replay."""
        rec = self.get_object()
        run = recommendation_simulate(user=request.user, recommendation=rec)
        fresh = recommendation_get(request.user, rec.pk)
        return Response(
            {
                "simulation": run.pk,
                "state": run.state,
                "url": reverse("simulate-run", args=[run.pk]),
                "recommendation": self.get_serializer(fresh).data,
            },
            status=status.HTTP_202_ACCEPTED,
        )

    @extend_schema(request=None, responses=RecommendationSerializer)
    @action(detail=True, methods=["post"])
    def apply(self, request, pk=None):
        """Make the change through the configuration services (platform admins); audited."""
        rec = self.get_object()
        recommendation_apply(user=request.user, recommendation=rec)
        return Response(self.get_serializer(recommendation_get(request.user, rec.pk)).data)

    @extend_schema(request=DismissSerializer, responses=RecommendationSerializer)
    @action(detail=True, methods=["post"])
    def dismiss(self, request, pk=None):
        """Close it without acting, with a reason (platform admins)."""
        rec = self.get_object()
        data = validated(DismissSerializer, request.data)
        recommendation_dismiss(user=request.user, recommendation=rec, reason=data["reason"])
        return Response(self.get_serializer(recommendation_get(request.user, rec.pk)).data)
